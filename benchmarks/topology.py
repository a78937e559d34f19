"""Are a ResNet's members the same on any topology? ResNet-20 members with BatchNorm,
dropout and crop augmentation trained for a few steps on 1 device, on 2 devices (members
split), on 8 devices (4 x 2: members and each member's batch split) and as 2 member groups,
compared with the 1-device run leaf by leaf.

    python -m benchmarks.topology [--steps 2] [--depth 20] [--out benchmarks/results/topology-resnet20.json]

Reports, per layout, the largest difference of any parameter or batch statistic, absolute
and relative to how far that leaf moved from its initial value (the size of the training
update): float32 rounding shows as 1e-7..1e-5 of an update, a semantic difference (e.g.
per-shard statistics, dropout masks or augmentations) as 1e-2 or more.
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

from benchmarks._provenance import stamp


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--depth", type=int, default=20)
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--out", default="benchmarks/results/topology-resnet20.json")
    args = parser.parse_args(argv)

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
                "model": {"name": "resnet", "options": {"depth": args.depth, "dropout_rate": 0.1}},
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
        worst_abs, worst_rel, where = 0.0, 0.0, ""
        for (path, a), b, i in zip(
            jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(reference), jax.tree.leaves(initial), strict=True
        ):
            diff = float(np.abs(a - b).max())
            moved = float(np.abs(b - i).max())
            rel = diff / moved if moved else 0.0
            worst_abs = max(worst_abs, diff)
            if rel > worst_rel:
                worst_rel, where = rel, jax.tree_util.keystr(path)
        rows.append(
            {
                "layout": name,
                "max_abs_diff": worst_abs,
                "max_diff_over_update": worst_rel,
                "leaf": where,
                "seconds": round(time.perf_counter() - t0, 1),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    result = {
        **stamp(),
        "model": f"resnet depth {args.depth}, BatchNorm, dropout 0.1, crop_padding 2",
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
