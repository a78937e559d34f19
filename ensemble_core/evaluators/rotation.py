"""Rotated test split, by default 0 to 180 degrees in 15-degree steps (Ovadia et al. 2019,
rotated MNIST; :func:`ensemble_core.shifts.rotate`), plus selective prediction at one of
those angles (default 60 degrees): the accuracy on the examples predicted with confidence
>= tau and the risk-coverage curve.

Options (:class:`Options`): ``degrees``, ``selective_degrees``, ``num_examples`` (test
images per angle; default ``eval.protocol``'s, :func:`ensemble_core.evaluators.shift_base.level_examples`).

Arrays (``eval/<name>.npz``): ``member_probs`` float32 ``[E, L*N, C]`` (L angles),
``labels`` int32, ``level`` float32 (degrees), ``healthy`` bool ``[E]``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ensemble_core import metrics as metrics_lib
from ensemble_core import shifts, timing
from ensemble_core.config import PipelineConfig
from ensemble_core.evaluators import METRICS, EvalContext, EvaluatorOutput, shift_base
from ensemble_core.plotting import save, subplots

SELECTIVE_DEGREES = 60.0
TAUS = (0.0, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)


class Options(BaseModel):
    """The rotation evaluator's options."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    degrees: tuple[float, ...] = Field(
        tuple(float(d) for d in shifts.ROTATION_DEGREES),
        min_length=1,
        description="Angles in degrees (each in [0, 360]); default Ovadia et al.'s 0, 15, ..., 180.",
    )
    selective_degrees: float = Field(
        SELECTIVE_DEGREES, description="The angle of the selective-prediction figures; one of degrees."
    )
    num_examples: int | None = Field(
        None,
        ge=1,
        description="Test images per level, a seeded random sample of the test split, the same at every level "
        "(default: eval.protocol's; null: the whole test split).",
    )

    @model_validator(mode="after")
    def _valid(self) -> Options:
        if any(not 0 <= d <= 360 for d in self.degrees) or len(set(self.degrees)) != len(self.degrees):
            raise ValueError(f"degrees {list(self.degrees)} must be distinct angles in [0, 360]")
        if self.selective_degrees not in self.degrees:
            raise ValueError(f"selective_degrees {self.selective_degrees:g} is not one of degrees {list(self.degrees)}")
        return self


def _selective_key(degrees: float) -> str:
    return f"selective_at_{degrees:g}"


def evaluate(ctx: EvalContext) -> EvaluatorOutput:
    """Every member on the rotated test split; see the module docstring."""
    opts = ctx.options or Options()
    n = shift_base.level_examples(ctx, opts, len(opts.degrees))
    out = shift_base.evaluate_shift(ctx, "rotation", "degrees", opts.degrees, shifts.rotate, n)
    with timing.part(METRICS):
        at = out.arrays["level"] == np.float32(opts.selective_degrees)
        probs, labels = out.arrays["member_probs"][:, at], out.arrays["labels"][at]
        healthy = ctx.healthy
        best = out.metrics["levels"][opts.degrees.index(opts.selective_degrees)]["best_member_index"]
        who = {"ensemble": metrics_lib.ensemble_probs(probs[healthy]), "best_member": probs[best]}
        out.metrics["selective_degrees"] = opts.selective_degrees
        out.metrics[_selective_key(opts.selective_degrees)] = {
            name: [{"tau": tau, **metrics_lib.accuracy_above(p, labels, tau)} for tau in TAUS]
            for name, p in who.items()
        }
    return out


def plot(
    metrics: dict, arrays: dict, plots_dir: Path, config: PipelineConfig, name: str = "rotation"
) -> dict[str, Path]:
    """``<name>.png`` (figures vs angle) and ``<name>_selective.png`` (accuracy vs
    confidence threshold and risk-coverage at the selective angle)."""
    paths = {name: shift_base.plot_levels(metrics, plots_dir, name, "rotation (degrees)")}
    paths[f"{name}_examples"] = shift_base.plot_examples(metrics, arrays, plots_dir, name)
    degrees = metrics.get("selective_degrees", SELECTIVE_DEGREES)
    at = arrays["level"] == np.float32(degrees)
    probs, labels = arrays["member_probs"][arrays["healthy"]][:, at], arrays["labels"][at]
    best = next(r["best_member_index"] for r in metrics["levels"] if r["level"] == degrees)
    fig, axes = subplots(1, 2, figsize=(10, 4))
    for who, rows in metrics[_selective_key(degrees)].items():
        ok = [r for r in rows if r["accuracy"] is not None]
        axes[0].plot([r["tau"] for r in ok], [r["accuracy"] for r in ok], "o-", label=who.replace("_", " "))
    axes[0].set(xlabel="confidence threshold tau", ylabel="accuracy on examples with confidence >= tau")
    axes[0].set_title(f"Selective prediction at {degrees:g} degrees")
    best_probs = arrays["member_probs"][best][at]
    for who, p in (("ensemble", metrics_lib.ensemble_probs(probs)), ("best member", best_probs)):
        coverage, risk = metrics_lib.risk_coverage(p, labels)
        axes[1].plot(coverage, risk, label=f"{who} (AURC {metrics_lib.aurc(p, labels):.3f})")
    axes[1].set(xlabel="coverage", ylabel="risk (error rate)", title=f"Risk-coverage at {degrees:g} degrees")
    for ax in axes:
        ax.legend(fontsize=8)
    paths[f"{name}_selective"] = save(fig, plots_dir / f"{name}_selective.png")
    return paths


def markdown(metrics: dict) -> list[str]:
    """The rotation table and the selective-prediction line at the selective angle."""
    lines = shift_base.markdown(metrics, "Rotation", "degrees")
    degrees = metrics.get("selective_degrees", SELECTIVE_DEGREES)
    sel = {r["tau"]: r for r in metrics[_selective_key(degrees)]["ensemble"]}
    r = sel[0.9]
    if r["accuracy"] is not None:
        lines.append(
            f"At {degrees:g} degrees the ensemble is confident (>= 0.9) on {r['fraction']:.1%} of the "
            f"examples, with accuracy {r['accuracy']:.4f} on them."
        )
    return lines


def table(metrics: dict) -> list[dict]:
    """The Prefect table artifact's rows (:func:`ensemble_core.evaluators.shift_base.table`)."""
    return shift_base.table(metrics)
