"""What every out-of-distribution evaluator shares: the test split (in-distribution)
scored together with an OOD set, and how well each uncertainty score tells them apart.

Scores (criteria; higher = more likely OOD, :func:`ensemble_core.metrics.ood_scores`):

- ``max_prob``: 1 - the maximum probability (Hendrycks & Gimpel 2017);
- ``entropy``: the predictive entropy (nats);
- ``mutual_information``: the members' mutual information (BALD; ensemble only);
- ``energy``: the free energy ``-logsumexp(z)`` of the logits (Liu et al. 2020): for
  the ensemble, of the members' mean logits; for a member, of its own logits;
- ``disagreement``: the fraction of member pairs whose top classes differ (ensemble only).

For each: AUROC, AUPR-in (in-distribution positive, score negated), AUPR-out (OOD
positive) and FPR at 95% TPR (:func:`ensemble_core.metrics.detection`), for the ensemble
and for the mean member (each healthy member's figures averaged, on the scores a single
network has: max_prob, entropy, energy), and the fraction of OOD inputs predicted with
confidence >= 0.9 (confidently wrong: no OOD label is right).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ensemble_core import metrics as metrics_lib
from ensemble_core import timing
from ensemble_core.evaluators import IMPORTS, METRICS, EvalContext, EvaluatorOutput, skipped
from ensemble_core.plotting import image_grid, save, subplots

CONFIDENT = 0.9
FIGURES = ("auroc", "aupr_in", "aupr_out", "fpr_at_95_tpr")
EXAMPLES = 16  # OOD images kept for the plots
#: The scores a single network has (the mean member's figures).
MEMBER_SCORES = ("max_prob", "entropy", "energy")


def softmax(logits: np.ndarray) -> np.ndarray:
    """``softmax`` over the last axis, computed in float64, returned float32."""
    z = np.asarray(logits, np.float64)
    z = np.exp(z - z.max(-1, keepdims=True))
    return (z / z.sum(-1, keepdims=True)).astype(np.float32)


def evaluate_ood(ctx: EvalContext, ood_images: np.ndarray, source: str) -> EvaluatorOutput:
    """Score the members on the test split followed by ``ood_images`` (uint8 ``[M, H, W, C]``).

    The members' logits are computed once (``ctx.predict_split_logits`` for the test split,
    ``ctx.predict_logits`` for the OOD images); probabilities are their softmax.

    Returns:
      metrics ``{"source", "num_in", "num_ood", "ensemble": {figure: {score: value}},
      "member_mean": {figure: {score: value}}, "confident_ood_fraction": {"ensemble",
      "member_mean"}}`` (figures :data:`FIGURES`; scores ``max_prob``, ``entropy``,
      ``mutual_information``, ``energy``, ``disagreement``, the mean member's
      :data:`MEMBER_SCORES`; ``disagreement`` needs two healthy members);
      arrays ``member_probs`` float32 ``[E, N+M, C]``, ``member_energy`` float32
      ``[E, N+M]`` (each member's :func:`~ensemble_core.metrics.energy`), ``is_ood`` bool
      ``[N+M]`` (test images first), ``labels`` int32 (-1 for OOD), ``healthy`` bool ``[E]``,
      ``ensemble_energy`` float32 ``[N+M]`` (of the mean logits), ``examples`` uint8
      ``[16, H, W, C]`` (OOD images spread over the set, for the plots).
      When the OOD images' ``[H, W, C]`` is not the dataset's (the model's input), the
      :func:`~ensemble_core.evaluators.skipped` output saying so instead.
    """
    shape = tuple(ctx.dataset.image_shape)
    if tuple(ood_images.shape[1:]) != shape:
        return skipped(f"the OOD images ({source}) are {tuple(ood_images.shape[1:])}, the model takes {shape}")
    with timing.part(IMPORTS):
        import sklearn.metrics  # noqa: F401  (loaded once per process, for metrics_lib.detection)
    labels = ctx.load("test")[1]
    in_logits, ood_logits = ctx.predict_split_logits("test"), ctx.predict_logits(ood_images)
    with timing.part(METRICS):
        return _scores(ctx, labels, ood_images, np.concatenate([in_logits, ood_logits], axis=1), source)


def _scores(
    ctx: EvalContext, labels: np.ndarray, ood_images: np.ndarray, logits: np.ndarray, source: str
) -> EvaluatorOutput:
    """:func:`evaluate_ood`'s output from every member's logits ``[E, N+M, C]`` (the test
    split's N ``labels`` first)."""
    probs = softmax(logits)
    is_ood = np.concatenate([np.zeros(len(labels), bool), np.ones(len(ood_images), bool)])
    all_labels = np.concatenate([labels.astype(np.int32), np.full(len(ood_images), -1, np.int32)])
    healthy, healthy_logits = probs[ctx.healthy], logits[ctx.healthy]
    ens_scores = metrics_lib.ood_scores(healthy, healthy_logits)
    ens = {k: metrics_lib.detection(v, is_ood) for k, v in ens_scores.items()}
    per_member = [metrics_lib.ood_scores(p[None], z[None]) for p, z in zip(healthy, healthy_logits, strict=True)]
    member_figures = [{k: metrics_lib.detection(s[k], is_ood) for k in MEMBER_SCORES} for s in per_member]
    member_mean = {k: {f: float(np.mean([m[k][f] for m in member_figures])) for f in FIGURES} for k in MEMBER_SCORES}
    confident = {
        "ensemble": metrics_lib.confident_fraction(metrics_lib.ensemble_probs(healthy)[is_ood], CONFIDENT),
        "member_mean": float(np.mean([metrics_lib.confident_fraction(m[is_ood], CONFIDENT) for m in healthy])),
    }
    metrics = {
        "source": source,
        "num_in": len(labels),
        "num_ood": len(ood_images),
        "ensemble": by_figure(ens),
        "member_mean": by_figure(member_mean),
        "confident_ood_fraction": confident,
    }
    return EvaluatorOutput(
        metrics=metrics,
        arrays={
            "member_probs": probs,
            "member_energy": metrics_lib.energy(logits).astype(np.float32),
            "ensemble_energy": ens_scores["energy"].astype(np.float32),
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


def criteria(arrays: dict) -> dict[str, dict[str, np.ndarray]]:
    """The scores of ``eval/<name>.npz``'s arrays, per criterion: ``{criterion: {"ensemble":
    [N+M], "one member": [N+M]}}`` (the first healthy member; absent for the criteria a
    single network lacks)."""
    healthy = arrays["healthy"]
    probs = arrays["member_probs"][healthy]
    ens = metrics_lib.ood_scores(probs)
    one = metrics_lib.ood_scores(probs[:1])
    out = {k: {"ensemble": v} for k, v in ens.items()}
    for k in ("max_prob", "entropy"):
        out[k]["one member"] = one[k]
    if "ensemble_energy" in arrays:
        out["energy"] = {"ensemble": arrays["ensemble_energy"], "one member": arrays["member_energy"][healthy][0]}
    order = ("max_prob", "entropy", "mutual_information", "energy", "disagreement")
    return {k: out[k] for k in order if k in out}


def roc_points(score: np.ndarray, is_ood: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ROC curve (FPR, TPR) of ``score`` flagging ``is_ood``, from scikit-learn's
    ``roc_curve`` (the same thresholds :func:`ensemble_core.metrics.detection` uses)."""
    from sklearn.metrics import roc_curve

    fpr, tpr, _ = roc_curve(is_ood, score, drop_intermediate=False)
    return fpr, tpr


def plot_ood(metrics: dict, arrays: dict, plots_dir: Path, name: str) -> dict[str, Path]:
    """``<name>_entropy.png``: predictive-entropy histograms, test vs OOD, ensemble vs one
    member (Lakshminarayanan et al. 2017, Fig. 5); ``<name>_roc.png``: one ROC panel per
    criterion, the ensemble's curve against the first member's (where a single network
    has that criterion); ``<name>_examples.png``."""
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
    by_criterion = criteria(arrays)
    fig, axes = subplots(1, len(by_criterion), figsize=(3.6 * len(by_criterion), 3.8), sharey=True)
    axes = np.atleast_1d(axes)
    for ax, (criterion, curves) in zip(axes, by_criterion.items(), strict=True):
        for who, score in curves.items():
            fpr, tpr = roc_points(score, is_ood)
            auroc = metrics_lib.detection(score, is_ood)["auroc"]
            ax.plot(fpr, tpr, label=f"{who} (AUROC {auroc:.3f})")
        ax.plot([0, 1], [0, 1], "k:")
        ax.set(xlabel="false positive rate (test flagged)", title=criterion.replace("_", " "))
        ax.legend(fontsize=7, loc="lower right")
    axes[0].set_ylabel("true positive rate (OOD flagged)")
    paths[f"{name}_roc"] = save(fig, plots_dir / f"{name}_roc.png")
    fig = image_grid(arrays["examples"][None], title=f"{name}: examples")
    paths[f"{name}_examples"] = save(fig, plots_dir / f"{name}_examples.png")
    return paths


def markdown(metrics: dict, title: str) -> list[str]:
    """A report.md section: AUROC, AUPR-in/out and FPR95 per score, ensemble vs mean member."""
    lines = [
        f"**{title}** ({metrics['num_in']} test vs {metrics['num_ood']} OOD images, {metrics['source']}):",
        "",
        "| score | ensemble AUROC | AUPR-in | AUPR-out | FPR@95%TPR | mean member AUROC | AUPR-in | AUPR-out "
        "| FPR@95%TPR |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
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
