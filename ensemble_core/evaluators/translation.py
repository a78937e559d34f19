"""Horizontally translated test split, by default 0 to 14 pixels (Ovadia et al. 2019;
:func:`ensemble_core.shifts.translate`, ``np.roll`` along the width).

Options (:class:`Options`): ``pixels``, ``num_examples`` (test images per shift; default
``eval.protocol``'s, :func:`ensemble_core.evaluators.shift_base.level_examples`).

Arrays (``eval/<name>.npz``): ``member_probs`` float32 ``[E, L*N, C]`` (L shifts),
``labels`` int32, ``level`` float32 (pixels).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ensemble_core import shifts
from ensemble_core.config import PipelineConfig
from ensemble_core.evaluators import EvalContext, EvaluatorOutput, shift_base


class Options(BaseModel):
    """The translation evaluator's options."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pixels: tuple[int, ...] = Field(
        shifts.TRANSLATION_PIXELS,
        min_length=1,
        description="Shifts in pixels along the width (each in [0, 27]); default 0..14 (rolls by k and 28 - k "
        "mirror each other).",
    )
    num_examples: int | None = Field(
        None,
        ge=1,
        description="Test images per level, a seeded random sample of the test split, the same at every level "
        "(default: eval.protocol's; null: the whole test split).",
    )

    @field_validator("pixels")
    @classmethod
    def _valid(cls, pixels: tuple[int, ...]) -> tuple[int, ...]:
        if any(not 0 <= p <= 27 for p in pixels) or len(set(pixels)) != len(pixels):
            raise ValueError(f"pixels {list(pixels)} must be distinct shifts in [0, 27]")
        return pixels


def evaluate(ctx: EvalContext) -> EvaluatorOutput:
    """Every member on the translated test split; see the module docstring."""
    opts = ctx.options or Options()
    n = shift_base.level_examples(ctx, opts, len(opts.pixels))
    return shift_base.evaluate_shift(ctx, "translation", "pixels", opts.pixels, shifts.translate, n)


def plot(
    metrics: dict, arrays: dict, plots_dir: Path, config: PipelineConfig, name: str = "translation"
) -> dict[str, Path]:
    """``<name>.png``: the figures against the shift in pixels; ``<name>_examples.png``."""
    return {
        name: shift_base.plot_levels(metrics, plots_dir, name, "translation (pixels)"),
        f"{name}_examples": shift_base.plot_examples(metrics, arrays, plots_dir, name),
    }


def markdown(metrics: dict) -> list[str]:
    """The translation table."""
    return shift_base.markdown(metrics, "Translation", "pixels")


def table(metrics: dict) -> list[dict]:
    """The Prefect table artifact's rows (:func:`ensemble_core.evaluators.shift_base.table`)."""
    return shift_base.table(metrics)
