"""Deep ensemble against BatchEnsemble and Packed-Ensembles: training and prediction throughput in one run.

    python -m benchmarks.methods                      # M = 4, batch 64, 20 steps, 5 rounds
    python -m benchmarks.methods --members 4 --batch 64 --steps 5 --rounds 3 \\
        --out benchmarks/results/methods-cpu-2core.json

Three ways to hold ``M`` members of the registry's CNN (:mod:`ensemble_core.models.cnn`:
Conv32 - Conv64 - Dense256 - Dense) on 28x28x1 images with 10 classes (the embedded MNIST's
shape, :data:`benchmarks.bench.IMAGE_SHAPE`):

- ``deep_ensemble``: ``M`` independent CNNs, parameters stacked ``[M, ...]``, the forward
  pass ``jax.vmap`` of ``CNN.apply`` over the parameters with the same batch for every member;
- ``deep_ensemble_unroll``: the same ``M`` CNNs, the members unrolled inside the one jitted
  program (:func:`ensemble_core.train.map_members` with ``'unroll'``), the member strategy
  the project picks on CPU (:func:`ensemble_core.train.default_strategy`: XLA:CPU turns a
  vmapped convolution into a grouped one, several times slower than separate ones), as a
  second baseline;
- ``batch_ensemble``: :class:`ensemble_core.methods.BatchEnsembleCNN` (shared weights,
  rank-1 fast weights per member);
- ``packed``: :class:`ensemble_core.methods.PackedCNN` with ``--alpha`` 2 and ``--gamma`` 1
  (the defaults; members of ``alpha / M`` of the CNN's width: 16, 32, 128 channels for
  ``M = 4``).

Each gets the same batch for every member (``[B, 28, 28, 1]``, logits ``[M, B, 10]``).
Training: one ``jax.jit`` step, ``jax.value_and_grad`` of the mean over members and
examples of the project's cross-entropy (:func:`ensemble_core.train.cross_entropy`), then
``optax.sgd(0.01)``; compiled with the project's train-step options
(:func:`ensemble_core.train.train_compiler_options`), without donation (on CPU donation
measured slower: :func:`ensemble_core.train.default_donate`). Prediction: a ``jax.jit``
forward pass to softmax probabilities ``[M, B, 10]``. The batch is fixed random images and
labels already on the device: input pipelines are left out.

Figures: member-images per second, ``M * B * steps / seconds`` (each member sees ``B``
images per step), in steady state: after compiling (timed, ``compile_seconds``) and one
call, ``--rounds`` rounds in each of which every method times a chunk of ``--steps`` steps,
the methods taking turns, so that a slow moment of the shared machine falls on all of them.
Reported: the median over rounds (and the best and every round beside it), and the ratios
to ``deep_ensemble`` and to ``deep_ensemble_unroll`` measured in the same run, of the medians
and the median of the rounds' own ratios. ``other_cores_busy``: the cores' worth of CPU other processes took while the
rounds ran (0 on an idle machine); XLA's FLOPs per member-image of each compiled step and
prediction (``cost_analysis``), and each method's parameter count, are recorded beside.
Writes JSON (``--out``) and prints a table.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.bench import IMAGE_SHAPE, NUM_CLASSES, ROOT
from benchmarks.provenance import busy_seconds, stamp

METHODS = ("deep_ensemble", "deep_ensemble_unroll", "batch_ensemble", "packed")
#: the ratios' denominators: the deep ensemble as vmapped, and as the project maps members on CPU
BASELINES = ("deep_ensemble", "deep_ensemble_unroll")
KINDS = ("train", "eval")
LEARNING_RATE = 0.01


def _flops(compiled: Any) -> float | None:
    """FLOPs of one call of a compiled program (XLA's cost analysis), or None if absent."""
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost["flops"]) if cost and "flops" in cost else None


def _own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _build(method: str, args: argparse.Namespace) -> tuple[Callable, Any, str]:
    """``(logits_fn(params, images) -> [M, B, classes], params, description)`` of a method."""
    import jax
    import jax.numpy as jnp

    from ensemble_core.methods import BatchEnsembleCNN, PackedCNN
    from ensemble_core.models.cnn import CNN
    from ensemble_core.train import map_members

    m = args.members
    dummy = jnp.zeros((1, *IMAGE_SHAPE), jnp.float32)
    keys = jax.random.split(jax.random.key(0), m)
    if method == "deep_ensemble":
        cnn = CNN(num_classes=NUM_CLASSES)
        params = jax.vmap(lambda k: cnn.init(k, dummy)["params"])(keys)

        def deep(p, x):
            return jax.vmap(lambda q: cnn.apply({"params": q}, x))(p)

        return deep, params, f"{m} CNNs, params stacked [M, ...], jax.vmap(CNN.apply) over params, same batch"
    if method == "deep_ensemble_unroll":
        cnn = CNN(num_classes=NUM_CLASSES)
        params = jax.vmap(lambda k: cnn.init(k, dummy)["params"])(keys)

        def unrolled(p, x):
            return map_members(lambda q: cnn.apply({"params": q}, x), "unroll")(p)

        return unrolled, params, f"{m} CNNs, params stacked [M, ...], members unrolled (map_members 'unroll')"
    if method == "batch_ensemble":
        be = BatchEnsembleCNN(num_classes=NUM_CLASSES, ensemble_size=m)
        params = be.init(keys[0], dummy)["params"]
        return (lambda p, x: be.apply({"params": p}, x)), params, f"BatchEnsembleCNN(ensemble_size={m})"
    packed = PackedCNN(num_classes=NUM_CLASSES, ensemble_size=m, alpha=args.alpha, gamma=args.gamma)
    params = packed.init(keys[0], dummy)["params"]
    return (
        (lambda p, x: packed.apply({"params": p}, x)),
        params,
        f"PackedCNN(ensemble_size={m}, alpha={args.alpha}, gamma={args.gamma})",
    )


def _compiled(method: str, args: argparse.Namespace, images: Any, labels: Any) -> dict[str, Any]:
    """A method's jitted training step and prediction, compiled (timed), with their state."""
    import jax
    import optax

    from ensemble_core.train import cross_entropy, train_compiler_options

    logits_fn, params, description = _build(method, args)
    tx = optax.sgd(LEARNING_RATE)

    def loss(p, x, y):
        logits = logits_fn(p, x)  # [M, B, classes]
        return jax.vmap(cross_entropy, in_axes=(0, None))(logits, y).mean()

    def step(p, opt_state, x, y):
        value, grads = jax.value_and_grad(loss)(p, x, y)
        updates, opt_state = tx.update(grads, opt_state, p)
        return optax.apply_updates(p, updates), opt_state, value

    def predict(p, x):
        return jax.nn.softmax(logits_fn(p, x), axis=-1)

    opt_state = tx.init(params)
    options = train_compiler_options(jax.default_backend())
    t0 = time.perf_counter()
    train = jax.jit(step, compiler_options=options).lower(params, opt_state, images, labels).compile()
    t1 = time.perf_counter()
    evaluate = jax.jit(predict).lower(params, images).compile()
    t2 = time.perf_counter()
    per_call = args.members * args.batch
    flops = {kind: _flops(c) for kind, c in (("train", train), ("eval", evaluate))}
    return {
        "params": params,
        "opt_state": opt_state,
        "train": train,
        "eval": evaluate,
        "record": {
            "description": description,
            "param_count": sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(params)),
            "compile_seconds": {"train": t1 - t0, "eval": t2 - t1},
            "xla_flops_per_member_image": {k: (v / per_call if v is not None else None) for k, v in flops.items()},
            "train_compiler_options": options,
        },
    }


def _chunks(state: dict[str, Any], steps: int, images: Any, labels: Any) -> dict[str, Callable[[], None]]:
    """A method's timed chunks: ``steps`` training steps (the state carried from one to the
    next) and ``steps`` predictions, each waiting for its last result."""
    import jax

    def train() -> None:
        p, s = state["params"], state["opt_state"]
        for _ in range(steps):
            p, s, value = state["train"](p, s, images, labels)
        jax.block_until_ready(value)
        state["params"], state["opt_state"] = p, s

    def evaluate() -> None:
        for _ in range(steps):
            probs = state["eval"](state["params"], images)
        jax.block_until_ready(probs)

    return {"train": train, "eval": evaluate}


def _summary(seconds: list[float], member_images: int) -> dict[str, Any]:
    rates = [member_images / s for s in seconds]
    return {"median": statistics.median(rates), "best": max(rates), "rounds": rates}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Compile, warm up and time every method; figures per method and ratios to the deep ensemble."""
    import jax
    import numpy as np

    rng = np.random.default_rng(0)
    images = jax.device_put(rng.uniform(0, 1, (args.batch, *IMAGE_SHAPE)).astype(np.float32))
    labels = jax.device_put(rng.integers(0, NUM_CLASSES, args.batch).astype(np.int32))
    states = {method: _compiled(method, args, images, labels) for method in METHODS}
    chunks = {method: _chunks(state, args.steps, images, labels) for method, state in states.items()}
    for method in METHODS:  # warm-up: the first call of a compiled program allocates
        for kind in KINDS:
            chunks[method][kind]()
    seconds: dict[str, dict[str, list[float]]] = {m: {k: [] for k in KINDS} for m in METHODS}
    busy0, own0, t0 = busy_seconds(), _own_cpu_seconds(), time.perf_counter()
    for r in range(args.rounds):
        order = METHODS if r % 2 == 0 else METHODS[::-1]
        for kind in KINDS:
            for method in order:
                start = time.perf_counter()
                chunks[method][kind]()
                seconds[method][kind].append(time.perf_counter() - start)
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    busy1, own1, wall = busy_seconds(), _own_cpu_seconds(), time.perf_counter() - t0
    others = None if busy0 is None or busy1 is None else max(0.0, (busy1 - busy0) - (own1 - own0)) / wall

    member_images = args.members * args.batch * args.steps
    methods: dict[str, Any] = {}
    for method in METHODS:
        methods[method] = {
            **states[method]["record"],
            **{f"{kind}_member_images_per_s": _summary(seconds[method][kind], member_images) for kind in KINDS},
        }
    ratios: dict[str, Any] = {}
    for baseline in BASELINES:
        ratios[baseline] = {}
        for method in METHODS:
            if method == baseline:
                continue
            ratio: dict[str, Any] = {"param_count": methods[method]["param_count"] / methods[baseline]["param_count"]}
            for kind in KINDS:
                key = f"{kind}_member_images_per_s"
                ours, base = methods[method][key], methods[baseline][key]
                paired = [a / b for a, b in zip(ours["rounds"], base["rounds"], strict=True)]
                ratio[kind] = {
                    "of_medians": ours["median"] / base["median"],
                    "median_of_round_ratios": statistics.median(paired),
                }
            ratios[baseline][method] = ratio
    return {
        "backend": jax.default_backend(),
        "devices": jax.device_count(),
        "device_kind": jax.devices()[0].device_kind,
        "other_cores_busy": others,
        "timed_wall_seconds": wall,
        "methods": methods,
        "ratios": {f"to_{baseline}": ratios[baseline] for baseline in BASELINES},
    }


def _table(result: dict[str, Any]) -> str:
    """One row per method: parameters, then training and prediction member-images/s (medians)
    with the ratios to each baseline (of the medians; the median of the rounds' ratios in
    parentheses)."""
    short = {"deep_ensemble": "DE", "deep_ensemble_unroll": "DE-unroll"}
    ratio_head = " ".join(f"{'x ' + short[b]:>17}" for b in BASELINES)
    head = f"{'method':20} {'params':>9} | {'train':>7} {ratio_head} | {'predict':>7} {ratio_head} | {'compile s':>9}"
    lines = [head, "-" * len(head)]
    for method, m in result["methods"].items():

        def ratios(kind: str, method: str = method) -> str:
            cells = []
            for baseline in BASELINES:
                r = result["ratios"][f"to_{baseline}"].get(method)
                if r is None:
                    cells.append(f"{'1':>17}")
                else:
                    of, paired = r[kind]["of_medians"], r[kind]["median_of_round_ratios"]
                    cells.append(f"{of:>9.2f} ({paired:>5.2f})")
            return " ".join(cells)

        lines.append(
            f"{method:20} {m['param_count']:>9,} | {m['train_member_images_per_s']['median']:>7,.0f} "
            f"{ratios('train')} | {m['eval_member_images_per_s']['median']:>7,.0f} {ratios('eval')} | "
            f"{sum(m['compile_seconds'].values()):>9.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--members", type=int, default=4, help="ensemble size M")
    parser.add_argument("--batch", type=int, default=64, help="images per step (every member sees all of them)")
    parser.add_argument("--steps", type=int, default=20, help="steps (training) or calls (prediction) per chunk")
    parser.add_argument("--rounds", type=int, default=5, help="timed chunks per method and kind; the median counts")
    parser.add_argument("--alpha", type=float, default=2.0, help="Packed-Ensembles' width factor")
    parser.add_argument("--gamma", type=int, default=1, help="Packed-Ensembles' groups per member")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "methods-cpu-2core.json"))
    args = parser.parse_args(argv)
    for name in ("members", "batch", "steps", "rounds", "gamma"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")

    measured = measure(args)
    result = {
        **stamp(),
        "what": "training steps and predictions of M members of the registry's CNN held as a deep ensemble "
        "(vmap over stacked params; members unrolled), BatchEnsemble and Packed-Ensembles; the same batch for "
        "every member",
        "command": "python -m benchmarks.methods " + " ".join(sys.argv[1:] if argv is None else argv),
        "versions": {p: importlib.metadata.version(p) for p in ("jax", "jaxlib", "flax", "optax")},
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "settings": {
            "members": args.members,
            "batch_size": args.batch,
            "image_shape": list(IMAGE_SHAPE),
            "num_classes": NUM_CLASSES,
            "steps_per_chunk": args.steps,
            "rounds": args.rounds,
            "packed": {"alpha": args.alpha, "gamma": args.gamma},
            "optimizer": f"optax.sgd({LEARNING_RATE})",
            "member_images": "members * batch_size per step or prediction",
        },
        **measured,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print()
    busy = measured["other_cores_busy"]
    print(
        f"M = {args.members}, batch {args.batch}, {args.steps} steps x {args.rounds} rounds, "
        f"{measured['devices']} {measured['backend']} device(s), {result['machine']['cpus']} cores"
        + (f"; other cores busy {busy:.2f}" if busy is not None else "")
        + "; member-images/s (medians), ratio of medians to each deep ensemble (median of the rounds' ratios)"
    )
    print(_table(result))
    print(f"\nwritten: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
