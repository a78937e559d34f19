"""MNIST-C corruptions of the test split (Mu & Gilmer 2019, "MNIST-C: A Robustness
Benchmark for Computer Vision"), each at its published severity
(:data:`ensemble_core.shifts.CORRUPTIONS`). Only for 28x28 one-channel images.

Arrays (``eval/corruptions.npz``): ``member_probs`` float32 ``[E, K*N, C]``, ``labels``
int32, ``level`` float32 (the index of the corruption in ``metrics["levels"]``, whose
rows carry its ``name``).
"""

from __future__ import annotations

from pathlib import Path

from ensemble_core import shifts
from ensemble_core.config import PipelineConfig
from ensemble_core.evaluators import EvalContext, EvaluatorOutput, _shift, skipped

NAMES = tuple(shifts.CORRUPTIONS)


def evaluate(ctx: EvalContext) -> EvaluatorOutput:
    """Every member on each corrupted copy of the test split; see the module docstring."""
    if tuple(ctx.dataset.image_shape) != (28, 28, 1):
        return skipped(f"MNIST-C corruptions are defined for 28x28x1 images, not {tuple(ctx.dataset.image_shape)}")
    out = _shift.evaluate_shift(
        ctx,
        "corruptions",
        "MNIST-C corruption (published severity)",
        tuple(range(len(NAMES))),
        lambda images, index: shifts.corrupt(images, NAMES[int(index)]),
    )
    for row in out.metrics["levels"]:
        row["name"] = NAMES[int(row["level"])]
    return out


def plot(metrics: dict, arrays: dict, plots_dir: Path, config: PipelineConfig) -> dict[str, Path]:
    """``corruptions.png``: the figures for each corruption."""
    ticks = [r["name"] for r in metrics["levels"]]
    return {
        "corruptions": _shift.plot_levels(metrics, plots_dir, "corruptions", "corruption", ticks=ticks),
        "corruptions_examples": _shift.plot_examples(metrics, arrays, plots_dir, "corruptions"),
    }


def markdown(metrics: dict) -> list[str]:
    """The table of corruptions."""
    return _shift.markdown(metrics, "MNIST-C corruptions", "one published severity each")


def table(metrics: dict) -> list[dict]:
    """The Prefect table artifact's rows (:func:`ensemble_core.evaluators._shift.table`)."""
    return _shift.table(metrics)
