"""Horizontally translated test split, 0 to 14 pixels (Ovadia et al. 2019;
:func:`ensemble_core.shifts.translate`, ``np.roll`` along the width).

Arrays (``eval/translation.npz``): ``member_probs`` float32 ``[E, 15*N, C]``, ``labels``
int32, ``level`` float32 (pixels).
"""

from __future__ import annotations

from pathlib import Path

from ensemble_core import shifts
from ensemble_core.config import PipelineConfig
from ensemble_core.evaluators import EvalContext, EvaluatorOutput, _shift


def evaluate(ctx: EvalContext) -> EvaluatorOutput:
    """Every member on the translated test split; see the module docstring."""
    return _shift.evaluate_shift(ctx, "translation", "pixels", shifts.TRANSLATION_PIXELS, shifts.translate)


def plot(metrics: dict, arrays: dict, plots_dir: Path, config: PipelineConfig) -> dict[str, Path]:
    """``translation.png``: the figures against the shift in pixels."""
    return {
        "translation": _shift.plot_levels(metrics, plots_dir, "translation", "translation (pixels)"),
        "translation_examples": _shift.plot_examples(metrics, arrays, plots_dir, "translation"),
    }


def markdown(metrics: dict) -> list[str]:
    """The translation table."""
    return _shift.markdown(metrics, "Translation", "pixels")


def table(metrics: dict) -> list[dict]:
    """The Prefect table artifact's rows (:func:`ensemble_core.evaluators._shift.table`)."""
    return _shift.table(metrics)
