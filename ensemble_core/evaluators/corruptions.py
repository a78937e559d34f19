"""MNIST-C corruptions of the test split (Mu & Gilmer 2019, "MNIST-C: A Robustness
Benchmark for Computer Vision"), each at its published severity
(:data:`ensemble_core.shifts.CORRUPTIONS`). Only for 28x28 one-channel images.

Options (:class:`Options`): ``corruptions``, a subset of the 15 (default: all);
``num_examples`` (test images per corruption; default ``eval.protocol``'s,
:func:`ensemble_core.evaluators.shift_base.level_examples`).

Arrays (``eval/<name>.npz``): ``member_probs`` float32 ``[E, K*N, C]``, ``labels``
int32, ``level`` float32 (the index of the corruption in ``metrics["levels"]``, whose
rows carry its ``name``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ensemble_core import shifts
from ensemble_core.config import PipelineConfig
from ensemble_core.data import DatasetInfo
from ensemble_core.evaluators import EvalContext, EvaluatorOutput, shift_base, skipped

NAMES = tuple(shifts.CORRUPTIONS)


class Options(BaseModel):
    """The corruptions evaluator's options."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    corruptions: tuple[str, ...] = Field(
        NAMES,
        min_length=1,
        description=f"MNIST-C corruptions to run, each at its published severity: {', '.join(NAMES)}.",
    )
    num_examples: int | None = Field(
        None,
        ge=1,
        description="Test images per level, a seeded random sample of the test split, the same at every level "
        "(default: eval.protocol's; null: the whole test split).",
    )

    @field_validator("corruptions")
    @classmethod
    def _known(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        return shift_base.distinct_levels("corruptions", names, NAMES)


def requirements(config: PipelineConfig, dataset: DatasetInfo, opts=None) -> str | None:
    """What this evaluator needs of the data that ``dataset`` lacks (28x28x1 images), or
    None; checked in the preflight (:func:`ensemble_core.evaluators.check_data`) and again here."""
    shape = tuple(int(d) for d in dataset.image_shape)
    return None if shape == (28, 28, 1) else f"MNIST-C corruptions are defined for 28x28x1 images, not {shape}"


def evaluate(ctx: EvalContext) -> EvaluatorOutput:
    """Every member on each corrupted copy of the test split; see the module docstring."""
    if (unmet := requirements(ctx.config, ctx.dataset, ctx.options)) is not None:
        return skipped(unmet)
    opts = ctx.options or Options()
    names = opts.corruptions
    # The cached arrays depend on which corruptions (the levels are their indices): a
    # subset is cached under its own key.
    key = (
        "corruptions" if names == NAMES else "corruptions-" + hashlib.sha256(",".join(names).encode()).hexdigest()[:12]
    )
    out = shift_base.evaluate_shift(
        ctx,
        key,
        "MNIST-C corruption (published severity)",
        tuple(range(len(names))),
        lambda images, index: shifts.corrupt(images, names[int(index)]),
        shift_base.level_examples(ctx, opts, len(names)),
    )
    for row in out.metrics["levels"]:
        row["name"] = names[int(row["level"])]
    return out


def plot(
    metrics: dict, arrays: dict, plots_dir: Path, config: PipelineConfig, name: str = "corruptions"
) -> dict[str, Path]:
    """``<name>.png``: the figures for each corruption; ``<name>_examples.png``."""
    ticks = [r["name"] for r in metrics["levels"]]
    return {
        name: shift_base.plot_levels(metrics, plots_dir, name, "corruption", ticks=ticks),
        f"{name}_examples": shift_base.plot_examples(metrics, arrays, plots_dir, name),
    }


def markdown(metrics: dict) -> list[str]:
    """The table of corruptions."""
    return shift_base.markdown(metrics, "MNIST-C corruptions", "one published severity each")


def table(metrics: dict) -> list[dict]:
    """The Prefect table artifact's rows (:func:`ensemble_core.evaluators.shift_base.table`)."""
    return shift_base.table(metrics)
