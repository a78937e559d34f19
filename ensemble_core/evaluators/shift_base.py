"""What every shift evaluator shares: a test split transformed at several levels, scored
level by level for the ensemble, the mean member and the best member (Ovadia et al. 2019,
"Can you trust your model's uncertainty? Evaluating predictive uncertainty under dataset
shift"), plus the plot of each figure against the level and a report section."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ensemble_core import confidence_intervals as intervals
from ensemble_core import metrics as metrics_lib
from ensemble_core import stopping, timing
from ensemble_core.accuracy_estimation import estimate_all, estimation_errors
from ensemble_core.calibration import apply_temperature
from ensemble_core.config.eval_section import examples_per_level
from ensemble_core.decisions import decision_lines, mean_scores
from ensemble_core.evaluators import METRICS, EvalContext, EvaluatorOutput
from ensemble_core.plotting import image_grid, save, subplots

FIGURES = ("accuracy", "nll", "brier", "ece")
WHO = ("ensemble", "member_mean", "best_member")
#: The ensemble's figures after temperature scaling (``eval.temperature_scaling``).
SCALED = "ensemble_temperature_scaled"
#: A level's prediction-set and abstention figures (:meth:`ensemble_core.decisions.DecisionFit.score`).
DECISIONS = "decisions"
#: A level's label-free accuracy estimates (:func:`ensemble_core.accuracy_estimation.estimate_all`).
ESTIMATES = "accuracy_estimates"
#: A level's confidence intervals of the ensemble's figures (:mod:`ensemble_core.confidence_intervals`).
INTERVALS = "intervals"
#: Example images per level kept for the plots.
EXAMPLES = 8
#: Bump when a transform changes, so cached shifted sets are built again.
CACHE_VERSION = 1
#: The seed of the test images a sampled shift evaluation scores (:func:`sample_indices`):
#: fixed, so every run, level and evaluator of a test split scores the same images.
SAMPLE_SEED = 0


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


def sample_indices(test_examples: int, n: int, seed: int = SAMPLE_SEED) -> np.ndarray:
    """The test images a shift evaluation scores at every level: all ``test_examples`` when
    ``n`` covers them, else a simple random sample of ``n`` without replacement drawn with
    ``np.random.default_rng(seed)``, in the split's order (int64, ascending). A random
    sample, not the first ``n``: a user's image folder lists its test split class by class,
    so its first images are of the first classes only; a simple random sample is what the
    confidence intervals (:mod:`ensemble_core.confidence_intervals`) assume."""
    if n >= test_examples:
        return np.arange(test_examples)
    return np.sort(np.random.default_rng(seed).choice(test_examples, n, replace=False))


def level_examples(ctx: EvalContext, opts: Any, levels: int) -> int:
    """Test images per level of a shift evaluator with ``levels`` levels: its option
    ``num_examples`` when the config gives one (an explicit null: the whole test split), else
    ``eval.protocol``'s (:func:`ensemble_core.config.eval_section.examples_per_level`);
    never more than the test split."""
    total = len(ctx.load("test")[0])
    if opts is not None and "num_examples" in opts.model_fields_set:
        return total if opts.num_examples is None else min(total, opts.num_examples)
    return examples_per_level(total, levels, ctx.config.eval.protocol)


def shifted_test_set(
    ctx: EvalContext,
    name: str,
    levels: Sequence[float],
    transform: Callable[[np.ndarray, float], np.ndarray],
    num_examples: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The test split (``num_examples`` of its images, :func:`sample_indices`; default all)
    transformed at every level, cached: images uint8 ``[L*N, H, W, C]`` (level-major), labels
    int32 ``[L*N]`` and level float32 ``[L*N]``."""
    images, labels = ctx.load("test")
    total = len(images)
    if num_examples is not None and num_examples < total:
        at = sample_indices(total, num_examples)
        images, labels = images[at], labels[at]
    # a sample is named by its size and the split's (the indices follow from both and the seed)
    size = f"n{len(images)}" if len(images) == total else f"n{len(images)}of{total}s{SAMPLE_SEED}"
    key = f"{name}-v{CACHE_VERSION}-{size}-" + "_".join(f"{x:g}" for x in levels)
    if len(key) > 200:  # many levels: name them by a digest
        key = f"{name}-v{CACHE_VERSION}-{size}-" + hashlib.sha256(key.encode()).hexdigest()[:16]

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
    (:func:`ensemble_core.accuracy_estimation.estimate_all`, fitted on the calibration split),
    and ``intervals``: ``{"ensemble": {figure: [low, high]}}``, the 95% confidence intervals
    of the ensemble's accuracy, NLL, Brier and ECE on the level's sample
    (:func:`ensemble_core.confidence_intervals.level_intervals`)."""
    bins = ctx.ece_bins
    out = []
    healthy = ctx.healthy
    for index, value in enumerate(levels):
        at = level == np.float32(value)
        s = metrics_lib.shift_scores(probs[:, at], labels[at], bins, healthy=healthy)
        ens = metrics_lib.ensemble_probs(probs[healthy][:, at])
        row = {"level": float(value), **s}
        row[INTERVALS] = {"ensemble": intervals.level_intervals(ens, labels[at], bins, seed=index)}
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
    """Score the members on the test split (``num_examples`` of its images,
    :func:`sample_indices`; default all) under ``transform`` at each level
    (:func:`shifted_test_set` then :func:`evaluate_shifted`)."""
    images, labels, level = shifted_test_set(ctx, name, levels, transform, num_examples)
    return evaluate_shifted(ctx, images, labels, level, levels, unit)


def predict_levels(ctx: EvalContext, images: np.ndarray, levels: int) -> np.ndarray:
    """Every member's probabilities float32 ``[E, L*N, C]`` on a level-major shifted set
    (``images`` uint8 ``[L*N, H, W, C]``, ``L = levels``). A level whose N images are the test
    split's sample (:func:`sample_indices`; rotation by 0 degrees, translation by 0 pixels)
    is not predicted again: its rows are the test split's predictions
    (:attr:`EvalContext.predict_split`), which evaluation computes once for every evaluator."""
    n = len(images) // levels
    blocks = [images[b * n : (b + 1) * n] for b in range(levels)]
    test_images = ctx.load("test")[0]
    at = sample_indices(len(test_images), n)
    test = test_images[at]
    same = [block.shape == test.shape and np.array_equal(block, test) for block in blocks]
    if not any(same):
        return ctx.predict(images)[0]
    known = ctx.predict_split("test")[0][:, at]
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


def mean_intervals(
    ctx: EvalContext,
    probs: np.ndarray,
    labels: np.ndarray,
    level: np.ndarray,
    levels: Sequence[float],
    groups: Mapping[str, Sequence[float]] | None = None,
) -> dict:
    """``{"ensemble": {figure: [low, high]}}``: the 95% confidence intervals of the mean over
    ``levels`` of the ensemble's accuracy, NLL and Brier (every level holds the same test
    images: :func:`ensemble_core.confidence_intervals.mean_over_levels`); with ``groups``
    (``{name: its levels}``, e.g. a corruption's severities) also ``{"groups": {name: {figure:
    [low, high]}}}``, the same over each group's levels."""
    ens = metrics_lib.ensemble_probs(probs[ctx.healthy])
    at = {float(v): level == np.float32(v) for v in levels}
    terms = {v: intervals.per_example(ens[mask], labels[mask]) for v, mask in at.items()}
    out: dict = {"ensemble": intervals.mean_over_levels([terms[float(v)] for v in levels])}
    if groups:
        out["groups"] = {g: intervals.mean_over_levels([terms[float(v)] for v in vs]) for g, vs in groups.items()}
    return out


def evaluate_shifted(
    ctx: EvalContext, images: np.ndarray, labels: np.ndarray, level: np.ndarray, levels: Sequence[float], unit: str
) -> EvaluatorOutput:
    """Score the members on a shifted test set (:func:`shifted_test_set`'s arrays).

    Returns:
      metrics ``{"unit", "levels": [per level], "mean", "ensemble_beats_best_member",
      "mean_intervals", "intervals"}`` (``mean_intervals``: ``{"ensemble": {figure: [low,
      high]}}``, the 95% intervals of the mean over the levels of the ensemble's accuracy, NLL
      and Brier, :func:`mean_intervals`; ``intervals``: the level, the examples per level
      and the methods, :func:`ensemble_core.confidence_intervals.describe`);
      arrays ``member_probs`` float32 ``[E, L*N, C]``, ``labels`` int32 ``[L*N]``,
      ``level`` float32 ``[L*N]``, ``healthy`` bool ``[E]``, ``examples`` uint8
      ``[L, 8, H, W, C]`` (the first test images at every level, for the plots).
    """
    probs = predict_levels(ctx, images, len(levels))
    num_test = len(ctx.load("test")[0])
    # the decision rules and accuracy estimators: fitted once per evaluation on the held-out
    # split, whose forward pass is timed as one, not as this evaluator's metrics
    ctx.decision_fit()
    ctx.accuracy_reference()
    n = len(images) // len(levels)
    with timing.part(METRICS):
        per_level = score_levels(ctx, probs, labels, level, levels)
        metrics = {"unit": unit, "levels": per_level, **summary(per_level)}
        metrics["mean_intervals"] = mean_intervals(ctx, probs, labels, level, levels)
        metrics[INTERVALS] = intervals.describe(n, num_test)
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
        ci = r.get(INTERVALS, {}).get("ensemble", {})
        label = r.get("name", f"{r['level']:g}")
        shown = " | ".join(intervals.show(e[f], ci.get(f)) for f in FIGURES)
        lines.append(f"| {label} | {shown} | {b['nll']:.4f} | {b['brier']:.4f} | {b['ece']:.4f} |")
    mean, mean_ci = metrics["mean"]["ensemble"], metrics.get("mean_intervals", {}).get("ensemble", {})
    shown = " | ".join(intervals.show(mean[f], mean_ci.get(f)) for f in FIGURES)
    best = metrics["mean"]["best_member"]
    lines.append(f"| mean | {shown} | {best['nll']:.4f} | {best['brier']:.4f} | {best['ece']:.4f} |")
    if INTERVALS in metrics:
        lines += ["", interval_sentence(metrics, "level")]
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


def interval_sentence(metrics: dict, unit: str) -> str:
    """The report.md sentence saying what the brackets are: 95% confidence intervals of the
    ensemble's figures on the sample of each ``unit`` (level, cell) and how they are computed
    (:mod:`ensemble_core.confidence_intervals`)."""
    about = metrics[INTERVALS]
    n, total = about["examples_per_level"], about.get("test_examples", about["examples_per_level"])
    sample = (
        f"{n} of the {total} test images per {unit} (a seeded random sample, the same at every {unit}; "
        f"eval.protocol: full scores all {total})"
        if n < total
        else f"all {n} test images at every {unit}"
    )
    return (
        f"In brackets: {about['confidence']:.0%} confidence intervals of the ensemble's figures on {sample}: "
        "Wilson score interval for the accuracy, "
        f"Student-t for the NLL and Brier means, percentile bootstrap ({intervals.BOOTSTRAP_RESAMPLES:,} resamples) "
        "for the ECE; "
        f"for the mean over every {unit}, Student-t over the images' averages (each image is in every {unit})."
    )


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
