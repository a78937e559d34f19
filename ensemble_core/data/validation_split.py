"""The validation and calibration splits: stratified, deterministic carves of the training split."""

from __future__ import annotations

import numpy as np

#: The seed of the validation carve: fixed, so every run (any ``seed``) holds out the same
#: examples and runs stay comparable on one validation split.
VALIDATION_SEED = 2020_12_04
#: The seed of the calibration carve (:func:`calibration_split`), another fixed seed so the
#: calibration split is a draw independent of the validation split's.
CALIBRATION_SEED = 2021_05_03


def validation_size(num_examples: int, fraction: float) -> int:
    """How many of ``num_examples`` training examples the validation split holds:
    ``round(fraction * num_examples)`` (Python's round, half to even)."""
    return round(fraction * num_examples)


def validation_split(
    labels: np.ndarray, fraction: float, *, total: int | None = None, seed: int = VALIDATION_SEED
) -> tuple[np.ndarray, np.ndarray]:
    """Carve a stratified validation split from a training split, deterministically.

    Of each class, a share proportional to its count goes to validation: the
    :func:`validation_size` total is apportioned over the classes by the largest
    remainder method (Hamilton's), so every class keeps its share to within one example.
    Which examples of a class are held out is a permutation drawn with the fixed
    :data:`VALIDATION_SEED`; the split depends on the labels and ``fraction`` only.

    Args:
      labels: int ``[N]``, the training split's labels.
      fraction: in [0, 1).
      total: how many to hold out, instead of :func:`validation_size` of ``fraction``
        (the calibration carve's count, :func:`calibration_split`).
      seed: the permutation's seed (default :data:`VALIDATION_SEED`).

    Returns:
      ``(train_indices, validation_indices)``: int64, sorted, disjoint, together ``0..N-1``.

    Raises:
      ValueError: ``fraction`` outside [0, 1).
    """
    if not 0 <= fraction < 1:
        raise ValueError(f"validation fraction {fraction!r} is outside [0, 1); fix: use e.g. 0.1")
    labels = np.asarray(labels)
    n = len(labels)
    total = validation_size(n, fraction) if total is None else min(int(total), n)
    classes, counts = np.unique(labels, return_counts=True)
    quota = counts * (total / n) if n else counts * 0.0
    take = np.floor(quota).astype(np.int64)
    short = total - int(take.sum())
    if short > 0:  # largest remainders first, ties to the lower class
        order = np.lexsort((classes, -(quota - take)))
        take[order[:short]] += 1
    rng = np.random.default_rng(seed)
    held = [rng.permutation(np.flatnonzero(labels == c))[:k] for c, k in zip(classes, take, strict=True)]
    val = np.sort(np.concatenate(held)) if held else np.zeros(0, np.int64)
    mask = np.zeros(n, bool)
    mask[val] = True
    return np.flatnonzero(~mask), val.astype(np.int64)


def calibration_split(
    labels: np.ndarray, validation_fraction: float, calibration_fraction: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The training split carved three ways: training, validation and calibration.

    The validation split is :func:`validation_split`'s with ``validation_fraction`` (the
    same examples as without a calibration split). The calibration split holds
    ``round(calibration_fraction * N)`` of the rest, stratified the same way with the fixed
    :data:`CALIBRATION_SEED`: the held-out data of split conformal prediction (Vovk et al.
    2005; Angelopoulos & Bates 2021, "A Gentle Introduction to Conformal Prediction",
    Sec. 1), which neither trains the members nor selects the ensemble.

    Args:
      labels: int ``[N]``, the training split's labels.
      validation_fraction, calibration_fraction: each in [0, 1), their sum below 1.

    Returns:
      ``(train_indices, validation_indices, calibration_indices)``: int64, sorted,
      pairwise disjoint, together ``0..N-1``.

    Raises:
      ValueError: a fraction outside [0, 1), or fractions summing to 1 or more.
    """
    if not 0 <= calibration_fraction < 1 or validation_fraction + calibration_fraction >= 1:
        raise ValueError(
            f"calibration fraction {calibration_fraction!r} with validation fraction {validation_fraction!r} "
            "leaves no training examples; fix: use e.g. 0.1 each"
        )
    labels = np.asarray(labels)
    rest, val = validation_split(labels, validation_fraction)
    count = validation_size(len(labels), calibration_fraction)
    if count == 0:
        return rest, val, np.zeros(0, np.int64)
    keep, cal = validation_split(labels[rest], 0.0, total=count, seed=CALIBRATION_SEED)
    return rest[keep], val, rest[cal]
