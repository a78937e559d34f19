"""Are a ResNet's members the same on any topology? ResNet-20 members (or ``--model``'s)
with BatchNorm, dropout and crop augmentation trained for a few steps on 1 device, on 2
devices (members split), on 8 devices (4 x 2: members and each member's batch split) and as
2 member groups, compared with the 1-device run leaf by leaf.

    python -m benchmarks.topology [--steps 2] [--depth 20] [--out benchmarks/results/topology-resnet20.json]
    python -m benchmarks.topology --model tests.user_models.flax_resnets:NnxResNet \
        --out benchmarks/results/topology-nnx-resnet.json

``--model`` is any ``model.name`` (default the registry ``resnet``); ``--options`` its
``model.options`` as a JSON (or YAML) mapping, by default ``{"depth": <--depth>,
"dropout_rate": 0.1}`` for the registry ``resnet`` and ``{}`` for any other model (a
class path's own defaults).

Reports, per layout, the largest difference of any parameter or batch statistic, absolute
and relative to how far that leaf moved from its initial value (the size of the training
update): float32 rounding shows as 1e-7..1e-5 of an update, a semantic difference (e.g.
per-shard statistics, dropout masks or augmentations) as 1e-2 or more. ``leaf`` names the
leaf of the largest relative difference and ``leaf_update`` how far it moved: a leaf that
barely moved in a few steps (a conv behind a zero-initialised BatchNorm scale) turns one
float32 ulp into a larger fraction. ``differing_leaves`` lists every leaf that differs, the
largest relative difference first, with the float32 spacing (ulp) at its largest value.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import argparse
import json
import sys
import time
from pathlib import Path

import jax
import numpy as np

from benchmarks.provenance import stamp


def _options(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict:
    """``model.options``: ``--options`` parsed, or the default for ``--model``."""
    if args.options is None:
        return {"depth": args.depth, "dropout_rate": 0.1} if args.model == "resnet" else {}
    from ensemble_core.config.strict_yaml import YAMLError, describe, load_yaml

    try:
        options = load_yaml(args.options)
    except YAMLError as e:
        parser.error(f"--options is not JSON/YAML: {describe(e)}")
    if options is None:
        return {}
    if not isinstance(options, dict):
        parser.error(f"--options must be a mapping, got {args.options!r}")
    return options


def _describe(model: str, options: dict) -> str:
    """The result's one-line ``model``: today's wording for the registry resnet."""
    if model == "resnet" and set(options) == {"depth", "dropout_rate"}:
        return f"resnet depth {options['depth']}, BatchNorm, dropout {options['dropout_rate']:g}, crop_padding 2"
    shown = ", ".join(f"{k}={v!r}" for k, v in options.items())
    return f"{model}({shown}), crop_padding 2"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--depth", type=int, default=20)
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--model", default="resnet", help="model.name: a registry name or package.module:Class")
    parser.add_argument(
        "--options",
        default=None,
        help='model.options, a JSON/YAML mapping (default: {"depth": DEPTH, "dropout_rate": 0.1} for resnet, else {})',
    )
    parser.add_argument("--out", default="benchmarks/results/topology-resnet20.json")
    args = parser.parse_args(argv)
    options = _options(args, parser)

    from ensemble_core import data as data_lib
    from ensemble_core import ensemble_setup as setup
    from ensemble_core.config import PipelineConfig
    from ensemble_core.mesh import replicated
    from ensemble_core.train import fit

    tfds_dir = data_lib.prepare(data_lib.EMBEDDED, args.data_dir).tfds_data_dir
    n = args.steps * args.batch_size
    images, labels = data_lib.load_split(data_lib.EMBEDDED, "train", tfds_dir, limit=n)
    e = args.members

    def train(devices: int, ensemble: int | None, data: int, group: int | None = None, groups: int = 1):
        cfg = PipelineConfig.model_validate(
            {
                "model": {"name": args.model, "options": options},
                "data": {"augment": {"crop_padding": 2}},
                "ensemble": {"size": e},
                "train": {"batch_size": args.batch_size, "learning_rate": 0.05},
                "mesh": {"ensemble": ensemble, "data": data, "member_strategy": "unroll"},
                "distributed": {"member_groups": groups},
            }
        )
        built = (
            setup.build(cfg, 10, num_devices=devices, group=group)
            if group is not None
            else setup.build(cfg, 10, num_devices=devices)
        )
        keys = built.member_keys()
        state = built.init_state(keys["init"], images.shape[1:])
        initial = jax.tree.map(np.asarray, state.variables)
        t0 = time.perf_counter()
        state, _ = fit(
            state,
            built.train_step(),
            jax.device_put(images, replicated(built.mesh)),
            jax.device_put(labels, replicated(built.mesh)),
            keys["data"],
            built.mesh,
            stochastic_keys=keys["stochastic"],
            epochs=1,
            batch_size=args.batch_size,
            learning_rates=built.learning_rates(len(images)),
        )
        return jax.tree.map(np.asarray, state.variables), initial, time.perf_counter() - t0

    reference, initial, seconds = train(1, None, 1)
    rows = [{"layout": "1 device", "seconds": round(seconds, 1)}]
    layouts = {
        "2 devices (ensemble 2)": lambda: train(2, 2, 1)[0],
        "8 devices (ensemble 4 x data 2)": lambda: train(8, 4, 2)[0],
        "2 member groups": lambda: jax.tree.map(
            lambda *parts: np.concatenate(parts), *[train(1, None, 1, group=g, groups=2)[0] for g in range(2)]
        ),
    }
    for name, run in layouts.items():
        t0 = time.perf_counter()
        got = run()
        worst_abs, worst_rel, where, where_moved = 0.0, 0.0, "", 0.0
        differing = []
        for (path, a), b, i in zip(
            jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(reference), jax.tree.leaves(initial), strict=True
        ):
            diff = float(np.abs(a - b).max())
            moved = float(np.abs(b - i).max())
            rel = diff / moved if moved else 0.0
            worst_abs = max(worst_abs, diff)
            if rel > worst_rel:
                worst_rel, where, where_moved = rel, jax.tree_util.keystr(path), moved
            if diff:
                ulp = float(np.spacing(np.abs(b).max().astype(np.float32)))
                differing.append(
                    {
                        "leaf": jax.tree_util.keystr(path),
                        "max_abs_diff": diff,
                        "update": moved,
                        "diff_over_update": rel,
                        "ulp_of_largest": ulp,
                    }
                )
        rows.append(
            {
                "layout": name,
                "max_abs_diff": worst_abs,
                "max_diff_over_update": worst_rel,
                "leaf": where,
                "leaf_update": where_moved,
                "seconds": round(time.perf_counter() - t0, 1),
                "differing_leaves": sorted(differing, key=lambda d: -d["diff_over_update"]),
            }
        )
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "differing_leaves"}), flush=True)
    result = {
        **stamp(),
        "model": _describe(args.model, options),
        "model_name": args.model,
        "model_options": options,
        "members": e,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "backend": jax.default_backend(),
        "command": "python -m benchmarks.topology " + " ".join(sys.argv[1:] if argv is None else argv),
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
