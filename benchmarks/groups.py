"""Member groups on a Dask cluster against one program, on this machine.

    python -m benchmarks.groups [--members 4] [--epochs 3] [--repeats 2]

Runs the ordinary command (``python -m flows.train_ensemble``) on the embedded mnist5k
with ``--members`` Flax MNIST CNNs, the test evaluator only, in two layouts, alternated
(A B A B ...) so both see the same machine:

* **G = 1**: one process trains every member on all the machine's cores (``task_runner=local``);
* **G = 2**: ``distributed.member_groups=2`` on a local Dask cluster of two worker
  processes, each pinned to one core (``distributed.pin_cores``), and the same unpinned.

Per run: the command's wall time, the training stage's steady-state seconds (for G = 2
the slower group's), the member-images/s (all groups together) and the test figures, which
must agree between the layouts. Writes ``benchmarks/results/groups-<backend>.json``
(``--out``) and prints a summary with the scaling estimate for N machines.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.provenance import stamp

ROOT = Path(__file__).resolve().parents[1]

LAYOUTS = {
    "G=1 one process, all cores": [],
    "G=2 Dask, 2 workers pinned to 1 core each": [
        "distributed.member_groups=2",
        "distributed.task_runner=dask",
        "distributed.workers=2",
    ],
    "G=2 Dask, 2 workers unpinned": [
        "distributed.member_groups=2",
        "distributed.task_runner=dask",
        "distributed.workers=2",
        "distributed.pin_cores=false",
    ],
}


def one_run(out_dir: Path, name: str, members: int, epochs: int, extra: list[str]) -> dict:
    overrides = [f"ensemble.size={members}", f"train.epochs={epochs}", "eval.evaluators=[test]", *extra]
    cmd = [sys.executable, "-m", "flows.train_ensemble", "--output-dir", str(out_dir), "--run-name", name]
    for o in overrides:
        cmd += ["--set", o]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    report = json.loads((out_dir / name / "report.json").read_text())
    return {
        "command_seconds": wall,
        "train_seconds": report["timing"]["train_seconds"],
        "train_member_images_per_s": report["timing"]["train_member_images_per_s"],
        "test": {k: report["ensemble"][k] for k in ("accuracy", "nll", "ece")},
        "topology": [
            {k: t[k] for k in ("group", "members", "pid", "worker", "train_seconds", "train_member_images_per_s")}
            for t in report["topology"]
        ],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.groups", description=__doc__.split("\n")[0])
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    runs: dict[str, list[dict]] = {name: [] for name in LAYOUTS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for i, (name, extra) in enumerate(LAYOUTS.items()):
                runs[name].append(one_run(Path(tmp), f"r{r}-{i}", args.members, args.epochs, extra))
                print(name, json.dumps(runs[name][-1]), flush=True)
    summary = {}
    for name, rows in runs.items():
        summary[name] = {
            "command_seconds_median": statistics.median(x["command_seconds"] for x in rows),
            "train_seconds_median": statistics.median(x["train_seconds"] for x in rows),
            "train_member_images_per_s_median": statistics.median(x["train_member_images_per_s"] for x in rows),
        }
    one, two, _ = (summary[n] for n in LAYOUTS)
    speedup = two["train_member_images_per_s_median"] / one["train_member_images_per_s_median"]
    per_worker = two["train_member_images_per_s_median"] / 2
    result = {
        **stamp(),
        "config": {"members": args.members, "epochs": args.epochs, "repeats": args.repeats, "model": "cnn"},
        "cores": os.cpu_count(),
        "runs": runs,
        "summary": summary,
        "g2_over_g1_member_images_per_s": speedup,
        "estimate": (
            f"one pinned worker trains {per_worker:.0f} member-images/s; groups never communicate while they "
            f"train, so N machines of C such cores should reach about N*C*{per_worker:.0f} member-images/s "
            f"(linear in groups while G <= N*C and E/G members still fill a worker), less the per-group "
            f"start-up ({one['command_seconds_median'] - one['train_seconds_median']:.0f} s of the G=1 command is "
            f"not training) and the gather, which reads every group's checkpoint once"
        ),
    }
    backend = "cpu"
    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / f"groups-{backend}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"summary": summary, "g2_over_g1": speedup, "estimate": result["estimate"]}, indent=2))


if __name__ == "__main__":
    main()
