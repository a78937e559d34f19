"""What the 15 common corruptions x 5 severities cost to generate, per corruption and in
total, on the test splits the docs quote: mnist5k's 1,000 28x28 grey digits, Fashion-MNIST's
10,000 28x28 grey images (read from Debian's IDX files when installed) and 1,000 32x32 RGB
images (CIFAR-10's geometry, seeded smooth noise: the cost does not depend on the content).

    python -m benchmarks.common_corruptions    # --out benchmarks/results/common-corruptions-cpu-2core.json

One process, one thread of Python (NumPy, SciPy and Pillow may use more); each set is
corrupted as the evaluator does it (blocks of 1,000 images), once (the evaluator caches the
result beside the prepared dataset, so a run pays this once per test split and selection).
The machine's busy CPU seconds over the timing are recorded beside it (``busy_seconds``):
on 2 cores, more than the benchmark's own means another process competed.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from benchmarks.provenance import busy_seconds, stamp
from ensemble_core.evaluators.common_corruptions import corrupt_in_blocks
from ensemble_core.shifts.common_corruptions import NAMES, SEVERITIES


def test_sets() -> dict[str, np.ndarray]:
    """The image sets timed: ``mnist5k`` (its test split), ``fashion_mnist`` (its test split,
    when the IDX files are installed), ``rgb32`` (seeded smooth noise) -> uint8 ``[N, H, W, C]``."""
    from ensemble_core import data

    sets = {}
    info = data.prepare(data.EMBEDDED, None)
    sets["mnist5k"] = data.load_split(data.EMBEDDED, "test", info.tfds_data_dir)[0]
    if data.idx_files_available("fashion_mnist", None):
        info = data.prepare("fashion_mnist", None, None)
        sets["fashion_mnist"] = data.load_split("fashion_mnist", "test", info.tfds_data_dir)[0]
    rng = np.random.default_rng(0)
    from scipy.ndimage import gaussian_filter

    smooth = gaussian_filter(rng.random((1000, 32, 32, 3)), sigma=(0, 2, 2, 0))
    smooth = (smooth - smooth.min()) / (smooth.max() - smooth.min())
    sets["rgb32"] = np.round(smooth * 255).astype(np.uint8)
    return sets


def time_set(images: np.ndarray) -> dict:
    """Seconds to corrupt ``images`` with every corruption at every severity."""
    per = {}
    busy0, t_all = busy_seconds(), time.perf_counter()
    for name in NAMES:
        t0 = time.perf_counter()
        for severity in SEVERITIES:
            corrupt_in_blocks(images, name, severity, 0)
        per[name] = time.perf_counter() - t0
    total = time.perf_counter() - t_all
    busy1 = busy_seconds()
    cells = len(NAMES) * len(SEVERITIES)
    return {
        "images": len(images),
        "shape": list(images.shape[1:]),
        "seconds_total": total,
        "corrupted_images_per_s": cells * len(images) / total,
        "seconds_per_corruption": per,
        "machine_busy_cpu_seconds": None if busy0 is None or busy1 is None else busy1 - busy0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/common-corruptions-cpu-2core.json")
    args = parser.parse_args(argv)
    result = {**stamp(), "sets": {}}
    for name, images in test_sets().items():
        result["sets"][name] = time_set(images)
        r = result["sets"][name]
        print(f"{name}: {r['seconds_total']:.1f} s for 75 cells ({r['corrupted_images_per_s']:,.0f} images/s)")
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
