"""The confidence intervals of the shifted figures (:mod:`ensemble_core.confidence_intervals`),
each against an independent reference: SciPy's Wilson interval and t-interval, the
project's own ECE, a mean over levels computed the long way; and how a shift evaluator
reports them (report.json's ``intervals``, report.md's brackets)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from ensemble_core import confidence_intervals as intervals
from ensemble_core import metrics
from ensemble_core.evaluators import shift_base


@pytest.mark.parametrize(("k", "n"), [(0, 1), (1, 1), (0, 10), (7, 10), (10, 10), (93, 100), (50, 100), (1, 300)])
@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_the_wilson_interval_is_scipys(k, n, confidence):
    low, high = intervals.wilson(k, n, confidence)
    ref = stats.binomtest(k, n).proportion_ci(confidence, method="wilson")
    assert (low, high) == pytest.approx((ref.low, ref.high), abs=1e-12)


def test_the_wilson_interval_takes_arrays_and_refuses_impossible_counts():
    k, n = np.array([0, 5, 30]), np.array([10, 10, 40])
    low, high = intervals.wilson(k, n)
    for i in range(3):
        ref = stats.binomtest(int(k[i]), int(n[i])).proportion_ci(0.95, method="wilson")
        assert (low[i], high[i]) == pytest.approx((ref.low, ref.high), abs=1e-12)
    with pytest.raises(ValueError, match="successes"):
        intervals.wilson(11, 10)
    with pytest.raises(ValueError, match="successes"):
        intervals.wilson(0, 0)


def test_the_mean_interval_is_scipys_t_interval():
    rng = np.random.default_rng(0)
    for n in (2, 5, 100, 1000):
        x = rng.exponential(size=n)  # skewed, like per-example NLLs
        ref = stats.ttest_1samp(x, 0.0).confidence_interval(0.95)
        assert intervals.mean_interval(x) == pytest.approx([ref.low, ref.high], rel=1e-12)
    assert intervals.mean_interval(np.array([0.3])) is None  # no spread to measure
    assert intervals.mean_interval(np.full(4, 0.25)) == [0.25, 0.25]


def _probs(n: int, classes: int = 10, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.full(classes, 0.3), size=n)
    labels = np.where(rng.random(n) < 0.7, probs.argmax(-1), rng.integers(0, classes, n))
    return probs, labels


@pytest.mark.parametrize("bins", [2, 10, 15])
def test_the_per_example_terms_average_to_the_projects_figures(bins):
    probs, labels = _probs(500)
    terms = intervals.per_example(probs, labels)
    assert terms["correct"].mean() == pytest.approx(metrics.accuracy(probs, labels), abs=1e-15)
    assert terms["nll"].mean() == pytest.approx(metrics.nll(probs, labels), rel=1e-12)
    assert terms["brier"].mean() == pytest.approx(metrics.brier(probs, labels), rel=1e-12)
    ece = intervals.ece_terms(terms["confidence"], terms["correct"], bins)
    assert ece == pytest.approx(metrics.ece(probs, labels, bins), rel=1e-12)
    # rows of a batch (the bootstrap's resamples) are independent samples
    rows = np.stack([terms["confidence"][:250], terms["confidence"][250:]])
    correct = np.stack([terms["correct"][:250], terms["correct"][250:]])
    batched = intervals.ece_terms(rows, correct, bins)
    assert batched == pytest.approx(
        [metrics.ece(probs[:250], labels[:250], bins), metrics.ece(probs[250:], labels[250:], bins)], rel=1e-12
    )


def test_the_ece_interval_is_scipys_percentile_bootstrap():
    """The same method as ``scipy.stats.bootstrap(method="percentile")`` with other random
    draws: the intervals agree to the resampling noise (1,000 resamples here, 5,000 there)."""
    probs, labels = _probs(300)
    terms = intervals.per_example(probs, labels)
    ci = intervals.ece_interval(terms["confidence"], terms["correct"], 15, seed=3)
    assert ci == intervals.ece_interval(terms["confidence"], terms["correct"], 15, seed=3)  # seeded
    ref = stats.bootstrap(
        (terms["confidence"], terms["correct"]),
        lambda c, k, axis=-1: intervals.ece_terms(c, k, 15, axis=axis),
        paired=True,
        vectorized=True,
        n_resamples=5_000,
        method="percentile",
        rng=np.random.default_rng(11),
    ).confidence_interval
    assert ci == pytest.approx([ref.low, ref.high], abs=0.01)
    assert ci[0] < metrics.ece(probs, labels, 15) + 0.01 and ci[0] < ci[1]
    assert intervals.ece_interval(terms["confidence"][:1], terms["correct"][:1], 15) is None


def test_level_intervals_hold_the_levels_figures():
    probs, labels = _probs(300, seed=1)
    ci = intervals.level_intervals(probs, labels, 15)
    figures = metrics.scores(probs, labels, 15)
    for figure in ("accuracy", "nll", "brier"):
        low, high = ci[figure]
        assert low <= figures[figure] <= high, figure
    k = int((probs.argmax(-1) == labels).sum())
    ref = stats.binomtest(k, 300).proportion_ci(0.95, method="wilson")
    assert ci["accuracy"] == pytest.approx([ref.low, ref.high], abs=1e-12)
    assert set(ci) == set(intervals.FIGURES)


def test_the_mean_over_levels_interval_averages_each_image_over_the_levels():
    """Three levels of the same 200 images: the mean of the levels' accuracies is the mean
    of the images' averages, and the interval is the t-interval of those 200 averages,
    computed here the long way."""
    rng = np.random.default_rng(2)
    labels = rng.integers(0, 10, 200)
    levels = [_probs(200, seed=s)[0] for s in (4, 5, 6)]
    terms = [intervals.per_example(p, labels) for p in levels]
    out = intervals.mean_over_levels(terms)
    per_image = np.mean([(p.argmax(-1) == labels).astype(float) for p in levels], axis=0)
    ref = stats.ttest_1samp(per_image, 0.0).confidence_interval(0.95)
    assert out["accuracy"] == pytest.approx([ref.low, ref.high], rel=1e-12)
    mean_accuracy = np.mean([metrics.accuracy(p, labels) for p in levels])
    assert np.mean(out["accuracy"]) == pytest.approx(mean_accuracy, rel=1e-12)  # centred on the mean
    nll = np.mean([-np.log(p[np.arange(200), labels]) for p in levels], axis=0)
    ref = stats.ttest_1samp(nll, 0.0).confidence_interval(0.95)
    assert out["nll"] == pytest.approx([ref.low, ref.high], rel=1e-12)
    # levels of other sizes are not paired: no interval is made up
    assert intervals.mean_over_levels([terms[0], intervals.per_example(levels[1][:100], labels[:100])]) == {}


def test_show_puts_the_interval_in_brackets():
    assert intervals.show(0.9333, [0.9, 0.95]) == "0.9333 [0.9000, 0.9500]"
    assert intervals.show(0.5, None) == "0.5000"


def test_a_shift_evaluator_reports_every_levels_intervals(tmp_path):
    """The rotation evaluator on 100 of 150 random images: each level's report.json row carries
    the intervals of its ensemble figures, the means theirs, and report.md shows them."""
    from ensemble_core import evaluators
    from ensemble_core.config import EvaluatorSpec
    from tests.test_shift_levels import CLASSES, SHAPE, _context

    n = 150
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (n, *SHAPE), dtype=np.uint8)
    labels = (np.arange(n) % CLASSES).astype(np.int32)
    ctx = _context(tmp_path, images, labels, [])
    degrees = [0, 30, 60, 90, 120]  # 3 x 150 / 5 = 90 images per level: the floor, 100, binds
    spec = EvaluatorSpec.model_validate({"type": "rotation", "degrees": degrees, "selective_degrees": 90})
    out = evaluators.get("rotation").evaluate(ctx.for_evaluator("rotation", spec))
    m = out.metrics
    assert m["intervals"]["examples_per_level"] == 100  # the sampled protocol's floor
    assert m["intervals"]["confidence"] == 0.95 and set(m["intervals"]["methods"]) >= set(intervals.FIGURES)
    for row in m["levels"]:
        ci = row[shift_base.INTERVALS]["ensemble"]
        assert ci["accuracy"][0] <= row["ensemble"]["accuracy"] <= ci["accuracy"][1]
        assert ci["nll"][0] <= row["ensemble"]["nll"] <= ci["nll"][1]
        assert ci["ece"] is not None
    mean = m["mean_intervals"]["ensemble"]
    assert mean["accuracy"][0] <= m["mean"]["ensemble"]["accuracy"] <= mean["accuracy"][1]
    text = "\n".join(evaluators.get("rotation").markdown(m))
    low, high = m["levels"][1][shift_base.INTERVALS]["ensemble"]["accuracy"]
    assert f"{m['levels'][1]['ensemble']['accuracy']:.4f} [{low:.4f}, {high:.4f}]" in text
    assert "95% confidence intervals" in text and "100 of the 150 test images per level" in text
