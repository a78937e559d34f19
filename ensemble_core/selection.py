"""Greedy ensemble selection (Caruana, Niculescu-Mizil, Crew & Ksikes 2004, "Ensemble
selection from libraries of models", ICML), on validation NLL, as hyper-deep ensembles
use it (Wenzel et al. 2020, "Hyperparameter ensembles for robustness and uncertainty
quantification", NeurIPS).

Plain forward selection with replacement tends to collapse onto a few strong members
(e.g. 8 picks = one network seven times and another once). The options below measure
the variants Caruana et al. discuss: selection without replacement (their basic
procedure, which section 2.1 replaces by selection with replacement, the default here),
sorted ensemble initialization (section 2.2) and bagged ensemble selection (section 2.3;
here the bags resample validation examples, not models: see :func:`bagged_selection`).
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import TYPE_CHECKING, Any

import numpy as np

from ensemble_core import metrics as metrics_lib
from ensemble_core.errors import DivergenceError
from ensemble_core.metrics import FLOAT64_TINY

if TYPE_CHECKING:
    from ensemble_core.config import PipelineConfig


@dataclasses.dataclass(frozen=True)
class Selection:
    """The selection's result.

    Attributes:
      members: pool indices in the order they were added; a member picked k times
        appears k times (length = the selection's size).
      validation_nll: the NLL (nats) of the running ensemble, the mean of the
        probabilities of ``members[:k + 1]``, after each addition k.
      weights: only for :func:`bagged_selection`: pool index -> multiplicity averaged
        over the bags (floats summing to the size; members never picked are left out);
        None for :func:`greedy_selection`.
    """

    members: list[int]
    validation_nll: list[float]
    weights: dict[int, float] | None = None

    @property
    def multiplicities(self) -> dict[int, int]:
        """Pool index -> times picked, by index."""
        ids, counts = np.unique(self.members, return_counts=True)
        return {int(i): int(n) for i, n in zip(ids, counts, strict=True)}

    @property
    def distinct(self) -> int:
        """The number of distinct pool indices (distinct networks) in the selection."""
        return len(set(self.members))


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _prepare(
    member_probs: np.ndarray,
    labels: np.ndarray,
    size: int,
    eligible: np.ndarray | None,
    replacement: bool,
    sorted_init: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Validate the inputs; return the labels' probabilities float64 ``[E, N]`` and the mask ``[E]``."""
    probs = np.asarray(member_probs)
    if probs.ndim != 3:
        raise ValueError(f"member_probs must be [E, N, C], got shape {probs.shape}; fix: stack the members first")
    e, n, _ = probs.shape
    labels = np.asarray(labels)
    if labels.shape != (n,):
        raise ValueError(f"labels have shape {labels.shape} for {n} examples; fix: pass one label per example")
    if size < 1:
        raise ValueError(f"selection size {size} is below 1; fix: select at least one member")
    mask = np.ones(e, bool) if eligible is None else np.asarray(eligible, bool)
    if mask.shape != (e,):
        raise ValueError(f"eligible has shape {mask.shape} for {e} members; fix: pass one flag per member")
    if not mask.any():
        raise ValueError("no member is eligible for selection; fix: train members that do not diverge")
    if not _is_int(sorted_init) or not 0 <= sorted_init <= size:
        raise ValueError(
            f"sorted_init={sorted_init!r} is not an integer in [0, size={size}]; fix: pass 0 <= sorted_init <= size"
        )
    n_eligible = int(mask.sum())
    if not replacement and size > n_eligible:
        raise ValueError(
            f"selection size {size} exceeds the {n_eligible} eligible members, and replacement=False picks each "
            "at most once; fix: lower size or pass replacement=True"
        )
    if sorted_init > n_eligible:
        raise ValueError(f"sorted_init={sorted_init} exceeds the {n_eligible} eligible members; fix: lower sorted_init")
    p_true = probs[:, np.arange(n), labels].astype(np.float64)  # [E, N]: only the label's probability matters
    return p_true, mask


def _greedy(
    p_true: np.ndarray, mask: np.ndarray, size: int, replacement: bool, sorted_init: int
) -> tuple[list[int], list[float]]:
    """Forward selection on the labels' probabilities ``p_true`` float64 ``[E, N]``: (picks, running NLLs)."""
    available = mask.copy()
    order: list[int] = []
    if sorted_init:
        alone = -np.mean(np.log(np.maximum(p_true, FLOAT64_TINY)), axis=1)  # [E]: each member's own NLL
        alone[~mask] = np.inf
        order = [int(i) for i in np.argsort(alone, kind="stable")[:sorted_init]]  # stable: ties to lowest index
    running = np.zeros(p_true.shape[1], np.float64)
    members: list[int] = []
    nlls: list[float] = []
    for k in range(1, size + 1):
        if k <= sorted_init:
            best = order[k - 1]
            score = float(-np.mean(np.log(np.maximum((running + p_true[best]) / k, FLOAT64_TINY))))
        else:
            candidate = (running[None, :] + p_true) / k  # [E, N]
            nll = -np.mean(np.log(np.maximum(candidate, FLOAT64_TINY)), axis=1)
            nll[~available] = np.inf
            best = int(np.argmin(nll))  # argmin: the first (lowest index) of equal values
            score = float(nll[best])
        members.append(best)
        nlls.append(score)
        running += p_true[best]
        if not replacement:
            available[best] = False
    return members, nlls


def greedy_selection(
    member_probs: np.ndarray,
    labels: np.ndarray,
    size: int,
    eligible: np.ndarray | None = None,
    *,
    replacement: bool = True,
    sorted_init: int = 0,
) -> Selection:
    """Pick ``size`` members whose equally weighted mean minimises validation NLL.

    Forward selection (Caruana et al. 2004, section 2): starting from the empty ensemble
    (or the sorted initialization below), each step adds the eligible member whose
    addition gives the lowest NLL of the averaged probabilities (every pick weighs the
    same, so a member picked twice counts twice); ties go to the lowest index. All
    candidates of a step are scored in one array expression (float64; probabilities
    clipped below as in :func:`ensemble_core.metrics.nll`). The defaults are plain
    selection with replacement, as before these options existed.

    Args:
      member_probs: float ``[E, N, C]`` probabilities of the pool on the validation split.
      labels: int ``[N]``.
      size: K >= 1, the number of picks.
      eligible: bool ``[E]`` (None: all); e.g. the healthy members.
      replacement: True (Caruana et al.'s selection with replacement, section 2.1): a
        member may be picked again; False: at most once (the sorted-initialization
        picks included), so the selection has ``size`` distinct members.
      sorted_init: N in [0, size], sorted ensemble initialization (Caruana et al.
        section 2.2): the first N picks are the N eligible members of lowest individual
        validation NLL, each once, in order of increasing NLL (ties: lowest index);
        greedy selection then adds the remaining ``size - N``.

    Returns:
      The :class:`Selection` (``weights`` None); ``validation_nll`` (nats) has one entry
      per pick, the first N (sorted initialization) included.

    Raises:
      ValueError: ``member_probs`` not 3-D, shapes that do not match, ``size < 1``, no
        eligible member, ``sorted_init`` not an integer in [0, size] or above the number
        of eligible members, or ``replacement=False`` with ``size`` above the number of
        eligible members.
    """
    p_true, mask = _prepare(member_probs, labels, size, eligible, replacement, sorted_init)
    members, nlls = _greedy(p_true, mask, size, replacement, sorted_init)
    return Selection(members=members, validation_nll=nlls)


def bagged_selection(
    member_probs: np.ndarray,
    labels: np.ndarray,
    size: int,
    eligible: np.ndarray | None = None,
    *,
    bags: int,
    seed: int = 0,
    replacement: bool = True,
    sorted_init: int = 0,
) -> Selection:
    """Greedy selection repeated on ``bags`` bootstrap samples of the validation split.

    Bag b (0-based) draws its N example indices, with replacement, exactly as
    ``np.random.default_rng([seed, b]).integers(0, N, size=N)`` (this seed convention is
    part of the contract: the same seed gives the same bags on every machine), and runs
    :func:`greedy_selection` on those examples with the same ``size``, ``eligible``,
    ``replacement`` and ``sorted_init``. The averaged multiplicity of member i is the
    mean over bags of the times bag b picked it (floats summing to ``size``); these are
    turned into integer multiplicities summing to ``size`` by the largest-remainder
    method: the floor of each, then one more pick to each of the largest fractional
    parts until ``size`` is reached (ties: lowest index). The rounding is done exactly on
    the integer totals over the bags.

    With ``replacement=False`` every averaged multiplicity is at most 1 and so is every
    rounded one: a member at 1 was picked in all bags and has no fractional part, and
    the extra picks only go to members with a positive fractional part (the fractional
    parts sum to the number of extra picks R and each is below 1, so more than R of
    them are positive), whose floor is 0.

    Note: Caruana et al. 2004 (section 2.3, "bagged ensemble selection") bag the
    *models*: each bag selects from a random subset of the library, and the bags'
    ensembles are averaged. This function instead bags the *validation examples*
    (bootstrap samples), as this project specifies; the pool stays whole in every bag.

    Args:
      member_probs: float ``[E, N, C]`` probabilities of the pool on the validation split.
      labels: int ``[N]``.
      size: K >= 1, the number of picks in each bag and in the result.
      eligible: bool ``[E]`` (None: all).
      bags: B >= 1, the number of bootstrap samples.
      seed: int >= 0, the first word of each bag's generator seed ``[seed, b]``.
      replacement, sorted_init: as in :func:`greedy_selection`, for every bag.

    Returns:
      The :class:`Selection`: ``members`` = the pool indices, each repeated by its
      rounded multiplicity, ordered by decreasing averaged multiplicity (ties: lowest
      index); ``validation_nll`` (nats) = the NLL on the FULL validation split of the
      running equally weighted mean of ``members[:k + 1]`` (the last entry is the selected
      ensemble's); ``weights`` = pool index -> averaged multiplicity, for the members
      picked in at least one bag.

    Raises:
      ValueError: as :func:`greedy_selection`, and ``bags`` not an integer >= 1 or
        ``seed`` not an integer >= 0.
    """
    if not _is_int(bags) or bags < 1:
        raise ValueError(f"bags={bags!r} is not an integer >= 1; fix: pass bags >= 1 (1: a single bootstrap sample)")
    if not _is_int(seed) or seed < 0:
        raise ValueError(f"seed={seed!r} is not an integer >= 0; fix: pass a non-negative integer seed")
    p_true, mask = _prepare(member_probs, labels, size, eligible, replacement, sorted_init)
    e, n = p_true.shape
    totals = np.zeros(e, np.int64)  # [E]: picks summed over the bags
    for b in range(bags):
        rows = np.random.default_rng([seed, b]).integers(0, n, size=n)
        picks, _ = _greedy(p_true[:, rows], mask, size, replacement, sorted_init)
        totals += np.bincount(picks, minlength=e)
    whole, remainder = np.divmod(totals, bags)  # averaged = whole + remainder / bags, exactly
    extra = size - int(whole.sum())
    by_fraction = np.lexsort((np.arange(e), -remainder))  # largest remainder first, ties to lowest index
    counts = whole.copy()
    counts[by_fraction[:extra]] += 1
    order = np.lexsort((np.arange(e), -totals))  # decreasing averaged multiplicity, ties to lowest index
    members = [int(i) for i in order for _ in range(int(counts[i]))]
    cumulative = np.cumsum(p_true[members], axis=0) / np.arange(1, size + 1)[:, None]  # [K, N]
    nlls = [float(v) for v in -np.mean(np.log(np.maximum(cumulative, FLOAT64_TINY)), axis=1)]
    weights = {int(i): float(totals[i] / bags) for i in np.flatnonzero(totals)}
    return Selection(members=members, validation_nll=nlls, weights=weights)


# MARK: selection as a config asks for it


def select_members(
    cfg: PipelineConfig, member_probs: np.ndarray, labels: np.ndarray, eligible: np.ndarray, *, first: bool = False
) -> Selection:
    """The greedy selection ``ensemble.selection`` (with ``first``: ``ensemble.first_selection``,
    a hyper-deep ensemble's selection from its search pool) asks for, of ``ensemble.select_size`` picks.

    Args:
      member_probs: float ``[E, N_val, C]`` validation probabilities of the pool.
      labels: int ``[N_val]``.
      eligible: bool ``[E]``: the healthy members.

    Returns:
      :func:`ensemble_core.selection.greedy_selection` (``selection.bags == 0``) or
      :func:`ensemble_core.selection.bagged_selection` with the bootstrap seeded by ``cfg.seed``.

    Raises:
      DivergenceError: no eligible member, or without replacement fewer eligible members
        than picks (diverged members are not eligible).
    """
    sel = cfg.ensemble.first_selection if first else cfg.ensemble.selection
    size = cfg.ensemble.select_size
    assert size is not None
    common: dict[str, Any] = {"eligible": eligible, "replacement": sel.replacement, "sorted_init": sel.sorted_init}
    try:
        if sel.bags:
            return bagged_selection(member_probs, labels, size, bags=sel.bags, seed=cfg.seed, **common)
        return greedy_selection(member_probs, labels, size, **common)
    except ValueError as err:
        raise DivergenceError(f"{err} (diverged members are not eligible)") from None


def selection_record(selection: Selection, member_probs: np.ndarray, labels: np.ndarray) -> dict[str, Any]:
    """A selection made on ``member_probs`` (float ``[E, N_val, C]``, the pool's validation
    probabilities) and ``labels`` (int ``[N_val]``) as JSON: ``members``, ``multiplicities``,
    ``distinct``, ``validation_nll`` (after each pick), ``weights`` (bagged: averaged
    multiplicities), ``member_validation_nll`` (every pool member's NLL, nats, as
    :func:`ensemble_core.metrics.nll`), ``validation_examples``."""
    member_nll = [metrics_lib.nll(p, labels) for p in member_probs]
    return {
        "members": [int(m) for m in selection.members],
        "multiplicities": {str(m): n for m, n in selection.multiplicities.items()},
        "distinct": selection.distinct,
        "validation_nll": [float(v) for v in selection.validation_nll],
        "weights": None if selection.weights is None else {str(m): w for m, w in selection.weights.items()},
        "member_validation_nll": [float(v) for v in member_nll],
        "validation_examples": len(labels),
    }
