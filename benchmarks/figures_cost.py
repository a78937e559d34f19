"""What the evaluation's figures cost to draw, and what laying them out costs.

    python -m benchmarks.figures_cost [--passes 7] [--out FILE]

Draws every figure of ``configs/default.yaml``'s evaluators, in this process, from each
evaluator's output on the promotion check's probe
(:func:`ensemble_core.runs.evaluation.figure_check.probe`: random images and member
probabilities of the embedded dataset's shape, nothing predicted). A figure's drawing cost
depends on its axes, ticks and text, not on how many images its numbers came from, so this
is what the default run's writer thread pays for its figures, without the forward passes
beside it. Two ways of saving, alternating, ``--passes`` times each:

- ``tight_layout``: ``fig.tight_layout()`` then ``savefig``, as :func:`ensemble_core.plotting.save`
  did before. The figure keeps a placeholder layout engine, and ``savefig`` draws it once
  more, unrendered, before the real draw.
- ``save``: :func:`ensemble_core.plotting.save` as it is now.

Records per way the CPU seconds of each pass (``time.process_time``, all figures), their
median, the number of figures, the figure draws of a pass (``Figure.draw`` calls), and
whether both ways wrote the same PNG bytes for every figure. Writes
``benchmarks/results/figures-cost-<cpus>core.json`` (or ``--out``) with ``date``,
``machine`` and ``commit`` (:mod:`benchmarks.provenance`).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.provenance import ROOT, stamp


def _tight_layout_save(fig, path: Path) -> Path:
    """The save as it was: ``fig.tight_layout()``, then the same PNG settings as
    :func:`ensemble_core.plotting.save`."""
    import matplotlib.pyplot as plt

    try:
        fig.tight_layout()
        png = io.BytesIO()
        fig.savefig(png, dpi=100, format="png", pil_kwargs={"compress_level": 1})
    finally:
        plt.close(fig)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(png.getvalue())
    return path


def measure(passes: int) -> dict:
    """Both ways of saving, alternating, ``passes`` times each (see the module docstring)."""
    import numpy as np

    from benchmarks.bench import IMAGE_SHAPE, NUM_CLASSES
    from ensemble_core import evaluators, plotting
    from ensemble_core.config import load_config
    from ensemble_core.data import DatasetInfo
    from ensemble_core.runs.evaluation.figure_check import probe

    cfg = load_config(ROOT / "configs" / "default.yaml")
    dataset = DatasetInfo(
        name="probe",
        data_dir="",
        num_classes=NUM_CLASSES,
        image_shape=IMAGE_SHAPE,
        num_train=0,
        num_test=0,
        class_names=tuple(str(i) for i in range(NUM_CLASSES)),
    )
    outputs = {}
    for name, spec in cfg.eval.evaluators.items():
        module = evaluators.get(spec.type)
        if hasattr(module, "plot"):
            outputs[name] = (module, probe(cfg, dataset, name))
    plotting.import_matplotlib()
    real_save = plotting.save
    ways = {"tight_layout": _tight_layout_save, "save": real_save}

    def draw_all(out_dir: Path) -> int:
        figures = 0
        for name, (module, out) in outputs.items():
            np.random.seed(0)
            figures += len(module.plot(out.metrics, out.arrays, out_dir, cfg, name=name))
        return figures

    seconds: dict[str, list[float]] = {way: [] for way in ways}
    digests: dict[str, dict[str, str]] = {}
    figures = 0
    # every module that imported plotting.save by name (the evaluators and their bases)
    callers = [
        m
        for n, m in list(sys.modules.items())
        if n.startswith("ensemble_core.") and getattr(m, "save", None) is real_save
    ]

    from matplotlib.figure import Figure

    real_draw = Figure.draw
    draws: dict[str, int] = {}
    drawing = [""]

    def counted_draw(self, renderer):  # how many times each way draws a figure, per pass
        draws[drawing[0]] = draws.get(drawing[0], 0) + 1
        return real_draw(self, renderer)

    def use(save) -> None:
        for module in callers:
            setattr(module, "save", save)  # noqa: B010  (a module attribute, set as monkeypatch does)

    setattr(Figure, "draw", counted_draw)  # noqa: B010
    try:
        for _ in range(passes + 1):  # the first pass of each warms matplotlib's caches, untimed
            for way, save in ways.items():
                use(save)
                drawing[0], draws[way] = way, 0
                with tempfile.TemporaryDirectory(prefix=f"figures-{way}-") as tmp:
                    out_dir = Path(tmp)
                    t0 = time.process_time()
                    figures = draw_all(out_dir)
                    seconds[way].append(time.process_time() - t0)
                    digests[way] = {
                        str(p.relative_to(out_dir)): hashlib.md5(p.read_bytes()).hexdigest()
                        for p in sorted(out_dir.rglob("*.png"))
                    }
    finally:
        use(real_save)
        setattr(Figure, "draw", real_draw)  # noqa: B010
    timed = {way: s[1:] for way, s in seconds.items()}
    return {
        "passes": passes,
        "figures": figures,
        "cpu_seconds": timed,
        "median_cpu_seconds": {way: statistics.median(s) for way, s in timed.items()},
        "figure_draws_per_pass": draws,
        "modules_patched": sorted(m.__name__ for m in callers),
        "identical_pngs": digests["tight_layout"] == digests["save"] and len(digests["save"]) == figures,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=7)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from flows import environment  # noqa: F401  (the flows' device layout and XLA flags, before JAX)

    result = {
        **stamp(),
        "command": "python -m benchmarks.figures_cost" + (f" --passes {args.passes}" if args.passes != 7 else ""),
        **measure(args.passes),
    }
    out = args.out or ROOT / "benchmarks" / "results" / f"figures-cost-{os.cpu_count()}core.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    m = result["median_cpu_seconds"]
    print(
        f"{result['figures']} figures: tight_layout {m['tight_layout']:.2f} CPU s, save {m['save']:.2f} CPU s "
        f"(median of {args.passes}); identical PNGs: {result['identical_pngs']}"
    )
    print(f"written: {out}")


if __name__ == "__main__":
    main()
