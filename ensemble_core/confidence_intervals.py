"""Confidence intervals of the figures of a shifted test set (a shift level, a corruption
cell): how far a figure measured on n test images may be from its value on the whole
distribution of such images. Evaluation runs on samples (:mod:`ensemble_core.config.eval_section`,
``eval.protocol``), so every shifted figure is reported with its interval.

Methods (95% by default, :data:`CONFIDENCE`):

- accuracy: the **Wilson score interval** of a binomial proportion (Wilson 1927, "Probable
  inference, the law of succession, and statistical inference", JASA 22; recommended over
  the Wald interval by Brown, Cai & DasGupta 2001, "Interval estimation for a binomial
  proportion", Statistical Science 16), without continuity correction: SciPy's
  ``scipy.stats.binomtest(k, n).proportion_ci(method="wilson")``, computed here in closed
  form for arrays (``tests/test_intervals.py`` compares the two);
- NLL and Brier score (means of per-example losses): the **Student-t interval of a mean**,
  ``mean +- t_{n-1, 1-a/2} * s / sqrt(n)`` (SciPy's ``ttest_1samp(x, 0).confidence_interval()``),
  valid by the central limit theorem for the sample sizes evaluation uses (n >= 100 by
  default);
- ECE (not a mean of per-example terms): the **percentile bootstrap** (Efron & Tibshirani
  1993, "An Introduction to the Bootstrap", ch. 13) over the examples,
  :data:`BOOTSTRAP_RESAMPLES` resamples, seeded (the same figures give the same interval);
  ``scipy.stats.bootstrap(method="percentile")``'s method, computed here with each example's
  bin found once (:func:`ece_interval`). ECE is biased upwards on small samples;
  the interval shows its sampling spread, not that bias;
- the mean over levels (cells) of accuracy, NLL and Brier: every level holds the same N
  test images, so the mean over the L levels is the mean over the N images of each image's
  average over the levels; those N averages are independent (the images are), and their
  Student-t interval accounts for the correlation between the levels (the cluster-robust
  interval with the image as the cluster: Cameron & Miller 2015, "A practitioner's guide to
  cluster-robust inference", J. Human Resources 50).
"""

from __future__ import annotations

import numpy as np
from scipy import special

from ensemble_core.metrics import calibration_bins

#: The intervals' confidence level.
CONFIDENCE = 0.95
#: Resamples of the ECE's percentile bootstrap (Efron & Tibshirani 1993 advise >= 1,000 for
#: percentile intervals).
BOOTSTRAP_RESAMPLES = 1000
#: Resampled examples drawn at once (bounds the bootstrap's memory: 16 MB of indices).
BOOTSTRAP_BATCH_ELEMENTS = 2_000_000
#: The figures of a level with an interval, and the method of each (report.json says which).
METHODS = {
    "accuracy": "Wilson score interval (Wilson 1927; scipy.stats.binomtest(...).proportion_ci(method='wilson'))",
    "nll": "Student-t interval of the mean per-example NLL (scipy.stats.ttest_1samp(...).confidence_interval())",
    "brier": "Student-t interval of the mean per-example Brier score",
    "ece": f"percentile bootstrap over the examples, {BOOTSTRAP_RESAMPLES} resamples (Efron & Tibshirani 1993; "
    "the method of scipy.stats.bootstrap(method='percentile'))",
    "mean": "Student-t interval over the test images of each image's average over the levels (cluster-robust, "
    "the image the cluster: Cameron & Miller 2015)",
}
FIGURES = ("accuracy", "nll", "brier", "ece")
MEAN_FIGURES = ("accuracy", "nll", "brier")

Interval = list[float] | None


def wilson(successes: int | np.ndarray, n: int | np.ndarray, confidence: float = CONFIDENCE) -> tuple:
    """The Wilson score interval ``(low, high)`` of ``successes`` out of ``n`` trials
    (arrays broadcast): centre ``(p + z^2 / 2n) / (1 + z^2 / n)``, half-width
    ``z / (1 + z^2 / n) * sqrt(p (1 - p) / n + z^2 / 4n^2)``, ``p = successes / n``,
    ``z`` the standard normal's ``1 - (1 - confidence) / 2`` quantile (Wilson 1927; the
    ``wilson`` method of ``scipy.stats.binomtest(...).proportion_ci``). Within [0, 1].

    Raises:
      ValueError: ``n < 1``, or ``successes`` outside ``[0, n]``.
    """
    k, n = np.asarray(successes, np.float64), np.asarray(n, np.float64)
    if np.any(n < 1) or np.any(k < 0) or np.any(k > n):
        raise ValueError(f"wilson needs 0 <= successes <= n and n >= 1; got {successes} of {n}")
    z = special.ndtri(0.5 + confidence / 2)  # the standard normal's quantile, as scipy.stats.norm.ppf
    p = k / n
    denom = 1 + z**2 / n
    centre = (p + z**2 / (2 * n)) / denom
    half = z / denom * np.sqrt(p * (1 - p) / n + z**2 / (4 * n**2))
    return np.clip(centre - half, 0.0, 1.0), np.clip(centre + half, 0.0, 1.0)


def mean_interval(values: np.ndarray, confidence: float = CONFIDENCE) -> Interval:
    """The Student-t interval ``[low, high]`` of the mean of ``values`` (``[n]``), or None
    when ``n < 2`` (no spread to measure). Zero spread gives ``[mean, mean]``."""
    x = np.asarray(values, np.float64).ravel()
    if len(x) < 2:
        return None
    mean, sd = float(x.mean()), float(x.std(ddof=1))
    t = float(special.stdtrit(len(x) - 1, 0.5 + confidence / 2))  # Student's t quantile, as scipy.stats.t.ppf
    half = t * sd / np.sqrt(len(x))
    return [float(mean - half), float(mean + half)]


def per_example(probs: np.ndarray, labels: np.ndarray) -> dict[str, np.ndarray]:
    """Per-example terms of the ensemble's figures on ``probs`` (``[N, C]``, float) and
    ``labels`` (``[N]``): ``correct`` (0/1), ``nll`` (``-log p_y``, clipped as
    :func:`ensemble_core.metrics.nll`), ``brier`` (``sum_c (p_c - onehot_c)^2``) and
    ``confidence`` (the top probability); each float64 ``[N]``. Their means are
    :mod:`ensemble_core.metrics`' accuracy, NLL and Brier score."""
    p = np.asarray(probs, np.float64)
    labels = np.asarray(labels)
    rows = np.arange(len(labels))
    onehot = np.zeros_like(p)
    onehot[rows, labels] = 1.0
    return {
        "correct": (np.argmax(p, -1) == labels).astype(np.float64),
        "nll": -np.log(np.maximum(p[rows, labels], np.finfo(np.float64).tiny)),
        "brier": np.sum((p - onehot) ** 2, axis=-1),
        "confidence": p.max(-1),
    }


def ece_terms(confidence: np.ndarray, correct: np.ndarray, num_bins: int, axis: int = -1) -> np.ndarray:
    """The ECE of :func:`ensemble_core.metrics.ece` from per-example ``confidence`` and
    ``correct`` along ``axis`` (any leading axes are independent samples: the bootstrap's
    resamples): ``sum_b |sum_{i in b} (correct_i - confidence_i)| / n`` over ``num_bins``
    equal-width bins, bin b holding confidences in ``(b/num_bins, (b+1)/num_bins]``."""
    conf = np.moveaxis(np.asarray(confidence, np.float64), axis, -1)
    gap = np.moveaxis(np.asarray(correct, np.float64), axis, -1) - conf
    n = conf.shape[-1]
    bins = calibration_bins(conf, num_bins)
    lead = conf.shape[:-1]
    rows = int(np.prod(lead, dtype=np.int64))
    flat = (np.arange(rows, dtype=np.int64)[:, None] * num_bins + bins.reshape(rows, n)).ravel()
    sums = np.bincount(flat, weights=gap.reshape(rows, n).ravel(), minlength=rows * num_bins)
    return (np.abs(sums.reshape(rows, num_bins)).sum(-1) / n).reshape(lead)


def ece_interval(
    confidence: np.ndarray, correct: np.ndarray, num_bins: int, confidence_level: float = CONFIDENCE, seed: int = 0
) -> Interval:
    """The percentile-bootstrap interval ``[low, high]`` of the ECE (:func:`ece_terms`) over
    the examples, or None for fewer than 2 examples: :data:`BOOTSTRAP_RESAMPLES` resamples of
    the ``(confidence, correct)`` pairs with replacement, drawn from
    ``np.random.default_rng(seed)``, and the ``(1 - level) / 2`` and ``(1 + level) / 2``
    quantiles of their ECEs (Efron & Tibshirani 1993, ch. 13: what
    ``scipy.stats.bootstrap(..., method="percentile")`` computes; the tests compare the two).
    Each example's bin is computed once, so a resample costs one ``bincount``: about 5 times
    faster than SciPy's generic loop, which matters under ``eval.protocol: full`` (75 cells of
    10,000 images)."""
    conf, corr = np.asarray(confidence, np.float64), np.asarray(correct, np.float64)
    n = len(conf)
    if n < 2:
        return None
    bins = calibration_bins(conf, num_bins)
    gaps = corr - conf
    rng = np.random.default_rng(seed)
    batch = max(1, BOOTSTRAP_BATCH_ELEMENTS // n)
    draws = []
    for start in range(0, BOOTSTRAP_RESAMPLES, batch):
        rows = min(batch, BOOTSTRAP_RESAMPLES - start)
        idx = rng.integers(0, n, (rows, n))
        key = (bins[idx] + num_bins * np.arange(rows)[:, None]).ravel()
        sums = np.bincount(key, weights=gaps[idx].ravel(), minlength=rows * num_bins)
        draws.append(np.abs(sums.reshape(rows, num_bins)).sum(-1) / n)
    alpha = 1 - confidence_level
    low, high = np.percentile(np.concatenate(draws), [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return [float(low), float(high)]


def level_intervals(probs: np.ndarray, labels: np.ndarray, num_bins: int, seed: int = 0) -> dict[str, Interval]:
    """``{figure: [low, high]}`` of the ensemble's accuracy, NLL, Brier and ECE on one
    shifted set (``probs`` the ensemble's ``[N, C]``), :data:`CONFIDENCE` level, by the
    module's methods."""
    terms = per_example(probs, labels)
    n = len(labels)
    low, high = wilson(int(terms["correct"].sum()), n)
    return {
        "accuracy": [float(low), float(high)],
        "nll": mean_interval(terms["nll"]),
        "brier": mean_interval(terms["brier"]),
        "ece": ece_interval(terms["confidence"], terms["correct"], num_bins, seed=seed),
    }


def mean_over_levels(per_level_terms: list[dict[str, np.ndarray]]) -> dict[str, Interval]:
    """``{figure: [low, high]}`` of the mean over the levels of the ensemble's accuracy,
    NLL and Brier, from each level's :func:`per_example` terms (every level the same N test
    images, in the same order): the Student-t interval of the N images' averages over the
    levels (the module docstring says why). Empty when the levels differ in size."""
    sizes = {len(t["correct"]) for t in per_level_terms}
    if len(sizes) != 1:
        return {}
    key = {"accuracy": "correct", "nll": "nll", "brier": "brier"}
    return {f: mean_interval(np.mean([t[key[f]] for t in per_level_terms], axis=0)) for f in MEAN_FIGURES}


def describe(examples_per_level: int, test_examples: int) -> dict:
    """report.json's ``intervals`` of a shift evaluator: the level, the sample size (of how
    many test images) and the methods (:data:`METHODS`)."""
    return {
        "confidence": CONFIDENCE,
        "examples_per_level": int(examples_per_level),
        "test_examples": int(test_examples),
        "methods": dict(METHODS),
    }


def show(value: float, interval: Interval, digits: int = 4) -> str:
    """``value [low, high]`` for report.md (``value`` alone without an interval)."""
    if interval is None:
        return f"{value:.{digits}f}"
    return f"{value:.{digits}f} [{interval[0]:.{digits}f}, {interval[1]:.{digits}f}]"
