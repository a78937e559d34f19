"""A run's figures under the literature's protocol, as a result file: the test split
(ensemble, best member, mean member), the common corruptions' means over every
corruption and severity, each OOD set's detection figures per criterion, and the run's
training time and throughput (docs/evaluation.md, "Measured: the literature's protocol").

    # a run made by the command line, summarised (its report.json is read):
    python -m flows.train_ensemble --config configs/fashion_mnist_best.yaml --run-name best
    python -m benchmarks.literature_protocol --run-dir runs/best \\
        --out benchmarks/results/protocol-fashion-mnist-cpu-2core.json
    # one config over several seeds: each run's figures and their spread over the seeds
    python -m benchmarks.literature_protocol --run-dir runs/s0 --run-dir runs/s1 --run-dir runs/s2 \\
        --out benchmarks/results/protocol-fashion-mnist-lenet5-cpu-2core.json
    # CIFAR-10's geometry on mock data (figures meaningless; the code path exercised), run here:
    python -m benchmarks.literature_protocol --cifar10-mock \\
        --out benchmarks/results/protocol-cifar10-mock-cpu-2core.json

``--cifar10-mock`` trains ``configs/cifar10_resnet20.yaml``'s evaluation (the dataset's
defaults) on the real TFDS ``cifar10`` builder's metadata with random records
(``tests/_cifar_mock.py``), with a small CNN ensemble so that it finishes in minutes.
The best member is the one with the lowest test NLL (chosen with hindsight).

With ``--run-dir`` given more than once (the same config, other seeds), the file holds each
run's summary under ``seeds`` and, under ``spread``, the mean, sample standard deviation
(``ddof=1``), minimum and maximum over the seeds of the ensemble's and the mean member's
test figures (and the temperature-scaled ensemble's, where reported), and the same over
every member of every run (``one_member``: what one network alone scores).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.provenance import busy_seconds, stamp

#: The test-split figures kept.
FIGURES = ("accuracy", "nll", "brier", "ece", "adaptive_ece", "aurc", "accuracy_at_80_coverage")
#: The figures whose spread over seeds is kept (``--run-dir`` more than once).
SPREAD_FIGURES = ("accuracy", "nll", "ece", "brier")


def summary(report: dict) -> dict:
    """The protocol's figures of a ``report.json``."""
    members = report["members"]
    best = min(range(len(members)), key=lambda i: members[i]["nll"])
    out = {
        "run_name": report["run_name"],
        "dataset": report["config"]["data"]["name"],
        "classes": report["config"]["data"].get("classes"),
        "model": report["config"]["model"]["name"],
        "members": len(members),
        "epochs": report["config"]["train"]["epochs"],
        "member_choice": report.get("member_choice"),
        "command_seconds": report["timing"].get("command_seconds"),
        "wall_seconds": report["timing"].get("wall_seconds"),
        "test": {
            "ensemble": {f: report["ensemble"].get(f) for f in FIGURES},
            "best_member": {f: members[best].get(f) for f in FIGURES},
            "best_member_index": best,
            "member_mean": {f: report["member_mean"].get(f) for f in FIGURES},
        },
        "timing": report["timing"],
        "evaluations": {},
    }
    if report.get("ensemble_temperature_scaled"):
        out["test"]["ensemble_temperature_scaled"] = report["ensemble_temperature_scaled"]
        out["test"]["temperature"] = report.get("temperature")
    for name, section in (report.get("evaluations") or {}).items():
        m = section["metrics"]
        if m.get("skipped"):
            out["evaluations"][name] = {"skipped": m["skipped"]}
        elif section.get("type") == "common_corruptions" or "by_corruption" in m:
            out["evaluations"][name] = {
                "mean": m["mean"],
                "cells": len(m["levels"]),
                "num_examples": m["num_examples"],
                "ensemble_beats_best_member": m["ensemble_beats_best_member"],
                "seconds": m.get("seconds"),
                "by_corruption_nll": {c: v["ensemble"]["nll"] for c, v in m["by_corruption"].items()},
            }
        elif "levels" in m:
            out["evaluations"][name] = {"mean": m["mean"], "levels": len(m["levels"])}
        elif "num_ood" in m:
            out["evaluations"][name] = {
                k: m[k] for k in ("source", "num_in", "num_ood", "ensemble", "member_mean", "confident_ood_fraction")
            }
    return out


def stats(values: list[float]) -> dict:
    """``mean``, ``std`` (sample, ``ddof=1``; 0 for one value), ``min``, ``max`` and ``n`` of ``values``."""
    a = np.asarray(values, dtype=np.float64)
    return {
        "mean": float(a.mean()),
        "std": float(a.std(ddof=1)) if len(a) > 1 else 0.0,
        "min": float(a.min()),
        "max": float(a.max()),
        "n": len(a),
    }


def ece_10_bins(run_dir: Path) -> dict | None:
    """uncertainty-baselines' ECE (``baselines/mnist/utils.py``, ``calibration``: 10
    equal-width confidence bins; this project's ``ece`` uses 15) of the run's test
    predictions (``predictions.npz``: ``member_probs`` float ``[M, N, C]``, ``labels`` int
    ``[N]``): ``{"ensemble": float, "members": [M floats]}``, or None without the file."""
    from ensemble_core import metrics

    path = Path(run_dir) / "predictions.npz"
    if not path.exists():
        return None
    with np.load(path) as f:
        probs, labels = f["member_probs"], f["labels"]
    return {
        "ensemble": metrics.ece(probs.mean(axis=0), labels, num_bins=10),
        "members": [metrics.ece(p, labels, num_bins=10) for p in probs],
    }


def spread(reports: list[dict]) -> dict:
    """The seed spread of several runs of one config (their ``report.json``): per figure of
    ``SPREAD_FIGURES``, :func:`stats` over the runs of the ensemble, the mean member and the
    temperature-scaled ensemble (where every run reports it), and over all members of all
    runs (``one_member``)."""
    out: dict = {"seeds": [r["config"]["seed"] for r in reports]}
    groups = {"ensemble": [r["ensemble"] for r in reports], "member_mean": [r["member_mean"] for r in reports]}
    if all(r.get("ensemble_temperature_scaled") for r in reports):
        groups["ensemble_temperature_scaled"] = [r["ensemble_temperature_scaled"] for r in reports]
    groups["one_member"] = [m for r in reports for m in r["members"]]
    for group, rows in groups.items():
        out[group] = {f: stats([row[f] for row in rows]) for f in SPREAD_FIGURES if all(f in row for row in rows)}
    return out


def cifar10_mock_run(work: Path) -> dict:
    """Train a small CNN ensemble on mock CIFAR-10 with the dataset's default evaluators and
    return its ``report.json``."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from ensemble_core import runs
    from ensemble_core.config import load_config
    from tests._cifar_mock import mocked_cifar10

    with mocked_cifar10(work / "tfds", num_train=512, num_test=200) as data_dir:
        cfg = load_config(
            Path("configs/cifar10_resnet20.yaml"),
            [
                f"data.data_dir={data_dir}",
                "model.name=cnn",
                "model.options={}",
                "ensemble.size=4",
                "train.epochs=2",
                "train.batch_size=64",
                "data.validation_fraction=0.125",
            ],
        )
        result = runs.run(cfg, work / "runs", "cifar10-mock")
        return json.loads(result.run_dir.report_json.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--run-dir",
        action="append",
        help="a finished run directory (its report.json is summarised); more than once: one config's seeds",
    )
    where.add_argument("--cifar10-mock", action="store_true", help="train and evaluate on mock CIFAR-10 here")
    parser.add_argument("--out", required=True)
    parser.add_argument("--note", default="", help="how the run was made (e.g. other jobs on the cores)")
    args = parser.parse_args(argv)
    busy0, t0 = busy_seconds(), time.perf_counter()
    if args.cifar10_mock:
        with tempfile.TemporaryDirectory() as tmp:
            report = cifar10_mock_run(Path(tmp))
        command = "python -m benchmarks.literature_protocol --cifar10-mock"
    else:
        reports = [json.loads((Path(d) / "report.json").read_text()) for d in args.run_dir]
        report = reports[0]
        command = "python -m benchmarks.literature_protocol " + " ".join(f"--run-dir {d}" for d in args.run_dir)
    result = {**stamp(), "command": command, "note": args.note, **summary(report)}
    if not args.cifar10_mock:
        eces = [ece_10_bins(Path(d)) for d in args.run_dir]
        if eces[0] is not None:
            result["test"]["ece_10_bins"] = eces[0]
        if len(reports) > 1:
            result["seeds"] = [summary(r) for r in reports]
            for seed, ece in zip(result["seeds"], eces, strict=True):
                if ece is not None:
                    seed["test"]["ece_10_bins"] = ece
            result["spread"] = spread(reports)
            known = [e for e in eces if e is not None]
            if len(known) == len(eces):
                result["spread"]["ece_10_bins"] = {
                    "ensemble": stats([e["ensemble"] for e in known]),
                    "one_member": stats([m for e in known for m in e["members"]]),
                }
    if args.cifar10_mock:
        busy1 = busy_seconds()
        result["wall_seconds"] = time.perf_counter() - t0
        result["machine_busy_cpu_seconds"] = None if busy0 is None or busy1 is None else busy1 - busy0
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
