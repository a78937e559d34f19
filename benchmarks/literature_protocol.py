"""A run's figures under the literature's protocol, as a result file: the test split
(ensemble, best member, mean member), the common corruptions' means over every
corruption and severity, each OOD set's detection figures per criterion, and the run's
training time and throughput (docs/evaluation.md, "Measured: the literature's protocol").

    # a run made by the command line, summarised (its report.json is read):
    python -m flows.train_ensemble --config configs/fashion_mnist_best.yaml --run-name best
    python -m benchmarks.literature_protocol --run-dir runs/best \\
        --out benchmarks/results/protocol-fashion-mnist-cpu-2core.json
    # CIFAR-10's geometry on mock data (figures meaningless; the code path exercised), run here:
    python -m benchmarks.literature_protocol --cifar10-mock \\
        --out benchmarks/results/protocol-cifar10-mock-cpu-2core.json

``--cifar10-mock`` trains ``configs/cifar10_resnet20.yaml``'s evaluation (the dataset's
defaults) on the real TFDS ``cifar10`` builder's metadata with random records
(``tests/_cifar_mock.py``), with a small CNN ensemble so that it finishes in minutes.
The best member is the one with the lowest test NLL (chosen with hindsight).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._provenance import busy_seconds, stamp

#: The test-split figures kept.
FIGURES = ("accuracy", "nll", "brier", "ece", "adaptive_ece", "aurc", "accuracy_at_80_coverage")


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
    where.add_argument("--run-dir", help="a finished run directory (its report.json is summarised)")
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
        report = json.loads((Path(args.run_dir) / "report.json").read_text())
        command = f"python -m benchmarks.literature_protocol --run-dir {args.run_dir}"
    result = {**stamp(), "command": command, "note": args.note, **summary(report)}
    if args.cifar10_mock:
        busy1 = busy_seconds()
        result["wall_seconds"] = time.perf_counter() - t0
        result["machine_busy_cpu_seconds"] = None if busy0 is None or busy1 is None else busy1 - busy0
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
