"""Label-free accuracy estimators (ensemble_core/accuracy_estimation.py) against hand
computations, their fitted thresholds, their bias on a calibrated model, their records and
their refusals of bad input."""

import json
import math

import numpy as np
import pytest

from ensemble_core import accuracy_estimation as ae
from ensemble_core.calibration import apply_temperature
from ensemble_core.errors import ConfigError, DataError

# Reference set: 2 members, 5 examples, 3 classes. Dyadic values, so every mean is exact.
REF_MEMBERS = np.array(
    [
        [[0.75, 0.125, 0.125], [0.125, 0.5, 0.375], [0.25, 0.25, 0.5], [0.5, 0.375, 0.125], [0.25, 0.25, 0.5]],
        [[0.5, 0.25, 0.25], [0.25, 0.25, 0.5], [0.125, 0.125, 0.75], [0.25, 0.625, 0.125], [0.625, 0.25, 0.125]],
    ]
)
# Member mean: [.625 .1875 .1875] [.1875 .375 .4375] [.1875 .1875 .625] [.375 .5 .125] [.4375 .25 .3125]
# ensemble top classes [0, 2, 2, 1, 0], max probabilities [.625, .4375, .625, .5, .4375] (mean .525);
# member 0 top [0, 1, 2, 0, 2], member 1 top [0, 2, 2, 1, 0].
REF_LABELS = np.array([0, 2, 1, 1, 2])  # the ensemble is right on examples 0, 1, 3: accuracy 3/5

# Target set: 2 members, 4 examples. Member mean [.875 .0625 .0625] [.375 .3125 .3125]
# [.5 .25 .25] [.4375 .3125 .25]: ensemble top classes all 0, max probabilities
# [.875, .375, .5, .4375] (mean .546875); member 0 top [0, 0, 0, 0], member 1 top [0, 1, 0, 0].
TGT_MEMBERS = np.array(
    [
        [[1.0, 0.0, 0.0], [0.5, 0.25, 0.25], [0.5, 0.25, 0.25], [0.5, 0.25, 0.25]],
        [[0.75, 0.125, 0.125], [0.25, 0.375, 0.375], [0.5, 0.25, 0.25], [0.375, 0.375, 0.25]],
    ]
)
REF_PROBS = REF_MEMBERS.mean(0)
TGT_PROBS = TGT_MEMBERS.mean(0)


def entropy_of(*p):
    return -sum(x * math.log(x) for x in p if x > 0)


def one_line(err):
    message = str(err.value)
    assert "\n" not in message and "; fix: " in message, message


def test_average_confidence_by_hand():
    assert ae.average_confidence(REF_PROBS) == pytest.approx(0.525)
    assert ae.average_confidence(TGT_PROBS) == pytest.approx(0.546875)


def test_agreement_estimators_by_hand():
    # Member 0 agrees with the ensemble on 2 of 5, member 1 on 5 of 5: 7/10.
    assert ae.agreement_with_ensemble(REF_MEMBERS) == pytest.approx(0.7)
    # Target: 4 of 4 and 3 of 4.
    assert ae.agreement_with_ensemble(TGT_MEMBERS) == pytest.approx(0.875)
    # The two members differ on examples 1, 3, 4 of the reference (3/5), example 1 of the target.
    assert ae.disagreement_estimate(REF_MEMBERS) == pytest.approx(1 - 3 / 5)
    assert ae.disagreement_estimate(TGT_MEMBERS) == pytest.approx(1 - 1 / 4)
    # 0.6 - (0.7 - 0.875)
    assert ae.agreement_estimate(REF_MEMBERS, REF_LABELS, TGT_MEMBERS) == pytest.approx(0.775)


def test_agreement_is_one_when_all_members_agree():
    members = np.stack([REF_PROBS, REF_PROBS * 0.5 + np.eye(3)[np.argmax(REF_PROBS, -1)] * 0.5, REF_PROBS])
    assert ae.agreement_with_ensemble(members) == 1.0
    assert ae.disagreement_estimate(members) == 1.0
    # Agreement 1 on both sets: the corrected estimate is the reference accuracy.
    assert ae.agreement_estimate(members, REF_LABELS, members) == pytest.approx(0.6)


def test_doc_by_hand_and_on_the_reference_itself():
    # 0.6 - (0.525 - 0.546875)
    assert ae.doc_estimate(REF_PROBS, REF_LABELS, TGT_PROBS) == pytest.approx(0.621875)
    assert ae.doc_estimate(REF_PROBS, REF_LABELS, REF_PROBS) == pytest.approx(0.6)
    # Clipped to [0, 1]: a far more confident target cannot exceed accuracy 1.
    sure = np.tile([[0.98, 0.01, 0.01]], (4, 1))
    assert ae.doc_estimate(REF_PROBS, np.array([0, 2, 2, 1, 0]), sure) == 1.0


@pytest.mark.parametrize(
    ("labels", "threshold", "tie_weight", "target_estimate"),
    [
        # Scores sorted [.625 .625 .5 .4375 .4375]; k correct -> t = the (k+1)-th highest.
        ([0, 2, 1, 1, 2], 0.4375, 0.0, 2 / 4),  # k = 3: 3 above t, none needed at t
        ([0, 2, 2, 1, 1], 0.4375, 0.5, 2 / 4 + 0.5 * 1 / 4),  # k = 4: 3 above, 1 of the 2 at t
        ([0, 2, 2, 1, 0], 0.4375, 1.0, 3 / 4),  # k = 5 (accuracy 1): t the lowest, all at t count
        ([1, 0, 0, 0, 1], 0.625, 0.0, 1 / 4),  # k = 0 (accuracy 0): t the highest, none at t count
        ([0, 0, 0, 0, 1], 0.625, 0.5, 1 / 4),  # k = 1: the tie at the top counted half
    ],
)
def test_atc_max_confidence_by_hand(labels, threshold, tie_weight, target_estimate):
    fitted = ae.fit_atc(REF_PROBS, np.array(labels), "max_confidence")
    k = int(np.sum(np.argmax(REF_PROBS, -1) == np.array(labels)))
    assert fitted == ae.AtcThreshold("max_confidence", threshold, k / 5, 5, tie_weight)
    # The threshold reproduces the reference accuracy on the reference set, ties or none.
    assert ae.atc_estimate(REF_PROBS, fitted) == pytest.approx(k / 5)
    # Target max probabilities [.875 .375 .5 .4375].
    assert ae.atc_estimate(TGT_PROBS, fitted) == pytest.approx(target_estimate)


def test_atc_negative_entropy_by_hand():
    fitted = ae.fit_atc(REF_PROBS, REF_LABELS)  # the default score
    assert fitted.score == "negative_entropy"
    # Reference entropies: ex0 = ex2 0.92, ex3 0.97, ex1 1.04, ex4 1.07; k = 3 -> t = -H(ex1).
    assert fitted.threshold == pytest.approx(-entropy_of(0.1875, 0.375, 0.4375))
    assert fitted.tie_weight == 0.0
    assert ae.atc_estimate(REF_PROBS, fitted) == pytest.approx(0.6)
    # Target entropies 0.43, 1.09, 1.04, 1.07: two below 1.0434.
    assert entropy_of(0.5, 0.25, 0.25) < entropy_of(0.1875, 0.375, 0.4375) < entropy_of(0.4375, 0.3125, 0.25)
    assert ae.atc_estimate(TGT_PROBS, fitted) == pytest.approx(0.5)


def test_atc_reproduces_reference_accuracy_on_random_sets():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 100):
        probs = rng.dirichlet(np.full(4, 0.7), size=n)
        probs[: n // 2] = probs[0]  # many ties
        labels = rng.integers(0, 4, size=n)
        for score in ae.ATC_SCORES:
            fitted = ae.fit_atc(probs, labels, score)
            assert ae.atc_estimate(probs, fitted) == pytest.approx(fitted.reference_accuracy, abs=1e-12)
            assert fitted.reference_accuracy == np.mean(np.argmax(probs, -1) == labels)


def test_estimate_all_by_hand():
    reference = ae.fit_reference(REF_MEMBERS, REF_LABELS)
    assert (reference.accuracy, reference.mean_confidence, reference.agreement) == pytest.approx((0.6, 0.525, 0.7))
    estimates = ae.estimate_all(reference, TGT_MEMBERS)
    assert tuple(estimates) == ae.ESTIMATORS
    assert estimates == pytest.approx(
        {
            "average_confidence": 0.546875,
            "atc_negative_entropy": 0.5,
            "atc_max_confidence": 0.5,
            "doc": 0.621875,
            "agreement_with_ensemble": 0.875,
            "disagreement": 0.75,
            "agreement_corrected": 0.775,
        }
    )
    # On the reference itself, the fitted estimators give the reference accuracy.
    again = ae.estimate_all(reference, REF_MEMBERS)
    for name in ("atc_negative_entropy", "atc_max_confidence", "doc", "agreement_corrected"):
        assert again[name] == pytest.approx(0.6)


def test_temperature_scales_the_ensemble_mean():
    reference = ae.fit_reference(REF_MEMBERS, REF_LABELS, temperature=2.0)
    scaled_ref = apply_temperature(REF_PROBS, 2.0)
    scaled_tgt = apply_temperature(TGT_PROBS, 2.0)
    assert reference.mean_confidence == pytest.approx(ae.average_confidence(scaled_ref))
    estimates = ae.estimate_all(reference, TGT_MEMBERS, temperature=2.0)
    assert estimates["average_confidence"] == pytest.approx(ae.average_confidence(scaled_tgt))
    assert estimates["doc"] == pytest.approx(ae.doc_estimate(scaled_ref, REF_LABELS, scaled_tgt))
    fitted = ae.fit_atc(scaled_ref, REF_LABELS, "max_confidence")
    assert estimates["atc_max_confidence"] == pytest.approx(ae.atc_estimate(scaled_tgt, fitted))
    # Top classes, hence agreement, do not move with the temperature.
    assert estimates["agreement_corrected"] == pytest.approx(0.775)
    with pytest.raises(ConfigError) as err:
        ae.estimate_all(reference, TGT_MEMBERS)  # fitted with T = 2, asked with none
    one_line(err)


def test_single_member_leaves_out_the_agreement_estimators():
    reference = ae.fit_reference(REF_MEMBERS[:1], REF_LABELS)
    assert reference.agreement is None
    estimates = ae.estimate_all(reference, TGT_MEMBERS[:1])
    assert tuple(estimates) == tuple(n for n in ae.ESTIMATORS if n not in ae.AGREEMENT_ESTIMATORS)
    assert ae.Reference.from_dict(json.loads(json.dumps(reference.to_dict()))) == reference
    with pytest.raises(DataError) as err:
        ae.disagreement_estimate(TGT_MEMBERS[:1])
    one_line(err)


def calibrated_draw(rng, n, members=3, classes=10):
    """Member probabilities [E, n, C] and labels drawn from the ensemble's own mean."""
    base = rng.normal(size=(1, n, classes)) * 2.5
    logits = base + rng.normal(size=(members, n, classes))
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    mean = p.mean(0)
    u = rng.random((n, 1))
    labels = np.minimum((np.cumsum(mean, -1) < u).sum(-1), classes - 1)
    return p, labels


def test_average_confidence_and_atc_unbiased_on_a_calibrated_model():
    rng = np.random.default_rng(1)
    draws = 300
    errors = {name: [] for name in ("average_confidence", "atc_negative_entropy", "atc_max_confidence", "doc")}
    for _ in range(draws):
        ref_members, ref_labels = calibrated_draw(rng, 400)
        members, labels = calibrated_draw(rng, 400)
        truth = float(np.mean(np.argmax(members.mean(0), -1) == labels))
        estimates = ae.estimate_all(ae.fit_reference(ref_members, ref_labels), members)
        for name, values in errors.items():
            values.append(estimates[name] - truth)
    for name, values in errors.items():
        bias, standard_error = np.mean(values), np.std(values) / math.sqrt(draws)
        # Sampling error only: within 4 standard errors (ATC and DoC: + 0.003 for their O(1/n) bias).
        slack = 0.0 if name == "average_confidence" else 0.003
        assert abs(bias) < 4 * standard_error + slack, (name, bias, standard_error)
        assert np.sqrt(np.mean(np.square(values))) < 0.05, name


def test_json_round_trip():
    for temperature in (None, 1.7):
        reference = ae.fit_reference(REF_MEMBERS, REF_LABELS, temperature)
        record = json.loads(json.dumps(reference.to_dict()))
        again = ae.Reference.from_dict(record)
        assert again == reference
        assert ae.estimate_all(again, TGT_MEMBERS, temperature) == ae.estimate_all(reference, TGT_MEMBERS, temperature)
    fitted = ae.fit_atc(REF_PROBS, np.array([0, 2, 2, 1, 1]), "max_confidence")
    assert ae.AtcThreshold.from_dict(json.loads(json.dumps(fitted.to_dict()))) == fitted


@pytest.mark.parametrize(
    "record",
    [
        {"score": "max_confidence", "threshold": 0.5, "reference_accuracy": 0.5, "n_reference": 3},
        {"score": "energy", "threshold": 0.5, "reference_accuracy": 0.5, "n_reference": 3, "tie_weight": 0.0},
        {"score": "max_confidence", "threshold": 0.5, "reference_accuracy": 1.5, "n_reference": 3, "tie_weight": 0},
    ],
)
def test_bad_atc_records_refused(record):
    with pytest.raises(ConfigError) as err:
        ae.AtcThreshold.from_dict(record)
    one_line(err)


def test_bad_reference_records_refused():
    record = ae.fit_reference(REF_MEMBERS, REF_LABELS).to_dict()
    missing = {k: v for k, v in record.items() if k != "accuracy"}
    for bad in ({**record, "extra": 1}, missing, {**record, "atc": []}, {**record, "atc": None}):
        with pytest.raises(ConfigError) as err:
            ae.Reference.from_dict(bad)
        one_line(err)


def nan_members():
    m = REF_MEMBERS.copy()
    m[1, 2, 0] = np.nan
    return m


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda: ae.average_confidence(np.zeros((0, 3))), DataError),  # empty set
        (lambda: ae.fit_reference(np.zeros((2, 0, 3)), np.zeros(0, int)), DataError),  # empty reference
        (lambda: ae.fit_reference(np.zeros((0, 5, 3)), REF_LABELS), DataError),  # no members
        (lambda: ae.fit_reference(nan_members(), REF_LABELS), DataError),  # NaN
        (lambda: ae.average_confidence(np.full((2, 3), np.nan)), DataError),  # NaN
        (lambda: ae.fit_reference(REF_MEMBERS * 3, REF_LABELS), DataError),  # logits, not probabilities
        (lambda: ae.fit_reference(REF_MEMBERS, REF_LABELS[:4]), DataError),  # labels of another N
        (lambda: ae.fit_reference(REF_MEMBERS, REF_LABELS + 1), DataError),  # label 3 of 3 classes
        (lambda: ae.fit_reference(REF_MEMBERS, REF_LABELS.astype(float)), DataError),  # float labels
        (lambda: ae.fit_atc(REF_PROBS, REF_LABELS, "energy"), ConfigError),  # unknown score
        (lambda: ae.fit_reference(REF_MEMBERS, REF_LABELS, temperature=0.0), ConfigError),
        (lambda: ae.fit_reference(REF_MEMBERS, REF_LABELS, temperature=math.nan), ConfigError),
        (lambda: ae.doc_estimate(REF_PROBS, REF_LABELS, np.full((4, 4), 0.25)), DataError),  # class counts
        (lambda: ae.agreement_estimate(REF_MEMBERS, REF_LABELS, np.full((2, 4, 4), 0.25)), DataError),
        (lambda: ae.agreement_estimate(REF_MEMBERS, REF_LABELS, TGT_MEMBERS[:1]), DataError),  # E differs
        (lambda: ae.estimate_all(ae.fit_reference(REF_MEMBERS, REF_LABELS), np.full((2, 4, 4), 0.25)), DataError),
        (lambda: ae.estimate_all(ae.fit_reference(REF_MEMBERS, REF_LABELS), TGT_MEMBERS[:1]), DataError),
        (lambda: ae.estimate_all(ae.fit_reference(REF_MEMBERS, REF_LABELS), np.zeros((2, 0, 3))), DataError),
        (lambda: ae.atc_estimate(TGT_PROBS[:, None], ae.fit_atc(REF_PROBS, REF_LABELS)), DataError),  # rank
    ],
)
def test_bad_input_refused_in_one_line(call, error):
    with pytest.raises(error) as err:
        call()
    one_line(err)


def test_estimation_errors_by_hand():
    estimates = [{"a": 0.5, "b": 0.9}, {"a": 0.7, "b": 0.6}]
    out = ae.estimation_errors(estimates, [0.55, 0.9])
    # a: |.5 - .55| = .05, |.7 - .9| = .2; b: .35, .3.
    assert out["a"] == pytest.approx({"mae": 0.125, "max_abs_error": 0.2, "worst_index": 1})
    assert out["b"] == pytest.approx({"mae": 0.325, "max_abs_error": 0.35, "worst_index": 0})
    assert isinstance(out["a"]["worst_index"], int)
    # Only the estimators every dict holds (a single-member run lacks the agreement ones).
    assert list(ae.estimation_errors([{"a": 0.5, "b": 0.9}, {"a": 0.7}], [0.5, 0.5])) == ["a"]


@pytest.mark.parametrize(
    ("estimates", "truth"),
    [
        ([], []),
        ([{"a": 0.5}], [0.5, 0.6]),
        ([{"a": 0.5}], [55.0]),  # percent, not a fraction
        ([{"a": 0.5}], [math.nan]),
        ([{"a": math.nan}], [0.5]),
        ([{"a": 0.5}, {"b": 0.5}], [0.5, 0.5]),
    ],
)
def test_bad_estimation_errors_input_refused(estimates, truth):
    with pytest.raises(DataError) as err:
        ae.estimation_errors(estimates, truth)
    one_line(err)
