"""What every shift evaluator shares: a test split transformed at several levels, scored
level by level for the ensemble, the mean member and the best member (Ovadia et al. 2019,
"Can you trust your model's uncertainty? Evaluating predictive uncertainty under dataset
shift"), plus the plot of each figure against the level and a report section."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ensemble_core import metrics as metrics_lib
from ensemble_core import stopping
from ensemble_core.accuracy_estimation import estimate_all, estimation_errors
from ensemble_core.calibration import apply_temperature
from ensemble_core.decisions import decision_lines, mean_scores
from ensemble_core.evaluators import EvalContext, EvaluatorOutput
from ensemble_core.plotting import image_grid, save, subplots

FIGURES = ("accuracy", "nll", "brier", "ece")
WHO = ("ensemble", "member_mean", "best_member")
#: The ensemble's figures after temperature scaling (``eval.temperature_scaling``).
SCALED = "ensemble_temperature_scaled"
#: A level's prediction-set and abstention figures (:meth:`ensemble_core.decisions.DecisionFit.score`).
DECISIONS = "decisions"
#: A level's label-free accuracy estimates (:func:`ensemble_core.accuracy_estimation.estimate_all`).
ESTIMATES = "accuracy_estimates"
#: Example images per level kept for the plots.
EXAMPLES = 8
#: Bump when a transform changes, so cached shifted sets are built again.
CACHE_VERSION = 1


def distinct_levels(option: str, values: tuple, known: Sequence) -> tuple:
    """``values`` when they are distinct members of ``known`` (an evaluator option listing
    levels: corruptions, severities).

    Raises:
      ValueError: naming ``option``, the values and the known ones (pydantic makes it the
        one-line refusal of ``eval.evaluators.<name>.<option>``).
    """
    if any(v not in known for v in values) or len(set(values)) != len(values):
        raise ValueError(f"{option} {list(values)} must be distinct values among {', '.join(map(str, known))}")
    return values


def shifted_test_set(
    ctx: EvalContext,
    name: str,
    levels: Sequence[float],
    transform: Callable[[np.ndarray, float], np.ndarray],
    num_examples: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The test split (its first ``num_examples`` images; default all) transformed at every
    level, cached: images uint8 ``[L*N, H, W, C]`` (level-major), labels int32 ``[L*N]``
    and level float32 ``[L*N]``."""
    images, labels = ctx.load("test")
    if num_examples is not None:
        images, labels = images[:num_examples], labels[:num_examples]
    key = f"{name}-v{CACHE_VERSION}-n{len(images)}-" + "_".join(f"{x:g}" for x in levels)
    if len(key) > 200:  # many levels: name them by a digest
        key = f"{name}-v{CACHE_VERSION}-n{len(images)}-" + hashlib.sha256(key.encode()).hexdigest()[:16]

    def build() -> dict[str, np.ndarray]:
        shifted = []
        for level in levels:
            stopping.check()  # building a shifted set takes seconds: a stop request ends it between levels
            shifted.append(transform(images, level))
        return {"images": np.concatenate(shifted)}

    shifted = ctx.cached(key, build, {"images": (len(levels) * len(images), *images.shape[1:])})["images"]
    level = np.repeat(np.asarray(levels, np.float32), len(images))
    return shifted, np.tile(labels.astype(np.int32), len(levels)), level


def score_levels(
    ctx: EvalContext, probs: np.ndarray, labels: np.ndarray, level: np.ndarray, levels: Sequence[float]
) -> list[dict]:
    """Per level: ``{"level", "ensemble", "member_mean", "best_member", "best_member_index"}``
    (:data:`ensemble_core.metrics.SCORES` of each: accuracy, NLL, Brier, ECE and adaptive
    ECE with the evaluator's ``ece_bins``, AURC and accuracy at 80% coverage, Geifman &
    El-Yaniv 2017), ``ensemble_temperature_scaled`` when the context has a temperature, and
    ``decisions`` when the run has prediction sets: the coverage and mean set size of each
    conformal score and the selective risk and coverage of the abstention rule, for the
    ensemble, the mean member and the best member
    (:meth:`ensemble_core.decisions.DecisionFit.score`), and ``accuracy_estimates``: every
    label-free estimate of the ensemble's accuracy at the level
    (:func:`ensemble_core.accuracy_estimation.estimate_all`, fitted on the calibration split)."""
    bins = ctx.ece_bins
    out = []
    healthy = ctx.healthy
    for value in levels:
        at = level == np.float32(value)
        s = metrics_lib.shift_scores(probs[:, at], labels[at], bins, healthy=healthy)
        ens = metrics_lib.ensemble_probs(probs[healthy][:, at])
        row = {"level": float(value), **s}
        if ctx.temperature is not None:
            row[SCALED] = metrics_lib.scores(apply_temperature(ens, ctx.temperature), labels[at], bins)
        fit = ctx.decision_fit()
        if fit is not None:
            row[DECISIONS] = fit.score(probs[:, at], labels[at], healthy, s["best_member_index"])
        reference = ctx.accuracy_reference()
        if reference is not None:
            row[ESTIMATES] = estimate_all(reference, probs[healthy][:, at], ctx.temperature)
        out.append(row)
    return out


def summary(per_level: list[dict]) -> dict:
    """The mean of every figure over the levels, for ``ensemble``, ``member_mean`` and
    ``best_member`` (the best member per level), ``ensemble_beats_best_member``: at
    how many levels the ensemble's NLL / Brier is below the best member's, and
    ``mean_decisions``, the mean of every level's ``decisions`` (when the levels have them),
    and ``accuracy_estimation``: each label-free estimator's error against the ensemble's
    true accuracy over the levels (:func:`ensemble_core.accuracy_estimation.estimation_errors`:
    ``mae``, ``max_abs_error`` in accuracy units, ``worst_index``)."""
    present = [who for who in (*WHO, SCALED) if who in per_level[0]]
    mean = {who: {f: float(np.mean([r[who][f] for r in per_level])) for f in metrics_lib.SCORES} for who in present}
    wins = {f: int(sum(r["ensemble"][f] < r["best_member"][f] for r in per_level)) for f in ("nll", "brier", "ece")}
    out = {"mean": mean, "ensemble_beats_best_member": {**wins, "of_levels": len(per_level)}}
    if DECISIONS in per_level[0]:
        out["mean_decisions"] = mean_scores([r[DECISIONS] for r in per_level])
    if ESTIMATES in per_level[0]:
        out["accuracy_estimation"] = estimation_errors(
            [r[ESTIMATES] for r in per_level], [r["ensemble"]["accuracy"] for r in per_level]
        )
    return out


def evaluate_shift(
    ctx: EvalContext,
    name: str,
    unit: str,
    levels: Sequence[float],
    transform: Callable[[np.ndarray, Any], np.ndarray],  # (images, level): degrees or pixels
    num_examples: int | None = None,
) -> EvaluatorOutput:
    """Score the members on the test split (its first ``num_examples`` images; default all)
    under ``transform`` at each level (:func:`shifted_test_set` then :func:`evaluate_shifted`)."""
    images, labels, level = shifted_test_set(ctx, name, levels, transform, num_examples)
    return evaluate_shifted(ctx, images, labels, level, levels, unit)


def predict_levels(ctx: EvalContext, images: np.ndarray, levels: int) -> np.ndarray:
    """Every member's probabilities float32 ``[E, L*N, C]`` on a level-major shifted set
    (``images`` uint8 ``[L*N, H, W, C]``, ``L = levels``). A level whose N images are the test
    split's first N (rotation by 0 degrees, translation by 0 pixels) is not predicted again:
    its rows are the test split's predictions (:attr:`EvalContext.predict_split`), which
    evaluation computes once for every evaluator."""
    n = len(images) // levels
    blocks = [images[b * n : (b + 1) * n] for b in range(levels)]
    test = ctx.load("test")[0][:n]
    same = [block.shape == test.shape and np.array_equal(block, test) for block in blocks]
    if not any(same):
        return ctx.predict(images)[0]
    known = ctx.predict_split("test")[0][:, :n]
    out = np.empty((known.shape[0], len(images), known.shape[2]), np.float32)
    rest = [b for b in range(levels) if not same[b]]
    if rest:
        probs = ctx.predict(np.concatenate([blocks[b] for b in rest]))[0]
        for i, b in enumerate(rest):
            out[:, b * n : (b + 1) * n] = probs[:, i * n : (i + 1) * n]
    for b in range(levels):
        if same[b]:
            out[:, b * n : (b + 1) * n] = known
    return out


def evaluate_shifted(
    ctx: EvalContext, images: np.ndarray, labels: np.ndarray, level: np.ndarray, levels: Sequence[float], unit: str
) -> EvaluatorOutput:
    """Score the members on a shifted test set (:func:`shifted_test_set`'s arrays).

    Returns:
      metrics ``{"unit", "levels": [per level], "mean", "ensemble_beats_best_member"}``;
      arrays ``member_probs`` float32 ``[E, L*N, C]``, ``labels`` int32 ``[L*N]``,
      ``level`` float32 ``[L*N]``, ``healthy`` bool ``[E]``, ``examples`` uint8
      ``[L, 8, H, W, C]`` (the first test images at every level, for the plots).
    """
    probs = predict_levels(ctx, images, len(levels))
    per_level = score_levels(ctx, probs, labels, level, levels)
    metrics = {"unit": unit, "levels": per_level, **summary(per_level)}
    n = len(images) // len(levels)
    examples = images.reshape(len(levels), n, *images.shape[1:])[:, :EXAMPLES]
    return EvaluatorOutput(
        metrics=metrics,
        arrays={
            "member_probs": probs,
            "labels": labels,
            "level": level,
            "healthy": ctx.healthy,
            "examples": examples,
        },
    )


def plot_levels(metrics: dict, plots_dir: Path, name: str, xlabel: str, ticks: Sequence[str] | None = None) -> Path:
    """``<name>.png``: accuracy, NLL, Brier and ECE against the level, for the ensemble, the
    mean member and the best member."""
    rows = metrics["levels"]
    xs = np.arange(len(rows)) if ticks is not None else [r["level"] for r in rows]
    fig, axes = subplots(1, 4, figsize=(16, 3.6))
    styles = {"ensemble": ("tab:red", "-"), "member_mean": ("tab:gray", "--"), "best_member": ("tab:blue", ":")}
    for ax, figure in zip(axes, FIGURES, strict=True):
        for who, (color, style) in styles.items():
            ax.plot(xs, [r[who][figure] for r in rows], style, marker=".", color=color, label=who.replace("_", " "))
        ax.set(xlabel=xlabel, title=f"{figure} under {name}")
        if ticks is not None:
            ax.set_xticks(xs, ticks, rotation=90, fontsize=7)
    axes[0].legend(fontsize=8)
    return save(fig, plots_dir / f"{name}.png")


def plot_examples(metrics: dict, arrays: dict, plots_dir: Path, name: str) -> Path:
    """``<name>_examples.png``: the first test images at every level (a row per level)."""
    labels = [str(row.get("name", f"{row['level']:g}")) for row in metrics["levels"]]
    return save(image_grid(arrays["examples"], labels, f"{name}: examples"), plots_dir / f"{name}_examples.png")


def markdown(metrics: dict, title: str, unit: str) -> list[str]:
    """A report.md section: the table of levels (ensemble vs best member) and the means."""
    lines = [
        f"**{title}** (ensemble vs best member vs mean member; {unit}):",
        "",
        "| level | accuracy | NLL | Brier | ECE | best member NLL | best member Brier | best member ECE |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in metrics["levels"]:
        e, b = r["ensemble"], r["best_member"]
        label = r.get("name", f"{r['level']:g}")
        lines.append(
            f"| {label} | {e['accuracy']:.4f} | {e['nll']:.4f} | {e['brier']:.4f} | {e['ece']:.4f} | "
            f"{b['nll']:.4f} | {b['brier']:.4f} | {b['ece']:.4f} |"
        )
    lines += ["", wins_sentence(metrics, "levels")]
    if "accuracy_estimation" in metrics:
        lines += ["", estimation_sentence(metrics, "levels")]
    if DECISIONS in metrics["levels"][0]:
        lines += [
            "",
            *decision_lines([(str(r.get("name", f"{r['level']:g}")), r[DECISIONS]) for r in metrics["levels"]]),
        ]
    if SCALED in metrics["mean"]:
        before, after = metrics["mean"]["ensemble"], metrics["mean"][SCALED]
        lines += [
            "",
            f"Temperature scaling (mean over levels): NLL {before['nll']:.4f} -> {after['nll']:.4f}, "
            f"Brier {before['brier']:.4f} -> {after['brier']:.4f}, ECE {before['ece']:.4f} -> {after['ece']:.4f}.",
        ]
    return lines


def wins_sentence(metrics: dict, unit: str) -> str:
    """The report.md sentence of :func:`summary`'s ``ensemble_beats_best_member``: at how
    many ``unit`` (levels, cells) the ensemble's NLL, Brier and ECE are below the best member's."""
    wins = metrics["ensemble_beats_best_member"]
    n = wins["of_levels"]
    return (
        f"Ensemble below the best member at {wins['nll']}/{n} {unit} in NLL, "
        f"{wins['brier']}/{n} in Brier, {wins['ece']}/{n} in ECE."
    )


def table(metrics: dict) -> list[dict]:
    """One row per level: the ensemble's and the best member's figures (rounded)."""
    rows = []
    for r in metrics["levels"]:
        row = {"level": r.get("name", r["level"])}
        row.update({f"ensemble {f}": round(r["ensemble"][f], 4) for f in FIGURES})
        row.update({f"best member {f}": round(r["best_member"][f], 4) for f in FIGURES})
        row.update({f"member mean {f}": round(r["member_mean"][f], 4) for f in FIGURES})
        if SCALED in r:
            row.update({f"ensemble scaled {f}": round(r[SCALED][f], 4) for f in FIGURES})
        rows.append(row)
    return rows


def estimation_sentence(metrics: dict, unit: str) -> str:
    """The report.md sentence of :func:`summary`'s ``accuracy_estimation``: each label-free
    estimator's mean and largest absolute error over the ``unit`` (levels, cells), in
    accuracy points, best first."""
    errors = metrics["accuracy_estimation"]
    ranked = sorted(errors.items(), key=lambda kv: kv[1]["mae"])
    names = [r.get("name", f"{r['level']:g}") for r in metrics["levels"]]
    parts = [
        f"{name} {100 * e['mae']:.1f} (worst {100 * e['max_abs_error']:.1f} at {names[e['worst_index']]})"
        for name, e in ranked
    ]
    head = f"Label-free accuracy estimates against the true accuracy over the {unit}, mean absolute error in points: "
    return head + "; ".join(parts) + "."
