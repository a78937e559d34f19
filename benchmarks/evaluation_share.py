"""Evaluation against training on a user's image folder: the default protocol and the full one.

    python -m benchmarks.evaluation_share [--train 2700] [--test 300] [--out FILE]

Writes ``--train`` + ``--test`` of the embedded dataset's digits as 28x28 grey PNG files in
an image folder (``<dir>/train/<digit>/`` and ``<dir>/test/<digit>/``,
:func:`tests._image_export.write_digit_folder`), then runs the default config on it through
the command line, ``python -m flows.train_ensemble --set data.source=image_folder --set
data.path=<dir>``, three times in one session, each in a fresh output directory:

1. ``warm-up``: prepares the snapshot and the derived sets, fills the compilation cache;
2. ``sampled``: the default evaluation (``eval.protocol: sampled``), warm caches, as a
   user's second run;
3. ``full``: ``eval.protocol: full`` (every test image at every level), warm caches.

From each run's ``report.json -> timing.stages``: the training stage's seconds, the
evaluation stage's seconds and their ratio (issue 58: evaluation at most 30% of training on
the default protocol), the shift evaluators' seconds and the report's confidence intervals
of the common corruptions' mean accuracy. Compare the ratios of one run of this script (the
machine is shared, seconds drift between sessions). Also the derived sets' bytes the runs
report, and the default OOD sets' AUROC and confidently-wrong fraction (uniform noise and
shuffled patches). Writes ``benchmarks/results/evaluation-share-image-folder-cpu-2core.json``.
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
from typing import Any

from benchmarks.provenance import ROOT, stamp

OUT = ROOT / "benchmarks" / "results" / "evaluation-share-image-folder-cpu-2core.json"
SHIFT_EVALUATORS = ("rotation", "translation", "common_corruptions")


def _run(folder: Path, out: Path, tfds: Path, extra: list[str]) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "flows.train_ensemble",
        "--set",
        "data.source=image_folder",
        "--set",
        f"data.path={folder}",
        "--set",
        f"data.data_dir={tfds}",
        "--output-dir",
        str(out),
        "--run-name",
        "r",
        *extra,
    ]
    load = os.getloadavg()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    report = json.loads((out / "r" / "report.json").read_text())
    stages = report["timing"]["stages"]
    train, evaluate = stages["train"]["seconds"], stages["evaluate"]["seconds"]
    parts = stages["evaluate"].get("parts", {})
    evaluations = report.get("evaluations", {})
    cc = evaluations.get("common_corruptions", {}).get("metrics", {})
    return {
        "wall_seconds": wall,
        "train_seconds": train,
        "steps_seconds": stages["train"].get("parts", {}).get("steps", {}).get("seconds"),
        "evaluate_seconds": evaluate,
        "evaluation_over_training": evaluate / train,
        "shift_evaluators_seconds": {k: parts[k]["seconds"] for k in SHIFT_EVALUATORS if k in parts},
        "evaluate_parts_seconds": {k: v["seconds"] for k, v in parts.items()},
        "common_corruptions_mean_accuracy": (cc.get("mean") or {}).get("accuracy"),
        "common_corruptions_mean_intervals": cc.get("mean_intervals"),
        "derived_sets_bytes": {
            k: v.get("metrics", {}).get("derived_sets", {}).get("bytes")
            for k, v in evaluations.items()
            if isinstance(v.get("metrics", {}).get("derived_sets"), dict)
        },
        "ensemble_test_accuracy": report["ensemble"]["accuracy"],
        # the default OOD sets of a user's data: uniform noise and shuffled patches
        "ood": {
            name: {
                "auroc": ev["metrics"]["ensemble"]["auroc"],
                "confident_ood_fraction": ev["metrics"].get("confident_ood_fraction"),
            }
            for name, ev in evaluations.items()
            if isinstance(ev.get("metrics", {}).get("ensemble"), dict) and "auroc" in ev["metrics"]["ensemble"]
        },
        "load_average_before": load,
        "load_average_after": os.getloadavg(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.evaluation_share", description=__doc__.split("\n")[0])
    parser.add_argument("--train", type=int, default=2700)
    parser.add_argument("--test", type=int, default=300)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from tests._image_export import write_digit_folder

    with tempfile.TemporaryDirectory(prefix="evaluation-share-") as tmp_name:
        tmp = Path(tmp_name)
        folder = tmp / "digits"
        files = write_digit_folder(folder, args.train, args.test)
        runs = {}
        for label, extra in (("warm-up", []), ("sampled", []), ("full", ["--set", "eval.protocol=full"])):
            runs[label] = _run(folder, tmp / f"out-{label}", tmp / "tfds", extra)
            r = runs[label]
            print(
                f"{label:8s} train {r['train_seconds']:6.1f} s  evaluate {r['evaluate_seconds']:6.1f} s  "
                f"ratio {r['evaluation_over_training']:.0%}  wall {r['wall_seconds']:.0f} s",
                flush=True,
            )
    result = {"image_files": files, "train": args.train, "test": args.test, "runs": runs, **stamp()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
