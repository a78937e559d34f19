"""Prediction sets and abstention on real Fashion-MNIST, and prediction on a folder of PNGs.

    python -m benchmarks.prediction_sets --run-dir RUN          # figures of a finished run
    python -m benchmarks.prediction_sets --folder-check          # the image-folder example
    python -m benchmarks.prediction_sets --table                 # docs/evaluation.md's tables

``--run-dir``: a finished run of ``configs/fashion_mnist.yaml`` (10 Flax MNIST CNNs, 5
epochs, 54,000 training images less the 10% validation and 10% calibration splits, every
evaluator of the dataset's defaults: the 15 common corruptions x 5 severities on 1,000
test images per cell), trained with::

    python -m flows.train_ensemble --config configs/fashion_mnist.yaml --run-name fm

Its ``report.json`` gives the label-free accuracy estimators' errors against the true
accuracy over each shift evaluator's levels (the 75 corruption cells, the rotations, the
translations), and, at ``prediction_sets.alpha`` (0.1): the empirical coverage and
mean set size of LAC, APS and RAPS on the test split and at every severity (mean over the
corruptions), and the selective risk and coverage of the abstention rule, for the ensemble,
the mean member and the best member; the checks of issue 56 (clean coverage within
0.88-0.93 for each score; the selective risk on the test split at most the target).

``--folder-check``: the README's image-folder example with real images. The first
``--train`` (6,000) training and all 10,000 test images of Fashion-MNIST's IDX files are
exported as grey PNGs in class folders named by the class (``T-shirt_top``, ``Trouser``,
...; ``<dir>/{train,test}/<class>/<index>.png``); a small ensemble (4 CNNs, 2 epochs) trains
on the folder's training images through :func:`ensemble_core.runs.run`; then
``python -m flows.predict --images <dir>/test`` (a subprocess, as a user types it) predicts
the test folder and its table is compared, row by row, with
:func:`ensemble_core.runs.predict_images` on the same test images read from the IDX files
as an array: the predicted names must be equal.

Writes ``benchmarks/results/prediction-sets-fashion-mnist-cpu-2core.json`` (``--out``; each
part updates only its own entry) and prints the tables.
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

OUT = ROOT / "benchmarks" / "results" / "prediction-sets-fashion-mnist-cpu-2core.json"
WHO = ("ensemble", "member_mean", "best_member")
#: Issue 56's bounds on the clean test split's coverage at alpha 0.1.
COVERAGE_RANGE = (0.88, 0.93)


def run_figures(run_dir: Path) -> dict:
    """The prediction-set and abstention figures of a finished run's ``report.json``."""
    report = json.loads((run_dir / "report.json").read_text())
    rules, test = report["decision_rules"], report["decisions"]
    cc = report["evaluations"]["common_corruptions"]["metrics"]
    alpha = rules["prediction_sets"][rules["method"]]["alpha"]
    methods = list(rules["prediction_sets"])
    clean = {m: test["ensemble"]["prediction_sets"][m]["coverage"] for m in methods}
    selective = test["ensemble"]["selective"]
    target = rules["abstention"]["target_risk"]
    return {
        "run_dir": str(run_dir),
        "config": {
            "data": report["config"]["data"]["name"],
            "ensemble_size": report["config"]["ensemble"]["size"],
            "epochs": report["config"]["train"]["epochs"],
        },
        "alpha": alpha,
        "rules": rules,
        "ensemble_test": {k: report["ensemble"][k] for k in ("accuracy", "nll", "ece")},
        "test": test,
        "by_severity": {"0": cc["clean"], **cc["decisions_by_severity"]},
        "cells": {r["name"]: r["decisions"]["ensemble"] for r in cc["levels"]},
        "rotation": {f"{r['level']:g}": r["decisions"] for r in report["evaluations"]["rotation"]["metrics"]["levels"]},
        "accuracy_estimation": {
            name: {
                "errors": section["metrics"]["accuracy_estimation"],
                "worst": {
                    est: section["metrics"]["levels"][e["worst_index"]].get(
                        "name", f"{section['metrics']['levels'][e['worst_index']]['level']:g}"
                    )
                    for est, e in section["metrics"]["accuracy_estimation"].items()
                },
            }
            for name, section in report["evaluations"].items()
            if "accuracy_estimation" in section.get("metrics", {})
        },
        "checks": {
            "clean_coverage_in_range": all(COVERAGE_RANGE[0] <= c <= COVERAGE_RANGE[1] for c in clean.values()),
            "selective_risk_at_most_target": selective["risk"] is not None and selective["risk"] <= target,
        },
    }


def export_folder(out: Path, n_train: int) -> dict[str, int]:
    """The first ``n_train`` training and every test image of Fashion-MNIST as grey PNGs
    in class folders named by the class (``/`` written ``_``)."""
    from PIL import Image

    from ensemble_core.data import FASHION_MNIST_CLASSES, idx_dir, read_idx_split

    folders = [name.replace("/", "_") for name in FASHION_MNIST_CLASSES]
    counts = {}
    for split, limit in (("train", n_train), ("test", None)):
        images, labels = read_idx_split(idx_dir("fashion_mnist"), split)
        images, labels = images[:limit], labels[:limit]
        for i, (image, label) in enumerate(zip(images, labels, strict=True)):
            path = out / split / folders[int(label)] / f"{i:05d}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image[..., 0], mode="L").save(path)
        counts[split] = len(labels)
    return counts


def folder_check(work: Path, n_train: int) -> dict:
    """Train on an exported folder, predict its test folder with the CLI, compare with arrays."""
    import numpy as np
    import pandas as pd

    from ensemble_core import runs
    from ensemble_core.config import load_config
    from ensemble_core.data import FASHION_MNIST_CLASSES, idx_dir, read_idx_split

    folder = work / "fashion-mnist-png"
    counts = export_folder(folder, n_train)
    cfg = load_config(
        None,
        [
            "data.source=image_folder",
            f"data.path={folder}",
            "data.name=fashion_png",
            f"data.data_dir={work / 'tfds'}",
            "ensemble.size=4",
            "train.epochs=2",
            "eval.evaluators=[test]",
        ],
    )
    t0 = time.perf_counter()
    result = runs.run(cfg, work / "runs", "png")
    trained = time.perf_counter() - t0
    table = work / "test-folder.csv"
    t0 = time.perf_counter()
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "flows.predict",
            "--images",
            str(folder / "test"),
            "--run-dir",
            str(result.run_dir.path),
            "--table",
            str(table),
            "--output",
            str(work / "test-folder.npz"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    predicted = time.perf_counter() - t0
    if cli.returncode != 0:
        raise SystemExit(f"flows.predict failed ({cli.returncode}): {cli.stderr[-2000:]}")
    rows = pd.read_csv(table)
    images, labels = read_idx_split(idx_dir("fashion_mnist"), "test")
    arrays = runs.predict_images(result.run_dir.path, images)
    index = np.asarray([int(Path(p).stem) for p in rows["input"]])
    names_from_arrays = arrays["predicted_name"][index]
    # the true class is the file's folder, which the export named after its IDX label
    true_names = np.asarray([Path(p).parent.name for p in rows["input"]])
    exported = np.asarray([n.replace("/", "_") for n in FASHION_MNIST_CLASSES])[labels[index]]
    in_set = [t in str(s).split("|") for t, s in zip(true_names, rows["prediction_set"].fillna(""), strict=True)]
    return {
        "exported": counts,
        "train_seconds": trained,
        "predict_cli_seconds": predicted,
        "rows": len(rows),
        "names_equal": int(np.sum(rows["predicted_name"].to_numpy() == names_from_arrays)),
        "probabilities_max_abs_diff": float(
            np.max(np.abs(rows["probability"].to_numpy() - arrays["ensemble_probs"][index].max(-1)))
        ),
        "folder_is_true_class": bool(np.all(exported == true_names)),
        "accuracy": float(np.mean(rows["predicted_name"].to_numpy() == true_names)),
        "set_coverage": float(np.mean(in_set)),
        "mean_set_size": float(rows["set_size"].mean()),
        "abstention_rate": float(rows["abstain"].mean()),
        "cli_first_lines": cli.stdout.splitlines()[:6],
        "cli_last_line": cli.stdout.strip().splitlines()[-1],
    }


def markdown(result: dict) -> str:
    """docs/evaluation.md's tables from the result file."""
    fig = result["run"]
    methods = list(fig["rules"]["prediction_sets"])
    lines = [
        "| severity | "
        + " | ".join(f"{m.upper()} coverage / size" for m in methods)
        + " | mean member APS coverage / size | abstention risk / coverage |",
        "| --- |" + " --- |" * (len(methods) + 2),
    ]
    for sev, d in fig["by_severity"].items():
        sets = d["ensemble"]["prediction_sets"]
        member = d["member_mean"]["prediction_sets"]["aps"]
        sel = d["ensemble"]["selective"]
        risk = "-" if sel["risk"] is None else f"{sel['risk']:.4f}"
        lines.append(
            f"| {sev} | "
            + " | ".join(f"{sets[m]['coverage']:.3f} / {sets[m]['mean_set_size']:.2f}" for m in methods)
            + f" | {member['coverage']:.3f} / {member['mean_set_size']:.2f} | {risk} / {sel['coverage']:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.prediction_sets", description=__doc__.split("\n")[0])
    parser.add_argument("--run-dir", type=Path, help="a finished run of configs/fashion_mnist.yaml")
    parser.add_argument("--folder-check", action="store_true", help="the image-folder example, end to end")
    parser.add_argument("--train", type=int, default=6000, help="training PNGs exported for --folder-check")
    parser.add_argument("--work-dir", type=Path, help="where --folder-check writes (default: a temporary dir)")
    parser.add_argument("--table", action="store_true", help="print docs/evaluation.md's table from --out")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    result = json.loads(args.out.read_text()) if args.out.exists() else {}
    if args.run_dir:
        result["run"] = {**run_figures(args.run_dir), **stamp()}
    if args.folder_check:
        with tempfile.TemporaryDirectory() as tmp:
            result["folder_check"] = {**folder_check(args.work_dir or Path(tmp), args.train), **stamp()}
    if args.run_dir or args.folder_check:
        result.update(stamp())
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps({k: v.get("checks", v) if isinstance(v, dict) else v for k, v in result.items()}, indent=1))
    if args.table and "run" in result:
        print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
