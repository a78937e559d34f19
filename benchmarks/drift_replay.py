"""The drift tests' false alarms and detections, replayed from a finished run's predictions.

    python -m benchmarks.drift_replay --run-dir RUN [--replays 200] [--night 500] [--alpha 0.05]

A "night" is ``--night`` unlabelled images the champion scores. Here the nights are drawn
from what a finished run (``configs/fashion_mnist.yaml``, the run of
``benchmarks.prediction_sets``) already predicted, so no network runs again:

- **clean nights**: ``--replays`` random subsamples (without replacement, seeded) of the
  test split's member probabilities (``predictions.npz``): data from the training
  distribution, never trained on;
- **corrupted nights**: for each of the 75 common-corruption cells
  (``eval/common_corruptions.npz``, 1,000 test images each), ``--cell-replays`` random
  subsamples of ``--night`` images of the cell.

Each night is tested against the run's reference, its calibration split
(``drift_reference.json``, written by the select stage), with
:func:`ensemble_core.drift_tests.drift_tests` at ``--alpha``: KS on the per-example
predictive entropy and mutual information, chi-square on the predicted classes, Holm's
correction. Reported: the false-alarm rate on clean nights (issue 57: at most ``alpha`` +
0.02 over at least 200 replays) with its binomial standard error, and the detection rate
per corruption and severity, with each test's own rejection rate.

Writes ``benchmarks/results/drift-replay-fashion-mnist-cpu-2core.json`` (``--out``) and
prints a table of the detection rate by severity.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from benchmarks.provenance import ROOT, stamp

OUT = ROOT / "benchmarks" / "results" / "drift-replay-fashion-mnist-cpu-2core.json"


def replay(run_dir: Path, replays: int, cell_replays: int, night: int, alpha: float, seed: int = 0) -> dict:
    """The false-alarm and detection rates of the drift tests (see the module docstring)."""
    from ensemble_core.drift_tests import TEST_NAMES, DriftReference, drift_tests

    reference = DriftReference.from_dict(json.loads((run_dir / "drift_reference.json").read_text()))
    selection = json.loads((run_dir / "selection.json").read_text())
    rows = np.asarray(selection["members"])  # the ensemble's picks: the reference's members
    rng = np.random.default_rng(seed)

    def nights(probs: np.ndarray, count: int) -> list[dict]:
        out = []
        for _ in range(count):
            pick = rng.choice(probs.shape[1], size=night, replace=False)
            out.append(drift_tests(reference, probs[:, pick], alpha, reference.temperature))
        return out

    def rates(results: list[dict]) -> dict:
        flagged = np.mean([r["drifted"] for r in results])
        per_test = {
            name: float(np.mean([r["tests"][name]["rejected"] for r in results if name in r["tests"]]))
            for name in TEST_NAMES
            if any(name in r["tests"] for r in results)
        }
        return {"rate": float(flagged), "per_test": per_test, "nights": len(results)}

    with np.load(run_dir / "predictions.npz") as f:
        clean = f["member_probs"][rows]
    clean_rates = rates(nights(clean, replays))
    p = clean_rates["rate"]
    clean_rates["standard_error"] = float(np.sqrt(p * (1 - p) / replays))
    report = json.loads((run_dir / "report.json").read_text())
    levels = report["evaluations"]["common_corruptions"]["metrics"]["levels"]
    with np.load(run_dir / "eval" / "common_corruptions.npz") as f:
        probs, level = f["member_probs"][rows], f["level"]
    cells = {}
    for row in levels:
        at = level == np.float32(row["level"])
        cells[row["name"]] = {
            "corruption": row["corruption"],
            "severity": row["severity"],
            "accuracy": row["ensemble"]["accuracy"],
            **rates(nights(probs[:, at], cell_replays)),
        }
    by_severity = {
        str(s): float(np.mean([c["rate"] for c in cells.values() if c["severity"] == s]))
        for s in sorted({c["severity"] for c in cells.values()})
    }
    return {
        "run_dir": str(run_dir),
        "alpha": alpha,
        "night": night,
        "reference_examples": reference.n,
        "clean": clean_rates,
        "cells": cells,
        "detection_by_severity": by_severity,
        "checks": {"false_alarms_at_most_alpha_plus_0.02": clean_rates["rate"] <= alpha + 0.02},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.drift_replay", description=__doc__.split("\n")[0])
    parser.add_argument("--run-dir", type=Path, required=True, help="a finished run with drift_reference.json")
    parser.add_argument("--replays", type=int, default=200, help="clean nights")
    parser.add_argument("--cell-replays", type=int, default=20, help="nights per corruption cell")
    parser.add_argument("--night", type=int, default=500, help="images per night")
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    result = {**replay(args.run_dir, args.replays, args.cell_replays, args.night, args.alpha), **stamp()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    clean = result["clean"]
    print(f"clean nights: {clean['rate']:.3f} flagged of {clean['nights']} (alpha {args.alpha})")
    for severity, rate in result["detection_by_severity"].items():
        print(f"severity {severity}: {rate:.3f} of corrupted nights flagged")
    return 0


if __name__ == "__main__":
    sys.exit(main())
