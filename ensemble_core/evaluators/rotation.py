"""Rotated test split, 0 to 180 degrees in 15-degree steps (Ovadia et al. 2019, rotated
MNIST; :func:`ensemble_core.shifts.rotate`), plus selective prediction at 60 degrees:
the accuracy on the examples predicted with confidence >= tau and the risk-coverage curve.

Arrays (``eval/rotation.npz``): ``member_probs`` float32 ``[E, 13*N, C]``, ``labels`` int32,
``level`` float32 (degrees), ``healthy`` bool ``[E]``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ensemble_core import metrics as metrics_lib
from ensemble_core import shifts
from ensemble_core.config import PipelineConfig
from ensemble_core.evaluators import EvalContext, EvaluatorOutput, _shift
from ensemble_core.plotting import plt, save

SELECTIVE_DEGREES = 60.0
TAUS = (0.0, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)


def evaluate(ctx: EvalContext) -> EvaluatorOutput:
    """Every member on the rotated test split; see the module docstring."""
    out = _shift.evaluate_shift(ctx, "rotation", "degrees", shifts.ROTATION_DEGREES, shifts.rotate)
    at = out.arrays["level"] == np.float32(SELECTIVE_DEGREES)
    probs, labels = out.arrays["member_probs"][:, at], out.arrays["labels"][at]
    healthy = ctx.healthy
    best = out.metrics["levels"][shifts.ROTATION_DEGREES.index(int(SELECTIVE_DEGREES))]["best_member_index"]
    who = {"ensemble": metrics_lib.ensemble_probs(probs[healthy]), "best_member": probs[best]}
    out.metrics["selective_at_60"] = {
        name: [{"tau": tau, **metrics_lib.accuracy_above(p, labels, tau)} for tau in TAUS] for name, p in who.items()
    }
    return out


def plot(metrics: dict, arrays: dict, plots_dir: Path, config: PipelineConfig) -> dict[str, Path]:
    """``rotation.png`` (figures vs angle) and ``rotation_selective.png`` (accuracy vs
    confidence threshold and risk-coverage at 60 degrees)."""
    paths = {"rotation": _shift.plot_levels(metrics, plots_dir, "rotation", "rotation (degrees)")}
    paths["rotation_examples"] = _shift.plot_examples(metrics, arrays, plots_dir, "rotation")
    at = arrays["level"] == np.float32(SELECTIVE_DEGREES)
    probs, labels = arrays["member_probs"][arrays["healthy"]][:, at], arrays["labels"][at]
    best = metrics["levels"][shifts.ROTATION_DEGREES.index(int(SELECTIVE_DEGREES))]["best_member_index"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for name, rows in metrics["selective_at_60"].items():
        ok = [r for r in rows if r["accuracy"] is not None]
        axes[0].plot([r["tau"] for r in ok], [r["accuracy"] for r in ok], "o-", label=name.replace("_", " "))
    axes[0].set(xlabel="confidence threshold tau", ylabel="accuracy on examples with confidence >= tau")
    axes[0].set_title(f"Selective prediction at {SELECTIVE_DEGREES:g} degrees")
    best_probs = arrays["member_probs"][best][at]
    for name, p in (("ensemble", metrics_lib.ensemble_probs(probs)), ("best member", best_probs)):
        coverage, risk = metrics_lib.risk_coverage(p, labels)
        axes[1].plot(coverage, risk, label=f"{name} (AURC {metrics_lib.aurc(p, labels):.3f})")
    axes[1].set(xlabel="coverage", ylabel="risk (error rate)", title=f"Risk-coverage at {SELECTIVE_DEGREES:g} degrees")
    for ax in axes:
        ax.legend(fontsize=8)
    paths["rotation_selective"] = save(fig, plots_dir / "rotation_selective.png")
    return paths


def markdown(metrics: dict) -> list[str]:
    """The rotation table and the selective-prediction line at 60 degrees."""
    lines = _shift.markdown(metrics, "Rotation", "degrees")
    sel = {r["tau"]: r for r in metrics["selective_at_60"]["ensemble"]}
    r = sel[0.9]
    if r["accuracy"] is not None:
        lines.append(
            f"At {SELECTIVE_DEGREES:g} degrees the ensemble is confident (>= 0.9) on {r['fraction']:.1%} of the "
            f"examples, with accuracy {r['accuracy']:.4f} on them."
        )
    return lines


def table(metrics: dict) -> list[dict]:
    """The Prefect table artifact's rows (:func:`ensemble_core.evaluators._shift.table`)."""
    return _shift.table(metrics)
