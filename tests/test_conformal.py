"""Split conformal prediction sets (ensemble_core.conformal) and selective prediction with
guaranteed risk (ensemble_core.selective), against their guarantees on synthetic data and
against independent references: MAPIE (the conformal sets and quantiles) and SciPy's
Clopper-Pearson interval (the SGR bound)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from ensemble_core import conformal, selective
from ensemble_core.errors import ConfigError, DataError
from ensemble_core.metrics import entropy, mutual_information

C = 10


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _draw(rng: np.random.Generator, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """A miscalibrated model: probabilities softmax(z), labels drawn from softmax(z / 1.5)
    (the model is overconfident), z ~ N(0, 2^2) per class."""
    z = rng.normal(0.0, 2.0, (*shape, C))
    true = _softmax(z / 1.5)
    u = rng.random(shape)[..., None]
    labels = np.minimum((np.cumsum(true, -1) < u).sum(-1), C - 1)
    return _softmax(z), labels


# --- coverage on exchangeable data ------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "randomized", "exact"),
    [("lac", False, True), ("aps", True, True), ("raps", True, True), ("aps", False, False), ("raps", False, False)],
)
@pytest.mark.slow  # over 1 CPU s with a warm compilation cache: make test-fast leaves it out (docs/development.md)
def test_marginal_coverage_over_many_draws(method, randomized, exact):
    """Over 2,000 draws of calibration (n = 200) and test (200) splits, the mean coverage
    is >= 1 - alpha and, for continuous scores (LAC, randomised APS/RAPS), <= 1 - alpha +
    1/(n+1): it is exactly ceil((n+1)(1-alpha))/(n+1) = 181/201 in expectation."""
    draws, n, n_test, alpha = 2000, 200, 200, 0.1
    rng = np.random.default_rng(1)
    probs, labels = _draw(rng, (draws, n + n_test))
    cover = np.empty(draws)
    for d in range(draws):
        cal = conformal.calibrate(probs[d, :n], labels[d, :n], method, alpha, randomized=randomized, seed=d)
        sets = conformal.prediction_sets(probs[d, n:], cal, seed=d)
        cover[d] = conformal.coverage(sets, labels[d, n:])
    mean, err = cover.mean(), 4 * cover.std(ddof=1) / math.sqrt(draws)
    assert mean >= 1 - alpha - err
    if exact:
        assert mean <= 1 - alpha + 1 / (n + 1) + err
        assert abs(mean - 181 / 201) <= err


def test_sets_are_adaptive_and_zero_sets_option():
    rng = np.random.default_rng(2)
    probs, labels = _draw(rng, (2000,))
    cal = conformal.calibrate(probs[:1000], labels[:1000], "aps", 0.3, seed=3)
    sets = conformal.prediction_sets(probs[1000:], cal, seed=4)
    assert np.array_equal(sets, conformal.prediction_sets(probs[1000:], cal, seed=4))  # reproducible
    sizes = conformal.set_sizes(sets)
    assert sizes.dtype == np.int64 and sizes.shape == (1000,)
    assert conformal.mean_set_size(sets) == pytest.approx(sizes.mean())
    full = conformal.prediction_sets(probs[1000:], cal, seed=4, allow_zero_sets=False)
    empty = sizes == 0
    assert empty.any()  # randomised APS can give empty sets
    assert (full[~empty] == sets[~empty]).all()
    assert (conformal.set_sizes(full)[empty] == 1).all()
    assert (np.argmax(full[empty], 1) == np.argmax(probs[1000:][empty], 1)).all()
    # uncertain examples get larger sets
    conf = probs[1000:].max(1)
    assert sizes[conf < np.median(conf)].mean() > sizes[conf >= np.median(conf)].mean()


def test_scores_match_their_definitions():
    p = np.array([[0.5, 0.2, 0.3], [0.1, 0.6, 0.3]])
    u = np.array([0.25, 0.5])
    lac = conformal.class_scores(p, "lac")
    np.testing.assert_allclose(lac, 1 - p)
    aps = conformal.class_scores(p, "aps", uniforms=u)
    # sum of the strictly more probable classes + U * p_y
    expected = np.array(
        [[u[0] * 0.5, 0.8 + u[0] * 0.2, 0.5 + u[0] * 0.3], [0.9 + u[1] * 0.1, u[1] * 0.6, 0.6 + u[1] * 0.3]]
    )
    np.testing.assert_allclose(aps, expected)
    np.testing.assert_allclose(conformal.class_scores(p, "aps"), [[0.5, 1.0, 0.8], [1.0, 0.6, 0.9]])
    raps = conformal.class_scores(p, "raps", uniforms=u, k_reg=1, lam=0.1)
    ranks = np.array([[1, 3, 2], [3, 1, 2]])
    np.testing.assert_allclose(raps, expected + 0.1 * np.maximum(0, ranks - 1))
    np.testing.assert_allclose(conformal.conformity_scores(p, np.array([2, 0]), "lac"), [0.7, 0.9])


def test_quantile_is_the_finite_sample_order_statistic():
    scores = np.random.default_rng(0).random(200)
    k = math.ceil(201 * 0.9)
    assert conformal.conformal_quantile(scores, 0.1) == np.sort(scores)[k - 1]
    assert conformal.conformal_quantile(scores, 0.1) == np.quantile(scores, k / 200, method="inverted_cdf")
    # n too small for alpha: ceil((n + 1)(1 - alpha)) > n -> +inf, every class in every set
    assert conformal.conformal_quantile(scores[:5], 0.1) == math.inf
    probs, labels = _draw(np.random.default_rng(1), (5,))
    cal = conformal.calibrate(probs, labels, "lac", 0.1)
    assert cal.threshold == math.inf
    assert conformal.prediction_sets(probs, cal).all()
    assert conformal.ConformalCalibration.from_dict(json.loads(json.dumps(cal.to_dict()))) == cal
    assert cal.to_dict()["threshold"] is None


def test_calibration_record_round_trips():
    probs, labels = _draw(np.random.default_rng(5), (300,))
    cal = conformal.calibrate(probs, labels, "raps", 0.05, k_reg=2, lam=0.05, seed=7)
    assert (cal.method, cal.k_reg, cal.lam, cal.n_calibration, cal.randomized) == ("raps", 2, 0.05, 300, True)
    assert conformal.ConformalCalibration.from_dict(json.loads(json.dumps(cal.to_dict()))) == cal
    default = conformal.calibrate(probs, labels, "raps", 0.05)
    assert (default.k_reg, default.lam) == (conformal.RAPS_DEFAULT_K_REG, conformal.RAPS_DEFAULT_LAM)
    lac = conformal.calibrate(probs, labels, "lac", 0.05)
    assert (lac.randomized, lac.k_reg, lac.lam) == (False, None, None)
    assert conformal.METHODS == ("lac", "aps", "raps")


@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.1, 1.5, float("nan")])
def test_refuses_alpha_outside_unit_interval(alpha):
    probs, labels = _draw(np.random.default_rng(0), (50,))
    with pytest.raises(ConfigError, match=r"alpha .* outside \(0, 1\); fix: "):
        conformal.calibrate(probs, labels, "aps", alpha)


def test_refuses_bad_inputs():
    probs, labels = _draw(np.random.default_rng(0), (50,))
    with pytest.raises(DataError, match=r"^the calibration split is empty \(N = 0\); fix: "):
        conformal.calibrate(probs[:0], labels[:0], "lac", 0.1)
    with pytest.raises(DataError, match="empty"):
        conformal.conformal_quantile(np.zeros(0), 0.1)
    with pytest.raises(ConfigError, match=r"unknown; fix: use one of lac, aps, raps$"):
        conformal.calibrate(probs, labels, "thr", 0.1)
    with pytest.raises(ConfigError, match="RAPS parameters"):
        conformal.calibrate(probs, labels, "aps", 0.1, k_reg=3)
    with pytest.raises(ConfigError, match="k_reg"):
        conformal.calibrate(probs, labels, "raps", 0.1, k_reg=-1)
    with pytest.raises(DataError, match="labels outside"):
        conformal.calibrate(probs, labels + C, "lac", 0.1)
    with pytest.raises(ConfigError, match="missing keys"):
        conformal.ConformalCalibration.from_dict({"method": "lac"})


# --- MAPIE, the independent reference ---------------------------------------------------


class _Fixed:
    """A prefit scikit-learn classifier whose predict_proba returns given rows: X holds
    row indices into ``table``."""

    def __init__(self, table: np.ndarray) -> None:
        self.table = table
        self.classes_ = np.arange(table.shape[1])
        self.n_features_in_ = 1

    def fit(self, x, y):
        return self

    def predict_proba(self, x):
        return self.table[np.asarray(x)[:, 0].astype(int)]

    def predict(self, x):
        return np.argmax(self.predict_proba(x), 1)

    def __sklearn_is_fitted__(self) -> bool:
        return True

    def get_params(self, deep=True):
        return {"table": self.table}


def _mapie_setup(method: str, alpha: float, seed: int, n: int = 400, n_test: int = 300):
    mapie_classification = pytest.importorskip("mapie.classification")
    probs, labels = _draw(np.random.default_rng(seed), (n + n_test,))
    rows = np.arange(n + n_test)[:, None]
    model = mapie_classification.SplitConformalClassifier(
        _Fixed(probs), confidence_level=1 - alpha, conformity_score=method, prefit=True, random_state=seed
    )
    model.conformalize(rows[:n], labels[:n])
    return model, probs, labels, n


def _mapie_threshold(model) -> float:
    """MAPIE's qhat (computed by predict_set: call that first)."""
    return float(np.ravel(model._mapie_classifier.conformity_score_function_.quantiles_)[0])


def test_lac_matches_mapie_exactly():
    alpha = 0.1
    model, probs, labels, n = _mapie_setup("lac", alpha, seed=11)
    ours = conformal.calibrate(probs[:n], labels[:n], "lac", alpha)
    np.testing.assert_allclose(
        np.ravel(model.conformity_scores), conformal.conformity_scores(probs[:n], labels[:n], "lac")
    )
    _, mapie_sets = model.predict_set(np.arange(n, len(probs))[:, None])
    assert ours.threshold == _mapie_threshold(model)
    assert np.array_equal(conformal.prediction_sets(probs[n:], ours), mapie_sets[:, :, 0])


def test_aps_matches_mapie_with_its_uniforms():
    """MAPIE's APS score is ``cumsum_incl(y) - u * p_y``, u from RandomState(seed), i.e.
    ours with ``U = 1 - u``; its "randomized" sets remove the crossing class when
    ``u < V``, i.e. keep it iff ours with ``U = 1 - u`` is <= qhat. Our own draws come from
    another generator (default_rng), so the sets of calibrate/prediction_sets cannot equal
    MAPIE's draw for draw: we compare scores, quantile and sets with MAPIE's uniforms fed
    to our public score functions, and the non-randomised sets at MAPIE's threshold."""
    alpha = 0.1
    seed = 12
    model, probs, labels, n = _mapie_setup("aps", alpha, seed=seed)
    u_cal = np.random.RandomState(seed).uniform(size=n)
    scores = conformal.conformity_scores(probs[:n], labels[:n], "aps", uniforms=1 - u_cal)
    np.testing.assert_allclose(scores, np.ravel(model.conformity_scores), atol=1e-12)
    test_rows = np.arange(n, len(probs))[:, None]
    _, randomized = model.predict_set(test_rows, conformity_score_params={"include_last_label": "randomized"})
    qhat = _mapie_threshold(model)
    assert conformal.conformal_quantile(scores, alpha) == pytest.approx(qhat, abs=1e-12)
    u_test = np.random.RandomState(seed).uniform(size=len(test_rows))
    ours = conformal.class_scores(probs[n:], "aps", uniforms=1 - u_test) <= qhat
    assert np.array_equal(ours, randomized[:, :, 0])
    _, deterministic = model.predict_set(test_rows, conformity_score_params={"include_last_label": False})
    fixed = conformal.ConformalCalibration("aps", alpha, qhat, n, randomized=False)
    assert np.array_equal(conformal.prediction_sets(probs[n:], fixed, allow_zero_sets=False), deterministic[:, :, 0])


def test_raps_quantile_matches_mapie():
    """MAPIE's RAPS tunes k_reg and lambda on a stratified 10% of the calibration split
    (StratifiedShuffleSplit(random_state=seed)) and calibrates on the rest, in the split's
    order; given its k_star, lambda_star, rows and uniforms, our scores and quantile equal
    its own, and its non-randomised sets at that threshold equal ours."""
    from sklearn.model_selection import StratifiedShuffleSplit

    alpha, seed = 0.1, 13
    model, probs, labels, n = _mapie_setup("raps", alpha, seed=seed)
    test_rows = np.arange(n, len(probs))[:, None]
    _, deterministic = model.predict_set(test_rows, conformity_score_params={"include_last_label": False})
    score_fn = model._mapie_classifier.conformity_score_function_
    k_reg, lam = int(np.ravel(score_fn.k_star)[0]), float(np.ravel(score_fn.lambda_star)[0])
    # size_raps None: StratifiedShuffleSplit's default test_size, 10%
    split = StratifiedShuffleSplit(1, test_size=score_fn.size_raps, random_state=seed)
    kept, tuning = next(split.split(np.zeros(n), labels[:n]))
    assert np.array_equal(np.ravel(score_fn.X_raps), tuning)
    u_cal = np.random.RandomState(seed).uniform(size=len(kept))
    scores = conformal.conformity_scores(probs[kept], labels[kept], "raps", uniforms=1 - u_cal, k_reg=k_reg, lam=lam)
    qhat = _mapie_threshold(model)
    assert conformal.conformal_quantile(scores, alpha) == pytest.approx(qhat, abs=1e-12)
    fixed = conformal.ConformalCalibration("raps", alpha, qhat, len(kept), randomized=False, k_reg=k_reg, lam=lam)
    assert np.array_equal(conformal.prediction_sets(probs[n:], fixed, allow_zero_sets=False), deterministic[:, :, 0])


def _reference_gcq(probs, tau, penalties, rand, allow_zero_sets):
    """Angelopoulos et al.'s ``gcq`` (github.com/aangelopoulos/conformal_classification,
    conformal.py), transcribed with its random draws passed in: the classes in decreasing
    probability up to the first whose penalised cumulative mass exceeds tau, the last
    removed when ``rand >= V``."""
    order = np.argsort(-probs, axis=1, kind="stable")
    ordered = np.take_along_axis(probs, order, axis=1)
    cumsum = np.cumsum(ordered, axis=1)
    penalties_cumsum = np.cumsum(penalties, axis=1)
    sizes_base = np.minimum(((cumsum + penalties_cumsum) <= tau).sum(axis=1) + 1, probs.shape[1])
    rows = np.arange(len(probs))
    last = sizes_base - 1
    v = (tau - (cumsum[rows, last] - ordered[rows, last]) - penalties_cumsum[0, last]) / ordered[rows, last]
    sizes = sizes_base - (rand >= v).astype(int)
    if not allow_zero_sets:
        sizes[sizes == 0] = 1
    sets = np.zeros(probs.shape, bool)
    for i in rows:
        sets[i, order[i, : sizes[i]]] = True
    return sets


@pytest.mark.parametrize(("method", "k_reg", "lam"), [("aps", None, None), ("raps", 2, 0.05), ("raps", 5, 0.5)])
@pytest.mark.parametrize("allow_zero_sets", [True, False])
def test_randomized_sets_match_the_reference_code(method, k_reg, lam, allow_zero_sets):
    """Our randomised sets ({c : score with the example's U <= qhat}) equal the paper's
    reference construction fed the same uniforms. (MAPIE 1.6's randomised RAPS divides by
    ``p_last - lam * max(0, L - k) + lam * [L > k]`` instead of ``p_last`` in V, so its sets
    differ from the reference once a set passes k_reg classes; its APS sets match, above.)"""
    probs, labels = _draw(np.random.default_rng(21), (1000,))
    cal = conformal.calibrate(probs[:500], labels[:500], method, 0.1, k_reg=k_reg, lam=lam, seed=5)
    ours = conformal.prediction_sets(probs[500:], cal, seed=6, allow_zero_sets=allow_zero_sets)
    rand = np.random.default_rng([6, 1]).random(500)  # prediction_sets' documented stream
    penalties = np.zeros((1, C))
    if method == "raps":
        penalties[:, cal.k_reg :] += cal.lam
    assert np.array_equal(ours, _reference_gcq(probs[500:], cal.threshold, penalties, rand, allow_zero_sets))


# --- selective prediction ---------------------------------------------------------------


def test_confidence_criteria():
    member = np.random.default_rng(0).dirichlet(np.ones(C), (4, 30))
    probs = member.mean(0)
    np.testing.assert_allclose(selective.confidence("max_probability", probs), probs.max(1))
    np.testing.assert_allclose(selective.confidence("entropy", probs), -entropy(probs))
    np.testing.assert_allclose(selective.confidence("mutual_information", probs, member), -mutual_information(member))
    with pytest.raises(ConfigError, match="needs member_probs"):
        selective.confidence("mutual_information", probs)
    with pytest.raises(ConfigError, match="unknown"):
        selective.confidence("margin", probs)


@pytest.mark.parametrize(("errors", "accepted", "delta"), [(0, 10, 0.05), (3, 50, 0.001), (40, 100, 0.2), (7, 7, 0.1)])
def test_bound_is_scipys_one_sided_clopper_pearson(errors, accepted, delta):
    """B*(r, delta) solves sum_{j<=errors} Binom(j; m, b) = delta, the one-sided (1 - delta)
    Clopper-Pearson upper limit: binomtest(..., alternative="less") at confidence 1 - delta,
    and the upper end of the TWO-sided exact interval at confidence 1 - 2 delta (each tail
    of a two-sided interval at level 1 - 2 delta holds delta)."""
    bound = selective.risk_upper_bound(errors, accepted, delta)
    one_sided = stats.binomtest(errors, accepted, alternative="less").proportion_ci(1 - delta, method="exact").high
    two_sided = stats.binomtest(errors, accepted).proportion_ci(1 - 2 * delta, method="exact").high
    assert bound == pytest.approx(one_sided, rel=1e-10, abs=1e-12)
    assert bound == pytest.approx(two_sided, rel=1e-10, abs=1e-12)
    if errors < accepted:
        assert stats.binom.cdf(errors, accepted, bound) == pytest.approx(delta, rel=1e-8)


def _selective_draw(rng: np.random.Generator, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Confidence kappa ~ U(0, 1), error with probability 0.4 (1 - kappa): the true risk
    of accepting kappa >= theta is 0.2 (1 - theta) (the mean of 0.4 (1 - kappa) over
    [theta, 1])."""
    kappa = rng.random(m)
    return kappa, rng.random(m) >= 0.4 * (1 - kappa)


def test_sgr_guarantees_the_target_risk():
    """Over 1,000 calibration draws (m = 2,000), the true risk of the chosen selection
    (known in closed form, no fresh sample needed) exceeds the target in at most a delta
    fraction of the draws."""
    draws, m, target, delta = 1000, 2000, 0.1, 0.1
    rng = np.random.default_rng(0)
    violations, feasible, coverages = 0, 0, []
    for _ in range(draws):
        kappa, correct = _selective_draw(rng, m)
        chosen = selective.select_threshold(kappa, correct, target, delta, criterion="max_probability")
        if not chosen.feasible:
            continue
        feasible += 1
        assert chosen.risk_bound < target
        violations += 0.2 * (1 - chosen.threshold) > target
        coverages.append(chosen.coverage)
        assert (chosen.risk, chosen.coverage) == pytest.approx(
            selective.selective_risk_coverage(selective.accept(kappa, chosen.threshold), correct)
        )
    assert violations / draws <= delta + 3 * math.sqrt(delta * (1 - delta) / draws)
    # not vacuous: nearly always feasible; the best coverage at risk 0.1 is 1 - theta* = 0.5
    assert feasible >= 0.9 * draws
    assert 0.25 < np.mean(coverages) <= 0.5


def test_sgr_infeasible_target_abstains_on_everything():
    kappa, correct = _selective_draw(np.random.default_rng(1), 200)
    chosen = selective.select_threshold(kappa, correct, 0.001, 0.001, criterion="entropy")
    assert not chosen.feasible and chosen.threshold == math.inf
    assert chosen.risk_bound >= 0.001 and (chosen.coverage, chosen.risk) == (0.0, 0.0)
    assert not selective.accept(kappa, chosen.threshold).any()
    assert selective.selective_risk_coverage(selective.accept(kappa, chosen.threshold), correct) == (0.0, 0.0)
    record = json.loads(json.dumps(chosen.to_dict()))
    assert record["threshold"] is None and selective.SelectiveThreshold.from_dict(record) == chosen


def test_sgr_refuses_bad_inputs():
    kappa, correct = _selective_draw(np.random.default_rng(1), 20)
    with pytest.raises(ConfigError, match=r"target_risk .* outside \(0, 1\); fix: "):
        selective.select_threshold(kappa, correct, 1.0, criterion="max_probability")
    with pytest.raises(ConfigError, match="delta"):
        selective.select_threshold(kappa, correct, 0.1, 0.0, criterion="max_probability")
    with pytest.raises(DataError, match="empty"):
        selective.select_threshold(kappa[:0], correct[:0], 0.1, criterion="max_probability")
    one = selective.select_threshold(kappa[:1], np.array([True]), 0.99, 0.5, criterion="max_probability")
    assert one.feasible and one.coverage == 1.0
