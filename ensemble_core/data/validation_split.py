"""The validation split: a stratified, deterministic carve of the training split."""

from __future__ import annotations

import numpy as np

#: The seed of the validation carve: fixed, so every run (any ``seed``) holds out the same
#: examples and runs stay comparable on one validation split.
VALIDATION_SEED = 2020_12_04


def validation_size(num_examples: int, fraction: float) -> int:
    """How many of ``num_examples`` training examples the validation split holds:
    ``round(fraction * num_examples)`` (Python's round, half to even)."""
    return round(fraction * num_examples)


def validation_split(labels: np.ndarray, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Carve a stratified validation split from a training split, deterministically.

    Of each class, a share proportional to its count goes to validation: the
    :func:`validation_size` total is apportioned over the classes by the largest
    remainder method (Hamilton's), so every class keeps its share to within one example.
    Which examples of a class are held out is a permutation drawn with the fixed
    :data:`VALIDATION_SEED`; the split depends on the labels and ``fraction`` only.

    Args:
      labels: int ``[N]``, the training split's labels.
      fraction: in [0, 1).

    Returns:
      ``(train_indices, validation_indices)``: int64, sorted, disjoint, together ``0..N-1``.

    Raises:
      ValueError: ``fraction`` outside [0, 1).
    """
    if not 0 <= fraction < 1:
        raise ValueError(f"validation fraction {fraction!r} is outside [0, 1); fix: use e.g. 0.1")
    labels = np.asarray(labels)
    n = len(labels)
    total = validation_size(n, fraction)
    classes, counts = np.unique(labels, return_counts=True)
    quota = counts * (total / n) if n else counts * 0.0
    take = np.floor(quota).astype(np.int64)
    short = total - int(take.sum())
    if short > 0:  # largest remainders first, ties to the lower class
        order = np.lexsort((classes, -(quota - take)))
        take[order[:short]] += 1
    rng = np.random.default_rng(VALIDATION_SEED)
    held = [rng.permutation(np.flatnonzero(labels == c))[:k] for c, k in zip(classes, take, strict=True)]
    val = np.sort(np.concatenate(held)) if held else np.zeros(0, np.int64)
    mask = np.zeros(n, bool)
    mask[val] = True
    return np.flatnonzero(~mask), val.astype(np.int64)
