"""Whether evaluation's forward passes can go faster on this machine: the default ensemble's
forward throughput against the cores it keeps busy and the machine's matmul peak.

    python -m benchmarks.forward_ceiling [--batches 64,125,250,500,1000,2000] [--out FILE]

The default run's time outside its optimizer steps is mostly evaluation's forward passes
over the images the literature's protocol scores (docs/benchmarks.md, "The fixed cost of a
run"). This measures, each setting in a fresh process (``--worker``):

- ``rows``: the default ensemble (``configs/default.yaml``'s model and size, the flows' eight
  simulated devices, ``mesh.member_strategy: auto``) computing every member's probabilities
  with :func:`ensemble_core.predict.member_probs`, as evaluation calls it, on 4,000 random
  uint8 images of the embedded dataset's shape: member-images per second (the best of five
  passes after one that compiles), for each ``eval.batch_size`` of ``--batches``, on all the
  machine's cores (``cores: "all"``) and with the process pinned to one core before JAX
  starts (``cores: "one"``, ``os.sched_setaffinity``); and ``gflops_per_s``, that rate
  times the FLOPs of one member on one image;
- ``flops_per_member_image``: the forward pass's FLOPs (:func:`benchmarks.flops.count_flops`
  of the jitted prediction, divided by members times images: products of its convolutions
  and dense layers);
- ``peak``: the float32 matmul peak (:func:`benchmarks.bench.matmul_peak`), on all cores
  and on one.

``rows[].gflops_per_s / peak[cores].matmul_gflops_per_s`` says how close the forward passes
come to what the machine's best kernel reaches, and the one-core rate against the all-core
rate whether they already keep every core busy (a ratio near ``1 / cores``: nothing runs
beside them for free). Writes ``benchmarks/results/forward-ceiling-<backend>-<cpus>core.json``
with ``date``, ``machine`` and ``commit`` (:mod:`benchmarks.provenance`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.provenance import ROOT, stamp

IMAGES = 4000  # images per timed pass: 16 batches of the default eval.batch_size
CORES = ("all", "one")
REPEATS = 5  # timed passes per setting; the fastest counts (least disturbed)
BATCHES = "64,125,250,500,1000,2000"  # default of --batches: around the default eval.batch_size, 250


def _pin(cores: str) -> None:
    """Pin this process to its lowest allowed core (``cores == "one"``), before JAX starts
    its thread pools."""
    if cores == "one":
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def _worker(batch: int | None, cores: str) -> dict:
    """One measurement: the ensemble's forward throughput at ``batch`` (or, with ``batch``
    None, the matmul peak) on ``cores``."""
    _pin(cores)
    from flows import environment  # noqa: F401  (the flows' device layout and XLA flags)

    if batch is None:
        from benchmarks.bench import matmul_peak

        return {"cores": cores, "cpus": len(os.sched_getaffinity(0)), **matmul_peak("float32")}

    import jax
    import numpy as np

    from benchmarks.bench import IMAGE_SHAPE, NUM_CLASSES, best_of
    from benchmarks.flops import count_flops
    from ensemble_core import ensemble_setup as setup
    from ensemble_core.config import load_config
    from ensemble_core.predict import member_probs

    cfg = load_config(ROOT / "configs" / "default.yaml")
    built = setup.build(cfg, NUM_CLASSES)
    state = built.init_state(built.member_keys()["init"], IMAGE_SHAPE)
    images = np.random.default_rng(0).integers(0, 256, (IMAGES, *IMAGE_SHAPE), dtype=np.uint8)
    predict = built.predict_fn()
    one = built.one_member_per_device
    members = cfg.ensemble.size

    def forward() -> None:
        member_probs(predict, state.variables, images, built.mesh, batch, one_member_per_device=one)

    forward()  # compiles
    best = best_of(REPEATS, forward)
    chunk = images[: min(batch, IMAGES)]
    flops = count_flops(predict, state.variables, jax.numpy.asarray(chunk)) / (members * len(chunk))
    rate = members * IMAGES / best
    return {
        "cores": cores,
        "cpus": len(os.sched_getaffinity(0)),
        "batch_size": batch,
        "members": members,
        "strategy": built.strategy,
        "backend": jax.default_backend(),
        "devices": jax.device_count(),
        "seconds": best,
        "member_images_per_s": rate,
        "flops_per_member_image": flops,
        "gflops_per_s": rate * flops / 1e9,
    }


def _run_worker(batch: int | None, cores: str) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.forward_ceiling", "--worker", "--cores", cores]
    if batch is not None:
        cmd += ["--batch", str(batch)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"worker failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", default=BATCHES, help="eval.batch_size values")
    parser.add_argument("--out", type=Path, help="result file (default: benchmarks/results/forward-ceiling-...)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cores", choices=CORES, default="all", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(args.batch, args.cores)))
        return 0
    batches = [int(b) for b in args.batches.split(",")]
    peak = {cores: _run_worker(None, cores) for cores in CORES}
    rows = []
    for batch in batches:
        for cores in CORES:
            row = _run_worker(batch, cores)
            row["share_of_peak"] = row["gflops_per_s"] / peak[cores]["matmul_gflops_per_s"]
            rows.append(row)
            where = "all cores" if cores == "all" else "one core "
            print(
                f"batch {batch:5d}, {where}: {row['member_images_per_s']:8.0f} member-images/s, "
                f"{row['gflops_per_s']:5.0f} GFLOP/s ({row['share_of_peak']:.0%} of the matmul peak)",
                flush=True,
            )
    best = {
        cores: max((r for r in rows if r["cores"] == cores), key=lambda r: r["member_images_per_s"]) for cores in CORES
    }
    result = {
        **stamp(),
        "command": "python -m benchmarks.forward_ceiling"
        + (f" --batches {args.batches}" if args.batches != BATCHES else ""),
        "images": IMAGES,
        "peak": peak,
        "rows": rows,
        "best": {
            cores: {"batch_size": r["batch_size"], "member_images_per_s": r["member_images_per_s"]}
            for cores, r in best.items()
        },
        "one_core_over_all": best["one"]["member_images_per_s"] / best["all"]["member_images_per_s"],
    }
    backend = rows[0]["backend"]
    out = args.out or ROOT / "benchmarks" / "results" / f"forward-ceiling-{backend}-{os.cpu_count()}core.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"one core / all cores: {result['one_core_over_all']:.2f}; wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
