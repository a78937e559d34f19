"""The test split: accuracy, NLL, Brier score and ECE of the ensemble, of every member and
of the mean member, and the ensemble's diversity (:func:`ensemble_core.metrics.evaluate_all`).

Arrays (``<run>/predictions.npz``): ``member_probs`` float32 ``[E, N, C]``, ``labels``
int32 ``[N]``, ``healthy`` bool ``[E]``. Plots: a reliability diagram (ensemble vs best
member) and per-member vs ensemble accuracy and NLL.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ensemble_core import metrics as metrics_lib
from ensemble_core.calibration import apply_temperature
from ensemble_core.config import PipelineConfig
from ensemble_core.evaluators import EvalContext, EvaluatorOutput
from ensemble_core.plotting import save, subplots


def evaluate(ctx: EvalContext) -> EvaluatorOutput:
    """Every member on the test split.

    Returns:
      metrics: :func:`ensemble_core.metrics.evaluate_all` (``ensemble``, ``members``,
      ``member_mean``, ``diversity``, ``diverged_members``; ECE and adaptive ECE with the
      evaluator's ``ece_bins``) plus ``eval_member_images_per_s`` and ``ece_bins``; with a
      fitted temperature also ``temperature`` and ``ensemble_temperature_scaled`` (the
      same figures after scaling).
    """
    _, labels = ctx.load("test")
    probs, throughput = ctx.predict_split("test")
    metrics = metrics_lib.evaluate_all(probs, labels, ctx.ece_bins, healthy=ctx.healthy)
    metrics["eval_member_images_per_s"] = throughput
    metrics["ece_bins"] = ctx.ece_bins
    if ctx.temperature is not None:
        scaled = apply_temperature(metrics_lib.ensemble_probs(probs[ctx.healthy]), ctx.temperature)
        metrics["temperature"] = ctx.temperature
        metrics["ensemble_temperature_scaled"] = metrics_lib.scores(scaled, labels, ctx.ece_bins)
    arrays = {"member_probs": probs, "labels": labels.astype(np.int32), "healthy": ctx.healthy}
    return EvaluatorOutput(metrics=metrics, arrays=arrays)


def plot(metrics: dict, arrays: dict, plots_dir: Path, config: PipelineConfig, name: str = "test") -> dict[str, Path]:
    """``reliability.png`` (ensemble vs the best member by NLL) and ``members.png``
    (prefixed ``<name>_`` for a second evaluator of this type)."""
    prefix = "" if name == "test" else f"{name}_"
    member_probs, labels = arrays["member_probs"], arrays["labels"]
    members, ensemble = metrics["members"], metrics["ensemble"]
    paths = {}

    best = int(np.argmin([m["nll"] for m in members]))
    fig, ax = subplots(figsize=(5, 5))
    ax.plot([0, 1], [0, 1], "k:", label="perfect calibration")
    for name, probs in (
        (f"ensemble (ECE {ensemble['ece']:.3f})", metrics_lib.ensemble_probs(member_probs)),
        (f"best member {best} (ECE {members[best]['ece']:.3f})", member_probs[best]),
    ):
        curve = metrics_lib.reliability_curve(probs, labels, metrics.get("ece_bins", config.eval.ece_bins))
        xs = [c for c, n in zip(curve["confidence"], curve["count"], strict=True) if n]
        ys = [a for a, n in zip(curve["accuracy"], curve["count"], strict=True) if n]
        ax.plot(xs, ys, "o-", label=name)
    ax.set(xlabel="confidence (top label)", ylabel="accuracy", title="Reliability diagram", xlim=(0, 1), ylim=(0, 1))
    ax.legend(loc="upper left", fontsize=8)
    paths["reliability"] = save(fig, plots_dir / f"{prefix}reliability.png")

    fig, axes = subplots(1, 2, figsize=(10, 4))
    e = len(members)
    for ax, key, label in ((axes[0], "accuracy", "test accuracy"), (axes[1], "nll", "test NLL (nats)")):
        ax.bar(range(e), [m[key] for m in members], color="tab:blue", label="members")
        ax.axhline(ensemble[key], color="tab:red", label="ensemble")
        ax.axhline(metrics["member_mean"][key], color="tab:gray", linestyle="--", label="member mean")
        values = [m[key] for m in members] + [ensemble[key]]
        span = max(values) - min(values) or abs(max(values)) * 0.1 or 0.1
        ax.set_ylim(min(values) - span, max(values) + span)
        ax.set(xlabel="member", ylabel=label, title=f"{label}: members vs ensemble")
        ax.legend(fontsize=8)
    paths["members"] = save(fig, plots_dir / f"{prefix}members.png")
    return paths
