"""Greedy ensemble selection with replacement (Caruana, Niculescu-Mizil, Crew & Ksikes
2004, "Ensemble selection from libraries of models", ICML), on validation NLL, as
hyper-deep ensembles use it (Wenzel et al. 2020, "Hyperparameter ensembles for
robustness and uncertainty quantification", NeurIPS)."""

from __future__ import annotations

import dataclasses

import numpy as np

from ensemble_core.metrics import _TINY


@dataclasses.dataclass(frozen=True)
class Selection:
    """The greedy selection's result.

    Attributes:
      members: pool indices in the order they were added; a member picked k times
        appears k times (length = the selection's size).
      validation_nll: the NLL (nats) of the running ensemble, the mean of the
        probabilities of ``members[:k + 1]``, after each addition k.
    """

    members: list[int]
    validation_nll: list[float]

    @property
    def multiplicities(self) -> dict[int, int]:
        """Pool index -> times picked, by index."""
        ids, counts = np.unique(self.members, return_counts=True)
        return {int(i): int(n) for i, n in zip(ids, counts, strict=True)}


def greedy_selection(
    member_probs: np.ndarray, labels: np.ndarray, size: int, eligible: np.ndarray | None = None
) -> Selection:
    """Pick ``size`` members (with replacement) whose equally weighted mean minimises NLL.

    Starting from the empty ensemble, each step adds the eligible member whose addition
    gives the lowest NLL of the averaged probabilities (every pick weighs the same, so a
    member picked twice counts twice); ties go to the lowest index. All candidates of a
    step are scored in one array expression (float64; probabilities clipped below as in
    :func:`ensemble_core.metrics.nll`).

    Args:
      member_probs: float ``[E, N, C]`` probabilities of the pool on the validation split.
      labels: int ``[N]``.
      size: K >= 1, the number of picks.
      eligible: bool ``[E]`` (None: all); e.g. the healthy members.

    Returns:
      The :class:`Selection`.

    Raises:
      ValueError: ``member_probs`` not 3-D, shapes that do not match, ``size < 1``, or no
        eligible member.
    """
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
    p_true = probs[:, np.arange(n), labels].astype(np.float64)  # [E, N]: only the label's probability matters
    running = np.zeros(n, np.float64)
    members, nlls = [], []
    for k in range(1, size + 1):
        candidate = (running[None, :] + p_true) / k  # [E, N]
        nll = -np.mean(np.log(np.maximum(candidate, _TINY)), axis=1)
        nll[~mask] = np.inf
        best = int(np.argmin(nll))  # argmin: the first (lowest index) of equal values
        members.append(best)
        nlls.append(float(nll[best]))
        running += p_true[best]
    return Selection(members=members, validation_nll=nlls)
