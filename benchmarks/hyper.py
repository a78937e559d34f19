"""A hyper-deep ensemble against the default deep ensemble, at equal final size.

    python -m benchmarks.hyper                       # both runs, then the throughput pair
    python -m benchmarks.hyper --skip-runs           # the throughput pair only

1. **Quality.** ``configs/hyper.yaml`` (a pool of 32 Flax MNIST CNNs with per-member learning
   rate, weight decay, label smoothing and schedule, early stopping, greedy selection of
   8, temperature scaling) and ``configs/default.yaml`` (8 CNNs, one setting), each run
   through :func:`ensemble_core.runs.run` on the embedded mnist5k with the test and
   rotation evaluators: test NLL, accuracy and ECE, the mean NLL over the 13 rotated test
   sets, and each run's wall time (training + evaluation).
2. **Cost of per-member hyperparameters.** 32 members with ``configs/hyper.yaml``'s search
   space against 32 members with one setting, same step, same process, alternated
   (A B A B) so both see the same machine: steady-state member-images/s of one epoch.

Writes ``benchmarks/results/hyper-<backend>.json`` (``--out``) and prints a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from flows import _env  # noqa: F401  (applies the XLA/JAX environment on import)

ROOT = Path(__file__).resolve().parents[1]


def _figures(result) -> dict:
    ens = result.evaluation.ensemble
    rotation = result.evaluation.results["rotation"].metrics["mean"]
    out = {
        "test": {k: ens[k] for k in ("accuracy", "nll", "brier", "ece")},
        "rotation_mean": rotation["ensemble"],
        "members_evaluated": len(result.evaluation.test["members"]),
        "selection": result.evaluation.selection,
    }
    test = result.evaluation.test
    if "ensemble_temperature_scaled" in test:
        out["test_temperature_scaled"] = test["ensemble_temperature_scaled"]
        out["rotation_mean_temperature_scaled"] = rotation.get("ensemble_temperature_scaled")
    return out


def quality(out_dir: Path, data_dir: str | None) -> dict:
    """Both runs, one after the other, with the test and rotation evaluators."""
    from ensemble_core import runs
    from ensemble_core.config import load_config

    results = {}
    for name in ("default", "hyper"):
        overrides = ["eval.evaluators=[test,rotation]", "promotion.enabled=false"]
        if data_dir:
            overrides.append(f"data.data_dir={data_dir}")
        cfg = load_config(ROOT / "configs" / f"{name}.yaml", overrides)
        t0 = time.perf_counter()
        result = runs.run(cfg, out_dir, name)
        wall = time.perf_counter() - t0
        results[name] = {
            "members_trained": cfg.ensemble.size,
            "wall_seconds": wall,
            "train_seconds": result.training.timing.train_seconds,
            **_figures(result),
        }
        print(f"{name}: {wall:.0f} s, test {results[name]['test']}, rotation {results[name]['rotation_mean']}")
    results["pool_wall_over_4x_default"] = results["hyper"]["wall_seconds"] / (4 * results["default"]["wall_seconds"])
    return results


def throughput(data_dir: str | None, rounds: int = 2) -> dict:
    """Member-images/s of one epoch of 32 members: searched hyperparameters vs one setting."""
    import jax

    from ensemble_core import data as data_lib
    from ensemble_core import setup
    from ensemble_core.config import load_config
    from ensemble_core.mesh import replicated
    from ensemble_core.train import fit

    tfds_dir = data_lib.prepare(data_lib.EMBEDDED, data_dir).tfds_data_dir
    images, labels = data_lib.load_split(data_lib.EMBEDDED, "train", tfds_dir)
    no_validation = [
        "train.patience=null",
        "ensemble.select_size=null",
        "eval.temperature_scaling=false",
        "data.validation_fraction=0",
    ]
    hyper = load_config(ROOT / "configs" / "hyper.yaml", no_validation)
    plain = load_config(None, ["ensemble.size=32", "data.validation_fraction=0"])
    built = {"search": setup.build(hyper, 10), "one_setting": setup.build(plain, 10)}
    out: dict = {name: [] for name in built}
    for _ in range(rounds):
        for name, b in built.items():
            keys = b.member_keys()
            state = b.init_state(keys["init"], images.shape[1:])
            x, y = (jax.device_put(a, replicated(b.mesh)) for a in (images, labels))
            _, timing = fit(
                state,
                b.train_step(),
                x,
                y,
                keys["data"],
                b.mesh,
                stochastic_keys=keys["stochastic"],
                epochs=1,
                batch_size=b.config.train.batch_size,
                learning_rates=b.learning_rates(len(images)),
            )
            seen = timing["steps"] * b.config.train.batch_size * b.plan.padded_members
            out[name].append(seen / timing["train_seconds"])
            print(f"{name}: {out[name][-1]:.0f} member-images/s")
    best = {name: max(v) for name, v in out.items()}
    return {
        "member_images_per_s": out,
        "best": best,
        "search_over_one_setting": best["search"] / best["one_setting"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--skip-runs", action="store_true")
    args = parser.parse_args()
    import jax

    report: dict = {"backend": jax.default_backend(), "devices": jax.device_count(), "cpus": os.cpu_count()}
    out = args.out or ROOT / "benchmarks" / "results" / f"hyper-{jax.default_backend()}.json"
    if not args.skip_runs:
        with tempfile.TemporaryDirectory() as tmp:
            report["quality"] = quality(Path(tmp), args.data_dir)
        out.write_text(json.dumps(report, indent=2))
    report["throughput"] = throughput(args.data_dir)
    out.write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k != "quality"}, indent=2))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
