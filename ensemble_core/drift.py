"""Data drift seen by the champion ensemble: how a new data snapshot differs from the one
the champion was trained on, before anything is trained on it.

Two signals, each compared with a threshold of ``nightly.drift``:

- **label shift**: the total variation distance between the class frequencies of the new
  training split and of the champion's, ``TV(p, q) = 0.5 * sum_c |p_c - q_c|`` in [0, 1]
  (Rabanser et al. 2019, "Failing loudly", use the same kind of two-distribution
  comparison for label shift).
- **uncertainty shift**: the champion ensemble's mean predictive entropy ``H(mean_e p_e)``
  and mean mutual information ``H(mean_e p_e) - mean_e H(p_e)`` on the new training split,
  minus the same means on the champion's own test split (nats). The ensemble's epistemic
  uncertainty rises on inputs unlike its training data (Lakshminarayanan et al. 2017,
  Ovadia et al. 2019): the deep ensemble as a drift detector.
"""

from __future__ import annotations

import numpy as np

from ensemble_core import metrics


def class_frequencies(counts) -> np.ndarray:
    """Counts per class ``[C]`` -> frequencies ``[C]`` (float64, sum 1).

    Raises:
      ValueError: no examples, a negative or non-finite count.
    """
    counts = np.asarray(counts, dtype=np.float64)
    if counts.ndim != 1 or not np.isfinite(counts).all() or (counts < 0).any() or counts.sum() <= 0:
        raise ValueError(f"class counts {counts.tolist()} are not non-negative counts of at least one example")
    return counts / counts.sum()


def label_shift(new_counts, champion_counts) -> dict:
    """Compare the class counts ``[C]`` of the new training split with the champion's.

    Classes missing from the shorter list count 0 (a class appeared or disappeared).

    Returns:
      ``total_variation`` (float in [0, 1]), ``new_frequencies`` and
      ``champion_frequencies`` (lists of C floats), ``largest_change`` (``class``,
      ``delta``: new minus champion frequency of the class that moved most).
    """
    c = max(len(new_counts), len(champion_counts))
    p = class_frequencies(np.pad(np.asarray(new_counts, np.float64), (0, c - len(new_counts))))
    q = class_frequencies(np.pad(np.asarray(champion_counts, np.float64), (0, c - len(champion_counts))))
    delta = p - q
    worst = int(np.argmax(np.abs(delta)))
    return {
        "total_variation": float(0.5 * np.abs(delta).sum()),
        "new_frequencies": [round(float(v), 6) for v in p],
        "champion_frequencies": [round(float(v), 6) for v in q],
        "largest_change": {"class": worst, "delta": round(float(delta[worst]), 6)},
    }


def uncertainty(member_probs: np.ndarray) -> dict:
    """Mean predictive entropy and mean mutual information (nats) of an ensemble's
    member probabilities float ``[E, N, C]``, and ``examples`` N."""
    return {
        "mean_predictive_entropy": float(np.mean(metrics.predictive_entropy(member_probs))),
        "mean_mutual_information": float(np.mean(metrics.mutual_information(member_probs))),
        "examples": int(member_probs.shape[1]),
    }


def uncertainty_shift(new_member_probs: np.ndarray, reference_member_probs: np.ndarray) -> dict:
    """The champion's uncertainty on the new data against its own test split.

    Args:
      new_member_probs: float ``[E, N, C]`` on the new training split.
      reference_member_probs: float ``[E, M, C]`` on the champion's test split.

    Returns:
      ``new`` and ``reference`` (:func:`uncertainty`), ``entropy_increase`` and
      ``mutual_information_increase`` (new minus reference means, nats).
    """
    new, ref = uncertainty(new_member_probs), uncertainty(reference_member_probs)
    return {
        "new": new,
        "reference": ref,
        "entropy_increase": new["mean_predictive_entropy"] - ref["mean_predictive_entropy"],
        "mutual_information_increase": new["mean_mutual_information"] - ref["mean_mutual_information"],
    }


def exceeded(figures: dict, thresholds: dict) -> list[str]:
    """Which thresholds the drift figures exceed, as one-line reasons.

    Args:
      figures: ``label_shift`` (:func:`label_shift`) and/or ``uncertainty``
        (:func:`uncertainty_shift`), each may be None.
      thresholds: ``label_shift_threshold``, ``entropy_threshold``,
        ``mutual_information_threshold`` (None: not checked), as ``nightly.drift``.
    """
    checks = []
    labels, unc = figures.get("label_shift"), figures.get("uncertainty")
    if labels is not None:
        checks.append(("class frequencies' total variation", labels["total_variation"], "label_shift_threshold"))
    if unc is not None:
        checks.append(("mean predictive entropy increase", unc["entropy_increase"], "entropy_threshold"))
        checks.append(
            ("mean mutual information increase", unc["mutual_information_increase"], "mutual_information_threshold")
        )
    out = []
    for what, value, key in checks:
        limit = thresholds.get(key)
        if limit is not None and value > limit:
            out.append(f"{what} {value:.4f} > nightly.drift.{key} {limit:g}")
    return out
