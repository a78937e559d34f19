"""Accuracy and uncertainty metrics of an ensemble and of its members.

All functions take member probabilities ``member_probs`` float ``[E, N, C]`` (softmax
outputs) or probabilities ``probs`` ``[N, C]`` and integer labels ``[N]``; they return
Python floats. The ensemble prediction is the mean of member probabilities
(Lakshminarayanan et al. 2017, "Simple and Scalable Predictive Uncertainty Estimation
using Deep Ensembles"). Logarithms are natural (nats).
"""

from __future__ import annotations

import numpy as np

_TINY = np.finfo(np.float64).tiny


def ensemble_probs(member_probs: np.ndarray) -> np.ndarray:
    """Mean over members: ``[E, N, C]`` -> ``[N, C]`` (float64)."""
    return np.asarray(member_probs, np.float64).mean(axis=0)


def accuracy(probs: np.ndarray, labels: np.ndarray) -> float:
    """Fraction of examples whose arg-max class equals the label."""
    return float(np.mean(np.argmax(probs, -1) == labels))


def nll(probs: np.ndarray, labels: np.ndarray) -> float:
    """Mean negative log-likelihood of the labels, ``-mean(log p[label])`` (nats).

    Probabilities are clipped below at the smallest positive float64 so a zero gives a
    large finite value instead of infinity.
    """
    p = np.asarray(probs, np.float64)[np.arange(len(labels)), labels]
    return float(-np.mean(np.log(np.maximum(p, _TINY))))


def brier(probs: np.ndarray, labels: np.ndarray) -> float:
    """Multi-class Brier score, ``mean_n sum_c (p_nc - onehot_nc)^2`` (Brier 1950), in [0, 2]."""
    p = np.asarray(probs, np.float64)
    onehot = np.eye(p.shape[-1])[labels]
    return float(np.mean(np.sum((p - onehot) ** 2, axis=-1)))


def ece(probs: np.ndarray, labels: np.ndarray, num_bins: int = 15) -> float:
    """Expected calibration error on the top-label confidence (Guo et al. 2017).

    ``sum_b |B_b|/N * |acc(B_b) - conf(B_b)|`` over ``num_bins`` equal-width bins of
    (0, 1]; bin b holds confidences in ``(b/num_bins, (b+1)/num_bins]``.
    """
    curve = reliability_curve(probs, labels, num_bins)
    n = len(labels)
    bins = zip(curve["count"], curve["accuracy"], curve["confidence"], strict=True)
    return float(sum(c / n * abs(a - f) for c, a, f in bins if c))


def entropy(probs: np.ndarray) -> np.ndarray:
    """Shannon entropy over the last axis, ``-sum_c p log p`` (nats), with 0 log 0 = 0."""
    p = np.asarray(probs, np.float64)
    return -np.sum(np.where(p > 0, p * np.log(np.maximum(p, _TINY)), 0.0), axis=-1)


def predictive_entropy(member_probs: np.ndarray) -> np.ndarray:
    """Entropy of the ensemble prediction, per example: ``[N]`` (total uncertainty)."""
    return entropy(ensemble_probs(member_probs))


def mutual_information(member_probs: np.ndarray) -> np.ndarray:
    """Per-example ``H(mean_e p_e) - mean_e H(p_e)``: ``[N]`` (epistemic part, nats).

    The BALD decomposition (Houlsby et al. 2011; Depeweg et al. 2018).
    """
    return predictive_entropy(member_probs) - entropy(member_probs).mean(axis=0)


def disagreement(member_probs: np.ndarray) -> float:
    """Mean over member pairs i < j of the fraction of examples where their arg-max
    predictions differ (Fort et al. 2019). 0 for a single member."""
    preds = np.argmax(member_probs, -1)  # [E, N]
    e = len(preds)
    if e < 2:
        return 0.0
    pairs = [np.mean(preds[i] != preds[j]) for i in range(e) for j in range(i + 1, e)]
    return float(np.mean(pairs))


def scores(probs: np.ndarray, labels: np.ndarray, num_bins: int = 15) -> dict[str, float]:
    """``{"accuracy", "nll", "brier", "ece"}`` of one probability table ``[N, C]``."""
    return {
        "accuracy": accuracy(probs, labels),
        "nll": nll(probs, labels),
        "brier": brier(probs, labels),
        "ece": ece(probs, labels, num_bins),
    }


def evaluate_all(
    member_probs: np.ndarray, labels: np.ndarray, num_bins: int = 15, healthy: np.ndarray | None = None
) -> dict:
    """Every metric of the report from member probabilities ``[E, N, C]`` and labels ``[N]``.

    Args:
      healthy: bool ``[E]``; the ensemble, member-mean and diversity figures use only the
        healthy members (default: all). Every member still gets its own scores.

    Returns:
      ``{"ensemble": scores, "members": [scores + {"healthy"}] * E, "member_mean": scores,
      "diversity": {"disagreement", "predictive_entropy", "mutual_information"},
      "diverged_members": [indices]}``.
    """
    healthy = np.ones(len(member_probs), bool) if healthy is None else np.asarray(healthy, bool)
    members = [{**scores(p, labels, num_bins), "healthy": bool(h)} for p, h in zip(member_probs, healthy, strict=True)]
    used = member_probs[healthy]
    kept = [m for m in members if m["healthy"]]
    return {
        "ensemble": scores(ensemble_probs(used), labels, num_bins),
        "members": members,
        "member_mean": {k: float(np.mean([m[k] for m in kept])) for k in ("accuracy", "nll", "brier", "ece")},
        "diversity": {
            "disagreement": disagreement(used),
            "predictive_entropy": float(predictive_entropy(used).mean()),
            "mutual_information": float(mutual_information(used).mean()),
        },
        "diverged_members": np.flatnonzero(~healthy).tolist(),
    }


def reliability_curve(probs: np.ndarray, labels: np.ndarray, num_bins: int = 15) -> dict[str, list]:
    """Per-bin mean confidence, accuracy and count (the data of a reliability diagram)."""
    p = np.asarray(probs, np.float64)
    conf = p.max(-1)
    correct = (np.argmax(p, -1) == labels).astype(np.float64)
    bins = np.clip(np.ceil(conf * num_bins).astype(int) - 1, 0, num_bins - 1)
    out = {"confidence": [], "accuracy": [], "count": []}
    for b in range(num_bins):
        mask = bins == b
        out["count"].append(int(mask.sum()))
        out["confidence"].append(float(conf[mask].mean()) if mask.any() else None)
        out["accuracy"].append(float(correct[mask].mean()) if mask.any() else None)
    return out
