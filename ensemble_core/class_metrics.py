"""The class-level view of a classifier's test predictions: per-class accuracy, NLL and
ECE, the confusion matrix, the most confused class pairs, and the examples worth looking
at (the most uncertain, the most confident wrong).

Pure numpy (scikit-learn's ``confusion_matrix`` for the matrix): probabilities ``probs``
float ``[N, C]`` (e.g. the ensemble's mean, :func:`ensemble_core.metrics.ensemble_probs`)
and integer labels ``[N]`` in ``0..C-1`` in, Python numbers, lists and numpy arrays out.
Logarithms are natural (nats).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ensemble_core import metrics as metrics_lib

__all__ = [
    "confusion_matrix",
    "most_confident_wrong",
    "most_confused_pairs",
    "most_uncertain",
    "normalized_confusion",
    "per_class_scores",
]


def _checked(probs: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``probs`` as float64 ``[N, C]`` and ``labels`` as int64 ``[N]`` in ``0..C-1``.

    Raises:
      ValueError: other shapes, non-integer labels, or labels outside ``0..C-1``.
    """
    p = np.asarray(probs, np.float64)
    if p.ndim != 2 or p.shape[1] < 1:
        raise ValueError(f"probs must be [N, C] with C >= 1; got shape {p.shape}")
    y = _labels(labels, p.shape[1], "labels")
    if y.shape != (p.shape[0],):
        raise ValueError(f"labels must be [N] = [{p.shape[0]}]; got shape {y.shape}")
    return p, y


def _labels(labels: np.ndarray, num_classes: int, what: str) -> np.ndarray:
    """Integer class indices ``[N]`` in ``0..num_classes-1`` as int64 (ValueError otherwise)."""
    y = np.asarray(labels)
    if y.ndim != 1:
        raise ValueError(f"{what} must be [N]; got shape {y.shape}")
    if y.size and not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"{what} must be integers; got {y.dtype}")
    y = y.astype(np.int64)
    if y.size and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(f"{what} must be class indices in 0..{num_classes - 1}; got {y.min()}..{y.max()}")
    return y


def per_class_scores(
    probs: np.ndarray,
    labels: np.ndarray,
    num_bins: int = 15,
    class_names: Sequence[str] | None = None,
) -> list[dict]:
    """One row per class ``c`` of the examples whose TRUE class is ``c``.

    - ``count``: how many test examples are of class ``c``;
    - ``accuracy``: the fraction of them predicted ``c`` (arg-max), i.e. the class's
      recall;
    - ``nll``: their mean negative log-likelihood ``-mean log p[c]`` (nats;
      :func:`ensemble_core.metrics.nll` on the subset);
    - ``ece``: the expected calibration error of the subset with
      :func:`ensemble_core.metrics.ece`'s definition (top-label confidence, ``num_bins``
      equal-width bins of (0, 1], a bin weighted by its share of the subset): a
      class-conditional ECE, not the classwise ECE of Kull et al. 2019 (which bins
      ``p[c]`` over every example).

    A class with no test example gets ``count`` 0 and None for the three figures (no
    NaN in report.json).

    Args:
      probs: float ``[N, C]``, each row a probability vector.
      labels: int ``[N]`` in ``0..C-1``.
      num_bins: ECE bins, >= 1.
      class_names: C names (label ``i`` is ``class_names[i]``); with them every row has
        ``name``.

    Returns:
      C dicts ``{"class": int, ["name": str,] "count": int, "accuracy": float | None,
      "nll": float | None, "ece": float | None}`` in class order.

    Raises:
      ValueError: bad shapes or labels (see above), ``num_bins < 1``, or ``class_names``
        not C long.
    """
    p, y = _checked(probs, labels)
    c = p.shape[1]
    if num_bins < 1:
        raise ValueError(f"num_bins must be >= 1; got {num_bins}")
    if class_names is not None and len(class_names) != c:
        raise ValueError(f"class_names has {len(class_names)} names for {c} classes")
    predicted = np.argmax(p, -1)
    rows = []
    for k in range(c):
        mask = y == k
        n = int(mask.sum())
        row: dict = {"class": k}
        if class_names is not None:
            row["name"] = str(class_names[k])
        row["count"] = n
        if n:
            row.update(
                accuracy=float(np.mean(predicted[mask] == k)),
                nll=metrics_lib.nll(p[mask], y[mask]),
                ece=metrics_lib.ece(p[mask], y[mask], num_bins),
            )
        else:
            row.update(accuracy=None, nll=None, ece=None)
        rows.append(row)
    return rows


def confusion_matrix(labels: np.ndarray, predicted: np.ndarray, num_classes: int) -> np.ndarray:
    """The confusion matrix: int64 ``[C, C]``, entry ``[i, j]`` the number of examples of
    true class ``i`` predicted as class ``j`` (rows true, columns predicted; the diagonal
    the correct ones). Every class has its row and column, seen or not
    (equal to scikit-learn's ``sklearn.metrics.confusion_matrix`` with ``labels=range(C)``).

    Args:
      labels, predicted: int ``[N]`` in ``0..C-1`` (N may be 0: all zeros).
      num_classes: C >= 1.

    Raises:
      ValueError: ``num_classes < 1``, shapes that differ, or indices outside ``0..C-1``.
    """
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1; got {num_classes}")
    y = _labels(labels, num_classes, "labels")
    yhat = _labels(predicted, num_classes, "predicted")
    if y.shape != yhat.shape:
        raise ValueError(f"labels and predicted must have one shape; got {y.shape} and {yhat.shape}")
    # One bincount over the C * C (true, predicted) pairs: scikit-learn's confusion_matrix
    # gives the same counts (the test compares them) but its import, about 1 CPU s with
    # SciPy, was paid by every run whose only evaluator is the test split's.
    pairs = y.astype(np.int64) * num_classes + yhat.astype(np.int64)
    return np.bincount(pairs, minlength=num_classes * num_classes).reshape(num_classes, num_classes)


def normalized_confusion(counts: np.ndarray) -> np.ndarray:
    """The confusion matrix with each row divided by its total: float64 ``[C, C]``, row
    ``i`` the distribution of the predictions for true class ``i`` (summing to 1); a row
    of zero count (a class with no example) stays all zeros.

    Raises:
      ValueError: ``counts`` is not square ``[C, C]``.
    """
    m = np.asarray(counts, np.float64)
    if m.ndim != 2 or m.shape[0] != m.shape[1]:
        raise ValueError(f"a confusion matrix is [C, C]; got shape {m.shape}")
    totals = m.sum(axis=1, keepdims=True)
    return np.divide(m, totals, out=np.zeros_like(m), where=totals > 0)


def most_confused_pairs(counts: np.ndarray, k: int = 5, class_names: Sequence[str] | None = None) -> list[dict]:
    """The ``k`` largest off-diagonal entries of a confusion matrix ``[C, C]``: which true
    class is most often predicted as which other class.

    Pairs of zero count are left out (fewer than ``k`` rows then); equal counts are ordered
    by true class, then predicted class.

    Returns:
      ``[{"true": i, "predicted": j, ["true_name": str, "predicted_name": str,] "count":
      int, "fraction": float}]``, largest count first; ``fraction`` is the count over the
      true class's examples (the row-normalised entry).

    Raises:
      ValueError: ``counts`` is not ``[C, C]``, ``k < 0``, or ``class_names`` not C long.
    """
    m = np.asarray(counts)
    if m.ndim != 2 or m.shape[0] != m.shape[1]:
        raise ValueError(f"a confusion matrix is [C, C]; got shape {m.shape}")
    if k < 0:
        raise ValueError(f"k must be >= 0; got {k}")
    if class_names is not None and len(class_names) != m.shape[0]:
        raise ValueError(f"class_names has {len(class_names)} names for {m.shape[0]} classes")
    off = m.astype(np.int64).copy()
    np.fill_diagonal(off, 0)
    flat = off.ravel()
    order = np.argsort(-flat, kind="stable")  # row-major: ties by true, then predicted class
    rows = []
    normalized = normalized_confusion(m)
    for index in order[:k]:
        if flat[index] <= 0:
            break
        i, j = divmod(int(index), m.shape[1])
        row: dict = {"true": i, "predicted": j}
        if class_names is not None:
            row.update(true_name=str(class_names[i]), predicted_name=str(class_names[j]))
        row.update(count=int(flat[index]), fraction=float(normalized[i, j]))
        rows.append(row)
    return rows


def most_uncertain(probs: np.ndarray, k: int) -> np.ndarray:
    """The indices of the ``min(k, N)`` examples of highest predictive entropy
    ``-sum_c p_c log p_c`` (of ``probs`` ``[N, C]``; for an ensemble's mean probabilities
    the total uncertainty, :func:`ensemble_core.metrics.predictive_entropy`), highest
    first; equal entropies in index order. int64 ``[min(k, N)]``.

    Raises:
      ValueError: ``probs`` not ``[N, C]`` or ``k < 0``.
    """
    p = np.asarray(probs, np.float64)
    if p.ndim != 2:
        raise ValueError(f"probs must be [N, C]; got shape {p.shape}")
    if k < 0:
        raise ValueError(f"k must be >= 0; got {k}")
    order = np.argsort(-metrics_lib.entropy(p), kind="stable")
    return order[:k].astype(np.int64)


def most_confident_wrong(probs: np.ndarray, labels: np.ndarray, k: int) -> np.ndarray:
    """The indices of the wrong predictions (arg-max != label) of highest top-label
    confidence ``max_c p_c``, most confident first, equal confidences in index order: int64
    ``[min(k, number wrong)]`` (empty when every prediction is right).

    Raises:
      ValueError: bad shapes or labels (:func:`per_class_scores`) or ``k < 0``.
    """
    p, y = _checked(probs, labels)
    if k < 0:
        raise ValueError(f"k must be >= 0; got {k}")
    wrong = np.flatnonzero(np.argmax(p, -1) != y)
    order = np.argsort(-p[wrong].max(-1), kind="stable") if wrong.size else wrong
    return wrong[order][:k].astype(np.int64)
