"""Ensemble training/evaluation throughput against the per-member loop a user writes.

    python -m benchmarks.bench                      # full table: cnn+mlp, E in 1..32
    python -m benchmarks.bench --models cnn --sizes 8 --steps 10
    python -m benchmarks.bench --models cnn --sizes 8 --steps 10 --precision bfloat16
    python -m benchmarks.bench --models resnet20,resnet20-nobn --sizes 1,2,4,8 --steps 3
    python -m benchmarks.bench --models resnet20 --sizes 8 --devices 1 \
        --strategy unroll,vmap,vmap_patches --steps 2 --skip-same-options

Models (``--models``, :data:`MODELS`): ``cnn``, ``mlp``, ``resnet20`` (the registry's
``resnet`` with its defaults: depth 20, width 16, BatchNorm) and ``resnet20-nobn``
(``model.options: {batch_norm: false}``), all on the embedded MNIST's 28x28x1 images, and
``cnn-nnx``: the ``cnn`` written as a ``flax.nnx.Module`` (``tests.user_models.nnx_nets:CNN``),
for method ``project`` only (the per-member loop is Linen's pattern; :mod:`benchmarks.nnx_vs_linen`).
``--strategy`` takes a comma-separated list (each strategy a row, against one loop
measurement); ``vmap_patches`` is ``vmap`` with every ``nn.Conv`` computed as patches
times a kernel matrix (:mod:`benchmarks.conv_patches`) while the step and the
predict function are traced. ``--devices N`` runs the project's workers on N simulated
host devices instead of the flows' 8.

For each model and ensemble size E, two fresh worker processes (so peak memory is per
configuration) measure:

- ``project``: ``ensemble_core``'s jitted struct-of-arrays step on the mesh and member
  strategy the project picks (or ``--strategy``), and the vmapped evaluation;
- ``loop``: each member trained alone by its own jitted single-model step, one member
  after another, and evaluated the same way, in these variants, timed in turns:

  - the **fair loop**, the baseline every printed and recorded ``speedup`` is against: the
    single-model loop a user writes from the Flax guide, one ``jax.jit(single_step,
    donate_argnums=(0, 1, 2))`` over (params, collections, optimizer state) with the batch
    as its arguments. Two ways to feed it are measured and the faster counts
    (``fair_variant``): ``host``, the batch gathered on the host from the NumPy training
    split (``train_x[perm]``, the ``train_epoch`` of the Flax "ensembling on multiple
    devices" HOWTO) and passed to the step; ``device``, the training split on the device
    and the batch gathered inside the step from the indices (as the project's step
    does). The state is donated where the project's step donates it
    (:func:`ensemble_core.train.default_donate`: not on CPU, where donation measured
    slower). The step is Flax's single-model pattern: ``apply(..., train=True,
    mutable=[collections], rngs={'dropout': key})`` with the member's mutable collections
    (BatchNorm's ``batch_stats``) carried from step to step;
  - ``guide``: the guide's own loop, as literally as it runs here: its jitted
    ``apply_model`` (loss, gradients, accuracy) and ``update_model``
    (``TrainState.apply_gradients``) with a ``flax.training.train_state.TrainState`` and
    ``optax.sgd``, the training images a float32 device array and the labels a NumPy array
    (the Flax MNIST example's ``get_datasets``), each batch gathered by
    ``train_ds['image'][perm, ...]`` with the rows of the guide's ``jax.random.permutation``
    (members without mutable collections only: the guide's CNN has none);
  - ``gather`` ("loop (gather outside)"): this benchmark's earlier loop, a device array
    indexed with a NumPy index outside the jitted step (``x[order[s, m]]``), one more
    dispatch per step, no donation;
  - ``loop*`` (``train_member_images_per_s_same_options``): the fair loop compiled with the
    project's train-step compiler options (:func:`ensemble_core.train.train_compiler_options`):
    ``speedup*`` is what the ensemble gains over a loop compiled as the project compiles.

  Evaluation: softmax probabilities per member and batch of 250 test images, fed from host
  slices (as the project's evaluation is) or from batches already on the device; the faster
  counts (``eval_variant``); the old loop's device-array slices are ``eval_..._gather``.

``--precision`` (``float32``, ``high``, ``bfloat16``) is the compute precision of every
side: the project's config gets ``train.precision`` (left out for ``float32``), the loops
cast params and images to bfloat16 inside the loss function (``bfloat16``) or are traced
under ``jax.default_matmul_precision("high")`` (``high``), and the roofline's matmul peak
is measured at it (``float32``: ``Precision.HIGHEST``, true float32).

Throughput is in member-images per second at batch 128 per member, steady state
(compilation excluded and reported separately; the fastest of 3 timed chunks); peak host memory is the worker's
``ru_maxrss``; device memory is reported where the backend exposes ``memory_stats``.
The roofline divides FLOPs per image counted from the jaxpr of the single-model step and
evaluation (:mod:`benchmarks.flops`: matmuls and convolutions, forward and backward as
executed; the same on every backend) by the matmul peak; XLA's own cost analysis is
recorded beside it (``xla_train_flops_per_image``; on GPU it leaves out cuDNN's
convolutions). ``--compile-cache`` measures a cold and a warm persistent-compilation-cache start.
Writes JSON (``--out``) and a PNG plot of throughput against E, and prints a table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from benchmarks.provenance import stamp

BATCH = 128
NUM_CLASSES = 10  # the embedded MNIST's classes
EVAL_BATCH = 250  # test images per forward pass, project and loop alike (the default eval.batch_size)
KIND_TITLES = {"train": "training", "eval": "evaluation"}
REPEATS = 3  # timed chunks per measurement (default of --repeats); the fastest counts (least disturbed)
IMAGE_SHAPE = (28, 28, 1)  # the embedded MNIST subset's images, for every model (ResNet-20 included)
#: --models names: (registry ``model.name``, ``model.options``)
MODELS = {
    "cnn": ("cnn", {}),
    "mlp": ("mlp", {}),
    "resnet20": ("resnet", {}),  # depth 20, width 16, BatchNorm (the registry's defaults)
    "resnet20-nobn": ("resnet", {"batch_norm": False}),  # convolutions with a bias instead of BatchNorm
    # the registry's cnn written as a flax.nnx.Module (same layers and pooling), by class path;
    # 'project' only: the per-member loop is Linen's pattern (benchmarks.nnx_vs_linen)
    "cnn-nnx": ("tests.user_models.nnx_nets:CNN", {}),
}
#: MODELS without the per-member loop (Linen's pattern): measured by method 'project' only,
#: so not in this module's table (main refuses them); benchmarks.nnx_vs_linen runs them
PROJECT_ONLY = frozenset({"cnn-nnx"})
#: --strategy values: the project's member strategies plus 'vmap_patches', vmap with every
#: nn.Conv replaced by patches + one batched matmul over the members
#: (:mod:`benchmarks.conv_patches`), applied around the step's and predict's tracing
STRATEGY_CHOICES = ("vmap", "unroll", "vmap_patches")
#: --precision values: the compute precision of the project's step (``train.precision``), the
#: loops' steps and the matmul peak; float32 is the project's default
PRECISION_CHOICES = ("float32", "high", "bfloat16")
#: the per-member loops timed by the loop worker, as the keys ``train_member_images_per_s_<name>`` name them
LOOPS = ("fair_host", "fair_device", "guide", "gather")


def best_of(repeats: int, fn) -> float:
    """Seconds of the fastest of ``repeats`` calls of ``fn``."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


ROOT = Path(__file__).resolve().parents[1]


# MARK: worker (one configuration, one process)


def _flops(compiled) -> float:
    """FLOPs of one call of a compiled XLA program, from XLA's own cost analysis."""
    cost = compiled.cost_analysis()
    return float((cost[0] if isinstance(cost, list) else cost)["flops"])


def precision_overrides(precision: str) -> dict:
    """The run-config overlay for ``--precision``: ``{"train": {"precision": precision}}``,
    or ``{}`` for ``float32`` (the project's default), so that float32 needs no
    ``train.precision`` key in the config schema.

    Raises:
      ValueError: ``precision`` is not one of :data:`PRECISION_CHOICES`.
    """
    if precision not in PRECISION_CHOICES:
        raise ValueError(f"unknown precision {precision!r}; use one of {', '.join(PRECISION_CHOICES)}")
    return {} if precision == "float32" else {"train": {"precision": precision}}


def matmul_peak(precision: str = "float32") -> dict:
    """The machine's attainable matmul FLOP/s on one device at the step's precision: a
    jitted ``n x n`` matmul (n = 2048 on CPU, 4096 elsewhere), timed as the best of 10
    chunks of 5.

    ``float32``: float32 inputs with ``precision=jax.lax.Precision.HIGHEST`` (true float32,
    not the TF32 or bf16 passes XLA uses for float32 on GPUs by default); ``high``:
    ``Precision.HIGH`` (TF32 on NVIDIA GPUs from Ampere on, bf16_3x on TPU); ``bfloat16``:
    bfloat16 inputs accumulated in float32 (``preferred_element_type``). The matmul at XLA's
    default precision (float32 inputs, no precision) is recorded beside it
    (``default_precision_matmul_gflops_per_s``): it is what float32 programs written
    without a precision get (on CPU the same as HIGHEST).
    """
    import jax
    import jax.numpy as jnp

    n = 2048 if jax.default_backend() == "cpu" else 4096
    a32 = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)

    def rate(f, a) -> float:
        f(a).block_until_ready()
        # best of 10 chunks: on a shared machine a short measurement can land in a slow moment
        seconds = best_of(10, lambda: [f(a) for _ in range(5)][-1].block_until_ready()) / 5
        return 2 * n**3 / seconds / 1e9

    if precision == "bfloat16":
        how = "bfloat16 inputs, float32 accumulation (preferred_element_type)"
        peak = rate(jax.jit(lambda a: jax.lax.dot(a, a, preferred_element_type=jnp.float32)), a32.astype(jnp.bfloat16))
    else:
        level = jax.lax.Precision.HIGHEST if precision == "float32" else jax.lax.Precision.HIGH
        how = f"float32 inputs, precision=jax.lax.Precision.{level.name}"
        peak = rate(jax.jit(lambda a: jnp.matmul(a, a, precision=level)), a32)
    return {
        "precision": precision,
        "matmul": how,
        "matmul_n": n,
        "matmul_gflops_per_s": peak,
        "default_precision_matmul_gflops_per_s": rate(jax.jit(lambda a: a @ a), a32),
    }


def _member_apply(model, variables: dict, images, precision: str, **kwargs):
    """``model.apply(variables, images, **kwargs)`` at the compute precision ``precision``
    (``--precision``), as the per-member loops run it: ``float32`` as written; ``high`` traced
    under ``jax.default_matmul_precision("high")``; ``bfloat16`` with the ``params``
    collection and the images cast to bfloat16 inside the traced function (the gradient
    with respect to the float32 parameters stays float32). The caller casts the logits to
    float32."""
    import contextlib

    import jax
    import jax.numpy as jnp

    if precision == "bfloat16":
        variables = {**variables, "params": jax.tree.map(lambda a: a.astype(jnp.bfloat16), variables["params"])}
        images = images.astype(jnp.bfloat16)
    with jax.default_matmul_precision("high") if precision == "high" else contextlib.nullcontext():
        return model.apply(variables, images, **kwargs)


def _best_of_each(repeats: int, chunks: dict[str, Callable[[], None]]) -> dict[str, float]:
    """Seconds of the fastest of ``repeats`` calls of each chunk, the chunks taking turns
    (one call of each per round), so that a slow moment of a shared machine does not
    fall on one of them only."""
    best = dict.fromkeys(chunks, float("inf"))
    for _ in range(repeats):
        for name, fn in chunks.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def _guide_train_epoch(state, train_ds: dict, perms, apply_model, update_model):
    """The Flax ensembling guide's single-model ``train_epoch``, its loop body verbatim
    (``../shared/seeds/002_c5ba55ad81db5000.txt``), over the rows of ``perms`` (its
    permutation is drawn by the caller, outside the timing, so a short timed chunk is not
    charged a whole epoch's permutation)."""
    import numpy as np

    epoch_loss = []
    epoch_accuracy = []
    for perm in perms:
        batch_images = train_ds["image"][perm, ...]
        batch_labels = train_ds["label"][perm, ...]
        grads, loss, accuracy = apply_model(state, batch_images, batch_labels)
        state = update_model(state, grads)
        epoch_loss.append(loss)
        epoch_accuracy.append(accuracy)
    train_loss = np.mean(epoch_loss)
    train_accuracy = np.mean(epoch_accuracy)
    return state, train_loss, train_accuracy


def _project_worker(args: argparse.Namespace, built, keys, order, train_x, train_y, test_x, out: dict) -> None:
    """Method ``project``: the project's jitted ensemble step and its evaluation (into ``out``)."""
    import jax
    import numpy as np

    from ensemble_core.mesh import replicated
    from ensemble_core.predict import member_probs

    steps, repeats = args.steps, args.repeats
    patches = args.strategy == "vmap_patches"
    if patches:
        from benchmarks.conv_patches import conv_as_patches

        intercept: Callable[[], contextlib.AbstractContextManager[Any]] = conv_as_patches  # every trace inside it
    else:
        intercept = contextlib.nullcontext
    strategy, plan, mesh = built.strategy, built.plan, built.mesh
    state = built.init_state(keys["init"], IMAGE_SHAPE)
    x = jax.device_put(train_x, replicated(mesh))
    y = jax.device_put(train_y, replicated(mesh))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("ensemble", "data"))
    idx = [jax.device_put(o, sharding) for o in order]
    step = built.train_step()
    member_keys = jax.device_put(
        np.asarray(jax.random.key_data(keys["stochastic"])),
        jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("ensemble")),
    )
    t0 = time.perf_counter()
    with intercept():
        compiled = cast(Any, step).lower(state, x, y, member_keys, idx[0]).compile()
    out["compile_seconds"] = time.perf_counter() - t0
    state, m = compiled(state, x, y, member_keys, idx[0])  # warm-up
    jax.block_until_ready(m)

    def train_chunk():
        nonlocal state
        for s in range(1, steps + 1):
            state, m = compiled(state, x, y, member_keys, idx[s])
        jax.block_until_ready((state, m))

    out["train_seconds"] = best_of(repeats, train_chunk)
    predict = built.predict_fn()
    one = built.one_member_per_device

    def eval_all():
        with intercept():
            member_probs(predict, state.variables, test_x, mesh, EVAL_BATCH, one_member_per_device=one)

    eval_all()  # compile
    out["eval_seconds"] = best_of(repeats, eval_all)
    out.update(strategy="vmap_patches" if patches else strategy, mesh={"ensemble": plan.ensemble, "data": plan.data})


def _loop_worker(args: argparse.Namespace, built, keys, order, train_x, train_y, test_x, out: dict) -> None:
    """Method ``loop``: the per-member loops of the module docstring, each member trained
    alone by a jitted single-model step, one member after another (into ``out``)."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import optax
    from flax.training import train_state

    from benchmarks.flops import count_flops
    from ensemble_core import data as data_lib
    from ensemble_core.train import cross_entropy, default_donate, train_compiler_options

    model, tx, precision = built.model, built.optimizer, args.precision
    assert isinstance(model, nn.Module), "the per-member loop is Flax Linen's pattern: a registry model"
    e, steps, repeats = args.size, args.steps, args.repeats
    backend = jax.default_backend()
    donate = default_donate(backend)
    donated: tuple[int, ...] = (0, 1, 2) if donate else ()

    def as_stored(new, old):
        return jax.tree.map(lambda n, o: n.astype(o.dtype), new, old)

    # The step a user writes for one Flax model (Flax's examples): mutable collections
    # (BatchNorm's batch_stats) updated in training mode, dropout from a key.
    def single_step(params, model_state, opt_state, xb, yb, key):
        def loss_fn(p):
            logits, updates = _member_apply(
                model,
                {"params": p, **model_state},
                data_lib.to_float(xb),
                precision,
                train=True,
                mutable=list(model_state),
                rngs={"dropout": key},
            )
            return cross_entropy(logits.astype(jnp.float32), yb).mean(), updates

        grads, updates = jax.grad(loss_fn, has_aux=True)(params)
        new_state = as_stored({name: updates[name] for name in model_state}, model_state)
        grad_updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, grad_updates), new_state, opt_state

    def gathered_step(params, model_state, opt_state, x, y, idx, key):
        return single_step(params, model_state, opt_state, x[idx], y[idx], key)

    variables = [model.init(keys["init"][m], jnp.zeros((1, *IMAGE_SHAPE)), train=False) for m in range(e)]
    dropout = [jax.random.fold_in(keys["stochastic"][m], 0) for m in range(e)]

    def fresh_states() -> list:
        """Every member's (params, collections, optimizer state), a copy of its own per loop
        (a donated buffer can be used once)."""
        states = []
        for var in variables:
            params = jax.tree.map(jnp.array, var["params"])
            mstate = {k: jax.tree.map(jnp.array, v) for k, v in dict(var).items() if k != "params"}
            states.append((params, mstate, tx.init(params)))
        return states

    x_dev, y_dev = jnp.asarray(train_x), jnp.asarray(train_y)
    idx_dev = [[jax.device_put(order[s, m]) for m in range(e)] for s in range(steps + 1)]

    def host_batch(s: int, m: int) -> tuple:  # the guide's gather: host arrays indexed on the host
        return train_x[order[s, m]], train_y[order[s, m]]

    def device_batch(s: int, m: int) -> tuple:  # the training split on the device, gathered in the step
        return x_dev, y_dev, idx_dev[s][m]

    def gather_batch(s: int, m: int) -> tuple:  # a device array indexed outside the step (the old loop)
        return x_dev[order[s, m]], y_dev[order[s, m]]

    # name: (step function, donated arguments, its batch arguments for step s of member m)
    loops: dict[str, tuple[Callable[..., Any], tuple[int, ...], Callable[[int, int], tuple]]] = {
        "fair_host": (single_step, donated, host_batch),
        "fair_device": (gathered_step, donated, device_batch),
        "gather": (single_step, (), gather_batch),  # not donated, as the old loop
    }
    jitted = {name: jax.jit(fn, donate_argnums=d) for name, (fn, d, _) in loops.items()}
    p0, ms0, o0 = fresh_states()[0]
    for name in ("fair_host", "fair_device"):
        batch_of = loops[name][2]
        t0 = time.perf_counter()
        compiled = jitted[name].lower(p0, ms0, o0, *batch_of(0, 0), dropout[0]).compile()
        out[f"compile_seconds_{name}"] = time.perf_counter() - t0
        if name == "fair_host":
            out["xla_train_flops_per_image"] = _flops(compiled) / BATCH
    out["train_flops_per_image"] = count_flops(single_step, p0, ms0, o0, *host_batch(0, 0), dropout[0]) / BATCH

    def member_chunk(fn, batch_of, states: list, steps_range: range) -> Callable[[], None]:
        def chunk() -> None:
            for m in range(e):
                params, mstate, opt_state = states[m]
                for s in steps_range:
                    params, mstate, opt_state = fn(params, mstate, opt_state, *batch_of(s, m), dropout[m])
                states[m] = (params, mstate, opt_state)
            jax.block_until_ready(states)

        return chunk

    timed: dict[str, Callable[[], None]] = {}
    states_of: dict[str, list] = {}
    for name, (_, _, batch_of) in loops.items():
        states_of[name] = fresh_states()
        member_chunk(jitted[name], batch_of, states_of[name], range(1))()  # warm-up: one step per member
        timed[name] = member_chunk(jitted[name], batch_of, states_of[name], range(1, steps + 1))

    # The guide's own loop (its apply_model / update_model with a flax TrainState, one model,
    # its batch gathering), for members without mutable collections as the guide's CNN.
    stateful = any(k != "params" for k in variables[0])
    guide = not stateful
    if guide:
        train_cfg = built.config.train
        guide_tx = optax.sgd(train_cfg.learning_rate, train_cfg.momentum)

        @jax.jit
        def apply_model(state, images, labels):
            def loss_fn(params):
                logits = _member_apply(model, {"params": params}, images, precision, train=True)
                logits = logits.astype(jnp.float32)
                one_hot = jax.nn.one_hot(labels, NUM_CLASSES)
                loss = optax.softmax_cross_entropy(logits=logits, labels=one_hot).mean()
                return loss, logits

            grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
            (loss, logits), grads = grad_fn(state.params)
            accuracy = jnp.mean(jnp.argmax(logits, -1) == labels)
            return grads, loss, accuracy

        @jax.jit
        def update_model(state, grads):
            return state.apply_gradients(grads=grads)

        # the Flax MNIST example's get_datasets: images float32 in [0, 1] as a jnp (device)
        # array, labels the host numpy array; the guide's permutation of the epoch, on device
        guide_ds = {"image": jnp.float32(train_x) / 255.0, "label": train_y}
        per_epoch = len(train_x) // BATCH
        guide_states = [
            train_state.TrainState.create(apply_fn=model.apply, params=p, tx=guide_tx) for p, _, _ in fresh_states()
        ]
        perms = [
            jax.random.permutation(jax.random.fold_in(keys["data"][m], 0), len(train_x))[: per_epoch * BATCH].reshape(
                (per_epoch, BATCH)
            )
            for m in range(e)
        ]  # the rows are order[:, m]: the batches the other loops train on
        warm_perms, timed_perms = [p[:1] for p in perms], [p[1 : steps + 1] for p in perms]

        def guide_chunk(member_perms: list) -> Callable[[], None]:
            def chunk() -> None:
                for m in range(e):
                    guide_states[m], _, _ = _guide_train_epoch(
                        guide_states[m], guide_ds, member_perms[m], apply_model, update_model
                    )
                jax.block_until_ready(guide_states)

            return chunk

        guide_chunk(warm_perms)()
        timed["guide"] = guide_chunk(timed_perms)

    seconds = _best_of_each(repeats, timed)
    for name, sec in seconds.items():
        out[f"train_seconds_{name}"] = sec
        out[f"train_member_images_per_s_{name}"] = e * steps * BATCH / sec
    if not guide:
        out["train_member_images_per_s_guide"] = None
        out["guide_skipped"] = "members with mutable collections: the guide's TrainState step has none"
    fair = max(("fair_host", "fair_device"), key=lambda n: out[f"train_member_images_per_s_{n}"])
    out["fair_variant"] = fair.removeprefix("fair_")
    out["train_seconds"] = seconds[fair]
    out["compile_seconds"] = out[f"compile_seconds_{fair}"]
    out["donate"] = donate
    if guide:
        out["fair_over_guide"] = out[f"train_member_images_per_s_{fair}"] / out["train_member_images_per_s_guide"]
    if not args.skip_same_options:
        # the fair loop's step with the compiler options of the project's train step: what
        # the ensemble gains over a loop compiled as the project compiles
        fn, donated_args, batch_of = loops[fair]
        options = train_compiler_options(backend, batch_norm=stateful)
        same = jax.jit(fn, donate_argnums=donated_args, compiler_options=options)
        same_states = fresh_states()
        member_chunk(same, batch_of, same_states, range(1))()  # compile and warm up
        same_chunk = member_chunk(same, batch_of, same_states, range(1, steps + 1))
        out["train_seconds_same_options"] = best_of(repeats, same_chunk)
        out["train_member_images_per_s_same_options"] = e * steps * BATCH / out["train_seconds_same_options"]

    # evaluation: softmax probabilities of every member, EVAL_BATCH test images per call
    def probs(p, ms, xb):
        logits = _member_apply(model, {"params": p, **ms}, data_lib.to_float(xb), precision, train=False)
        return jax.nn.softmax(logits.astype(jnp.float32))

    apply = jax.jit(probs)
    members = states_of[fair]
    starts = range(0, len(test_x), EVAL_BATCH)
    test_dev = jnp.asarray(test_x)
    test_batches = [jax.device_put(test_x[i : i + EVAL_BATCH]) for i in starts]

    def eval_chunk(batch_of: Callable[[int, int], Any]) -> Callable[[], None]:
        def chunk() -> None:
            res = [[apply(*members[m][:2], batch_of(j, i)) for j, i in enumerate(starts)] for m in range(e)]
            jax.block_until_ready(res)

        return chunk

    evals = {
        "host": eval_chunk(lambda j, i: test_x[i : i + EVAL_BATCH]),  # host slices, as member_probs passes them
        "device": eval_chunk(lambda j, i: test_batches[j]),  # the test set on the device, split beforehand
        "gather": eval_chunk(lambda j, i: test_dev[i : i + EVAL_BATCH]),  # a device array sliced outside (old loop)
    }
    for chunk in evals.values():
        chunk()  # compile
    eval_seconds = _best_of_each(repeats, evals)
    for name, sec in eval_seconds.items():
        out[f"eval_seconds_{name}"] = sec
        out[f"eval_member_images_per_s_{name}"] = e * len(test_x) / sec
    best_eval = min(("host", "device"), key=lambda n: eval_seconds[n])
    out["eval_variant"] = best_eval
    out["eval_seconds"] = eval_seconds[best_eval]
    p0, ms0 = members[0][0], members[0][1]
    out["eval_flops_per_image"] = count_flops(probs, p0, ms0, test_x[:EVAL_BATCH]) / EVAL_BATCH
    out["xla_eval_flops_per_image"] = _flops(apply.lower(p0, ms0, test_x[:EVAL_BATCH]).compile()) / EVAL_BATCH


def _worker(args: argparse.Namespace) -> dict:
    """One measurement (``--worker``): method ``peak``, ``project`` or ``loop`` for one model and E."""
    from flows import environment  # noqa: F401  (device layout and env, as in the flows)

    if args.method == "peak":
        return matmul_peak(args.precision)

    import jax
    import numpy as np

    from ensemble_core import data as data_lib
    from ensemble_core import ensemble_setup as setup
    from ensemble_core import rngs
    from ensemble_core.config import PipelineConfig

    tfds_dir = data_lib.prepare(data_lib.EMBEDDED, args.data_dir).tfds_data_dir
    train_x, train_y = data_lib.load_split(data_lib.EMBEDDED, "train", tfds_dir)
    test_x, _ = data_lib.load_split(data_lib.EMBEDDED, "test", tfds_dir)
    e, steps = args.size, args.steps
    name, options = MODELS[args.model]
    strategy_option = "vmap" if args.strategy == "vmap_patches" else (args.strategy or "auto")
    overrides = precision_overrides(args.precision)
    cfg = PipelineConfig.model_validate(
        {
            "model": {"name": name, "options": options},
            "ensemble": {"size": e},
            "mesh": {"member_strategy": strategy_option},
            **overrides,
        }
    )
    built = setup.build(cfg, NUM_CLASSES)
    keys = built.member_keys()
    order = np.stack([rngs.epoch_order(keys["data"], 0, len(train_x), BATCH)[: steps + 1]])[0]  # [S+1, E, B]
    out = {
        "model": args.model,
        "size": e,
        "method": args.method,
        "precision": args.precision,
        "backend": jax.default_backend(),
        "device_kind": jax.devices()[0].device_kind,  # e.g. 'NVIDIA H100 80GB HBM3', 'cpu'
        "devices": jax.device_count(),
    }
    if args.method == "project":
        _project_worker(args, built, keys, order, train_x, train_y, test_x, out)
    else:
        _loop_worker(args, built, keys, order, train_x, train_y, test_x, out)
    out["train_member_images_per_s"] = e * steps * BATCH / out["train_seconds"]
    out["eval_member_images_per_s"] = e * len(test_x) / out["eval_seconds"]
    out["peak_host_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    stats = jax.devices()[0].memory_stats() if hasattr(jax.devices()[0], "memory_stats") else None
    out["peak_device_mb"] = stats["peak_bytes_in_use"] / 2**20 if stats and "peak_bytes_in_use" in stats else None
    return out


# MARK: driver


def run_worker(model: str, size: int, method: str, args, env: dict | None = None, strategy: str | None = None) -> dict:
    """Measure one configuration in a fresh worker process (``python -m benchmarks.bench
    --worker``), so that compile time, peak memory and the JAX state are its own.

    Args:
      model: a :data:`MODELS` name.
      size: the ensemble size E.
      method: ``"project"`` (the project's ensemble step and evaluation), ``"loop"`` (the
        per-member Linen loops: the fair loop, the guide's loop, the old gather loop) or
        ``"peak"`` (the matmul roofline).
      args: a namespace with ``steps``, ``data_dir``, ``repeats`` and ``skip_same_options``
        (as :func:`main` parses them), and optionally ``precision`` (default ``float32``).
      env: the worker's environment (``XLA_FLAGS``, ``JAX_COMPILATION_CACHE_DIR``);
        default: this process's.
      strategy: a :data:`STRATEGY_CHOICES` value overriding the member strategy, or None.

    Returns:
      The worker's measurement: ``train_member_images_per_s``, ``eval_member_images_per_s``,
      ``compile_seconds``, ``peak_host_mb``, the backend and device count, and more (the
      loop worker: every loop's ``train_member_images_per_s_<loop>`` of :data:`LOOPS`, the
      FLOPs per image counted and by XLA).

    Raises:
      SystemExit: the worker failed (its command and the tail of its stderr).
    """
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.bench",
        "--worker",
        "--model",
        model,
        "--size",
        str(size),
        "--method",
        method,
        "--steps",
        str(args.steps),
        "--data-dir",
        args.data_dir,
        "--repeats",
        str(args.repeats),
        "--precision",
        getattr(args, "precision", "float32"),
    ]
    if strategy:
        cmd += ["--strategy", strategy]
    if args.skip_same_options:
        cmd += ["--skip-same-options"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env or os.environ.copy())
    if proc.returncode:
        raise SystemExit(f"worker failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def compare(model: str, size: int, project: dict, loop: dict) -> dict:
    """One row of the result file: the project's and the loop worker's measurements of one
    model and E, and the ratios between them.

    Args:
      model: a :data:`MODELS` name; size: E.
      project, loop: :func:`run_worker`'s results of methods ``project`` and ``loop``.

    Returns:
      ``{"model", "size", "project", "loop", ...}`` with ``train_speedup`` and
      ``eval_speedup`` against the fair loop (``loop["train_member_images_per_s"]``),
      ``train_speedup_guide`` / ``train_speedup_gather`` / ``eval_speedup_gather``
      against the guide's and the old gather loop, ``train_speedup_same_options`` against
      ``loop*`` (None where not measured), ``fair_over_guide``, and the FLOPs per image
      counted from the jaxpr (``train_flops_per_image``, ``eval_flops_per_image``) and by
      XLA's cost analysis (``xla_train_flops_per_image``, ``xla_eval_flops_per_image``).
    """
    p_train, p_eval = project["train_member_images_per_s"], project["eval_member_images_per_s"]
    return {
        "model": model,
        "size": size,
        "project": project,
        "loop": loop,
        "train_speedup": p_train / loop["train_member_images_per_s"],
        "train_speedup_guide": _ratio(p_train, loop.get("train_member_images_per_s_guide")),
        "train_speedup_gather": _ratio(p_train, loop.get("train_member_images_per_s_gather")),
        "train_speedup_same_options": _ratio(p_train, loop.get("train_member_images_per_s_same_options")),
        "eval_speedup": p_eval / loop["eval_member_images_per_s"],
        "eval_speedup_gather": _ratio(p_eval, loop.get("eval_member_images_per_s_gather")),
        "fair_over_guide": loop.get("fair_over_guide"),
        **{
            key: loop[key]
            for key in (
                "train_flops_per_image",
                "xla_train_flops_per_image",
                "eval_flops_per_image",
                "xla_eval_flops_per_image",
            )
        },
    }


def _num(value: float | None, width: int, fmt: str = ".0f", suffix: str = "") -> str:
    return f"{'-':>{width}}" if value is None else f"{format(value, fmt) + suffix:>{width}}"


def _table(rows: list[dict]) -> str:
    head = (
        f"{'model':13} {'E':>3} | {'train proj':>10} {'fair loop':>10} {'speedup':>7} {'guide':>8} "
        f"{'gather':>8} {'speedup':>7} {'loop*':>7} {'speedup*':>8} | "
        f"{'eval proj':>10} {'eval loop':>10} {'speedup':>7} | {'compile s':>9} | {'peak MB':>8} | strategy"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        p, lp = r["project"], r["loop"]
        lines.append(
            f"{r['model']:13} {r['size']:>3} | {p['train_member_images_per_s']:>10.0f} "
            f"{lp['train_member_images_per_s']:>10.0f} {_num(r['train_speedup'], 7, '.2f', 'x')} "
            f"{_num(lp.get('train_member_images_per_s_guide'), 8)} "
            f"{_num(lp.get('train_member_images_per_s_gather'), 8)} "
            f"{_num(r.get('train_speedup_gather'), 7, '.2f', 'x')} "
            f"{_num(lp.get('train_member_images_per_s_same_options'), 7)} "
            f"{_num(r.get('train_speedup_same_options'), 8, '.2f', 'x')} | "
            f"{p['eval_member_images_per_s']:>10.0f} {lp['eval_member_images_per_s']:>10.0f} "
            f"{r['eval_speedup']:>6.2f}x | {p['compile_seconds']:>9.2f} | {p['peak_host_mb']:>8.0f} | "
            f"{p['strategy']} mesh {p['mesh']['ensemble']}x{p['mesh']['data']}"
        )
    return "\n".join(lines)


def _plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    models = list(dict.fromkeys(r["model"] for r in rows))
    several = len({r["project"]["strategy"] for r in rows}) > 1
    lines = [(m, st) for m in models for st in dict.fromkeys(r["project"]["strategy"] for r in rows if r["model"] == m)]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    # the loop's lines: (key of the loop worker's figure, style, label); the fair loop first
    loop_lines = {
        "train": [
            ("train_member_images_per_s", "s--", "per-member loop (fair)"),
            ("train_member_images_per_s_guide", "v-.", "Flax guide's loop"),
            ("train_member_images_per_s_gather", "x:", "loop (gather outside)"),
            ("train_member_images_per_s_same_options", "^:", "fair loop, project's compiler options"),
        ],
        "eval": [("eval_member_images_per_s", "s--", "per-member loop (fair)")],
    }
    for ax, kind in zip(axes, ("train", "eval"), strict=True):
        for i, (model, strategy) in enumerate(lines):
            color = colors[i % len(colors)]
            rs = [r for r in rows if r["model"] == model and r["project"]["strategy"] == strategy]
            sizes = [r["size"] for r in rs]
            first_of_model = lines.index((model, strategy)) == [m for m, _ in lines].index(model)
            ax.plot(
                sizes,
                [r["project"][f"{kind}_member_images_per_s"] for r in rs],
                "o-",
                color=color,
                label=f"{model}: ensemble-pipeline" + (f" ({strategy})" if several else ""),
            )
            if not first_of_model:
                continue  # the loops do not depend on the strategy: one set of lines per model
            for key, style, label in loop_lines[kind]:
                if all(r["loop"].get(key) for r in rs):
                    ax.plot(sizes, [r["loop"][key] for r in rs], style, color=color, label=f"{model}: {label}")
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="ensemble size E",
            ylabel="member-images / s",
            title=f"{KIND_TITLES[kind]} throughput ({title})",
        )
        ax.set_xticks(sorted({r["size"] for r in rows}), labels=[str(s) for s in sorted({r["size"] for r in rows})])
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def add_roofline(rows: list[dict]) -> None:
    """Add achieved GFLOP/s to every row, in place: ``<kind>_gflops_per_s`` of the project
    and of the fair loop, and ``train_gflops_per_s_<loop>`` of the other loops, each the
    member-images/s times the FLOPs per image counted from the jaxpr
    (``row["train_flops_per_image"]`` / ``row["eval_flops_per_image"]``, :mod:`benchmarks.flops`),
    in 1e9 FLOP/s."""
    for r in rows:
        for kind in ("train", "eval"):
            flops = r[f"{kind}_flops_per_image"]
            for who in ("project", "loop"):
                r[who][f"{kind}_gflops_per_s"] = r[who][f"{kind}_member_images_per_s"] * flops / 1e9
        for name in LOOPS:
            rate = r["loop"].get(f"train_member_images_per_s_{name}")
            r["loop"][f"train_gflops_per_s_{name}"] = None if rate is None else rate * r["train_flops_per_image"] / 1e9


def _roofline_lines(result: dict) -> list[str]:
    rows, peak = result["rows"], result["peak"]
    gflops = peak["matmul_gflops_per_s"]
    lines = [
        f"roofline: {peak['precision']} matmul peak {gflops:.0f} GFLOP/s (jitted {peak['matmul_n']}^3 matmul, "
        f"{peak['matmul']}; at XLA's default precision {peak['default_precision_matmul_gflops_per_s']:.0f}); "
        "FLOPs counted from the jaxpr (matmuls and convolutions), XLA's cost analysis in brackets"
    ]
    for r in rows:
        if r["size"] != max(x["size"] for x in rows):
            continue
        lp, pr = r["loop"], r["project"]
        lines.append(
            f"  {r['model']} E={r['size']} {pr['strategy']}: "
            f"train {r['train_flops_per_image'] / 1e6:.1f} MFLOP/img ({r['xla_train_flops_per_image'] / 1e6:.1f}), "
            f"project {pr['train_gflops_per_s']:.0f} GFLOP/s ({100 * pr['train_gflops_per_s'] / gflops:.0f}% of peak), "
            f"fair loop {lp['train_gflops_per_s']:.0f} ({100 * lp['train_gflops_per_s'] / gflops:.0f}%); "
            f"eval {r['eval_flops_per_image'] / 1e6:.1f} MFLOP/img ({r['xla_eval_flops_per_image'] / 1e6:.1f}), "
            f"project {100 * pr['eval_gflops_per_s'] / gflops:.0f}% of peak, "
            f"fair loop {100 * lp['eval_gflops_per_s'] / gflops:.0f}%"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="cnn,mlp")
    parser.add_argument("--sizes", default="1,2,4,8,16,32")
    parser.add_argument("--steps", type=int, default=10, help="timed training steps per member")
    parser.add_argument(
        "--strategy",
        help=f"override the member strategy: one or a comma-separated list of {', '.join(STRATEGY_CHOICES)} "
        "(each a row against the same loop measurement)",
    )
    parser.add_argument("--repeats", type=int, default=REPEATS, help="timed chunks per measurement; the fastest counts")
    parser.add_argument(
        "--precision",
        choices=PRECISION_CHOICES,
        default="float32",
        help="compute precision of the project's step (train.precision), the loops' steps and the matmul peak "
        "(float32: Precision.HIGHEST; high: Precision.HIGH; bfloat16: bfloat16 inputs, float32 accumulation)",
    )
    parser.add_argument(
        "--skip-same-options",
        action="store_true",
        help="skip loop* (the fair loop with the project's compiler options)",
    )
    parser.add_argument(
        "--devices",
        type=int,
        help="simulated host devices of the project's workers (XLA_FLAGS=--xla_force_host_platform_device_count; "
        "default: the flows' 8)",
    )
    parser.add_argument("--data-dir", default=str(Path(tempfile.gettempdir()) / "ensemble-bench-tfds"))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "latest.json"))
    parser.add_argument("--compile-cache", action="store_true", help="also measure cold vs warm compile cache")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--method", choices=["project", "loop", "peak"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in args.models.split(","):
        if name not in MODELS:
            parser.error(f"unknown model {name!r}; use one of {', '.join(MODELS)}")
        if name in PROJECT_ONLY:
            parser.error(f"{name!r} has no per-member loop to compare with; python -m benchmarks.nnx_vs_linen runs it")
    strategies = args.strategy.split(",") if args.strategy else [None]
    for st in strategies:
        if st is not None and st not in STRATEGY_CHOICES:
            parser.error(f"unknown strategy {st!r}; use one of {', '.join(STRATEGY_CHOICES)}")
    if args.worker:
        if args.method != "peak" and args.model in PROJECT_ONLY and args.method == "loop":
            parser.error(f"{args.model!r} has no per-member loop (Flax Linen's pattern)")
        print(json.dumps(_worker(args)))
        return 0

    env = os.environ.copy()
    cache = tempfile.mkdtemp(prefix="ensemble-bench-jax-")
    env["JAX_COMPILATION_CACHE_DIR"] = cache  # fresh per benchmark: compile times are cold
    if args.devices:
        flags = " ".join(f for f in env.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f)
        env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={args.devices}".strip()
    rows = []
    for model in args.models.split(","):
        for size in map(int, args.sizes.split(",")):
            loop = None
            for strategy in strategies:
                project = run_worker(model, size, "project", args, env, strategy)
                if loop is None:  # one loop measurement per model and size, whatever the strategies
                    loop = run_worker(model, size, "loop", args, env)
                rows.append(compare(model, size, project, loop))
                print(_table(rows[-1:]).splitlines()[-1], flush=True)
    result = {
        **{k: v for k, v in stamp().items() if k != "machine"},  # date, commit
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "cpus": os.cpu_count(),
            "backend": rows[0]["project"]["backend"],
            "device_kind": rows[0]["project"].get("device_kind"),
            "devices": rows[0]["project"]["devices"],
        },
        "batch_size": BATCH,
        "image_shape": list(IMAGE_SHAPE),
        "steps": args.steps,
        "repeats": args.repeats,
        "precision": args.precision,
        "xla_flags": env.get("XLA_FLAGS", ""),
        "command": "python -m benchmarks.bench " + " ".join(argv if argv is not None else sys.argv[1:]),
        "peak": run_worker("cnn", 1, "peak", args, env),
        "rows": rows,
    }
    if args.compile_cache:
        warm_cache = tempfile.mkdtemp(prefix="ensemble-bench-jax-")
        env["JAX_COMPILATION_CACHE_DIR"] = warm_cache
        cold = run_worker("cnn", 8, "project", args, env)["compile_seconds"]
        warm = run_worker("cnn", 8, "project", args, env)["compile_seconds"]
        result["compile_cache"] = {
            "model": "cnn",
            "size": 8,
            "cold_seconds": cold,
            "warm_seconds": warm,
            "warm_over_cold": warm / cold,
        }
    add_roofline(rows)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    _plot(rows, out.with_suffix(".png"), f"{result['machine']['backend']}, {result['machine']['cpus']} cores")
    print()
    print(_table(rows))
    print()
    print("\n".join(_roofline_lines(result)))
    guide = [r["fair_over_guide"] for r in rows if r.get("fair_over_guide") is not None]
    if guide:
        print(f"\nfair loop / guide's loop: {min(guide):.2f}x to {max(guide):.2f}x (training member-images/s)")
    if "compile_cache" in result:
        c = result["compile_cache"]
        print(
            f"\ncompile cache (cnn, E=8): cold {c['cold_seconds']:.2f} s, warm {c['warm_seconds']:.2f} s "
            f"({100 * c['warm_over_cold']:.0f}%)"
        )
    print(f"\nwritten: {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
