"""What every out-of-distribution evaluator shares: the test split (in-distribution)
followed by an OOD set, and how well three uncertainty scores tell them apart.

Scores (higher = more likely OOD, :func:`ensemble_core.metrics.ood_scores`): maximum
probability (Hendrycks & Gimpel 2017, as 1 - max p), predictive entropy and mutual
information. For each: AUROC, AUPR (OOD positive) and FPR at 95% TPR
(:func:`ensemble_core.metrics.detection`), for the ensemble and for the mean member (each
healthy member's figures averaged; a single member's mutual information is 0, so the
member figures use max probability and entropy only), and the fraction of OOD inputs
predicted with confidence >= 0.9 (confidently wrong: no OOD label is right).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ensemble_core import metrics as metrics_lib
from ensemble_core.evaluators import EvalContext, EvaluatorOutput, skipped
from ensemble_core.plotting import image_grid, save, subplots

CONFIDENT = 0.9
FIGURES = ("auroc", "aupr", "fpr_at_95_tpr")
EXAMPLES = 16  # OOD images kept for the plots
MEMBER_SCORES = ("max_prob", "entropy")


def evaluate_ood(ctx: EvalContext, ood_images: np.ndarray, source: str) -> EvaluatorOutput:
    """Score the members on the test split followed by ``ood_images`` (uint8 ``[M, H, W, C]``).

    Returns:
      metrics ``{"source", "num_in", "num_ood", "ensemble": {figure: {score: value}},
      "member_mean": {figure: {score: value}}, "confident_ood_fraction": {"ensemble",
      "member_mean"}}`` (figures ``auroc``, ``aupr``, ``fpr_at_95_tpr``; scores
      ``max_prob``, ``entropy``, ``mutual_information``, the last for the ensemble only);
      arrays ``member_probs`` float32 ``[E, N+M, C]``, ``is_ood`` bool
      ``[N+M]`` (test images first), ``labels`` int32 (-1 for OOD), ``healthy`` bool ``[E]``,
      ``examples`` uint8 ``[16, H, W, C]`` (OOD images spread over the set, for the plots).
      When the OOD images' ``[H, W, C]`` is not the dataset's (the model's input), the
      :func:`~ensemble_core.evaluators.skipped` output saying so instead.
    """
    shape = tuple(ctx.dataset.image_shape)
    if tuple(ood_images.shape[1:]) != shape:
        return skipped(f"the OOD images ({source}) are {tuple(ood_images.shape[1:])}, the model takes {shape}")
    images, labels = ctx.load("test")
    test_probs, _ = ctx.predict_split("test")
    probs = np.concatenate([test_probs, ctx.predict(ood_images)[0]], axis=1)
    is_ood = np.concatenate([np.zeros(len(images), bool), np.ones(len(ood_images), bool)])
    all_labels = np.concatenate([labels.astype(np.int32), np.full(len(ood_images), -1, np.int32)])
    healthy = probs[ctx.healthy]
    ens = {k: metrics_lib.detection(v, is_ood) for k, v in metrics_lib.ood_scores(healthy).items()}
    per_member = [metrics_lib.ood_scores(m[None]) for m in healthy]
    member_mean = {
        k: {f: float(np.mean([metrics_lib.detection(s[k], is_ood)[f] for s in per_member])) for f in ens[k]}
        for k in MEMBER_SCORES
    }
    confident = {
        "ensemble": metrics_lib.confident_fraction(metrics_lib.ensemble_probs(healthy)[is_ood], CONFIDENT),
        "member_mean": float(np.mean([metrics_lib.confident_fraction(m[is_ood], CONFIDENT) for m in healthy])),
    }
    metrics = {
        "source": source,
        "num_in": len(images),
        "num_ood": len(ood_images),
        "ensemble": by_figure(ens),
        "member_mean": by_figure(member_mean),
        "confident_ood_fraction": confident,
    }
    return EvaluatorOutput(
        metrics=metrics,
        arrays={
            "member_probs": probs,
            "is_ood": is_ood,
            "labels": all_labels,
            "healthy": ctx.healthy,
            "examples": ood_images[:: max(1, len(ood_images) // EXAMPLES)][:EXAMPLES],
        },
    )


def by_figure(per_score: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """``{score: {figure: v}}`` -> ``{figure: {score: v}}`` (report.json's layout:
    ``ensemble.auroc.mutual_information``)."""
    figures = next(iter(per_score.values())).keys()
    return {f: {score: d[f] for score, d in per_score.items()} for f in figures}


def plot_ood(metrics: dict, arrays: dict, plots_dir: Path, name: str) -> dict[str, Path]:
    """``<name>_entropy.png``: predictive-entropy histograms, test vs OOD, ensemble vs one
    member (Lakshminarayanan et al. 2017, Fig. 5); ``<name>_roc.png``: ROC curves of the
    ensemble's three scores and the first member's entropy."""
    probs, is_ood = arrays["member_probs"][arrays["healthy"]], arrays["is_ood"]
    fig, axes = subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, (who, p) in zip(axes, (("ensemble", probs), ("one member", probs[:1])), strict=True):
        h = metrics_lib.predictive_entropy(p)
        bins = np.linspace(0, np.log(probs.shape[-1]), 30)
        ax.hist(h[~is_ood], bins=bins, alpha=0.6, density=True, label="test (in-distribution)")
        ax.hist(h[is_ood], bins=bins, alpha=0.6, density=True, label=f"{name} (OOD)")
        ax.set(xlabel="predictive entropy (nats)", title=f"{who}")
        ax.legend(fontsize=8)
    paths = {f"{name}_entropy": save(fig, plots_dir / f"{name}_entropy.png")}
    fig, ax = subplots(figsize=(5, 5))
    curves = {f"ensemble {k}": v for k, v in metrics_lib.ood_scores(probs).items()}
    curves["one member entropy"] = metrics_lib.ood_scores(probs[:1])["entropy"]
    for label, score in curves.items():
        order = np.argsort(-score, kind="stable")
        tpr = np.cumsum(is_ood[order]) / is_ood.sum()
        fpr = np.cumsum(~is_ood[order]) / (~is_ood).sum()
        ax.plot(np.r_[0, fpr], np.r_[0, tpr], label=label)
    ax.plot([0, 1], [0, 1], "k:")
    ax.set(xlabel="false positive rate (test flagged)", ylabel="true positive rate (OOD flagged)", title=f"ROC: {name}")
    ax.legend(fontsize=8)
    paths[f"{name}_roc"] = save(fig, plots_dir / f"{name}_roc.png")
    fig = image_grid(arrays["examples"][None], title=f"{name}: examples")
    paths[f"{name}_examples"] = save(fig, plots_dir / f"{name}_examples.png")
    return paths


def markdown(metrics: dict, title: str) -> list[str]:
    """A report.md section: AUROC/AUPR/FPR95 per score, ensemble vs mean member."""
    lines = [
        f"**{title}** ({metrics['num_in']} test vs {metrics['num_ood']} OOD images, {metrics['source']}):",
        "",
        "| score | ensemble AUROC | AUPR | FPR@95%TPR | mean member AUROC | AUPR | FPR@95%TPR |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    ens, mean = metrics["ensemble"], metrics["member_mean"]
    for score in ens["auroc"]:
        cells = [f"{ens[f][score]:.4f}" for f in FIGURES]
        cells += [f"{mean[f][score]:.4f}" if score in mean[f] else "-" for f in FIGURES]
        lines.append(f"| {score} | " + " | ".join(cells) + " |")
    c = metrics["confident_ood_fraction"]
    lines += [
        "",
        f"OOD inputs predicted with confidence >= {CONFIDENT}: ensemble {c['ensemble']:.1%}, "
        f"mean member {c['member_mean']:.1%}.",
    ]
    return lines


def table(metrics: dict) -> list[dict]:
    """One row per score: the ensemble's and the mean member's detection figures."""
    rows = []
    ens, mean = metrics["ensemble"], metrics["member_mean"]
    for score in ens["auroc"]:
        row = {"score": score, **{f"ensemble {f}": round(ens[f][score], 4) for f in FIGURES}}
        row.update({f"member mean {f}": round(mean[f][score], 4) for f in FIGURES if score in mean[f]})
        rows.append(row)
    return rows
