"""``make soak``: the statistical versions of what ``make test`` proves once.

    python -m benchmarks.soak_suite [--parts tests,sweep,recovery,deployment-soak]
                                    [--recovery-tries 3] [--soak-runs 10]

Runs, one after another (each writes its own result file under ``benchmarks/results/``):

- ``tests``: the tests marked ``soak`` but not ``sweep`` (``pytest -m "soak and not
  sweep"``: SIGTERM at ten random moments of every stage and of grouped training, the
  multi-host fault matrix, the repeated orchestration faults, the other stop-signal
  variants), each test's outcome, wall and CPU seconds in ``soak-tests-cpu-2core.json``;
- ``sweep``: ``benchmarks.reliability_sweep --jobs 2`` (the tests marked ``sweep``,
  ``tests/system/``: 86 bad inputs and faults through every entry point; as root, it
  mounts tmpfs file systems), ``reliability-sweep.json``;
- ``recovery``: ``benchmarks.recovery`` (lost machines and whole-stack restarts, killed
  and recovered again and again), ``recovery-cpu-2core.json``;
- ``deployment-soak``: ``benchmarks.soak`` (consecutive deployment runs on one worker
  under CPU load), ``soak-cpu-2core.json``.

Then writes ``soak-suite-cpu-2core.json``: date, machine, commit, and per part its
command, exit code, minutes and result file. Exits 1 if any part failed. The figures of
docs/reliability.md come from these files (``make docs-check``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.provenance import ROOT, stamp

RESULTS = ROOT / "benchmarks" / "results"
PARTS = ("tests", "sweep", "recovery", "deployment-soak")


def _write_tests_result(report: Path, rc: int, seconds: float, out: Path) -> None:
    records = json.loads(report.read_text())["records"] if report.exists() else []
    outcomes: dict[str, int] = {}
    for r in records:
        outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
    result = {
        **stamp(),
        "command": "python -m pytest -n 2 --dist loadfile -m soak tests",
        "exit_code": rc,
        "wall_s": round(seconds, 1),
        "tests": len(records),
        "outcomes": outcomes,
        "records": sorted(records, key=lambda r: r["test"]),
    }
    out.write_text(json.dumps(result, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak_suite", description=__doc__.split("\n")[0])
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--recovery-tries", type=int, default=3)
    parser.add_argument("--soak-runs", type=int, default=10)
    args = parser.parse_args(argv)
    parts = args.parts.split(",")
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        print(f"error: unknown part {unknown[0]!r}; fix: pick from {', '.join(PARTS)}", file=sys.stderr)
        return 2
    commands = {
        "tests": [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-n",
            "2",
            "--dist",
            "loadfile",
            "-m",
            "soak and not sweep",
            "tests",
        ],
        "sweep": [sys.executable, "-m", "benchmarks.reliability_sweep", "--jobs", "2"],
        "recovery": [sys.executable, "-m", "benchmarks.recovery", "--tries", str(args.recovery_tries)],
        "deployment-soak": [sys.executable, "-m", "benchmarks.soak", "--runs", str(args.soak_runs)],
    }
    files = {
        "tests": "soak-tests-cpu-2core.json",
        "sweep": "reliability-sweep.json",
        "recovery": "recovery-cpu-2core.json",
        "deployment-soak": "soak-cpu-2core.json",
    }
    summary = {**stamp(), "command": "make soak", "parts": {}}
    for part in parts:
        print(f"== {part}", flush=True)
        start = time.monotonic()
        cmd = commands[part]
        if part == "tests":  # the suite's own report, read back into its result file
            with tempfile.TemporaryDirectory(prefix="ensemble-soak-") as work:
                report = Path(work) / "report.json"
                env = {**os.environ, "ENSEMBLE_SUITE_REPORT": str(report)}
                rc = subprocess.run(cmd, cwd=ROOT, env=env).returncode
                _write_tests_result(report, rc, time.monotonic() - start, RESULTS / files[part])
        else:
            rc = subprocess.run(cmd, cwd=ROOT).returncode
        summary["parts"][part] = {
            "command": " ".join(["python", *cmd[1:]]),
            "exit_code": rc,
            "minutes": round((time.monotonic() - start) / 60, 1),
            "result_file": files[part],
        }
        print(json.dumps({part: summary["parts"][part]}), flush=True)
    summary["all_passed"] = all(p["exit_code"] == 0 for p in summary["parts"].values())
    out = RESULTS / "soak-suite-cpu-2core.json"
    out.write_text(json.dumps(summary, indent=1) + "\n")
    print(f"wrote {out}")
    return 0 if summary["all_passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
