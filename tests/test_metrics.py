"""Metrics against hand-computed cases and independent implementations (scikit-learn, SciPy)."""

import numpy as np
import pytest
import scipy.stats
from sklearn.metrics import accuracy_score, log_loss

from ensemble_core import metrics


def _ece_loop(probs, labels, num_bins):
    # Guo et al. 2017, written out per example.
    n = len(labels)
    total = 0.0
    for b in range(num_bins):
        lo, hi = b / num_bins, (b + 1) / num_bins
        members = [i for i in range(n) if lo < max(probs[i]) <= hi or (b == 0 and max(probs[i]) == 0)]
        if members:
            acc = sum(int(np.argmax(probs[i]) == labels[i]) for i in members) / len(members)
            conf = sum(max(probs[i]) for i in members) / len(members)
            total += len(members) / n * abs(acc - conf)
    return total


def test_hand_computed_case():
    probs = np.array([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.2, 0.2, 0.6], [0.5, 0.4, 0.1]])
    labels = np.array([0, 1, 0, 1])
    assert metrics.accuracy(probs, labels) == 0.5
    assert metrics.nll(probs, labels) == pytest.approx(-(np.log(0.7) + np.log(0.6) + np.log(0.2) + np.log(0.4)) / 4)
    brier = (
        (0.3**2 + 0.2**2 + 0.1**2)
        + (0.1**2 + 0.4**2 + 0.3**2)
        + (0.8**2 + 0.2**2 + 0.6**2)
        + (0.5**2 + 0.6**2 + 0.1**2)
    ) / 4
    assert metrics.brier(probs, labels) == pytest.approx(brier)
    # 3 bins: (0,1/3] empty, (1/3,2/3]: confs .6 .6 .5 acc 1,0,0; (2/3,1]: conf .7 acc 1.
    ece = 3 / 4 * abs(1 / 3 - (0.6 + 0.6 + 0.5) / 3) + 1 / 4 * abs(1 - 0.7)
    assert metrics.ece(probs, labels, 3) == pytest.approx(ece)


def test_perfect_and_uniform_predictions():
    labels = np.array([0, 1, 2])
    onehot = np.eye(3)[labels]
    perfect = {"accuracy": 1.0, "nll": 0.0, "brier": 0.0, "ece": 0.0, "adaptive_ece": 0.0, "aurc": 0.0}
    assert metrics.scores(onehot, labels) == pytest.approx({**perfect, "accuracy_at_80_coverage": 1.0})
    uniform = np.full((3, 3), 1 / 3)
    assert metrics.nll(uniform, labels) == pytest.approx(np.log(3))
    assert metrics.entropy(uniform) == pytest.approx(np.full(3, np.log(3)))
    same = np.stack([uniform, uniform])
    assert metrics.mutual_information(same) == pytest.approx(np.zeros(3), abs=1e-12)


def test_against_sklearn_and_scipy():
    rng = np.random.default_rng(0)
    e, n, c = 5, 300, 10
    logits = rng.normal(size=(e, n, c)) * 3
    member_probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    labels = rng.integers(0, c, size=n)
    ens = member_probs.mean(0)
    assert metrics.accuracy(ens, labels) == pytest.approx(accuracy_score(labels, ens.argmax(-1)))
    assert metrics.nll(ens, labels) == pytest.approx(log_loss(labels, ens, labels=range(c)))
    assert metrics.ece(ens, labels, 15) == pytest.approx(_ece_loop(ens, labels, 15))
    h = scipy.stats.entropy(ens, axis=-1)
    assert metrics.predictive_entropy(member_probs) == pytest.approx(h)
    mi = h - np.mean([scipy.stats.entropy(p, axis=-1) for p in member_probs], axis=0)
    assert metrics.mutual_information(member_probs) == pytest.approx(mi)
    preds = member_probs.argmax(-1)
    pairs = [np.mean(preds[i] != preds[j]) for i in range(e) for j in range(e) if i < j]
    assert metrics.disagreement(member_probs) == pytest.approx(np.mean(pairs))


def test_evaluate_all_structure():
    rng = np.random.default_rng(1)
    member_probs = rng.dirichlet(np.ones(4), size=(3, 50))
    labels = rng.integers(0, 4, 50)
    out = metrics.evaluate_all(member_probs, labels)
    assert len(out["members"]) == 3
    for m, p in zip(out["members"], member_probs, strict=True):
        assert m["nll"] == pytest.approx(log_loss(labels, p, labels=range(4)))
    assert out["member_mean"]["accuracy"] == pytest.approx(np.mean([m["accuracy"] for m in out["members"]]))
    assert set(out["diversity"]) == {"disagreement", "predictive_entropy", "mutual_information"}


# --- OOD detection, selective prediction, shift ----------------------------------------


def _detection_by_loops(score, is_ood):
    """Independent oracle (plain loops over pairs and thresholds, no scikit-learn):
    AUROC as the Mann-Whitney statistic over all (OOD, ID) pairs, ties half; average
    precision as sum over distinct thresholds (descending) of recall gain x precision;
    FPR at the largest threshold flagging >= 95% of the OOD examples (integer test)."""
    pos = [float(v) for v, o in zip(score, is_ood, strict=True) if o]
    neg = [float(v) for v, o in zip(score, is_ood, strict=True) if not o]
    wins = sum(1.0 if p > q else 0.5 if p == q else 0.0 for p in pos for q in neg)
    ap, prev_recall, fpr95 = 0.0, 0.0, None
    for t in sorted(set(map(float, score)), reverse=True):
        tp = sum(p >= t for p in pos)
        fp = sum(q >= t for q in neg)
        ap += (tp / len(pos) - prev_recall) * tp / (tp + fp)
        prev_recall = tp / len(pos)
        if fpr95 is None and 100 * tp >= 95 * len(pos):
            fpr95 = fp / len(neg)
    # AUPR-in: in-distribution positive, flagged when -score >= t, i.e. score <= -t.
    ap_in, prev_recall = 0.0, 0.0
    for t in sorted(set(map(float, score))):
        tp = sum(q <= t for q in neg)
        fp = sum(p <= t for p in pos)
        ap_in += (tp / len(neg) - prev_recall) * tp / (tp + fp)
        prev_recall = tp / len(neg)
    return {"auroc": wins / (len(pos) * len(neg)), "aupr_in": ap_in, "aupr_out": ap, "fpr_at_95_tpr": fpr95}


def _softmax(x):
    z = np.exp(x - x.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def test_ood_scores_orientation_and_values():
    rng = np.random.default_rng(2)
    member_probs = _softmax(rng.normal(size=(4, 30, 5)) * 2)
    out = metrics.ood_scores(member_probs)
    assert set(out) == {"max_prob", "entropy", "mutual_information", "disagreement"}
    ens = member_probs.mean(0)
    np.testing.assert_allclose(out["max_prob"], 1 - ens.max(-1))
    np.testing.assert_allclose(out["entropy"], scipy.stats.entropy(ens, axis=-1))
    np.testing.assert_allclose(out["mutual_information"], metrics.mutual_information(member_probs))
    for v in out.values():
        assert v.shape == (30,)
    # A confident (one-hot) example scores lower than a uniform one under every score.
    conf = np.stack([np.eye(3)[[0, 0]], np.full((2, 3), 1 / 3)], axis=1)  # [E=2, N=2, C=3]
    conf[1, 1] = [0.9, 0.05, 0.05]  # members disagree on the second example
    s = metrics.ood_scores(conf)
    assert s["max_prob"][0] < s["max_prob"][1]
    assert s["entropy"][0] < s["entropy"][1]
    assert s["mutual_information"][0] == pytest.approx(0) and s["mutual_information"][1] > 0
    single = metrics.ood_scores(member_probs[:1])
    np.testing.assert_allclose(single["mutual_information"], 0, atol=1e-12)
    assert "disagreement" not in single  # a single network has no members to disagree
    with pytest.raises(ValueError):
        metrics.ood_scores(ens)


@pytest.mark.parametrize("seed", range(6))
def test_detection_against_loops_with_ties(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(20, 200))
    is_ood = rng.random(n) < rng.uniform(0.1, 0.9)
    is_ood[:2] = [True, False]
    # Coarse scores, so many ties within and across classes; OOD shifted up.
    score = np.round(rng.normal(size=n) + is_ood * rng.uniform(0, 2), 1)
    out = metrics.detection(score, is_ood)
    assert out == pytest.approx(_detection_by_loops(score, is_ood), abs=1e-12)
    # Integer labels and a shuffled order give the same result.
    perm = rng.permutation(n)
    assert metrics.detection(score[perm], is_ood[perm].astype(int)) == pytest.approx(out)


@pytest.mark.parametrize("ties", [False, True])
def test_detection_equals_scikit_learns_own_functions_on_an_evaluation_sized_set(ties):
    """detection builds every figure from one roc_curve: scikit-learn's roc_auc_score and
    average_precision_score (in and out) on 11,000 float32 scores are the oracle."""
    from sklearn.metrics import average_precision_score, roc_auc_score

    rng = np.random.default_rng(7)
    is_ood = np.arange(11_000) >= 1_000
    score = (rng.normal(size=11_000) + 1.5 * is_ood).astype(np.float32)
    if ties:
        score = np.round(score, 1)  # about 100 distinct values: ties within and across classes
    out = metrics.detection(score, is_ood)
    s = score.astype(np.float64)
    assert out["auroc"] == pytest.approx(roc_auc_score(is_ood, s), abs=1e-12)
    assert out["aupr_out"] == pytest.approx(average_precision_score(is_ood, s), abs=1e-12)
    assert out["aupr_in"] == pytest.approx(average_precision_score(~is_ood, -s), abs=1e-12)


def test_detection_all_tied_and_mann_whitney():
    is_ood = np.array([1, 0, 1, 0, 0], bool)
    out = metrics.detection(np.zeros(5), is_ood)
    assert out == pytest.approx({"auroc": 0.5, "aupr_in": 0.6, "aupr_out": 0.4, "fpr_at_95_tpr": 1.0})
    rng = np.random.default_rng(7)
    score = rng.integers(0, 5, 60).astype(float)
    y = rng.random(60) < 0.4
    u = scipy.stats.mannwhitneyu(score[y], score[~y]).statistic
    assert metrics.detection(score, y)["auroc"] == pytest.approx(u / (y.sum() * (~y).sum()))


def test_detection_perfectly_separated():
    is_ood = np.array([0, 1, 0, 1, 1, 0, 0, 1], bool)
    score = np.where(is_ood, 2.0, 1.0) + np.arange(8) * 0.01
    out = metrics.detection(score, is_ood)
    assert out == pytest.approx({"auroc": 1.0, "aupr_in": 1.0, "aupr_out": 1.0, "fpr_at_95_tpr": 0.0})
    assert _detection_by_loops(score, is_ood) == out
    # Reversed orientation: the worst case.
    rev = metrics.detection(-score, is_ood)
    assert rev["auroc"] == 0.0 and rev["fpr_at_95_tpr"] == 1.0
    assert rev["aupr_out"] == pytest.approx(_detection_by_loops(-score, is_ood)["aupr_out"])
    assert rev["aupr_in"] == pytest.approx(_detection_by_loops(-score, is_ood)["aupr_in"])


def test_detection_fpr95_threshold_boundary():
    # 20 OOD: 19 flagged is exactly 95% TPR, so the threshold stops before the last OOD.
    ood = np.r_[np.arange(1.0, 20.0) + 10, -100.0]
    ind = np.array([0.5, 5.0, 15.0, 50.0])
    score = np.r_[ood, ind]
    is_ood = np.r_[np.ones(20, bool), np.zeros(4, bool)]
    out = metrics.detection(score, is_ood)
    assert out["fpr_at_95_tpr"] == pytest.approx(2 / 4)  # 15 and 50 are >= 11
    assert out["fpr_at_95_tpr"] == pytest.approx(_detection_by_loops(score, is_ood)["fpr_at_95_tpr"])


@pytest.mark.parametrize("bad", [np.zeros(4, bool), np.ones(4, bool)])
def test_detection_one_class_absent_raises(bad):
    with pytest.raises(ValueError, match="both OOD"):
        metrics.detection(np.arange(4.0), bad)
    with pytest.raises(ValueError):
        metrics.detection(np.arange(3.0), np.array([1, 0, 1, 0], bool))
    with pytest.raises(ValueError):
        metrics.detection(np.array([0.0, np.nan]), np.array([1, 0], bool))


def test_confident_fraction_and_accuracy_above():
    probs = np.array([[0.95, 0.05], [0.9, 0.1], [0.6, 0.4], [0.2, 0.8], [0.02, 0.98]])
    labels = np.array([0, 1, 0, 1, 0])
    assert metrics.confident_fraction(probs) == pytest.approx(3 / 5)  # .95, .9 (>=), .98
    assert metrics.confident_fraction(probs, tau=0.99) == 0.0
    out = metrics.accuracy_above(probs, labels, 0.9)
    assert out == pytest.approx({"accuracy": 1 / 3, "fraction": 3 / 5})
    assert metrics.accuracy_above(probs, labels, 0.0) == pytest.approx(
        {"accuracy": metrics.accuracy(probs, labels), "fraction": 1.0}
    )
    assert metrics.accuracy_above(probs, labels, 0.99) == {"accuracy": None, "fraction": 0.0}


def _risk_coverage_loop(probs, labels):
    n = len(labels)
    conf = [max(p) for p in probs]
    # Stable descending order: higher confidence first, then lower input index.
    order = sorted(range(n), key=lambda i: (-conf[i], i))
    cov, risk = [], []
    for k in range(1, n + 1):
        chosen = order[:k]
        errs = sum(int(np.argmax(probs[i]) != labels[i]) for i in chosen)
        cov.append(k / n)
        risk.append(errs / k)
    return np.array(cov), np.array(risk)


@pytest.mark.parametrize("seed", range(4))
def test_risk_coverage_against_loop(seed):
    rng = np.random.default_rng(seed)
    n, c = 80, 4
    probs = rng.dirichlet(np.ones(c) * 0.5, size=n)
    probs[::7] = probs[3]  # ties in confidence
    labels = rng.integers(0, c, n)
    cov, risk = metrics.risk_coverage(probs, labels)
    ref_cov, ref_risk = _risk_coverage_loop(probs, labels)
    np.testing.assert_allclose(cov, ref_cov)
    np.testing.assert_allclose(risk, ref_risk)
    assert risk[-1] == pytest.approx(1 - metrics.accuracy(probs, labels))
    assert metrics.aurc(probs, labels) == pytest.approx(ref_risk.mean())


def test_aurc_perfect_and_ordering():
    rng = np.random.default_rng(5)
    probs = rng.dirichlet(np.ones(3), size=40)
    assert metrics.aurc(probs, probs.argmax(-1)) == 0.0
    # Errors only on the least confident example vs only on the most confident one.
    probs = np.array([[0.9, 0.1], [0.8, 0.2], [0.6, 0.4]])
    assert metrics.aurc(probs, np.array([0, 0, 1])) == pytest.approx((0 + 0 + 1 / 3) / 3)
    assert metrics.aurc(probs, np.array([1, 0, 0])) == pytest.approx((1 + 1 / 2 + 1 / 3) / 3)


def test_shift_scores_best_member_and_healthy():
    rng = np.random.default_rng(3)
    e, n, c = 5, 60, 4
    member_probs = _softmax(rng.normal(size=(e, n, c)) * rng.uniform(0.5, 3, size=(e, 1, 1)))
    labels = rng.integers(0, c, n)
    nlls = [log_loss(labels, p, labels=range(c)) for p in member_probs]
    out = metrics.shift_scores(member_probs, labels, num_bins=10)
    assert set(out) == {"ensemble", "member_mean", "best_member", "best_member_index"}
    assert out["best_member_index"] == int(np.argmin(nlls))
    assert out["best_member"] == pytest.approx(metrics.scores(member_probs[np.argmin(nlls)], labels, 10))
    assert out["best_member"]["nll"] == pytest.approx(min(nlls))
    full = metrics.evaluate_all(member_probs, labels, 10)
    assert out["ensemble"] == pytest.approx(full["ensemble"])
    assert out["member_mean"] == pytest.approx(full["member_mean"])

    # Exclude the best member: the next best healthy one is chosen, indexed among all E.
    healthy = np.ones(e, bool)
    healthy[np.argmin(nlls)] = False
    out_h = metrics.shift_scores(member_probs, labels, num_bins=10, healthy=healthy)
    masked = np.where(healthy, nlls, np.inf)
    assert out_h["best_member_index"] == int(np.argmin(masked))
    full_h = metrics.evaluate_all(member_probs, labels, 10, healthy=healthy)
    assert out_h["ensemble"] == pytest.approx(full_h["ensemble"])
    assert out_h["member_mean"] == pytest.approx(full_h["member_mean"])
    with pytest.raises(ValueError, match="healthy"):
        metrics.shift_scores(member_probs, labels, healthy=np.zeros(e, bool))


# --- Energy, disagreement, adaptive ECE, selective prediction (issue 41) ------------------


def test_energy_is_minus_logsumexp_of_the_mean_logits():
    rng = np.random.default_rng(5)
    logits = rng.normal(size=(3, 40, 6)) * 4
    probs = _softmax(logits)
    out = metrics.ood_scores(probs, logits)
    np.testing.assert_allclose(out["energy"], -scipy.special.logsumexp(logits.mean(0), axis=-1), rtol=1e-12)
    # Large logits do not overflow (the shift by the maximum).
    big = np.array([[1000.0, 999.0, -5.0]])
    assert metrics.energy(big)[0] == pytest.approx(-scipy.special.logsumexp(big[0]))
    # Liu et al. 2020: larger logits, lower energy, less OOD.
    assert metrics.energy(np.array([[5.0, 0, 0]]))[0] < metrics.energy(np.array([[1.0, 0, 0]]))[0]
    with pytest.raises(ValueError, match="member_logits"):
        metrics.ood_scores(probs, logits[:, :5])


def test_disagreement_per_example_against_pairs():
    rng = np.random.default_rng(6)
    probs = rng.dirichlet(np.ones(4), size=(5, 60))
    preds = probs.argmax(-1)
    pairs = [(i, j) for i in range(5) for j in range(i + 1, 5)]
    expected = np.mean([preds[i] != preds[j] for i, j in pairs], axis=0)
    np.testing.assert_allclose(metrics.member_disagreement(probs), expected, atol=1e-12)
    # Its mean is the report's disagreement (Fort et al. 2019).
    assert metrics.member_disagreement(probs).mean() == pytest.approx(metrics.disagreement(probs))
    np.testing.assert_array_equal(metrics.member_disagreement(probs[:1]), 0.0)


def _adaptive_ece_loop(probs, labels, bins):
    """Independent oracle: the examples sorted by confidence cut into ``bins`` consecutive
    groups whose sizes differ by at most one (the larger ones first), in a plain loop."""
    conf = probs.max(-1)
    correct = probs.argmax(-1) == labels
    order = sorted(range(len(conf)), key=lambda i: conf[i])
    n, total, start = len(conf), 0.0, 0
    for b in range(bins):
        size = n // bins + (1 if b < n % bins else 0)
        idx = order[start : start + size]
        start += size
        if idx:
            total += len(idx) / n * abs(np.mean([correct[i] for i in idx]) - np.mean([conf[i] for i in idx]))
    return total


@pytest.mark.parametrize("n, bins", [(100, 10), (37, 15), (5, 15)])
def test_adaptive_ece_against_a_loop(n, bins):
    rng = np.random.default_rng(n)
    probs = rng.dirichlet(np.ones(5) * 0.5, size=n)
    labels = rng.integers(0, 5, n)
    assert metrics.adaptive_ece(probs, labels, bins) == pytest.approx(_adaptive_ece_loop(probs, labels, min(bins, n)))
    # Perfectly calibrated by construction: confidence 1 and always right.
    onehot = np.eye(5)[labels]
    assert metrics.adaptive_ece(onehot, labels, bins) == pytest.approx(0.0)


def test_accuracy_at_coverage_against_sorting():
    rng = np.random.default_rng(8)
    probs = rng.dirichlet(np.ones(4), size=50)
    labels = rng.integers(0, 4, 50)
    keep = np.argsort(-probs.max(-1), kind="stable")[:40]  # 80% of 50
    expected = np.mean(probs[keep].argmax(-1) == labels[keep])
    assert metrics.accuracy_at_coverage(probs, labels, 0.8) == pytest.approx(expected)
    assert metrics.accuracy_at_coverage(probs, labels, 1.0) == pytest.approx(metrics.accuracy(probs, labels))
    with pytest.raises(ValueError, match="coverage"):
        metrics.accuracy_at_coverage(probs, labels, 0.0)
    assert set(metrics.scores(probs, labels)) == set(metrics.SCORES)
