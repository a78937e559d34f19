"""The test suite's own figures: ``.ci/run`` on a fresh clone, timed, with one core held busy.

    python -m benchmarks.suite [--runs 3] [--no-busy-core] [--fast] [--append]
                               [--out benchmarks/results/suite-cpu-2core.json] [--logs DIR]
    python -m benchmarks.suite --fast-only [--runs 3] [--no-busy-core] [--out FILE]

Each run clones the committed ``HEAD`` of this repository into a new temporary directory
(as CI does), starts ``python3 -c "while True: pass"`` (unless ``--no-busy-core``) and
runs ``.ci/run`` there (install from nothing, then the README's test command, ``make
test``), with ``ENSEMBLE_SUITE_REPORT`` set so that the suite records each test's wall
and CPU seconds (``tests/conftest.py``). ``--fast`` also times ``make test-fast`` in the
last clone, under the same load. Writes (``--out``): ``date``, ``machine``, ``commit``,
and per run the install-and-suite seconds, the suite's seconds as pytest printed them,
the number of tests by outcome, the CPU seconds of all tests (their processes and the
children they reaped), the machine's CPU seconds during ``.ci/run`` and the busy core's
part of them (what is left is the suite's, its servers and daemons included), the same
machine time by kind of process (``processes``: pytest-xdist workers, Prefect servers,
flow-run processes, command lines, JAX processes, ...; ``benchmarks/process_cpu.py``) and
what its samples missed (``unsampled_s``), the 15 slowest tests
(wall seconds, setup and teardown included), each module's wall and CPU seconds, and
per pytest-xdist worker when it finished and the modules it ran; ``budget_s`` is the suite's budget
(15 minutes, issue 37), and ``within_budget`` says whether every run met it. ``--append``
adds the runs to those already in ``--out`` when that file was written for the same commit
(runs in a row measured in separate sittings); otherwise it starts the file anew. ``--logs
DIR`` keeps each run's ``.ci/run`` output, ``make test-fast`` output and per-test report in
``DIR/run-<i>/`` (the clone itself is removed): where a failure's traceback is read.

``--fast`` rows also hold the CPU seconds of ``make test-fast``'s process tree.
``--fast-only`` measures the edit loop alone: one fresh clone, ``make setup``, then ``make
test-fast`` once with its compilation cache empty (``cold``) and ``--runs`` times after it
(``warm``, as in an edit loop), each run's wall and pytest seconds, CPU seconds of its
process tree, outcomes and the cache's bytes; ``within_fast_budget`` says whether every warm
run met the 60 s budget. Written to ``--out`` (default ``suite-fast-<cpus>core.json``).

The README and docs/development.md take their suite figures from this file (checked by
``make docs-check``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from benchmarks.process_cpu import ProcessSampler, children_cpu_seconds, process_cpu_s
from benchmarks.provenance import ROOT, busy_seconds, stamp

BUDGET_S = 15 * 60  # make test on 2 cores with one held busy, install excluded
FAST_BUDGET_S = 60  # make test-fast (issue 61)
SUMMARY = re.compile(
    r"^=* ?(?P<counts>\d+ (?:passed|failed|skipped|error|errors|deselected)\b.*?) in (?P<seconds>[0-9.]+)s", re.M
)


def _counts(text: str) -> tuple[dict[str, int], float | None]:
    """pytest's last summary line: {'passed': n, 'failed': n, ...} and its seconds."""
    found = list(SUMMARY.finditer(text))
    if not found:
        return {}, None
    last = found[-1]
    counts = {m.group(2): int(m.group(1)) for m in re.finditer(r"(\d+) (\w+)", last.group("counts"))}
    return counts, float(last.group("seconds"))


def _timed(cmd: list[str], cwd: Path, env: dict[str, str], log: Path) -> tuple[int, float, str]:
    start = time.monotonic()
    with log.open("w") as f:
        rc = subprocess.run(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    return rc, time.monotonic() - start, log.read_text(errors="replace")


def _records(report: Path) -> list[dict]:
    return json.loads(report.read_text())["records"] if report.exists() else []


def _by_module(records: list[dict]) -> dict[str, dict[str, float]]:
    """Wall and CPU seconds per test module, the most CPU first: where the budget goes."""
    modules: dict[str, dict[str, float]] = {}
    for r in records:
        m = modules.setdefault(r["test"].split("::")[0], {"wall_s": 0.0, "cpu_s": 0.0, "tests": 0})
        m["wall_s"] += r["wall_s"]
        m["cpu_s"] += r["cpu_s"]
        m["tests"] += 1
    ordered = sorted(modules.items(), key=lambda kv: -kv[1]["cpu_s"])
    return {k: {key: round(v[key], 1) if key != "tests" else v[key] for key in v} for k, v in ordered}


def _timeline(records: list[dict]) -> dict[str, dict]:
    """Per pytest-xdist worker: when it finished its last test (seconds after the suite's
    first test started) and the modules it ran, in order: where the suite's tail comes from."""
    if not records or "start" not in records[0]:
        return {}
    t0 = min(r["start"] for r in records)
    workers: dict[str, dict] = {}
    for r in sorted(records, key=lambda r: r["start"]):
        w = workers.setdefault(r["worker"], {"ends_s": 0.0, "modules": []})
        w["ends_s"] = round(max(w["ends_s"], r["start"] + r["wall_s"] - t0), 1)
        module = r["test"].split("::")[0].removeprefix("tests/")
        if not w["modules"] or w["modules"][-1] != module:
            w["modules"].append(module)
    return dict(sorted(workers.items()))


def _linux_busy_s() -> float:
    """:func:`benchmarks.provenance.busy_seconds`, which this benchmark needs: it measures
    the machine through ``/proc``.

    Raises:
      SystemExit: no ``/proc/stat`` (not Linux).
    """
    busy = busy_seconds()
    if busy is None:
        raise SystemExit("benchmarks.suite reads /proc/stat: run it on Linux")
    return busy


@contextlib.contextmanager
def _busy_core(enabled: bool) -> Iterator[subprocess.Popen | None]:
    """``python3 -c "while True: pass"`` for the body's time (None when not ``enabled``)."""
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if enabled else None
    try:
        yield burner
    finally:
        if burner is not None:
            burner.kill()


def _test_fast(clone: Path, env: dict[str, str], log: Path) -> dict:
    """``make test-fast`` in ``clone``: its exit code, wall and pytest seconds, the CPU
    seconds of its process tree and its tests by outcome."""
    before = children_cpu_seconds()
    rc, wall_s, text = _timed(["make", "test-fast"], clone, env, log)
    cpu_s = children_cpu_seconds() - before
    counts, suite_s = _counts(text)
    return {
        "exit_code": rc,
        "wall_s": round(wall_s, 1),
        "suite_s": suite_s,
        "cpu_s": round(cpu_s, 1),
        "outcomes": counts,
    }


def one_run(work: Path, busy_core: bool, fast: bool) -> dict:
    """Clone, run ``.ci/run`` (and ``make test-fast`` with ``fast``), return its figures."""
    clone = work / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    report = work / "suite-report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "ENSEMBLE_"))}
    env["ENSEMBLE_SUITE_REPORT"] = str(report)
    env["JAX_COMPILATION_CACHE_DIR"] = str(work / "jax-cache")  # cold, as on a fresh machine
    with _busy_core(busy_core) as burner:
        busy_before = _linux_busy_s()
        with ProcessSampler() as sampler:
            rc, total_s, text = _timed([".ci/run"], clone, env, work / "ci.log")
        machine_cpu_s = _linux_busy_s() - busy_before
        burner_cpu_s = process_cpu_s(burner.pid) if burner is not None else 0.0
        counts, suite_s = _counts(text)
        records = _records(report)
        processes = sampler.by_kind()
        row = {
            "exit_code": rc,
            "install_and_suite_s": round(total_s, 1),
            "suite_s": suite_s,
            "tests": sum(counts.get(k, 0) for k in ("passed", "failed", "skipped", "error", "errors")),
            "outcomes": counts,
            "cpu_s": round(sum(r["cpu_s"] for r in records), 1),
            # The whole machine while .ci/run ran (install included), and the busy core's
            # share of it: what the suite had is the rest (its servers and daemons too).
            "machine_cpu_s": round(machine_cpu_s, 1),
            "busy_core_cpu_s": round(burner_cpu_s, 1),
            # The same machine time by kind of process (benchmarks/process_cpu.py), the
            # servers and daemons no test reaps included; unsampled_s: what the samples
            # missed (processes shorter than a sample's interval, the kernel's own).
            "processes": processes,
            "unsampled_s": round(machine_cpu_s - sum(k["cpu_s"] for k in processes.values()), 1),
            "slowest": [
                {"test": r["test"], "wall_s": r["wall_s"], "cpu_s": r["cpu_s"]}
                for r in sorted(records, key=lambda r: -r["wall_s"])[:15]
            ],
            "failed": [r["test"] for r in records if r.get("outcome") == "failed"],
            "modules": _by_module(records),
            "workers": _timeline(records),
        }
        if fast:
            row["fast"] = _test_fast(clone, env, work / "fast.log")
    return row


def fast_only(work: Path, runs: int, busy_core: bool) -> dict:
    """``make test-fast`` in one fresh clone: once with its compilation cache empty, then
    ``runs`` times with it warm (each: wall and pytest seconds, CPU seconds, outcomes)."""
    clone = work / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "ENSEMBLE_", "JAX_"))}
    rc, setup_s, _ = _timed(["make", "setup"], clone, env, work / "setup.log")
    if rc:
        raise SystemExit(f"make setup failed: {(work / 'setup.log').read_text()[-2000:]}")
    cache = clone / ".cache" / "jax-test-fast"
    rows = []
    with _busy_core(busy_core):
        for i in range(runs + 1):
            row = {"cache": "cold" if i == 0 else "warm", **_test_fast(clone, env, work / f"fast-{i}.log")}
            row["cache_bytes"] = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file())
            rows.append(row)
            print(json.dumps(row), flush=True)
    return {"setup_s": round(setup_s, 1), "runs": rows}


def _portable(argv: list[str]) -> list[str]:
    """``argv`` with ``--logs``'s folder written as ``DIR``: where this machine kept the logs
    says nothing of the measurement, and result files hold no machine paths
    (tests/test_result_files.py)."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--logs" and i + 1 < len(out):
            out[i + 1] = "DIR"
        elif arg.startswith("--logs="):
            out[i] = "--logs=DIR"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.suite", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-busy-core", action="store_true", help="do not hold a core busy")
    parser.add_argument("--fast", action="store_true", help="also time make test-fast in the last clone")
    parser.add_argument("--fast-only", action="store_true", help="only make test-fast: cold, then --runs warm")
    parser.add_argument("--append", action="store_true", help="add to --out's runs of the same commit")
    parser.add_argument("--logs", help="keep each run's logs and report under this folder")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.out is None:
        name = f"suite-fast-{os.cpu_count()}core.json" if args.fast_only else "suite-cpu-2core.json"
        args.out = str(ROOT / "benchmarks" / "results" / name)
    result = {
        **stamp(),
        "command": "python -m benchmarks.suite " + " ".join(_portable(argv if argv is not None else sys.argv[1:])),
        "busy_core": not args.no_busy_core,
        "budget_s": BUDGET_S,
        "fast_budget_s": FAST_BUDGET_S,
        "runs": [],
    }
    # What is measured is a clone of HEAD: the work tree's own changes play no part.
    if result["commit"]:
        result["commit"] = result["commit"].removesuffix("-dirty")
    if args.fast_only:
        with tempfile.TemporaryDirectory(prefix="ensemble-suite-fast-") as work:
            result.update(fast_only(Path(work), args.runs, not args.no_busy_core))
        warm = [r for r in result["runs"] if r["cache"] == "warm"]
        result["all_passed"] = all(r["exit_code"] == 0 for r in result["runs"])
        result["within_fast_budget"] = all(r["suite_s"] is not None and r["suite_s"] <= FAST_BUDGET_S for r in warm)
        result["max_warm_suite_s"] = max((r["suite_s"] or 0.0) for r in warm) if warm else None
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")
        return 0 if result["all_passed"] else 1
    earlier = json.loads(Path(args.out).read_text()) if args.append and Path(args.out).exists() else None
    if earlier is not None and earlier.get("commit") == result["commit"]:
        result["runs"] = earlier["runs"]
        result["command"] = f"{earlier['command']}; {result['command']}"
    for i in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="ensemble-suite-") as work:
            try:
                row = one_run(Path(work), not args.no_busy_core, args.fast and i == args.runs - 1)
            finally:
                if args.logs:
                    keep = Path(args.logs) / f"run-{len(result['runs']) + 1}"
                    keep.mkdir(parents=True, exist_ok=True)
                    for name in ("ci.log", "fast.log", "suite-report.json"):
                        if (Path(work) / name).exists():
                            shutil.copy(Path(work) / name, keep / name)
        result["runs"].append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "slowest"}), flush=True)
    runs = result["runs"]
    result["all_passed"] = all(r["exit_code"] == 0 for r in runs)
    result["within_budget"] = all(r["suite_s"] is not None and r["suite_s"] <= BUDGET_S for r in runs)
    result["max_suite_s"] = max((r["suite_s"] or 0.0) for r in runs)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0 if result["all_passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
