"""Greedy ensemble selection and temperature scaling against independent references:
a plain-Python Caruana loop, scikit-learn's log loss and scipy.optimize."""

import math

import numpy as np
import pytest
from scipy import optimize, special
from sklearn.metrics import log_loss

from ensemble_core.calibration import (
    MAX_TEMPERATURE,
    MIN_TEMPERATURE,
    apply_temperature,
    fit_temperature,
    temperature_nll,
)
from ensemble_core.selection import greedy_selection


def _caruana(member_probs, labels, size, eligible=None):
    """Caruana et al. 2004, written with lists and math.log (the reference)."""
    e, n = len(member_probs), len(labels)
    eligible = [True] * e if eligible is None else list(eligible)
    picked, nlls = [], []
    for _ in range(size):
        best, best_nll = None, math.inf
        for c in range(e):
            if not eligible[c]:
                continue
            total = 0.0
            for i in range(n):
                p = (sum(member_probs[m][i][labels[i]] for m in picked) + member_probs[c][i][labels[i]]) / (
                    len(picked) + 1
                )
                total -= math.log(max(p, np.finfo(np.float64).tiny))
            if total / n < best_nll:  # strict: ties keep the lower index
                best, best_nll = c, total / n
        picked.append(best)
        nlls.append(best_nll)
    return picked, nlls


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("e, size", [(1, 3), (5, 1), (5, 3), (12, 10)])
@pytest.mark.parametrize("masked", [False, True])
def test_greedy_selection_equals_a_plain_python_caruana_loop(seed, e, size, masked):
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.full(4, 0.7), size=(e, 40))
    labels = rng.integers(0, 4, 40)
    eligible = None
    if masked and e > 1:
        eligible = rng.random(e) < 0.6
        eligible[rng.integers(e)] = True
    got = greedy_selection(probs, labels, size, eligible=eligible)
    want, want_nll = _caruana(probs.tolist(), labels.tolist(), size, eligible)
    assert got.members == want
    np.testing.assert_allclose(got.validation_nll, want_nll, rtol=0, atol=1e-9)
    if eligible is not None:
        assert all(eligible[m] for m in got.members)


def test_ties_go_to_the_lowest_index_and_a_strong_member_is_picked_again():
    rng = np.random.default_rng(3)
    base = rng.dirichlet(np.ones(3), size=(2, 30))
    labels = rng.integers(0, 3, 30)
    dup = np.stack([base[1], base[0], base[0], base[1]])  # members 0 and 3 equal, 1 and 2 equal
    # Which of the two networks is better alone, by its validation NLL computed here:
    nll = [log_loss(labels, b, labels=range(3)) for b in base]
    assert abs(nll[0] - nll[1]) > 1e-3  # a real difference: only the twins tie
    better = 0 if nll[0] < nll[1] else 1  # base index
    tied = [m for m in range(4) if np.array_equal(dup[m], base[better])]
    assert len(tied) == 2  # the better network is two pool members, a tie
    first = greedy_selection(dup, labels, 1).members[0]
    assert first == min(tied), (first, tied)  # of two equal members the lower index wins
    # Every later step ties the same twins again (adding either gives the same mean): the
    # whole sequence is the plain-Python loop's, and never the higher twin of a pair.
    got = greedy_selection(dup, labels, 4).members
    assert got == _caruana(dup.tolist(), labels.tolist(), 4)[0]
    assert set(got) <= {0, 1}  # 0 and 1: the lower index of each equal pair
    # Sorted initialization ranks equal members by index too (a stable sort): the better
    # network's twins first, the lower index first, then the lower of the other pair.
    init = greedy_selection(dup, labels, 3, sorted_init=3, replacement=False).members
    assert init == [min(tied), max(tied), 1 - min(tied)], init
    # Three identical members: every pick is member 0.
    assert greedy_selection(np.stack([base[0]] * 3), labels, 3).members == [0, 0, 0]
    # member 0 is right everywhere, member 1 a mild complement: the best multiset repeats member 0
    good = np.full((30, 3), 0.05)
    good[np.arange(30), labels] = 0.9
    meh = np.full((30, 3), 1 / 3)
    sel = greedy_selection(np.stack([meh, good]), labels, 3)
    assert sel.members == [1, 1, 1] and sel.multiplicities == {1: 3}


def test_last_validation_nll_is_sklearns_log_loss_of_the_selected_mean():
    rng = np.random.default_rng(4)
    probs = 0.02 + 0.9 * rng.dirichlet(np.ones(5), size=(7, 60))
    probs /= probs.sum(-1, keepdims=True)
    labels = rng.integers(0, 5, 60)
    sel = greedy_selection(probs, labels, 6)
    mean = probs[sel.members].mean(0)
    assert sel.validation_nll[-1] == pytest.approx(log_loss(labels, mean, labels=range(5)), abs=1e-9)
    assert sum(sel.multiplicities.values()) == 6


@pytest.mark.parametrize(
    "args, match",
    [
        ((np.ones((2, 3)), np.zeros(3, int), 1), r"\[E, N, C\]"),
        ((np.ones((2, 3, 4)) / 4, np.zeros(2, int), 1), "one label per example"),
        ((np.ones((2, 3, 4)) / 4, np.zeros(3, int), 0), "below 1"),
    ],
)
def test_bad_selection_input_is_refused(args, match):
    with pytest.raises(ValueError, match=match):
        greedy_selection(*args)
    with pytest.raises(ValueError, match="no member is eligible"):
        greedy_selection(np.ones((2, 3, 4)) / 4, np.zeros(3, int), 1, eligible=np.zeros(2, bool))


def _oracle_nll(probs, labels, t):
    logp = special.log_softmax(np.log(np.maximum(probs, 1e-300)) / t, axis=-1)
    return -np.mean(logp[np.arange(len(labels)), labels])


@pytest.mark.parametrize("sharpness, seed", [(3.0, 0), (3.0, 1), (0.4, 2)])
def test_fitted_temperature_equals_scipys_minimiser(sharpness, seed):
    rng = np.random.default_rng(seed)
    n, c = 2000, 10
    labels = rng.integers(0, c, n)
    logits = rng.normal(size=(n, c))
    right = rng.random(n) < 0.7
    logits[np.arange(n), np.where(right, labels, (labels + 1) % c)] += 2.0
    probs = special.softmax(sharpness * logits, axis=-1)
    t = fit_temperature(probs, labels)
    ref = optimize.minimize_scalar(
        lambda x: _oracle_nll(probs, labels, x),
        bounds=(MIN_TEMPERATURE, MAX_TEMPERATURE),
        method="bounded",
        options={"xatol": 1e-10},
    )
    assert t == pytest.approx(ref.x, rel=1e-4)
    assert _oracle_nll(probs, labels, t) <= ref.fun + 1e-9
    assert temperature_nll(probs, labels, t) == pytest.approx(_oracle_nll(probs, labels, t), abs=1e-9)
    assert (t > 1) == (sharpness > 1)  # overconfident: soften; underconfident: sharpen


def test_temperature_one_is_the_identity_and_bad_temperatures_are_refused():
    rng = np.random.default_rng(5)
    probs = rng.dirichlet(np.ones(6), size=50)
    out = apply_temperature(probs, 1.0)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, probs, atol=1e-6)
    np.testing.assert_allclose(apply_temperature(probs, 3.0).sum(-1), 1.0, atol=1e-6)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite and > 0"):
            apply_temperature(probs, bad)
    with pytest.raises(ValueError, match="labels outside"):
        fit_temperature(probs, np.full(50, 6))
    with pytest.raises(ValueError, match="non-empty"):
        fit_temperature(probs[:0], np.zeros(0, int))
