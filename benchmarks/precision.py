"""The compute precision ``train.precision``: float32, high and bfloat16 on the default run.

    python -m benchmarks.precision [--out FILE] [--epochs N] [--data-dir DIR]

Trains ``configs/default.yaml`` (8 Flax MNIST CNNs on the embedded mnist5k) once per
precision of :data:`PRECISIONS` through :func:`ensemble_core.runs.run` (the flow's
sequence without Prefect), each in a fresh output directory, with ``eval.evaluators``
reduced to ``{test: {}}`` and retention and promotion off. From each run's
``report.json``: the ensemble's and the mean member's test accuracy and NLL, the
training seconds (steady state), the training throughput in member-images/s and the
compile seconds of the train step. The runs share one process, in the order of
:data:`PRECISIONS` (the first one prepares the dataset, outside its training time), and
a fresh, empty JAX compilation cache, so each precision's programs are compiled, not
loaded from an earlier run's cache. The 1-, 5- and 15-minute load averages and the
machine's busy CPU seconds around each run are saved: other jobs on the cores slow it.

On CPU, ``high`` trains bit for bit as ``float32`` (XLA:CPU ignores the precision of
a matmul; ``tests/test_precision.py``), so its row differs from float32's in time only.

Writes ``benchmarks/results/precision-<backend>-<cpus>core.json`` (or ``--out``) with
``date``, ``machine`` and ``commit`` (:mod:`benchmarks.provenance`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks.provenance import ROOT, busy_seconds, stamp

#: The values of ``train.precision`` measured, in this order.
PRECISIONS = ("float32", "high", "bfloat16")


def overrides(precision: str, epochs: int | None, data_dir: str | None) -> list[str]:
    """The ``--set`` overrides of one run on top of ``configs/default.yaml``."""
    sets = [
        f"train.precision={precision}",
        "eval.evaluators={test: {}}",
        "promotion.enabled=false",
        "retention.enabled=false",
    ]
    if epochs is not None:
        sets.append(f"train.epochs={epochs}")
    if data_dir is not None:
        sets.append(f"data.data_dir={data_dir}")
    return sets


def figures(report: dict[str, Any]) -> dict[str, Any]:
    """What the benchmark keeps of a run's ``report.json``: test accuracy and NLL of the
    ensemble and the mean member, and the training timing."""
    timing = report["timing"]
    return {
        "ensemble": {k: report["ensemble"][k] for k in ("accuracy", "nll")},
        "member_mean": {k: report["member_mean"][k] for k in ("accuracy", "nll")},
        "train_seconds": timing["train_seconds"],
        "train_member_images_per_s": timing["train_member_images_per_s"],
        "compile_seconds": timing["compile_seconds"],
        "eval_member_images_per_s": timing.get("eval_member_images_per_s"),
    }


def run_one(precision: str, epochs: int | None, data_dir: str | None) -> dict[str, Any]:
    """One run of the default config at ``precision`` in a fresh output directory (removed
    after): its :func:`figures`, wall seconds and the machine's load around it."""
    from ensemble_core import runs
    from ensemble_core.config import load_config

    cfg = load_config(ROOT / "configs" / "default.yaml", overrides(precision, epochs, data_dir))
    out_dir = Path(tempfile.mkdtemp(prefix=f"precision-{precision}-"))
    load_before, busy_before = os.getloadavg(), busy_seconds()
    t0 = time.perf_counter()
    try:
        result = runs.run(cfg, out_dir, precision)
        report = json.loads(result.run_dir.report_json.read_text())
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    wall = time.perf_counter() - t0
    busy_after = busy_seconds()
    row = {
        "epochs": cfg.train.epochs,
        "wall_seconds": wall,
        **figures(report),
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "machine_busy_cpu_seconds": None if busy_before is None or busy_after is None else busy_after - busy_before,
    }
    print(json.dumps({precision: {k: row[k] for k in ("ensemble", "member_mean", "train_seconds", "compile_seconds")}}))
    return row


def against(row: dict[str, Any], base: dict[str, Any]) -> dict[str, float]:
    """``row`` against the float32 row ``base``: the ratio of the training throughputs, and
    the differences of the ensemble's test NLL (nats) and accuracy."""
    return {
        "throughput_ratio": row["train_member_images_per_s"] / base["train_member_images_per_s"],
        "ensemble_nll_difference": row["ensemble"]["nll"] - base["ensemble"]["nll"],
        "ensemble_accuracy_difference": row["ensemble"]["accuracy"] - base["ensemble"]["accuracy"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=None, help="result file (default: benchmarks/results/precision-...json)")
    parser.add_argument("--epochs", type=int, default=None, help="train.epochs (default: configs/default.yaml's)")
    parser.add_argument("--data-dir", default=None, help="data.data_dir (default: configs/default.yaml's)")
    args = parser.parse_args(argv)

    # A fresh compilation cache: every precision's programs compiled here (set before JAX is imported).
    cache = tempfile.mkdtemp(prefix="precision-jax-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = cache
    from flows import environment  # noqa: F401  (applies the XLA/JAX environment on import)

    try:
        import jax

        rows = {precision: run_one(precision, args.epochs, args.data_dir) for precision in PRECISIONS}
        backend = jax.default_backend()
        devices = [d.device_kind for d in jax.devices()]
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    result = {
        "command": "python -m benchmarks.precision"
        + (f" --epochs {args.epochs}" if args.epochs is not None else "")
        + " (configs/default.yaml, eval.evaluators={test: {}}, promotion and retention off)",
        **stamp(),
        "jax": metadata.version("jax"),
        "backend": backend,
        "devices": {"count": len(devices), "kind": devices[0] if devices else None},
        "precisions": rows,
        "against_float32": {p: against(rows[p], rows["float32"]) for p in PRECISIONS},
    }
    path = (
        Path(args.out)
        if args.out
        else ROOT / "benchmarks" / "results" / f"precision-{backend}-{os.cpu_count()}core.json"
    )
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["against_float32"], indent=2))
    print(path)


if __name__ == "__main__":
    main()
