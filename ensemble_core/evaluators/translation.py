"""Horizontally translated test split, by default 0 to 14 pixels (Ovadia et al. 2019;
:func:`ensemble_core.shifts.translate`, ``np.roll`` along the width): those below the
images' width (a roll by the width or more repeats a smaller one); shifts given in
``pixels`` must all be below it (a named evaluator is refused in the preflight).

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
from ensemble_core.data import DatasetInfo
from ensemble_core.evaluators import EvalContext, EvaluatorOutput, shift_base, skipped


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


def shifts_for(opts: Options, width: int) -> tuple[int, ...]:
    """The shifts to evaluate on images ``width`` pixels wide: ``opts.pixels`` as given, or
    (the default, not given) those of the defaults below ``width``: a roll by ``width`` or
    more is a roll by ``pixels % width``, one of the others."""
    if "pixels" in opts.model_fields_set:
        return opts.pixels
    return tuple(p for p in opts.pixels if p < width)


def requirements(config: PipelineConfig, dataset: DatasetInfo, opts: Options | None = None) -> str | None:
    """What the shifts need of the data that ``dataset`` lacks (every shift given in
    ``pixels`` narrower than the images: a roll by the width W or more is a roll by
    ``pixels % W``, another level under the same name), or None; checked in the preflight
    (:func:`ensemble_core.evaluators.check_data`) and again by :func:`evaluate`."""
    width = int(dataset.image_shape[1])
    beyond = [p for p in shifts_for(opts or Options(), width) if p >= width]
    if beyond:
        return (
            f"a translation by {beyond[0]} pixels of the {width}-pixel-wide images is a roll by "
            f"{beyond[0] % width} (shifts must be below {width})"
        )
    return None


def evaluate(ctx: EvalContext) -> EvaluatorOutput:
    """Every member on the translated test split; see the module docstring."""
    opts = ctx.options or Options()
    if (unmet := requirements(ctx.config, ctx.dataset, opts)) is not None:
        return skipped(unmet)
    pixels = shifts_for(opts, int(ctx.dataset.image_shape[1]))
    n = shift_base.level_examples(ctx, opts, len(pixels))
    return shift_base.evaluate_shift(ctx, "translation", "pixels", pixels, shifts.translate, n)


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
