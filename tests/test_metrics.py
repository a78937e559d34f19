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
    assert metrics.scores(onehot, labels) == pytest.approx({"accuracy": 1.0, "nll": 0.0, "brier": 0.0, "ece": 0.0})
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
