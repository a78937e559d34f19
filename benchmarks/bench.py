"""Ensemble training/evaluation throughput against the seed's per-member loop.

    python -m benchmarks.bench                      # full table: cnn+mlp, E in 1..32
    python -m benchmarks.bench --models cnn --sizes 8 --steps 10

For each model and ensemble size E, two fresh worker processes (so peak memory is per
configuration) measure:

- ``project``: ``ensemble_core``'s jitted struct-of-arrays step on the mesh and member
  strategy the project picks (or ``--strategy``), and the vmapped evaluation;
- ``loop``: the baseline of the seed documents: each member trained alone by its own
  jitted single-model step, one member after another, and evaluated the same way.
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
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BATCH = 128
EVAL_BATCH = 250  # test images per forward pass, project and loop alike (the default eval.batch_size)
KIND_TITLES = {"train": "training", "eval": "evaluation"}
REPEATS = 3  # timed chunks per measurement; the fastest counts (least disturbed)


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
    from ensemble_core import rngs, setup
    from ensemble_core.config import PipelineConfig
    from ensemble_core.mesh import replicated
    from ensemble_core.predict import member_probs
    from ensemble_core.train import cross_entropy, train_compiler_options

    data_lib.prepare(data_lib.EMBEDDED, args.data_dir)
    train_x, train_y = data_lib.load_split(data_lib.EMBEDDED, "train", args.data_dir)
    test_x, _ = data_lib.load_split(data_lib.EMBEDDED, "test", args.data_dir)
    e, steps = args.size, args.steps
    cfg = PipelineConfig.model_validate(
        {"model": {"name": args.model}, "ensemble": {"size": e}, "mesh": {"member_strategy": args.strategy or "auto"}}
    )
    built = setup.build(cfg, 10)
    model, tx = built.model, built.optimizer
    keys = built.member_keys()
    order = np.stack([rngs.epoch_order(keys["data"], 0, len(train_x), BATCH)[: steps + 1]])[0]  # [S+1, E, B]
    out = {
        "model": args.model,
        "size": e,
        "method": args.method,
        "backend": jax.default_backend(),
        "devices": jax.device_count(),
    }

    if args.method == "project":
        strategy, plan, mesh = built.strategy, built.plan, built.mesh
        state = built.init_state(keys["init"], (28, 28, 1))
        x = jax.device_put(train_x, replicated(mesh))
        y = jax.device_put(train_y, replicated(mesh))
        sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("ensemble", "data"))
        idx = [jax.device_put(o, sharding) for o in order]
        step = built.train_step()
        member_keys = jax.device_put(
            keys["stochastic"], jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("ensemble"))
        )
        t0 = time.perf_counter()
        compiled = step.lower(state, x, y, member_keys, idx[0]).compile()
        out["compile_seconds"] = time.perf_counter() - t0
        state, m = compiled(state, x, y, member_keys, idx[0])  # warm-up
        jax.block_until_ready(m)

        def train_chunk():
            nonlocal state
            for s in range(1, steps + 1):
                state, m = compiled(state, x, y, member_keys, idx[s])
            jax.block_until_ready((state, m))

        out["train_seconds"] = _best_of(REPEATS, train_chunk)
        predict = built.predict_fn()
        one = strategy == "unroll"
        member_probs(predict, state.variables, test_x, mesh, EVAL_BATCH, one_member_per_device=one)  # compile
        out["eval_seconds"] = _best_of(
            REPEATS, lambda: member_probs(predict, state.variables, test_x, mesh, EVAL_BATCH, one_member_per_device=one)
        )
        out.update(strategy=strategy, mesh={"ensemble": plan.ensemble, "data": plan.data})
    else:

        def single_step(params, opt_state, xb, yb):
            logits = lambda p: model.apply({"params": p}, data_lib.to_float(xb), train=True)  # noqa: E731
            grads = jax.grad(lambda p: cross_entropy(logits(p), yb).mean())(params)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        step = jax.jit(single_step)  # the seed's step, as a user writes it
        # the same step with the compiler options of the project's train step: what the
        # ensemble gains over a loop compiled as the project compiles
        step_same_options = jax.jit(single_step, compiler_options=train_compiler_options(jax.default_backend()))
        apply = jax.jit(lambda p, xb: jax.nn.softmax(model.apply({"params": p}, data_lib.to_float(xb))))
        members = [model.init(keys["init"][m], jnp.zeros((1, 28, 28, 1)))["params"] for m in range(e)]
        opt = [tx.init(p) for p in members]
        x, y = jnp.asarray(train_x), jnp.asarray(train_y)
        first = order[0, 0]
        t0 = time.perf_counter()
        compiled_step = step.lower(members[0], opt[0], x[first], y[first]).compile()
        out["compile_seconds"] = time.perf_counter() - t0
        out["train_flops_per_image"] = _flops(compiled_step) / BATCH
        for m in range(e):  # warm-up: one step per member (as the project's warm-up step)
            members[m], opt[m] = step(members[m], opt[m], x[order[0, m]], y[order[0, m]])
        jax.block_until_ready(members)

        def train_chunk(fn=step):
            for m in range(e):
                for s in range(1, steps + 1):
                    members[m], opt[m] = fn(members[m], opt[m], x[order[s, m]], y[order[s, m]])
            jax.block_until_ready(members)

        out["train_seconds"] = _best_of(REPEATS, train_chunk)
        for m in range(e):  # compile and warm up
            members[m], opt[m] = step_same_options(members[m], opt[m], x[order[0, m]], y[order[0, m]])
        out["train_seconds_same_options"] = _best_of(REPEATS, lambda: train_chunk(step_same_options))
        out["train_member_images_per_s_same_options"] = e * steps * BATCH / out["train_seconds_same_options"]
        tx_dev = jnp.asarray(test_x)

        def eval_all():
            res = [
                [apply(members[m], tx_dev[i : i + EVAL_BATCH]) for i in range(0, len(test_x), EVAL_BATCH)]
                for m in range(e)
            ]
            jax.block_until_ready(res)

        eval_all()  # compile
        out["eval_flops_per_image"] = _flops(apply.lower(members[0], tx_dev[:EVAL_BATCH]).compile()) / EVAL_BATCH
        out["eval_seconds"] = _best_of(REPEATS, eval_all)

    out["train_member_images_per_s"] = e * steps * BATCH / out["train_seconds"]
    out["eval_member_images_per_s"] = e * len(test_x) / out["eval_seconds"]
    out["peak_host_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    stats = jax.devices()[0].memory_stats() if hasattr(jax.devices()[0], "memory_stats") else None
    out["peak_device_mb"] = stats["peak_bytes_in_use"] / 2**20 if stats and "peak_bytes_in_use" in stats else None
    return out


# MARK: driver


def _run_worker(model: str, size: int, method: str, args, env: dict | None = None) -> dict:
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
    ]
    if args.strategy:
        cmd += ["--strategy", args.strategy]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env or os.environ.copy())
    if proc.returncode:
        raise SystemExit(f"worker failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _table(rows: list[dict]) -> str:
    head = (
        f"{'model':5} {'E':>3} | {'train proj':>10} {'train loop':>10} {'speedup':>7} {'loop*':>7} {'speedup*':>8} | "
        f"{'eval proj':>10} {'eval loop':>10} {'speedup':>7} | {'compile s':>9} | {'peak MB':>8} | strategy"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        p, lp = r["project"], r["loop"]
        lines.append(
            f"{r['model']:5} {r['size']:>3} | {p['train_member_images_per_s']:>10.0f} "
            f"{lp['train_member_images_per_s']:>10.0f} {r['train_speedup']:>6.2f}x "
            f"{lp['train_member_images_per_s_same_options']:>7.0f} {r['train_speedup_same_options']:>7.2f}x | "
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
    for ax, kind in zip(axes, ("train", "eval"), strict=True):
        for model, color in (("cnn", "tab:blue"), ("mlp", "tab:orange")):
            rs = [r for r in rows if r["model"] == model]
            if not rs:
                continue
            sizes = [r["size"] for r in rs]
            ax.plot(
                sizes,
                [r["project"][f"{kind}_member_images_per_s"] for r in rs],
                "o-",
                color=color,
                label=f"{model}: ensemble-pipeline",
            )
            ax.plot(
                sizes,
                [r["loop"][f"{kind}_member_images_per_s"] for r in rs],
                "s--",
                color=color,
                label=f"{model}: per-member loop",
            )
            if kind == "train" and all("train_member_images_per_s_same_options" in r["loop"] for r in rs):
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
    parser.add_argument("--strategy", choices=["vmap", "unroll"], help="override the member strategy")
    parser.add_argument("--data-dir", default=str(Path(tempfile.gettempdir()) / "ensemble-bench-tfds"))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "latest.json"))
    parser.add_argument("--compile-cache", action="store_true", help="also measure cold vs warm compile cache")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--method", choices=["project", "loop", "peak"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(args)))
        return 0

    env = os.environ.copy()
    cache = tempfile.mkdtemp(prefix="ensemble-bench-jax-")
    env["JAX_COMPILATION_CACHE_DIR"] = cache  # fresh per benchmark: compile times are cold
    rows = []
    for model in args.models.split(","):
        for size in map(int, args.sizes.split(",")):
            project = _run_worker(model, size, "project", args, env)
            loop = _run_worker(model, size, "loop", args, env)
            rows.append(
                {
                    "model": model,
                    "size": size,
                    "project": project,
                    "loop": loop,
                    "train_speedup": project["train_member_images_per_s"] / loop["train_member_images_per_s"],
                    "train_speedup_same_options": project["train_member_images_per_s"]
                    / loop["train_member_images_per_s_same_options"],
                    "eval_speedup": project["eval_member_images_per_s"] / loop["eval_member_images_per_s"],
                }
            )
            print(_table(rows[-1:]).splitlines()[-1], flush=True)
    result = {
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "cpus": os.cpu_count(),
            "backend": rows[0]["project"]["backend"],
            "devices": rows[0]["project"]["devices"],
        },
        "batch_size": BATCH,
        "steps": args.steps,
        "peak": _run_worker("cnn", 1, "peak", args, env),
        "rows": rows,
    }
    if args.compile_cache:
        warm_cache = tempfile.mkdtemp(prefix="ensemble-bench-jax-")
        env["JAX_COMPILATION_CACHE_DIR"] = warm_cache
        cold = _run_worker("cnn", 8, "project", args, env)["compile_seconds"]
        warm = _run_worker("cnn", 8, "project", args, env)["compile_seconds"]
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
        if r["size"] == 8:
            lp = r["loop"]
            print(
                f"  {r['model']} E=8: train {lp['train_flops_per_image'] / 1e6:.1f} MFLOP/img, "
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
