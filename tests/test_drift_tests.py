"""Drift as two-sample tests (:mod:`ensemble_core.drift_tests`) against SciPy on the same
inputs, Holm's adjustment against a hand computation and Bonferroni's bound, the false-alarm
rate under the null over replays of one synthetic ensemble model, a shifted sample flagged,
the edge cases and the JSON round trip."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats

from ensemble_core import calibration, drift_tests, metrics
from ensemble_core.drift_tests import DriftReference, holm, reference_from
from ensemble_core.drift_tests import drift_tests as run_tests
from ensemble_core.errors import ConfigError, DataError

# MARK: synthetic ensembles


def softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(-1, keepdims=True)
    ez = np.exp(z)
    return ez / ez.sum(-1, keepdims=True)


def ensemble_sample(rng, n: int, e: int = 3, c: int = 4, scale: float = 2.0, bias=None) -> np.ndarray:
    """Member probabilities ``[E, n, C]`` of one synthetic ensemble model: each example's
    shared logits ``scale * N(0, 1)`` (plus a class ``bias``), each member's own noise."""
    z = scale * rng.normal(size=(n, c)) + (0.0 if bias is None else np.asarray(bias))
    return softmax(z[None] + 0.7 * rng.normal(size=(e, n, c)))


def predicting(classes, c: int, e: int = 2, confidence: float = 0.7) -> np.ndarray:
    """Member probabilities ``[E, n, C]`` whose ensemble predicts ``classes`` ``[n]``."""
    classes = np.asarray(classes)
    p = np.full((len(classes), c), (1 - confidence) / (c - 1))
    p[np.arange(len(classes)), classes] = confidence
    return np.broadcast_to(p, (e, *p.shape)).copy()


# MARK: p-values equal SciPy's


@pytest.mark.parametrize("temperature", [None, 1.7])
def test_ks_tests_equal_scipy(temperature):
    rng = np.random.default_rng(1)
    ref_probs, new_probs = ensemble_sample(rng, 150), ensemble_sample(rng, 120, scale=1.5)
    ref = reference_from(ref_probs, temperature=temperature)
    out = run_tests(ref, new_probs, temperature=temperature)

    def entropy(p):
        mean = p.mean(0)
        return metrics.entropy(mean if temperature is None else calibration.apply_temperature(mean, temperature))

    ks_h = stats.ks_2samp(entropy(ref_probs), entropy(new_probs))
    ks_mi = stats.ks_2samp(metrics.mutual_information(ref_probs), metrics.mutual_information(new_probs))
    for name, want in [("predictive_entropy", ks_h), ("mutual_information", ks_mi)]:
        got = out["tests"][name]
        assert got["method"] == "ks_2samp"
        assert got["statistic"] == pytest.approx(want.statistic, abs=1e-12)
        assert got["p_value"] == pytest.approx(want.pvalue, rel=1e-9, abs=1e-15)
    assert (out["n_reference"], out["n_new"], out["alpha"], out["correction"]) == (150, 120, 0.05, "holm")
    assert out["skipped"] == {}


def test_class_test_equals_chi2_contingency_and_drops_a_class_never_predicted():
    rng = np.random.default_rng(2)
    ref_classes = rng.choice([0, 1, 3, 4], size=200, p=[0.4, 0.3, 0.2, 0.1])  # class 2 never predicted
    new_classes = rng.choice([0, 1, 3, 4], size=180, p=[0.3, 0.3, 0.25, 0.15])
    ref = reference_from(predicting(ref_classes, c=5))
    out = run_tests(ref, predicting(new_classes, c=5))
    got = out["tests"]["predicted_class"]
    table = np.stack([np.bincount(ref_classes, minlength=5), np.bincount(new_classes, minlength=5)])[:, [0, 1, 3, 4]]
    want = stats.chi2_contingency(table, correction=False)
    assert got["method"] == "chi2_contingency"
    assert got["classes"] == [0, 1, 3, 4]
    assert got["dof"] == want.dof == 3
    assert got["statistic"] == pytest.approx(want.statistic, rel=1e-12)
    assert got["p_value"] == pytest.approx(want.pvalue, rel=1e-9)
    assert got["min_expected_count"] >= drift_tests.MIN_EXPECTED_COUNT


# MARK: Holm


def test_holm_against_a_hand_computation():
    # sorted 0.01, 0.03, 0.04 -> 3 * 0.01, 2 * 0.03, max(0.06, 1 * 0.04): back in input order
    np.testing.assert_allclose(holm([0.01, 0.04, 0.03]), [0.03, 0.06, 0.06], rtol=1e-12)
    np.testing.assert_allclose(holm([0.5, 0.001, 0.2, 0.3]), [0.6, 0.004, 0.6, 0.6], rtol=1e-12)
    np.testing.assert_allclose(holm([0.6, 0.7]), [1.0, 1.0])
    assert holm([]).shape == (0,)
    with pytest.raises(DataError, match="fix: "):
        holm([0.1, 1.5])


def test_holm_lies_between_the_raw_p_values_and_bonferroni():
    rng = np.random.default_rng(3)
    for m in (1, 2, 3, 7):
        for _ in range(50):
            p = rng.random(m) ** 3
            adj = holm(p)
            assert (adj >= p - 1e-15).all()
            assert (adj <= np.minimum(1.0, m * p) + 1e-15).all()  # never more than Bonferroni
            order = np.argsort(p)
            assert (np.diff(adj[order]) >= 0).all()  # monotone in the raw p-values
    assert holm([0.02])[0] == 0.02  # one test: nothing to correct


# MARK: false alarms and power


def test_false_alarm_rate_under_the_null_is_at_most_alpha():
    rng = np.random.default_rng(4)
    replays, alarms = 300, 0
    for _ in range(replays):
        ref = reference_from(ensemble_sample(rng, 120))
        alarms += run_tests(ref, ensemble_sample(rng, 100))["drifted"]
    assert alarms / replays <= 0.05 + 0.02


def test_a_flatter_sample_and_a_class_shift_are_flagged():
    rng = np.random.default_rng(5)
    ref = reference_from(ensemble_sample(rng, 300))
    flat = run_tests(ref, ensemble_sample(rng, 200, scale=0.7))
    assert flat["drifted"]
    assert flat["tests"]["predictive_entropy"]["rejected"]
    assert flat["tests"]["predictive_entropy"]["p_adjusted"] < 1e-6

    shifted = run_tests(ref, ensemble_sample(rng, 200, bias=[3.0, 0.0, 0.0, 0.0]))
    assert shifted["drifted"]
    assert shifted["tests"]["predicted_class"]["rejected"]


# MARK: edge cases


def test_one_member_skips_the_mutual_information_test():
    rng = np.random.default_rng(6)
    ref = reference_from(ensemble_sample(rng, 80, e=1))
    assert set(ref.mutual_information) == {0.0}
    out = run_tests(ref, ensemble_sample(rng, 60, e=1))
    assert set(out["tests"]) == {"predictive_entropy", "predicted_class"}
    assert "one member" in out["skipped"]["mutual_information"]
    raw = [out["tests"][k]["p_value"] for k in ("predictive_entropy", "predicted_class")]
    adjusted = [out["tests"][k]["p_adjusted"] for k in ("predictive_entropy", "predicted_class")]
    np.testing.assert_allclose(adjusted, holm(raw))  # Holm over the two tests run


def test_small_expected_counts_use_a_deterministic_permutation_test():
    ref_classes = [0, 0, 0, 1, 1, 2]
    new_classes = [0, 1, 1, 1, 2, 2, 2]
    ref = reference_from(predicting(ref_classes, c=4))
    out = run_tests(ref, predicting(new_classes, c=4))
    got = out["tests"]["predicted_class"]
    assert got["method"] == "permutation_total_variation"
    assert got["classes"] == [0, 1, 2]
    assert got["min_expected_count"] < drift_tests.MIN_EXPECTED_COUNT
    assert got == run_tests(ref, predicting(new_classes, c=4))["tests"]["predicted_class"]  # deterministic

    def tv(a, b):
        return 0.5 * np.abs(np.bincount(a, minlength=3) / len(a) - np.bincount(b, minlength=3) / len(b)).sum()

    assert got["statistic"] == pytest.approx(tv(np.array(ref_classes), np.array(new_classes)))
    # SciPy's exact permutation test (C(13, 6) = 1716 splits) of the same statistic
    exact = stats.permutation_test(
        (np.array(ref_classes), np.array(new_classes)),
        tv,
        permutation_type="independent",
        alternative="greater",
        n_resamples=np.inf,
    )
    assert got["p_value"] == pytest.approx(exact.pvalue, abs=0.02)


def test_one_class_predicted_in_both_sets_skips_the_class_test():
    ref = reference_from(predicting([1] * 10, c=3))
    out = run_tests(ref, predicting([1] * 8, c=3))
    assert "predicted_class" not in out["tests"]
    assert "one class" in out["skipped"]["predicted_class"]
    assert not out["drifted"]


@pytest.mark.parametrize(
    "bad",
    [np.zeros((3, 0, 4)), np.zeros((0, 5, 4)), np.zeros((5, 4)), np.full((2, 3, 4), np.nan), np.ones((2, 3, 4))],
)
def test_bad_member_probs_are_refused_in_one_line(bad):
    rng = np.random.default_rng(7)
    with pytest.raises(DataError) as ref_err:
        reference_from(bad)
    ref = reference_from(ensemble_sample(rng, 20, e=2))
    with pytest.raises(DataError) as new_err:
        run_tests(ref, bad)
    for err in (ref_err, new_err):
        assert "\n" not in str(err.value)
        assert "; fix: " in str(err.value)


def test_mismatches_and_bad_settings_are_refused():
    rng = np.random.default_rng(8)
    ref = reference_from(ensemble_sample(rng, 30, e=3, c=4), temperature=1.5)
    new = ensemble_sample(rng, 30, e=3, c=4)
    with pytest.raises(DataError, match="members"):
        run_tests(ref, ensemble_sample(rng, 30, e=2, c=4), temperature=1.5)
    with pytest.raises(DataError, match="classes"):
        run_tests(ref, ensemble_sample(rng, 30, e=3, c=5), temperature=1.5)
    with pytest.raises(ConfigError, match="temperature"):
        run_tests(ref, new)
    for alpha in (0.0, 1.0, -0.1, float("nan"), True):
        with pytest.raises(ConfigError, match="alpha"):
            run_tests(ref, new, alpha=alpha, temperature=1.5)
    with pytest.raises(ConfigError, match="temperature"):
        reference_from(new, temperature=0.0)
    assert run_tests(ref, new, alpha=0.2, temperature=1.5)["alpha"] == 0.2


# MARK: JSON


def test_the_reference_survives_a_json_round_trip():
    rng = np.random.default_rng(9)
    ref = reference_from(ensemble_sample(rng, 50), temperature=1.3)
    d = json.loads(json.dumps(ref.to_dict()))
    assert all(isinstance(v, float) for v in d["entropy"] + d["mutual_information"])
    back = DriftReference.from_dict(d)
    assert back == ref
    new = ensemble_sample(rng, 40)
    assert run_tests(back, new, temperature=1.3) == run_tests(ref, new, temperature=1.3)
    assert json.loads(json.dumps(run_tests(ref, new, temperature=1.3)))["n_new"] == 40  # the result is JSON-able


@pytest.mark.parametrize(
    "change",
    [
        {"entropy": []},
        {"class_counts": [1, 2]},
        {"mutual_information": [0.0]},
        {"members": 0},
        {"entropy": "x"},
    ],
)
def test_a_damaged_reference_dict_is_refused_in_one_line(change):
    rng = np.random.default_rng(10)
    d = {**reference_from(ensemble_sample(rng, 12)).to_dict(), **change}
    with pytest.raises(DataError) as err:
        DriftReference.from_dict(d)
    assert "\n" not in str(err.value) and "; fix: " in str(err.value)
    d.pop("members")
    with pytest.raises(DataError, match="lacks members"):
        DriftReference.from_dict(d)
