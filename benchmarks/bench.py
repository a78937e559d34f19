"""Ensemble training/evaluation throughput against the seed's per-member loop.

    python -m benchmarks.bench                      # full table: cnn+mlp, E in 1..32
    python -m benchmarks.bench --models cnn --sizes 8 --steps 10
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
- ``loop``: the baseline of the seed documents: each member trained alone by its own
  jitted single-model step, one member after another, and evaluated the same way. The
  step is Flax's single-model pattern: ``apply(..., train=True, mutable=[collections],
  rngs={'dropout': key})`` with the member's mutable collections (BatchNorm's
  ``batch_stats``) carried from step to step; evaluation applies ``train=False``.
  ``loop*`` (``train_member_images_per_s_same_options``) is that loop compiled with the
  project's train-step compiler options (:func:`ensemble_core.train.train_compiler_options`):
  ``speedup*`` is what the ensemble gains over a loop compiled as the project compiles.

Throughput is in member-images per second at batch 128 per member, steady state
(compilation excluded and reported separately; the fastest of 3 timed chunks); peak host memory is the worker's
``ru_maxrss``; device memory is reported where the backend exposes ``memory_stats``.
``--compile-cache`` measures a cold and a warm persistent-compilation-cache start.
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

from benchmarks._provenance import stamp

BATCH = 128
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


def _best_of(repeats: int, fn) -> float:
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


def _matmul_peak() -> dict:
    """The machine's attainable float32 FLOP/s on one device: a jitted 2048^3 matmul."""
    import jax
    import jax.numpy as jnp

    n = 2048
    a = jnp.ones((n, n), jnp.float32)
    f = jax.jit(lambda a: a @ a)
    f(a).block_until_ready()
    # best of 10 chunks: on a shared machine a short measurement can land in a slow moment
    seconds = _best_of(10, lambda: [f(a) for _ in range(5)][-1].block_until_ready()) / 5
    return {"matmul_n": n, "matmul_gflops_per_s": 2 * n**3 / seconds / 1e9}


def _worker(args: argparse.Namespace) -> dict:
    from flows import _env  # noqa: F401  (device layout and env, as in the flows)

    if args.method == "peak":
        return _matmul_peak()

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from ensemble_core import data as data_lib
    from ensemble_core import ensemble_setup as setup
    from ensemble_core import rngs
    from ensemble_core.config import PipelineConfig
    from ensemble_core.mesh import replicated
    from ensemble_core.predict import member_probs
    from ensemble_core.train import cross_entropy, train_compiler_options

    tfds_dir = data_lib.prepare(data_lib.EMBEDDED, args.data_dir).tfds_data_dir
    train_x, train_y = data_lib.load_split(data_lib.EMBEDDED, "train", tfds_dir)
    test_x, _ = data_lib.load_split(data_lib.EMBEDDED, "test", tfds_dir)
    e, steps, repeats = args.size, args.steps, args.repeats
    name, options = MODELS[args.model]
    patches = args.strategy == "vmap_patches"
    strategy_option = "vmap" if patches else (args.strategy or "auto")
    cfg = PipelineConfig.model_validate(
        {
            "model": {"name": name, "options": options},
            "ensemble": {"size": e},
            "mesh": {"member_strategy": strategy_option},
        }
    )
    built = setup.build(cfg, 10)
    if patches:
        from benchmarks.conv_patches import conv_as_patches

        intercept: Callable[[], contextlib.AbstractContextManager[Any]] = conv_as_patches  # every trace inside it
    else:
        intercept = contextlib.nullcontext
    model, tx = built.model, built.optimizer
    keys = built.member_keys()
    order = np.stack([rngs.epoch_order(keys["data"], 0, len(train_x), BATCH)[: steps + 1]])[0]  # [S+1, E, B]
    out = {
        "model": args.model,
        "size": e,
        "method": args.method,
        "backend": jax.default_backend(),
        "device_kind": jax.devices()[0].device_kind,  # e.g. 'NVIDIA H100 80GB HBM3', 'cpu'
        "devices": jax.device_count(),
    }

    if args.method == "project":
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

        out["train_seconds"] = _best_of(repeats, train_chunk)
        predict = built.predict_fn()
        one = strategy == "unroll"

        def eval_all():
            with intercept():
                member_probs(predict, state.variables, test_x, mesh, EVAL_BATCH, one_member_per_device=one)

        eval_all()  # compile
        out["eval_seconds"] = _best_of(repeats, eval_all)
        out.update(
            strategy="vmap_patches" if patches else strategy, mesh={"ensemble": plan.ensemble, "data": plan.data}
        )
    else:
        import flax.linen as nn

        assert isinstance(model, nn.Module), "the per-member loop is Flax Linen's pattern: a registry model"

        # The seed's step, as a user writes it for one Flax model (Flax's examples): mutable
        # collections (BatchNorm's batch_stats) updated in training mode, dropout from a key.
        def single_step(params, model_state, opt_state, xb, yb, key):
            def loss_fn(p):
                logits, updates = model.apply(
                    {"params": p, **model_state},
                    data_lib.to_float(xb),
                    train=True,
                    mutable=list(model_state),
                    rngs={"dropout": key},
                )
                return cross_entropy(logits, yb).mean(), updates

            grads, updates = jax.grad(loss_fn, has_aux=True)(params)
            new_state = {name: updates[name] for name in model_state}
            grad_updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, grad_updates), new_state, opt_state

        step = jax.jit(single_step)
        # the same step with the compiler options of the project's train step: what the
        # ensemble gains over a loop compiled as the project compiles
        step_same_options = jax.jit(single_step, compiler_options=train_compiler_options(jax.default_backend()))
        apply = jax.jit(
            lambda p, ms, xb: jax.nn.softmax(
                cast(jax.Array, model.apply({"params": p, **ms}, data_lib.to_float(xb), train=False))
            )
        )
        variables = [model.init(keys["init"][m], jnp.zeros((1, *IMAGE_SHAPE)), train=False) for m in range(e)]
        members = [v["params"] for v in variables]
        mstate = [{k: v for k, v in dict(var).items() if k != "params"} for var in variables]
        opt = [tx.init(p) for p in members]
        dropout = [jax.random.fold_in(keys["stochastic"][m], 0) for m in range(e)]
        x, y = jnp.asarray(train_x), jnp.asarray(train_y)
        first = order[0, 0]
        t0 = time.perf_counter()
        compiled_step = step.lower(members[0], mstate[0], opt[0], x[first], y[first], dropout[0]).compile()
        out["compile_seconds"] = time.perf_counter() - t0
        out["train_flops_per_image"] = _flops(compiled_step) / BATCH

        def loop_chunk(fn=step, steps_range=range(1, steps + 1)):
            for m in range(e):
                for s in steps_range:
                    members[m], mstate[m], opt[m] = fn(
                        members[m], mstate[m], opt[m], x[order[s, m]], y[order[s, m]], dropout[m]
                    )
            jax.block_until_ready(members)

        loop_chunk(step, range(1))  # warm-up: one step per member (as the project's warm-up step)
        out["train_seconds"] = _best_of(repeats, loop_chunk)
        if not args.skip_same_options:
            loop_chunk(step_same_options, range(1))  # compile and warm up
            out["train_seconds_same_options"] = _best_of(repeats, lambda: loop_chunk(step_same_options))
            out["train_member_images_per_s_same_options"] = e * steps * BATCH / out["train_seconds_same_options"]
        tx_dev = jnp.asarray(test_x)

        def eval_all():
            res = [
                [apply(members[m], mstate[m], tx_dev[i : i + EVAL_BATCH]) for i in range(0, len(test_x), EVAL_BATCH)]
                for m in range(e)
            ]
            jax.block_until_ready(res)

        eval_all()  # compile
        out["eval_flops_per_image"] = (
            _flops(apply.lower(members[0], mstate[0], tx_dev[:EVAL_BATCH]).compile()) / EVAL_BATCH
        )
        out["eval_seconds"] = _best_of(repeats, eval_all)

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
        per-member Linen baseline) or ``"peak"`` (the matmul roofline).
      args: a namespace with ``steps``, ``data_dir``, ``repeats`` and ``skip_same_options``
        (as :func:`main` parses them).
      env: the worker's environment (``XLA_FLAGS``, ``JAX_COMPILATION_CACHE_DIR``);
        default: this process's.
      strategy: a :data:`STRATEGY_CHOICES` value overriding the member strategy, or None.

    Returns:
      The worker's measurement: ``train_member_images_per_s``, ``eval_member_images_per_s``,
      ``compile_seconds``, ``peak_host_mb``, the backend and device count, and more.

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
    ]
    if strategy:
        cmd += ["--strategy", strategy]
    if args.skip_same_options:
        cmd += ["--skip-same-options"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env or os.environ.copy())
    if proc.returncode:
        raise SystemExit(f"worker failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _table(rows: list[dict]) -> str:
    head = (
        f"{'model':13} {'E':>3} | {'train proj':>10} {'train loop':>10} {'speedup':>7} {'loop*':>7} {'speedup*':>8} | "
        f"{'eval proj':>10} {'eval loop':>10} {'speedup':>7} | {'compile s':>9} | {'peak MB':>8} | strategy"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        p, lp = r["project"], r["loop"]
        if r.get("train_speedup_same_options") is None:
            same = f"{'-':>7} {'-':>8} | "
        else:
            same = f"{lp['train_member_images_per_s_same_options']:>7.0f} {r['train_speedup_same_options']:>7.2f}x | "
        lines.append(
            f"{r['model']:13} {r['size']:>3} | {p['train_member_images_per_s']:>10.0f} "
            f"{lp['train_member_images_per_s']:>10.0f} {r['train_speedup']:>6.2f}x "
            f"{same}"
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
                continue  # the loop does not depend on the strategy: one line per model
            ax.plot(
                sizes,
                [r["loop"][f"{kind}_member_images_per_s"] for r in rs],
                "s--",
                color=color,
                label=f"{model}: per-member loop",
            )
            if kind == "train" and all(r["loop"].get("train_member_images_per_s_same_options") for r in rs):
                ax.plot(
                    sizes,
                    [r["loop"]["train_member_images_per_s_same_options"] for r in rs],
                    "^:",
                    color=color,
                    label=f"{model}: loop, project's compiler options",
                )
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
        "--skip-same-options", action="store_true", help="skip loop* (the loop with the project's compiler options)"
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
                same = loop.get("train_member_images_per_s_same_options")
                rows.append(
                    {
                        "model": model,
                        "size": size,
                        "project": project,
                        "loop": loop,
                        "train_speedup": project["train_member_images_per_s"] / loop["train_member_images_per_s"],
                        "train_speedup_same_options": project["train_member_images_per_s"] / same if same else None,
                        "eval_speedup": project["eval_member_images_per_s"] / loop["eval_member_images_per_s"],
                    }
                )
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
    for r in rows:  # achieved GFLOP/s, from the loop worker's FLOPs per image (same model)
        for kind in ("train", "eval"):
            flops = r["loop"][f"{kind}_flops_per_image"]
            for who in ("project", "loop"):
                r[who][f"{kind}_gflops_per_s"] = r[who][f"{kind}_member_images_per_s"] * flops / 1e9
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    _plot(rows, out.with_suffix(".png"), f"{result['machine']['backend']}, {result['machine']['cpus']} cores")
    print()
    print(_table(rows))
    peak = result["peak"]["matmul_gflops_per_s"]
    print(f"\nroofline: float32 matmul peak {peak:.0f} GFLOP/s (jitted {result['peak']['matmul_n']}^3 matmul)")
    for r in rows:
        if r["size"] == max(x["size"] for x in rows):
            lp = r["loop"]
            print(
                f"  {r['model']} E={r['size']} {r['project']['strategy']}: "
                f"train {lp['train_flops_per_image'] / 1e6:.1f} MFLOP/img, "
                f"project {r['project']['train_gflops_per_s']:.0f} GFLOP/s "
                f"({100 * r['project']['train_gflops_per_s'] / peak:.0f}% of peak), "
                f"loop {lp['train_gflops_per_s']:.0f} ({100 * lp['train_gflops_per_s'] / peak:.0f}%); "
                f"eval {lp['eval_flops_per_image'] / 1e6:.1f} MFLOP/img, project "
                f"{100 * r['project']['eval_gflops_per_s'] / peak:.0f}% of peak, "
                f"loop {100 * lp['eval_gflops_per_s'] / peak:.0f}%"
            )
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
