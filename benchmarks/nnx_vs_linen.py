"""NNX against Linen: the same CNN as a member network, written both ways, in one run.

    python -m benchmarks.nnx_vs_linen                 # 5 rounds, E = 8, 10 steps
    python -m benchmarks.nnx_vs_linen --rounds 5 --size 8 --steps 10 \\
        --out benchmarks/results/nnx-vs-linen-cpu-2core.json

The two networks are the registry's Linen ``cnn`` (:mod:`ensemble_core.models.cnn`) and
``tests.user_models.nnx_nets:CNN``, the same layers and pooling as a ``flax.nnx.Module``
(``cnn`` and ``cnn-nnx`` in :data:`benchmarks.bench.MODELS`). Each round runs
:mod:`benchmarks.bench`'s ``project`` worker (a fresh process, the project's ensemble
train step and evaluation, on the flows' 8 simulated CPU devices) for each, the
order alternating from round to round so that a drift of a shared machine falls on both
sides alike. Every worker gets an empty persistent compilation cache, so every compile
time is cold.

Reported per round and as the median of the rounds: training and evaluation
member-images/s (the fastest of ``--repeats`` timed chunks, as in ``benchmarks.bench``),
compile seconds of the train step (lowering included), and the ratios NNX / Linen: of the
medians (``median.nnx_over_linen``) and, beside them, the median of the rounds' own ratios
(``median.round_ratios``). ``within_10_percent``: NNX's median training and evaluation
throughput are both at least 0.9 x Linen's. ``other_cores_busy`` (per worker) is how much
of the machine other work took meanwhile (a round measured while it was well above 0 was
disturbed).

First, one more process lowers both networks' train step and evaluation and compares
their StableHLO, source locations and the names of the result's fields removed
(``programs``: ``train_step_same_program``, ``eval_same_program``, and XLA's FLOPs of each
train step): where both are true, NNX and Linen hand XLA the same computation, and any
difference of throughput is the machine's.

Writes JSON (``--out``) and prints a table.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

from benchmarks.bench import BATCH, EVAL_BATCH, MODELS, REPEATS, ROOT, run_worker
from benchmarks.process_cpu import children_cpu_seconds
from benchmarks.provenance import busy_seconds, stamp

#: the two sides: bench.MODELS names
LINEN, NNX = "cnn", "cnn-nnx"
#: figures compared, and how the ratio reads (NNX / Linen for each)
FIGURES = ("train_member_images_per_s", "eval_member_images_per_s", "compile_seconds")
TOLERANCE = 0.9  # NNX throughput at least this fraction of Linen's


def _measure(model: str, args: argparse.Namespace, env: dict) -> dict:
    """One project worker with its own empty compilation cache (a cold compile), and how
    busy the rest of the machine was meanwhile: ``other_cores_busy``, the cores' worth of
    CPU time (steal included) not spent by the worker, over its wall time (0 on an idle
    machine; 1 means another job took a whole core of the 2)."""
    cache = tempfile.mkdtemp(prefix="ensemble-nnx-vs-linen-jax-")
    busy0, own0, t0 = busy_seconds(), children_cpu_seconds(), time.perf_counter()
    try:
        out = run_worker(model, args.size, "project", args, {**env, "JAX_COMPILATION_CACHE_DIR": cache})
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    busy1, own1, wall = busy_seconds(), children_cpu_seconds(), time.perf_counter() - t0
    others = None if busy0 is None or busy1 is None else max(0.0, (busy1 - busy0) - (own1 - own0)) / wall
    return {**out, "worker_wall_seconds": wall, "other_cores_busy": others}


def _program_text(lowered) -> str:
    """A lowered program's StableHLO without what names it rather than computes: source
    locations and the names of the result's fields (``params['Conv_0']`` against
    ``params['conv1']``)."""
    text = re.sub(r'jax\.result_info = "[^"]*"', "", lowered.as_text())
    text = re.sub(r"loc\([^()]*(\([^()]*\)[^()]*)*\)", "", text)
    return "\n".join(line for line in text.splitlines() if not line.startswith("#loc"))


def _program_worker(args: argparse.Namespace) -> dict:
    """Lower both networks' train step and evaluation (as ``benchmarks.bench``'s project
    worker builds them) and compare the programs: are they the same computation?"""
    from flows import environment  # device layout and env, as in the flows, before JAX starts

    environment.apply()  # (applied on import; a statement here keeps the import above JAX's)
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from benchmarks.bench import IMAGE_SHAPE
    from ensemble_core import ensemble_setup as setup
    from ensemble_core.config import PipelineConfig
    from ensemble_core.mesh import replicated

    programs: dict[str, dict[str, str]] = {}
    flops: dict[str, float] = {}
    for side in (LINEN, NNX):
        name, options = MODELS[side]
        model = {"name": name, "options": options}
        cfg = PipelineConfig.model_validate({"model": model, "ensemble": {"size": args.size}})
        built = setup.build(cfg, 10)
        mesh, keys = built.mesh, built.member_keys()
        state = built.init_state(keys["init"], IMAGE_SHAPE)
        images = jax.device_put(np.zeros((4 * BATCH, *IMAGE_SHAPE), np.uint8), replicated(mesh))
        labels = jax.device_put(np.zeros(4 * BATCH, np.int32), replicated(mesh))
        idx = jax.device_put(np.zeros((args.size, BATCH), np.int32), NamedSharding(mesh, P("ensemble", "data")))
        member_keys = jax.device_put(
            np.asarray(jax.random.key_data(keys["stochastic"])), NamedSharding(mesh, P("ensemble"))
        )
        train = cast(Any, built.train_step()).lower(state, images, labels, member_keys, idx)
        chunk = jax.device_put(np.zeros((EVAL_BATCH, *IMAGE_SHAPE), np.uint8), NamedSharding(mesh, P("data")))
        predict = cast(Any, built.predict_fn()).lower(state.variables, chunk)
        programs[side] = {"train": _program_text(train), "eval": _program_text(predict)}
        cost = train.compile().cost_analysis()
        flops[side] = float((cost[0] if isinstance(cost, list) else cost)["flops"])
    return {
        "train_step_same_program": programs[LINEN]["train"] == programs[NNX]["train"],
        "eval_same_program": programs[LINEN]["eval"] == programs[NNX]["eval"],
        "train_step_flops": flops,
        "devices": jax.device_count(),
        "how": "StableHLO of jit(...).lower(...) for each, source locations and result field names removed",
    }


def _compare_programs(args: argparse.Namespace, env: dict) -> dict:
    """:func:`_program_worker` in a fresh process (JAX on the flows' devices)."""
    cmd = [sys.executable, "-m", "benchmarks.nnx_vs_linen", "--program-worker", "--size", str(args.size)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    if proc.returncode:
        raise SystemExit(f"program worker failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _ratios(linen: dict, nnx: dict) -> dict:
    return {f: nnx[f] / linen[f] for f in FIGURES}


def _table(rows: list[dict], median: dict) -> str:
    head = (
        f"{'round':>6} {'order':16} | {'train linen':>11} {'train nnx':>10} {'ratio':>6} | "
        f"{'eval linen':>10} {'eval nnx':>9} {'ratio':>6} | {'compile linen':>13} {'nnx':>6} {'ratio':>6}"
    )

    def line(label: str, order: str, linen: dict, nnx: dict, ratio: dict) -> str:
        return (
            f"{label:>6} {order:16} | {linen['train_member_images_per_s']:>11,.0f} "
            f"{nnx['train_member_images_per_s']:>10,.0f} {ratio['train_member_images_per_s']:>5.2f}x | "
            f"{linen['eval_member_images_per_s']:>10,.0f} {nnx['eval_member_images_per_s']:>9,.0f} "
            f"{ratio['eval_member_images_per_s']:>5.2f}x | {linen['compile_seconds']:>12.2f}s "
            f"{nnx['compile_seconds']:>5.2f}s {ratio['compile_seconds']:>5.2f}x"
        )

    lines = [head, "-" * len(head)]
    for r in rows:
        busy = [r[side].get("other_cores_busy") for side in (LINEN, NNX)]
        others = " | other cores busy " + "/".join(f"{b:.2f}" for b in busy) if None not in busy else ""
        lines.append(line(str(r["round"]), " then ".join(r["order"]), r[LINEN], r[NNX], r["nnx_over_linen"]) + others)
    lines.append("-" * len(head))
    lines.append(line("median", "", median[LINEN], median[NNX], median["nnx_over_linen"]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # 3 rounds proved too few: the same evaluation program's timings spread about 10% between processes
    parser.add_argument("--rounds", type=int, default=5, help="rounds of one Linen and one NNX worker each")
    parser.add_argument("--size", type=int, default=8, help="ensemble size E")
    parser.add_argument("--steps", type=int, default=10, help="timed training steps per member")
    parser.add_argument("--repeats", type=int, default=REPEATS, help="timed chunks per measurement; the fastest counts")
    parser.add_argument("--data-dir", default=str(Path(tempfile.gettempdir()) / "ensemble-bench-tfds"))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "nnx-vs-linen-cpu-2core.json"))
    parser.add_argument("--program-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.program_worker:
        print(json.dumps(_program_worker(args)))
        return 0
    args.skip_same_options = True  # run_worker's option of the loop baseline, unused by 'project'
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")

    env = os.environ.copy()
    programs = _compare_programs(args, env)
    print(
        f"same program (StableHLO, names aside): train step {programs['train_step_same_program']}, "
        f"evaluation {programs['eval_same_program']}",
        flush=True,
    )
    rows: list[dict[str, Any]] = []
    for i in range(args.rounds):
        order = (LINEN, NNX) if i % 2 == 0 else (NNX, LINEN)
        measured = {model: _measure(model, args, env) for model in order}
        rows.append(
            {
                "round": i + 1,
                "order": list(order),
                LINEN: measured[LINEN],
                NNX: measured[NNX],
                "nnx_over_linen": _ratios(measured[LINEN], measured[NNX]),
            }
        )
        print(_table(rows[-1:], rows[-1]).splitlines()[2], flush=True)

    median = {side: {f: statistics.median(r[side][f] for r in rows) for f in FIGURES} for side in (LINEN, NNX)}
    # ratios of the medians; the median of the per-round ratios (each round's pair measured
    # back to back, so a drift between rounds cancels) is kept beside them
    median["nnx_over_linen"] = _ratios(median[LINEN], median[NNX])
    median["round_ratios"] = {f: statistics.median(r["nnx_over_linen"][f] for r in rows) for f in FIGURES}
    ratio = median["nnx_over_linen"]
    first = rows[0][LINEN]
    result = {
        **stamp(),
        "what": "the registry's Linen cnn against the same CNN as a flax.nnx.Module "
        "(tests.user_models.nnx_nets:CNN): the project's ensemble train step and evaluation, "
        "one fresh worker each, order alternating by round, cold compilation cache",
        "command": "python -m benchmarks.nnx_vs_linen " + " ".join(sys.argv[1:] if argv is None else argv),
        "models": {side: {"model.name": MODELS[side][0], "model.options": MODELS[side][1]} for side in (LINEN, NNX)},
        "backend": first["backend"],
        "device_kind": first.get("device_kind"),
        "devices": first["devices"],
        "strategy": {side: rows[0][side]["strategy"] for side in (LINEN, NNX)},
        "mesh": {side: rows[0][side]["mesh"] for side in (LINEN, NNX)},
        "versions": {p: importlib.metadata.version(p) for p in ("jax", "jaxlib", "flax", "optax")},
        "size": args.size,
        "batch_size": BATCH,
        "eval_batch_size": EVAL_BATCH,
        "steps": args.steps,
        "repeats": args.repeats,
        "rounds": args.rounds,
        "xla_flags": env.get("XLA_FLAGS", ""),
        "programs": programs,
        "rows": rows,
        "median": median,
        "tolerance": TOLERANCE,
        "within_10_percent": bool(
            ratio["train_member_images_per_s"] >= TOLERANCE and ratio["eval_member_images_per_s"] >= TOLERANCE
        ),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print()
    print(f"E = {args.size}, {args.steps} steps, {result['devices']} {result['backend']} devices; member-images/s")
    print(_table(rows, median))
    print(
        f"\nNNX / Linen (medians): train {ratio['train_member_images_per_s']:.2f}x, "
        f"eval {ratio['eval_member_images_per_s']:.2f}x, compile {ratio['compile_seconds']:.2f}x; "
        f"within 10%: {result['within_10_percent']}"
    )
    paired = median["round_ratios"]
    print(
        f"median of the rounds' ratios: train {paired['train_member_images_per_s']:.2f}x, "
        f"eval {paired['eval_member_images_per_s']:.2f}x, compile {paired['compile_seconds']:.2f}x"
    )
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
