"""Caruana et al. 2004's remedies for collapsing greedy selection (sorted initialization,
selection without replacement, bagged selection) against independent references: a
plain-Python selection loop (lists, math.log, fractions; numpy only draws the bootstrap
indices of the bags) and scikit-learn's log loss."""

import math
from fractions import Fraction

import numpy as np
import pytest
from sklearn.metrics import log_loss

from ensemble_core.selection import Selection, bagged_selection, greedy_selection

TINY = np.finfo(np.float64).tiny


def _nll(q, picked, n):
    """Plain-Python NLL of the equally weighted mean of ``picked``'s label probabilities."""
    total = 0.0
    for i in range(n):
        total -= math.log(max(sum(q[m][i] for m in picked) / len(picked), TINY))
    return total / n


def _reference(member_probs, labels, size, eligible=None, replacement=True, sorted_init=0):
    """Caruana et al. 2004 with sorted initialization and optional replacement, in plain Python."""
    e, n = len(member_probs), len(labels)
    q = [[member_probs[m][i][labels[i]] for i in range(n)] for m in range(e)]  # label probabilities
    eligible = [True] * e if eligible is None else [bool(x) for x in eligible]
    alone = sorted((_nll(q, [m], n), m) for m in range(e) if eligible[m])  # ties: lowest index
    picked, nlls = [], []
    for _, m in alone[:sorted_init]:
        picked.append(m)
        nlls.append(_nll(q, picked, n))
    for _ in range(size - sorted_init):
        best, best_nll = None, math.inf
        for c in range(e):
            if not eligible[c] or (not replacement and c in picked):
                continue
            score = _nll(q, [*picked, c], n)
            if score < best_nll:  # strict: ties keep the lower index
                best, best_nll = c, score
        picked.append(best)
        nlls.append(best_nll)
    return picked, nlls


def _bagged_reference(member_probs, labels, size, eligible, bags, seed, replacement=True, sorted_init=0):
    """Bootstrap the examples, select on each bag, average counts exactly, round by largest remainder."""
    e, n = len(member_probs), len(labels)
    totals = [0] * e
    for b in range(bags):
        rows = np.random.default_rng([seed, b]).integers(0, n, size=n).tolist()  # numpy: only the indices
        bag_probs = [[member_probs[m][i] for i in rows] for m in range(e)]
        picked, _ = _reference(bag_probs, [labels[i] for i in rows], size, eligible, replacement, sorted_init)
        for m in picked:
            totals[m] += 1
    avg = [Fraction(t, bags) for t in totals]
    counts = [math.floor(a) for a in avg]
    by_fraction = sorted(range(e), key=lambda m: (-(avg[m] - counts[m]), m))
    for m in by_fraction[: size - sum(counts)]:
        counts[m] += 1
    members = [m for m in sorted(range(e), key=lambda m: (-avg[m], m)) for _ in range(counts[m])]
    q = [[member_probs[m][i][labels[i]] for i in range(n)] for m in range(e)]
    nlls = [_nll(q, members[: k + 1], n) for k in range(len(members))]
    weights = {m: float(avg[m]) for m in range(e) if avg[m] > 0}
    return members, nlls, weights


def _pool(seed, e, n=30, c=4):
    rng = np.random.default_rng(seed)
    return rng, rng.dirichlet(np.full(c, 0.7), size=(e, n)), rng.integers(0, c, n)


def _mask(rng, e, masked):
    if not masked:
        return None
    eligible = rng.random(e) < 0.7
    eligible[rng.integers(e)] = True
    return eligible


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    "e, size, replacement, sorted_init",
    [(6, 4, True, 2), (6, 4, False, 0), (6, 4, False, 2), (9, 7, True, 3), (9, 6, False, 6), (5, 3, True, 0)],
)
@pytest.mark.parametrize("masked", [False, True])
def test_greedy_variants_equal_a_plain_python_reference(seed, e, size, replacement, sorted_init, masked):
    rng, probs, labels = _pool(seed, e)
    eligible = _mask(rng, e, masked)
    if eligible is not None and not replacement and eligible.sum() < size:
        eligible[: size + 1] = True  # enough members to pick each once
    got = greedy_selection(probs, labels, size, eligible, replacement=replacement, sorted_init=sorted_init)
    want, want_nll = _reference(probs.tolist(), labels.tolist(), size, eligible, replacement, sorted_init)
    assert got.members == want
    np.testing.assert_allclose(got.validation_nll, want_nll, rtol=0, atol=1e-9)
    assert got.weights is None
    if eligible is not None:
        assert all(eligible[m] for m in got.members)


@pytest.mark.parametrize("seed", [0, 3])
@pytest.mark.parametrize(
    "e, size, bags, replacement, sorted_init",
    [(5, 4, 3, True, 0), (6, 5, 4, True, 2), (6, 4, 5, False, 0), (7, 5, 3, False, 2), (4, 3, 1, True, 1)],
)
@pytest.mark.parametrize("masked", [False, True])
def test_bagged_selection_equals_a_plain_python_reference(seed, e, size, bags, replacement, sorted_init, masked):
    rng, probs, labels = _pool(seed + 10, e, n=20)
    eligible = _mask(rng, e, masked)
    if eligible is not None and eligible.sum() < size:
        eligible[: size + 1] = True
    got = bagged_selection(
        probs, labels, size, eligible, bags=bags, seed=seed, replacement=replacement, sorted_init=sorted_init
    )
    members, nlls, weights = _bagged_reference(
        probs.tolist(), labels.tolist(), size, eligible, bags, seed, replacement, sorted_init
    )
    assert got.members == members
    assert got.weights == weights
    np.testing.assert_allclose(got.validation_nll, nlls, rtol=0, atol=1e-9)
    assert len(got.members) == size and sum(got.multiplicities.values()) == size
    assert sum(got.weights.values()) == pytest.approx(size, abs=1e-12)
    if not replacement:
        assert max(got.multiplicities.values()) == 1 and got.distinct == size
    if eligible is not None:
        assert all(eligible[m] for m in got.members)


def _dominated_pool(n=40, c=3, seed=7):
    """Member 2 is right with 0.9 everywhere; the others are noisy (dirichlet) guesses."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, c, n)
    probs = rng.dirichlet(np.ones(c), size=(6, n))
    probs[2] = 0.05
    probs[2, np.arange(n), labels] = 0.9
    return probs, labels


def test_a_dominant_member_collapses_greedy_and_no_replacement_prevents_it():
    probs, labels = _dominated_pool()
    plain = greedy_selection(probs, labels, 5)
    assert plain.members == [2] * 5 and plain.distinct == 1 and plain.multiplicities == {2: 5}
    spread = greedy_selection(probs, labels, 5, replacement=False)
    assert spread.members[0] == 2 and spread.distinct == 5 and len(set(spread.members)) == 5
    every = greedy_selection(probs, labels, 6, replacement=False)
    assert sorted(every.members) == list(range(6))
    bagged = bagged_selection(probs, labels, 5, bags=4, replacement=False)
    assert bagged.distinct == 5 and bagged.weights[2] == 1.0 and 2 in bagged.members  # picked in every bag


@pytest.mark.parametrize("n_init", [1, 3, 5])
def test_sorted_init_starts_with_the_best_members_by_sklearns_log_loss(n_init):
    _, probs, labels = _pool(11, 8, n=50)
    alone = [log_loss(labels, probs[m], labels=range(4)) for m in range(8)]
    best = sorted(range(8), key=lambda m: alone[m])[:n_init]
    sel = greedy_selection(probs, labels, 5, sorted_init=n_init)
    assert sel.members[:n_init] == best
    for k in range(5):
        mean = probs[sel.members[: k + 1]].mean(0)
        assert sel.validation_nll[k] == pytest.approx(log_loss(labels, mean, labels=range(4)), abs=1e-9)


def test_sorted_init_ties_go_to_the_lowest_index_and_count_against_no_replacement():
    probs, labels = _dominated_pool()
    dup = np.concatenate([probs, probs[2:3]])  # member 6 equals member 2
    sel = greedy_selection(dup, labels, 3, sorted_init=2)
    assert sel.members[:2] == [2, 6]  # the two equal best members, lower index first
    assert sel.members[2] == 2  # with replacement greedy goes back to the dominant member
    once = greedy_selection(dup, labels, 3, sorted_init=2, replacement=False)
    assert once.members[:2] == [2, 6] and once.distinct == 3
    masked = greedy_selection(dup, labels, 2, np.array([1, 1, 0, 1, 1, 1, 1], bool), sorted_init=2)
    assert 2 not in masked.members and masked.members[0] == 6


def test_bagged_with_one_bag_is_greedy_on_that_bootstrap_sample():
    _, probs, labels = _pool(5, 7, n=40)
    rows = np.random.default_rng([9, 0]).integers(0, 40, size=40)
    on_bag = greedy_selection(probs[:, rows], labels[rows], 6)
    bagged = bagged_selection(probs, labels, 6, bags=1, seed=9)
    assert bagged.multiplicities == on_bag.multiplicities
    assert bagged.weights == {m: float(k) for m, k in on_bag.multiplicities.items()}
    mean = probs[bagged.members].mean(0)
    assert bagged.validation_nll[-1] == pytest.approx(log_loss(labels, mean, labels=range(4)), abs=1e-9)
    counts = [bagged.multiplicities[m] for m in dict.fromkeys(bagged.members)]
    assert counts == sorted(counts, reverse=True)  # ordered by decreasing multiplicity


def test_bagged_selection_is_reproducible_and_its_seed_matters():
    _, probs, labels = _pool(6, 8, n=25)
    a = bagged_selection(probs, labels, 5, bags=6, seed=1)
    assert a == bagged_selection(probs, labels, 5, bags=6, seed=1)
    others = [bagged_selection(probs, labels, 5, bags=6, seed=s).weights for s in range(2, 6)]
    assert any(w != a.weights for w in others)


def test_selection_distinct_counts_pool_indices():
    assert Selection(members=[19, 19, 5, 19], validation_nll=[1.0] * 4).distinct == 2


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"size": 4, "replacement": False}, "exceeds the 3 eligible members.*fix:"),
        ({"size": 2, "sorted_init": 3}, r"sorted_init=3 .*\[0, size=2\].*fix:"),
        ({"size": 2, "sorted_init": -1}, "sorted_init=-1.*fix:"),
        ({"size": 2, "sorted_init": 1.0}, "sorted_init=1.0.*fix:"),
        ({"size": 4, "sorted_init": 4}, "sorted_init=4 exceeds the 3 eligible.*fix:"),
    ],
)
def test_bad_variant_arguments_are_refused(kwargs, match):
    probs = np.full((4, 3, 2), 0.5)
    labels = np.zeros(3, int)
    eligible = np.array([1, 1, 0, 1], bool)
    with pytest.raises(ValueError, match=match):
        greedy_selection(probs, labels, eligible=eligible, **kwargs)
    with pytest.raises(ValueError, match=match):
        bagged_selection(probs, labels, eligible=eligible, bags=2, **kwargs)


@pytest.mark.parametrize(
    "kwargs, match",
    [({"bags": 0}, "bags=0.*fix:"), ({"bags": 2.0}, "bags=2.0.*fix:"), ({"bags": 2, "seed": -1}, "seed=-1.*fix:")],
)
def test_bad_bagging_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        bagged_selection(np.full((2, 3, 2), 0.5), np.zeros(3, int), 1, **kwargs)
