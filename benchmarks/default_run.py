"""The default run, measured as ``make run`` runs it: the README's quick-start figures.

    python -m benchmarks.default_run [--out FILE] [--keep]

Runs ``python -m flows.train_ensemble`` (the default config, Prefect's temporary server,
every evaluator) in a subprocess with a fresh output directory, timing its wall clock and
the moment each Prefect task run reports ``Finished`` in its log. Then reads the run's
``report.json``: training and compile time, training and evaluation throughput, the
ensemble's and the mean member's test figures, the members' best epochs, and every shift
and OOD evaluator's figures (``evaluations``, as ``report.json`` holds them). Each stage's time is
from the previous task run's ``Finished`` line to its own; the evaluation stage's
(``evaluation_seconds``) is from ``select_members``'s to ``evaluate_members``'s (every
evaluator: the test split, then the shift and OOD sets; results recorded before the select
stage existed measured from ``train_members``'s, selection included). The data and compilation caches
are whatever this machine has (``make run`` on a set-up machine: warm). The 1-, 5- and
15-minute load averages before and after are saved: other jobs on the cores slow it.

Writes ``benchmarks/results/default-run-<backend>-<cpus>core.json`` (or ``--out``) with
``date``, ``machine`` and ``commit`` (:mod:`benchmarks.provenance`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

from benchmarks.provenance import ROOT, stamp

FINISHED = re.compile(r"Task run '(?P<task>[A-Za-z_]+)-[0-9a-z]+' - Finished in state (?P<state>\w+)")


def run_flow(out_dir: Path) -> tuple[float, dict[str, float], bool]:
    """The CLI's wall time, each task run's ``Finished`` moment (s from the start), and
    whether TFDS built a dataset during the run (its ``Generating ... examples`` lines: a
    machine without the prepared Fashion-MNIST, say, pays for it in the run)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "flows.train_ensemble", "--output-dir", str(out_dir)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    finished: dict[str, float] = {}
    prepared = False
    assert proc.stdout is not None
    for line in proc.stdout:
        print(line, end="", flush=True)
        prepared = prepared or ("Generating" in line and "examples" in line)
        m = FINISHED.search(line)
        if m and m["state"] == "Completed":
            finished[m["task"]] = time.perf_counter() - t0
    rc = proc.wait()
    wall = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"error: {' '.join(cmd)} exited with {rc}")
    return wall, finished, prepared


def figures(report: dict) -> dict:
    """What the README quotes from a run's report.json."""
    pool = report.get("pool") or []
    epochs = [m["best_epoch"] for m in pool if m.get("best_epoch") is not None]
    evaluations = report.get("evaluations", {})
    return {
        "timing": report["timing"],
        "ensemble": report["ensemble"],
        "member_mean": report["member_mean"],
        "diversity": report["diversity"],
        "best_epochs": {"min": min(epochs), "max": max(epochs)} if epochs else None,
        "evaluators": sorted(["test", *evaluations]),
        "evaluators_skipped": sorted(n for n, e in evaluations.items() if e.get("metrics", {}).get("skipped")),
        "backend": report["backend"],
        "devices": report["devices"],
        "data_splits": (report.get("data_snapshot") or {}).get("splits"),
        "evaluations": {name: e.get("metrics") for name, e in evaluations.items()},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=None, help="result file (default: benchmarks/results/default-run-...json)")
    parser.add_argument("--keep", action="store_true", help="keep the run's output directory")
    args = parser.parse_args(argv)

    out_dir = Path(tempfile.mkdtemp(prefix="default-run-"))
    load_before = os.getloadavg()
    try:
        wall, finished, prepared = run_flow(out_dir)
        (report_path,) = out_dir.glob("*/report.json")
        report = json.loads(report_path.read_text())
    finally:
        if not args.keep:
            shutil.rmtree(out_dir, ignore_errors=True)
    stages = {}
    previous = 0.0
    for task, at in sorted(finished.items(), key=lambda kv: kv[1]):
        stages[task] = at - previous
        previous = at
    load_after = os.getloadavg()
    result = {
        "command": "python -m benchmarks.default_run (runs python -m flows.train_ensemble, the default config)",
        **stamp(),
        "prefect": metadata.version("prefect"),
        "jax": metadata.version("jax"),
        "wall_seconds": wall,
        "load_average": {"before": load_before, "after": load_after},
        "task_finished_after_s": finished,
        "stage_seconds": stages,
        "evaluation_seconds": stages.get("evaluate_members"),
        "prepared_a_dataset_during_run": prepared,
        **figures(report),
    }
    path = (
        Path(args.out)
        if args.out
        else ROOT / "benchmarks" / "results" / (f"default-run-{report['backend']}-{os.cpu_count()}core.json")
    )
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("date", "wall_seconds", "stage_seconds", "timing", "ensemble")}, indent=2))
    print(path)


if __name__ == "__main__":
    main()
