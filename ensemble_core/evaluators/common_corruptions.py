"""The 15 common corruptions of Hendrycks & Dietterich 2019 ("Benchmarking Neural Network
Robustness to Common Corruptions and Perturbations") at severities 1-5, on the test split
of any dataset (:mod:`ensemble_core.shifts.common_corruptions` says how each corruption and
its parameters follow the reference code at the image's size).

Every (corruption, severity) cell holds the same ``num_examples`` test images (a seeded
random sample of the test split, :func:`ensemble_core.evaluators.shift_base.sample_indices`;
by default ``eval.protocol``'s size, :func:`ensemble_core.evaluators.shift_base.level_examples`),
so the cells are paired; the corrupted copies are generated once per test split, seed and
selection, and cached beside the prepared dataset like every derived set (corrupted in
blocks of :data:`BLOCK` images, each block with its own seed). The figures are
those of every shift evaluator (:mod:`ensemble_core.evaluators.shift_base`) per cell, and
the literature's summary: the mean over all corruptions and severities (uncertainty-
baselines' cA / cNLL / cECE) for the ensemble, the mean member, the best member and each
member, and the mean over severities per corruption.

Options (:class:`Options`): ``corruptions`` (default: all 15), ``severities`` (default:
1-5), ``num_examples`` (test images per cell; default: ``eval.protocol``'s, 100 or more;
null: the whole test split), ``seed``.

Every cell's ensemble figures carry their 95% confidence intervals (``levels[].intervals``),
the means over the cells and over each corruption's severities theirs
(``mean_intervals``; :mod:`ensemble_core.confidence_intervals`).

Arrays (``eval/<name>.npz``): ``member_probs`` float32 ``[E, L*N, C]``, ``labels`` int32
``[L*N]``, ``level`` float32 ``[L*N]`` (the cell's index in ``metrics["levels"]``, whose
rows carry ``corruption`` and ``severity``), ``healthy`` bool ``[E]``, ``examples`` uint8
``[L, 8, H, W, C]``.
"""

from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ensemble_core import confidence_intervals as intervals
from ensemble_core import metrics as metrics_lib
from ensemble_core import timing
from ensemble_core.config import PipelineConfig
from ensemble_core.data import DatasetInfo
from ensemble_core.decisions import decision_lines, mean_scores
from ensemble_core.evaluators import METRICS, EvalContext, EvaluatorOutput, shift_base, skipped
from ensemble_core.plotting import image_grid, save, subplots
from ensemble_core.shifts.common_corruptions import MIN_SIDE, NAMES, SEVERITIES, corrupt

log = logging.getLogger(__name__)

#: Bump when a corruption changes, so cached corrupted sets are built again.
CACHE_VERSION = 2
#: Test images corrupted at once. Larger batches leave the CPU caches: measured on 2 cores
#: (benchmarks/common_corruptions.py), 10,000 images in one batch took 75 times as long as
#: 1,000, not 10 times.
BLOCK = 1000


def corrupt_in_blocks(images: np.ndarray, name: str, severity: int, seed: int) -> np.ndarray:
    """``images`` (uint8 ``[N, H, W, C]``) corrupted in blocks of :data:`BLOCK`, block ``b``
    with the seed ``SeedSequence([seed, b])`` draws (so the result does not depend on the
    machine, only on ``seed`` and the images' order)."""
    out = np.empty_like(images)
    for b, start in enumerate(range(0, len(images), BLOCK)):
        block_seed = int(np.random.SeedSequence([seed, b]).generate_state(1)[0])
        out[start : start + BLOCK] = corrupt(images[start : start + BLOCK], name, severity, block_seed)
    return out


class Options(BaseModel):
    """The common_corruptions evaluator's options."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    corruptions: tuple[str, ...] = Field(
        NAMES, min_length=1, description=f"Corruptions to run (Hendrycks & Dietterich 2019): {', '.join(NAMES)}."
    )
    severities: tuple[int, ...] = Field(SEVERITIES, min_length=1, description="Severities to run, among 1-5.")
    num_examples: int | None = Field(
        None,
        ge=1,
        description="Test images per corruption and severity, a seeded random sample of the test split, the same "
        "in every cell (default: eval.protocol's; null: the whole test split).",
    )
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed of the random corruptions (noise, snow, ...).")

    @field_validator("corruptions")
    @classmethod
    def _known(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        return shift_base.distinct_levels("corruptions", names, NAMES)

    @field_validator("severities")
    @classmethod
    def _severities(cls, values: tuple[int, ...]) -> tuple[int, ...]:
        return shift_base.distinct_levels("severities", values, SEVERITIES)


def cells(opts: Options) -> list[tuple[str, int]]:
    """The (corruption, severity) cells, corruption-major, in the options' order."""
    return [(name, severity) for name in opts.corruptions for severity in opts.severities]


def cache_key(opts: Options, num_examples: int) -> str:
    """The derived set's name: everything the corrupted images depend on."""
    selection = ",".join(opts.corruptions) + "|" + ",".join(map(str, opts.severities))
    digest = hashlib.sha256(selection.encode()).hexdigest()[:12]
    return f"common_corruptions-v{CACHE_VERSION}-n{num_examples}-seed{opts.seed}-{digest}"


def requirements(config: PipelineConfig, dataset: DatasetInfo, opts: Options | None = None) -> str | None:
    """What the corruptions need of the data that ``dataset`` lacks (images of at least
    :data:`~ensemble_core.shifts.common_corruptions.MIN_SIDE` pixels a side, 1 or 3
    channels), or None; checked in the preflight (:func:`ensemble_core.evaluators.check_data`)
    and again by :func:`evaluate`."""
    height, width, channels = (int(d) for d in dataset.image_shape)
    if min(height, width) < MIN_SIDE:
        return f"the common corruptions need images of at least {MIN_SIDE}x{MIN_SIDE} pixels, not {height}x{width}"
    if channels not in (1, 3):
        return f"the common corruptions need 1 or 3 channels, not {channels}"
    return None


def evaluate(ctx: EvalContext) -> EvaluatorOutput:
    """Every member on each corrupted copy of the test split; see the module docstring.

    Returns:
      metrics ``{"unit", "levels": [per cell, with "corruption" and "severity"], "mean",
      "ensemble_beats_best_member", "members_mean", "by_corruption", "num_examples",
      "seconds"}``: ``mean`` holds the averages over every cell of
      :data:`ensemble_core.metrics.SCORES` for ``ensemble``, ``member_mean`` and
      ``best_member`` (the best member per cell); ``members_mean`` the same per member
      (``[E]``, diverged members included, with ``healthy``); ``by_corruption`` the
      averages over severities per corruption; ``seconds`` the wall time of generating
      (``generate``, 0 when cached) and of predicting and scoring (``evaluate``).
    """
    opts: Options = ctx.options or Options()
    if (unmet := requirements(ctx.config, ctx.dataset, opts)) is not None:
        return skipped(unmet)
    images, _ = ctx.load("test")
    grid = cells(opts)
    n = shift_base.level_examples(ctx, opts, len(grid))
    generated = {"seconds": 0.0}

    def transform(test_images: np.ndarray, index: float) -> np.ndarray:
        name, severity = grid[int(index)]
        if severity == opts.severities[0]:
            log.info(
                "%s: corrupting %d test images with %s (%d/%d, severities %s)",
                ctx.name,
                len(test_images),
                name,
                opts.corruptions.index(name) + 1,
                len(opts.corruptions),
                list(opts.severities),
            )
        t0 = time.perf_counter()
        out = corrupt_in_blocks(test_images, name, severity, opts.seed)
        generated["seconds"] += time.perf_counter() - t0
        return out

    t0 = time.perf_counter()
    shifted, labels, level = shift_base.shifted_test_set(
        ctx, cache_key(opts, n), tuple(range(len(grid))), transform, num_examples=n
    )
    built = time.perf_counter() - t0
    log.info("%s: predicting %d corrupted images (%d cells of %d)", ctx.name, len(shifted), len(grid), n)
    t0 = time.perf_counter()
    out = shift_base.evaluate_shifted(ctx, shifted, labels, level, tuple(range(len(grid))), "corruption and severity")
    fit = ctx.decision_fit()
    test_probs, test_labels = ctx.predict_split("test")[0], ctx.load("test")[1]
    with timing.part(METRICS):
        severities = {c: tuple(float(i) for i, (name, _) in enumerate(grid) if name == c) for c in opts.corruptions}
        out.metrics["mean_intervals"] = shift_base.mean_intervals(
            ctx, out.arrays["member_probs"], labels, level, tuple(range(len(grid))), severities
        )
        for row in out.metrics["levels"]:
            row["corruption"], row["severity"] = grid[int(row["level"])]
            row["name"] = f"{row['corruption']}-{row['severity']}"
        metrics = out.metrics
        metrics["num_examples"] = n
        metrics["members_mean"] = members_mean(out.arrays["member_probs"], labels, level, len(grid), ctx)
        metrics["by_corruption"] = by_corruption(metrics["levels"], opts.corruptions)
        if fit is not None:
            metrics["decisions_by_severity"] = decisions_by_severity(metrics["levels"])
            # the same n test images, uncorrupted: the severity-0 point of the plot
            at = shift_base.sample_indices(len(images), n)
            clean, clean_labels = test_probs[:, at], test_labels[at]
            best = metrics_lib.shift_scores(clean, clean_labels, ctx.ece_bins, healthy=ctx.healthy)["best_member_index"]
            metrics["clean"] = fit.score(clean, clean_labels, ctx.healthy, best)
    metrics["seconds"] = {"generate": built if generated["seconds"] else 0.0, "evaluate": time.perf_counter() - t0}
    log.info(
        "%s: mean over %d cells: ensemble accuracy %.4f, NLL %.4f, ECE %.4f (best member NLL %.4f)",
        ctx.name,
        len(grid),
        metrics["mean"]["ensemble"]["accuracy"],
        metrics["mean"]["ensemble"]["nll"],
        metrics["mean"]["ensemble"]["ece"],
        metrics["mean"]["best_member"]["nll"],
    )
    return out


def members_mean(probs: np.ndarray, labels: np.ndarray, level: np.ndarray, cells_: int, ctx: EvalContext) -> list:
    """Each member's :data:`~ensemble_core.metrics.SCORES` averaged over the cells:
    ``[{figure: value, "healthy": bool}] * E``."""
    masks = [level == np.float32(c) for c in range(cells_)]
    out = []
    for e in range(len(probs)):
        per_cell = [metrics_lib.scores(probs[e, at], labels[at], ctx.ece_bins) for at in masks]
        mean = {f: float(np.mean([s[f] for s in per_cell])) for f in metrics_lib.SCORES}
        out.append({**mean, "healthy": bool(ctx.healthy[e])})
    return out


def decisions_by_severity(rows: list[dict]) -> dict[str, dict]:
    """``{severity: mean over the corruptions of the cells' decisions}``: the coverage and
    mean set size of each conformal score and the selective risk and coverage, for the
    ensemble, the mean member and the best member (:func:`ensemble_core.decisions.mean_scores`)."""
    severities = sorted({r["severity"] for r in rows})
    return {str(s): mean_scores([r[shift_base.DECISIONS] for r in rows if r["severity"] == s]) for s in severities}


def plot_decisions(metrics: dict, plots_dir: Path, name: str, alpha: float) -> Path:
    """``<name>_prediction_sets.png``: the coverage and mean set size of each conformal
    score against the severity (0: the clean test split when given as ``metrics["clean"]``),
    averaged over the corruptions, ensemble vs mean member vs best member, with the target
    coverage ``1 - alpha``; and the selective risk and coverage of the abstention rule."""
    by = metrics["decisions_by_severity"]
    severities = [int(s) for s in by]
    points = {s: by[str(s)] for s in severities}
    if metrics.get("clean"):
        points = {0: metrics["clean"], **points}
    xs = list(points)
    methods = list(next(iter(points.values()))["ensemble"]["prediction_sets"])
    styles = {"ensemble": ("tab:red", "-"), "member_mean": ("tab:gray", "--"), "best_member": ("tab:blue", ":")}
    markers = dict(zip(methods, "osD", strict=False))
    fig, axes = subplots(1, 4, figsize=(17, 3.6))
    for who, (color, style) in styles.items():
        for m in methods:
            cover = [points[x][who]["prediction_sets"][m]["coverage"] if who in points[x] else np.nan for x in xs]
            size = [points[x][who]["prediction_sets"][m]["mean_set_size"] if who in points[x] else np.nan for x in xs]
            label = f"{who.replace('_', ' ')} {m.upper()}"
            axes[0].plot(xs, cover, style, marker=markers[m], color=color, label=label)
            axes[1].plot(xs, size, style, marker=markers[m], color=color, label=label)
        risk = [np.nan if who not in points[x] else points[x][who]["selective"]["risk"] for x in xs]
        kept = [np.nan if who not in points[x] else points[x][who]["selective"]["coverage"] for x in xs]
        axes[2].plot(xs, [np.nan if r is None else r for r in risk], style, marker="o", color=color, label=who)
        axes[3].plot(xs, kept, style, marker="o", color=color, label=who)
    axes[0].axhline(1 - alpha, color="k", linewidth=0.8, label=f"target {1 - alpha:g}")
    titles = ("set coverage", "mean set size (classes)", "selective risk (errors among accepted)", "accepted fraction")
    for ax, title in zip(axes, titles, strict=True):
        ax.set(xlabel="severity (0: clean test split)" if 0 in points else "severity", title=title)
        ax.set_xticks(xs)
    axes[0].legend(fontsize=6)
    axes[2].legend(fontsize=7)
    return save(fig, plots_dir / f"{name}_prediction_sets.png")


def by_corruption(rows: list[dict], names: tuple[str, ...]) -> dict:
    """``{corruption: {"ensemble" | "member_mean" | "best_member": {figure: mean over its
    severities}}}``."""
    out = {}
    for name in names:
        mine = [r for r in rows if r["corruption"] == name]
        out[name] = {
            who: {f: float(np.mean([r[who][f] for r in mine])) for f in metrics_lib.SCORES}
            for who in ("ensemble", "member_mean", "best_member")
        }
    return out


def plot(
    metrics: dict, arrays: dict, plots_dir: Path, config: PipelineConfig, name: str = "common_corruptions"
) -> dict[str, Path]:
    """``<name>.png``: accuracy, NLL and ECE against the severity (1-5), averaged over the
    corruptions, ensemble vs mean member vs best member (Ovadia et al. 2019, Fig. 1's
    layout); ``<name>_corruptions.png``: NLL per corruption, averaged over severities;
    ``<name>_examples.png``: the first test images in every cell."""
    rows = metrics["levels"]
    severities = sorted({r["severity"] for r in rows})
    styles = {"ensemble": ("tab:red", "-"), "member_mean": ("tab:gray", "--"), "best_member": ("tab:blue", ":")}
    fig, axes = subplots(1, 3, figsize=(13, 3.6))
    for ax, figure in zip(axes, ("accuracy", "nll", "ece"), strict=True):
        for who, (color, style) in styles.items():
            ys = [np.mean([r[who][figure] for r in rows if r["severity"] == s]) for s in severities]
            ax.plot(severities, ys, style, marker="o", color=color, label=who.replace("_", " "))
        ax.set(xlabel="severity", title=f"{figure}, mean over corruptions")
        ax.set_xticks(severities)
    axes[0].legend(fontsize=8)
    paths = {name: save(fig, plots_dir / f"{name}.png")}
    names = list(metrics["by_corruption"])
    fig, ax = subplots(figsize=(max(6, 0.55 * len(names)), 3.8))
    xs = np.arange(len(names))
    for k, (who, (color, _)) in enumerate(styles.items()):
        heights = [metrics["by_corruption"][c][who]["nll"] for c in names]
        ax.bar(xs + (k - 1) * 0.27, heights, 0.27, color=color, label=who)
    ax.set_xticks(xs, names, rotation=60, ha="right", fontsize=7)
    ax.set(ylabel="NLL (nats), mean over severities", title="NLL per corruption")
    ax.legend(fontsize=8)
    paths[f"{name}_corruptions"] = save(fig, plots_dir / f"{name}_corruptions.png")
    paths[f"{name}_examples"] = plot_examples(metrics, arrays, plots_dir, name)
    if "decisions_by_severity" in metrics:
        paths[f"{name}_prediction_sets"] = plot_decisions(metrics, plots_dir, name, config.prediction_sets.alpha)
    if "accuracy_estimation" in metrics:
        paths[f"{name}_accuracy_estimates"] = plot_estimates(metrics, plots_dir, name)
    return paths


def plot_estimates(metrics: dict, plots_dir: Path, name: str) -> Path:
    """``<name>_accuracy_estimates.png``: every label-free estimate of the ensemble's
    accuracy against its true accuracy, one point per cell coloured by severity, a panel
    per estimator with its mean absolute error (the diagonal: a perfect estimate)."""
    rows = metrics["levels"]
    errors = metrics["accuracy_estimation"]
    names = list(errors)
    cols = min(4, len(names))
    fig, axes = subplots(-(-len(names) // cols), cols, figsize=(4 * cols, 3.8 * -(-len(names) // cols)), squeeze=False)
    true = np.asarray([r["ensemble"]["accuracy"] for r in rows])
    severity = np.asarray([r["severity"] for r in rows])
    for ax, est in zip(axes.flat, names, strict=False):
        ax.plot([0, 1], [0, 1], "k:", linewidth=0.8)
        points = ax.scatter(true, [r[shift_base.ESTIMATES][est] for r in rows], c=severity, cmap="viridis", s=12)
        ax.set(
            xlabel="true accuracy",
            ylabel="estimate",
            title=f"{est} (MAE {100 * errors[est]['mae']:.1f} pts)",
            xlim=(0, 1),
            ylim=(0, 1),
        )
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    fig.colorbar(points, ax=axes.flat[len(names) - 1], label="severity")
    return save(fig, plots_dir / f"{name}_accuracy_estimates.png")


def plot_examples(metrics: dict, arrays: dict, plots_dir: Path, name: str) -> Path:
    """``<name>_examples.png``: the first test image in every cell, a row per corruption
    and a column per severity (Hendrycks & Dietterich 2019, Fig. 1's layout). One image
    per cell, not the 8 ``arrays["examples"]`` holds: 75 x 8 images made a figure 70
    inches tall, the most expensive plot of a run."""
    rows = metrics["levels"]
    corruptions = list(dict.fromkeys(r["corruption"] for r in rows))
    severities = sorted({r["severity"] for r in rows})
    examples = arrays["examples"]  # [cells, k, H, W, C]
    grid = np.zeros((len(corruptions), len(severities), *examples.shape[2:]), examples.dtype)
    for r in rows:
        grid[corruptions.index(r["corruption"]), severities.index(r["severity"])] = examples[int(r["level"]), 0]
    title = f"{name}: severities {', '.join(map(str, severities))}"
    return save(image_grid(grid, corruptions, title), plots_dir / f"{name}_examples.png")


def markdown(metrics: dict) -> list[str]:
    """The summary (means over every cell, per who), the per-corruption table."""
    mean = metrics["mean"]
    ci = metrics.get("mean_intervals", {})
    lines = [
        f"**Common corruptions** (Hendrycks & Dietterich 2019; {len(metrics['by_corruption'])} corruptions x "
        f"{len({r['severity'] for r in metrics['levels']})} severities, {metrics['num_examples']} test images each), "
        "mean over corruptions and severities:",
        "",
        "| | accuracy | NLL | Brier | ECE | adaptive ECE | AURC |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for who in ("ensemble", "member_mean", "best_member", shift_base.SCALED):
        if who in mean:
            m, at = mean[who], ci.get(who, {})
            lines.append(
                f"| {who.replace('_', ' ')} | {intervals.show(m['accuracy'], at.get('accuracy'))} | "
                f"{intervals.show(m['nll'], at.get('nll'))} | {intervals.show(m['brier'], at.get('brier'))} | "
                f"{m['ece']:.4f} | {m['adaptive_ece']:.4f} | {m['aurc']:.4f} |"
            )
    lines += [
        "",
        "| corruption | accuracy | NLL | ECE | best member NLL | mean member NLL |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    groups = ci.get("groups", {})
    for name, by in metrics["by_corruption"].items():
        e, at = by["ensemble"], groups.get(name, {})
        lines.append(
            f"| {name} | {intervals.show(e['accuracy'], at.get('accuracy'))} | "
            f"{intervals.show(e['nll'], at.get('nll'))} | {e['ece']:.4f} | {by['best_member']['nll']:.4f} | "
            f"{by['member_mean']['nll']:.4f} |"
        )
    if shift_base.INTERVALS in metrics:
        lines += [
            "",
            shift_base.interval_sentence(metrics, "cell"),
            "Every cell's intervals: report.json -> evaluations.<name>.metrics.levels[].intervals.",
        ]
    lines += ["", shift_base.wins_sentence(metrics, "cells")]
    if "accuracy_estimation" in metrics:
        lines += ["", shift_base.estimation_sentence(metrics, "cells")]
    if "decisions_by_severity" in metrics:
        rows = [("clean (severity 0)", metrics["clean"])] if metrics.get("clean") else []
        rows += [(f"severity {s}", d) for s, d in metrics["decisions_by_severity"].items()]
        lines += ["", "Mean over the corruptions at each severity:", "", *decision_lines(rows)]
    return lines


def table(metrics: dict) -> list[dict]:
    """One row per (corruption, severity) cell (:func:`ensemble_core.evaluators.shift_base.table`)."""
    return shift_base.table(metrics)
