"""The test split: accuracy, NLL, Brier score and ECE of the ensemble, of every member and
of the mean member, and the ensemble's diversity (:func:`ensemble_core.metrics.evaluate_all`);
and the ensemble's class-level view (:mod:`ensemble_core.class_metrics`): per-class
accuracy, NLL and ECE, the confusion matrix, and the examples worth looking at.

Arrays (``<run>/predictions.npz``): ``member_probs`` float32 ``[E, N, C]``, ``labels``
int32 ``[N]``, ``healthy`` bool ``[E]``; for each example set ``<set>`` of
:data:`EXAMPLE_SETS` (``uncertain``: the :data:`EXAMPLES` test images of highest
predictive entropy; ``confident_wrong``: the wrong predictions of highest confidence,
fewer when fewer are wrong), ``<set>_indices`` int64 ``[k]`` (in the test split),
``<set>_images`` uint8 ``[k, H, W, C]``, ``<set>_labels`` and ``<set>_predicted`` int32
``[k]``, ``<set>_probs`` float32 ``[k, C]`` (the ensemble's probabilities). Plots: a
reliability diagram (ensemble vs best member), per-member vs ensemble accuracy and NLL,
the row-normalised confusion matrix and the two example grids.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ensemble_core import class_metrics, timing
from ensemble_core import metrics as metrics_lib
from ensemble_core.calibration import apply_temperature
from ensemble_core.config import PipelineConfig
from ensemble_core.decisions import DecisionFit
from ensemble_core.evaluators import METRICS, EvalContext, EvaluatorOutput
from ensemble_core.plotting import labelled_image_grid, save, short_label, subplots

#: Images per example set (fewer when fewer exist).
EXAMPLES = 16
#: The example sets: name -> (plot key and file stem, plot title).
EXAMPLE_SETS = {
    "uncertain": ("uncertain_examples", "Test split: the most uncertain images (highest predictive entropy)"),
    "confident_wrong": ("confident_wrong_examples", "Test split: the most confident wrong predictions"),
}
#: Most confused class pairs kept in ``confusion_matrix.most_confused``.
MOST_CONFUSED = 5
#: Up to this many classes the confusion matrix plot writes each cell's count.
ANNOTATE_MAX_CLASSES = 20
#: Above this many classes the confusion matrix plot names no classes on its axes.
NAMED_AXES_MAX_CLASSES = 120


def evaluate(ctx: EvalContext) -> EvaluatorOutput:
    """Every member on the test split.

    Returns:
      metrics: :func:`ensemble_core.metrics.evaluate_all` (``ensemble``, ``members``,
      ``member_mean``, ``diversity``, ``diverged_members``; ECE and adaptive ECE with the
      evaluator's ``ece_bins``) plus ``eval_member_images_per_s`` and ``ece_bins``; with a
      fitted temperature also ``temperature`` and ``ensemble_temperature_scaled`` (the
      same figures after scaling). The class-level view of the ensemble (the healthy
      members' mean probabilities, before temperature scaling):

      - ``per_class``: :func:`ensemble_core.class_metrics.per_class_scores` with the class
        names, C rows ``{"class", "name", "count", "accuracy", "nll", "ece"}`` (None
        figures for a class with no test example);
      - ``confusion_matrix``: ``{"counts": [[int] * C] * C`` (rows true, columns
        predicted), ``"normalized": [[float] * C] * C`` (rows divided by their totals,
        rounded to 6 decimals; a row without examples all 0), ``"class_names": [str] * C``,
        ``"most_confused"``: :func:`ensemble_core.class_metrics.most_confused_pairs`, up to
        :data:`MOST_CONFUSED`}``.

      With the run's decision rules (:attr:`EvalContext.decision_fit`), ``decisions``:
      :meth:`ensemble_core.decisions.DecisionFit.score` on the test split (coverage and
      mean set size of each conformal score, selective risk and coverage; the ensemble,
      the mean member and the best member by test NLL), and ``decision_rules``: the
      ensemble's rules (:meth:`ensemble_core.decisions.DecisionRules.to_dict`).
      arrays: see the module docstring.
    """
    images, labels = ctx.load("test")
    probs, throughput = ctx.predict_split("test")
    fit = ctx.decision_fit()
    with timing.part(METRICS):
        metrics, arrays = _scores(ctx, images, labels, probs, throughput, fit)
    return EvaluatorOutput(metrics=metrics, arrays=arrays)


def _scores(
    ctx: EvalContext,
    images: np.ndarray,
    labels: np.ndarray,
    probs: np.ndarray,
    throughput: float,
    fit: DecisionFit | None,
) -> tuple[dict, dict]:
    """:func:`evaluate`'s metrics and arrays from every member's test probabilities."""
    metrics = metrics_lib.evaluate_all(probs, labels, ctx.ece_bins, healthy=ctx.healthy)
    metrics["eval_member_images_per_s"] = throughput
    metrics["ece_bins"] = ctx.ece_bins
    ensemble = metrics_lib.ensemble_probs(probs[ctx.healthy])
    if ctx.temperature is not None:
        scaled = apply_temperature(ensemble, ctx.temperature)
        metrics["temperature"] = ctx.temperature
        metrics["ensemble_temperature_scaled"] = metrics_lib.scores(scaled, labels, ctx.ece_bins)
    names = class_names(ctx.dataset.class_names, ensemble.shape[1])
    metrics["per_class"] = class_metrics.per_class_scores(ensemble, labels, ctx.ece_bins, names)
    counts = class_metrics.confusion_matrix(labels, np.argmax(ensemble, -1), len(names))
    metrics["confusion_matrix"] = {
        "counts": counts.tolist(),
        "normalized": np.round(class_metrics.normalized_confusion(counts), 6).tolist(),
        "class_names": names,
        "most_confused": class_metrics.most_confused_pairs(counts, MOST_CONFUSED, names),
    }
    if fit is not None:
        healthy = np.flatnonzero(ctx.healthy)
        best = int(healthy[np.argmin([metrics["members"][i]["nll"] for i in healthy])])
        metrics["decisions"] = fit.score(probs, labels, ctx.healthy, best)
        metrics["decision_rules"] = fit.ensemble.to_dict()
    arrays = {"member_probs": probs, "labels": labels.astype(np.int32), "healthy": ctx.healthy}
    chosen = {
        "uncertain": class_metrics.most_uncertain(ensemble, EXAMPLES),
        "confident_wrong": class_metrics.most_confident_wrong(ensemble, labels, EXAMPLES),
    }
    for key, idx in chosen.items():
        arrays[f"{key}_indices"] = idx
        arrays[f"{key}_images"] = np.asarray(images[idx], np.uint8)
        arrays[f"{key}_labels"] = np.asarray(labels[idx], np.int32)
        arrays[f"{key}_predicted"] = np.argmax(ensemble[idx], -1).astype(np.int32)
        arrays[f"{key}_probs"] = ensemble[idx].astype(np.float32)
    return metrics, arrays


def class_names(names: tuple[str, ...] | list[str], num_classes: int) -> list[str]:
    """The dataset's class names as a list of ``num_classes`` strings, or the indices
    ``"0"``, ``"1"``, ... when it has none (or not one per class)."""
    if len(names) == num_classes:
        return [str(n) for n in names]
    return [str(i) for i in range(num_classes)]


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

    if "confusion_matrix" in metrics:
        cm = metrics["confusion_matrix"]
        fig = confusion_figure(np.asarray(cm["counts"]), cm["class_names"])
        paths["confusion_matrix"] = save(fig, plots_dir / f"{prefix}confusion_matrix.png")
        for key, (stem, title) in EXAMPLE_SETS.items():
            if len(arrays.get(f"{key}_images", ())) == 0:  # no example (e.g. no wrong prediction): no plot
                continue
            captions = example_captions(
                arrays[f"{key}_labels"], arrays[f"{key}_predicted"], arrays[f"{key}_probs"], cm["class_names"]
            )
            fig = labelled_image_grid(arrays[f"{key}_images"], captions, title=title)
            paths[stem] = save(fig, plots_dir / f"{prefix}{stem}.png")
    return paths


def example_captions(labels: np.ndarray, predicted: np.ndarray, probs: np.ndarray, names: list[str]) -> list[str]:
    """One caption per example, "true: <name> /" and "pred: <name> (p=0.93)" on two lines:
    ``labels`` and ``predicted`` int ``[k]``, ``probs`` float ``[k, C]`` (p is the
    probability of the predicted class, two decimals), names shortened by
    :func:`ensemble_core.plotting.short_label`."""
    return [
        f"true: {short_label(names[t])} /\npred: {short_label(names[p])} (p={row[p]:.2f})"
        for t, p, row in zip(labels.tolist(), predicted.tolist(), np.asarray(probs), strict=True)
    ]


def confusion_figure(counts: np.ndarray, names: list[str]):
    """The confusion matrix ``counts`` int ``[C, C]`` (rows true, columns predicted)
    row-normalised as a heat map (0 to 1, a colour bar), class names on both axes
    (shortened; none above :data:`NAMED_AXES_MAX_CLASSES` classes), each nonzero cell's
    count written in it up to :data:`ANNOTATE_MAX_CLASSES` classes. The figure grows with
    C up to 20 inches. Returns the figure (pass it to :func:`ensemble_core.plotting.save`)."""
    c = len(names)
    normalized = class_metrics.normalized_confusion(counts)
    side = min(max(5.0, 0.45 * c + 2.5), 20.0)
    fig, ax = subplots(figsize=(side + 1.2, side))
    image = ax.imshow(normalized, cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="fraction of the true class")
    if c <= NAMED_AXES_MAX_CLASSES:
        small = c > ANNOTATE_MAX_CLASSES
        labels = [short_label(n, 12 if small else 18) for n in names]
        fontsize = 5 if c > 60 else 6 if small else 8
        ax.set_xticks(range(c), labels, rotation=90 if small else 45, ha="center" if small else "right")
        ax.set_yticks(range(c), labels)
        for text in (*ax.get_xticklabels(), *ax.get_yticklabels()):
            text.set_fontsize(fontsize)
            text.set_parse_math(False)
    if c <= ANNOTATE_MAX_CLASSES:
        for i in range(c):
            for j in range(c):
                if counts[i, j]:
                    colour = "white" if normalized[i, j] > 0.5 else "black"
                    ax.text(j, i, str(int(counts[i, j])), ha="center", va="center", fontsize=7, color=colour)
    title = "Confusion matrix (test split; rows row-normalised"
    ax.set(
        xlabel="predicted class",
        ylabel="true class",
        title=title + (", cells: counts)" if c <= ANNOTATE_MAX_CLASSES else ")"),
    )
    return fig
