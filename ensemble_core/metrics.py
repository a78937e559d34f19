"""Accuracy and uncertainty metrics of an ensemble and of its members.

All functions take member probabilities ``member_probs`` float ``[E, N, C]`` (softmax
outputs) or probabilities ``probs`` ``[N, C]`` and integer labels ``[N]``; they return
Python floats. The ensemble prediction is the mean of member probabilities
(Lakshminarayanan et al. 2017, "Simple and Scalable Predictive Uncertainty Estimation
using Deep Ensembles"). Logarithms are natural (nats).
"""

from __future__ import annotations

import numpy as np

FLOAT64_TINY = np.finfo(np.float64).tiny


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
    return float(-np.mean(np.log(np.maximum(p, FLOAT64_TINY))))


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
    conf, correct, bins = _top_label_bins(probs, labels, num_bins)
    # |B_b|/N * |acc(B_b) - conf(B_b)| = |sum_{i in B_b} (correct_i - conf_i)| / N
    gaps = np.bincount(bins, weights=correct - conf, minlength=num_bins)
    return float(np.abs(gaps).sum() / len(conf))


def entropy(probs: np.ndarray) -> np.ndarray:
    """Shannon entropy over the last axis, ``-sum_c p log p`` (nats), with 0 log 0 = 0."""
    p = np.asarray(probs, np.float64)
    return -np.sum(np.where(p > 0, p * np.log(np.maximum(p, FLOAT64_TINY)), 0.0), axis=-1)


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


#: The figures :func:`scores` gives, in report order.
SCORES = ("accuracy", "nll", "brier", "ece", "adaptive_ece", "aurc", "accuracy_at_80_coverage")


def adaptive_ece(probs: np.ndarray, labels: np.ndarray, num_bins: int = 15) -> float:
    """Adaptive (equal-mass) expected calibration error on the top-label confidence.

    ``sum_b |B_b|/N * |acc(B_b) - conf(B_b)|`` where the examples, sorted by confidence
    (stable sort), are split into ``num_bins`` bins of equal count (``np.array_split``:
    sizes differ by at most one). The "AdaECE" of Mukhoti et al. 2020 ("Calibrating Deep
    Neural Networks using Focal Loss") and the equal-mass binning of Nixon et al. 2019
    ("Measuring Calibration in Deep Learning"); with fewer examples than bins, every
    example is its own bin.

    Args:
      probs: float ``[N, C]``; labels: int ``[N]``; num_bins: >= 1.
    """
    p = _check_probs(probs, labels)
    conf = p.max(-1)
    correct = (np.argmax(p, -1) == np.asarray(labels)).astype(np.float64)
    order = np.argsort(conf, kind="stable")
    n = len(conf)
    k = min(num_bins, n)
    # np.array_split's bins: the first n % k hold n // k + 1 examples, the rest n // k
    sizes = np.full(k, n // k)
    sizes[: n % k] += 1
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    # |B_b|/N * |acc(B_b) - conf(B_b)| = |sum_{i in B_b} (correct_i - conf_i)| / N
    gaps = np.add.reduceat((correct - conf)[order], starts)
    return float(np.abs(gaps).sum() / n)


def accuracy_at_coverage(probs: np.ndarray, labels: np.ndarray, coverage: float = 0.8) -> float:
    """Selective prediction: the accuracy on the ``ceil(coverage * N)`` most confident
    examples (top-label confidence, stable sort as :func:`risk_coverage`), i.e.
    ``1 - risk(coverage)`` on the risk-coverage curve (Geifman & El-Yaniv 2017).

    Raises:
      ValueError: ``coverage`` not in (0, 1].
    """
    return accuracy_on_curve(risk_coverage(probs, labels)[1], coverage)


def accuracy_on_curve(risk: np.ndarray, coverage: float) -> float:
    """``1 - risk(coverage)`` of a risk-coverage curve's ``risk`` ``[N]``
    (:func:`risk_coverage`): the accuracy of the ``ceil(coverage * N)`` most confident.

    Raises:
      ValueError: ``coverage`` not in (0, 1].
    """
    if not 0 < coverage <= 1:
        raise ValueError(f"coverage must be in (0, 1]; got {coverage}")
    k = max(1, int(np.ceil(coverage * len(risk) - 1e-9)))
    return float(1.0 - risk[k - 1])


def scores(probs: np.ndarray, labels: np.ndarray, num_bins: int = 15) -> dict[str, float]:
    """The figures :data:`SCORES` of one probability table ``[N, C]``: accuracy, NLL,
    Brier, ECE and adaptive ECE (``num_bins`` bins each), AURC and the accuracy at 80%
    coverage (selective prediction)."""
    risk = risk_coverage(probs, labels)[1]  # one curve for AURC and the accuracy at 80%
    return {
        "accuracy": accuracy(probs, labels),
        "nll": nll(probs, labels),
        "brier": brier(probs, labels),
        "ece": ece(probs, labels, num_bins),
        "adaptive_ece": adaptive_ece(probs, labels, num_bins),
        "aurc": float(np.mean(risk)),
        "accuracy_at_80_coverage": accuracy_on_curve(risk, 0.8),
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
        "member_mean": {k: float(np.mean([m[k] for m in kept])) for k in SCORES},
        "diversity": {
            "disagreement": disagreement(used),
            "predictive_entropy": float(predictive_entropy(used).mean()),
            "mutual_information": float(mutual_information(used).mean()),
        },
        "diverged_members": np.flatnonzero(~healthy).tolist(),
    }


def reliability_curve(probs: np.ndarray, labels: np.ndarray, num_bins: int = 15) -> dict[str, list]:
    """Per-bin mean confidence, accuracy and count (the data of a reliability diagram)."""
    conf, correct, bins = _top_label_bins(probs, labels, num_bins)
    count = np.bincount(bins, minlength=num_bins)
    conf_sum = np.bincount(bins, weights=conf, minlength=num_bins)
    correct_sum = np.bincount(bins, weights=correct, minlength=num_bins)
    return {
        "confidence": [float(s / c) if c else None for s, c in zip(conf_sum, count, strict=True)],
        "accuracy": [float(s / c) if c else None for s, c in zip(correct_sum, count, strict=True)],
        "count": [int(c) for c in count],
    }


def _top_label_bins(probs: np.ndarray, labels: np.ndarray, num_bins: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Top-label confidence float64 ``[N]``, correctness float64 ``[N]`` (1.0 or 0.0) and
    equal-width bin int64 ``[N]`` of each example: bin b holds confidences in
    ``(b/num_bins, (b+1)/num_bins]``."""
    p = np.asarray(probs, np.float64)
    conf = p.max(-1)
    correct = (np.argmax(p, -1) == labels).astype(np.float64)
    return conf, correct, calibration_bins(conf, num_bins)


def calibration_bins(confidence: np.ndarray, num_bins: int) -> np.ndarray:
    """The equal-width bin of each confidence, int64 of ``confidence``'s shape: bin b holds
    confidences in ``(b/num_bins, (b+1)/num_bins]`` (a confidence of 0 is in bin 0), the
    binning of ECE and the reliability diagram (Guo et al. 2017)."""
    return np.clip(np.ceil(np.asarray(confidence) * num_bins).astype(np.int64) - 1, 0, num_bins - 1)


# --- Out-of-distribution detection, selective prediction and dataset shift -------------


def _check_member_probs(member_probs: np.ndarray) -> np.ndarray:
    p = np.asarray(member_probs, np.float64)
    if p.ndim != 3:
        raise ValueError(f"member_probs must be [E, N, C]; got shape {p.shape}")
    if p.shape[0] == 0:
        raise ValueError("member_probs has no members (E = 0)")
    return p


def _check_probs(probs: np.ndarray, labels: np.ndarray | None = None) -> np.ndarray:
    p = np.asarray(probs, np.float64)
    if p.ndim != 2:
        raise ValueError(f"probs must be [N, C]; got shape {p.shape}")
    if p.shape[0] == 0:
        raise ValueError("probs has no examples (N = 0)")
    if labels is not None and np.shape(labels) != (p.shape[0],):
        raise ValueError(f"labels must be [N] = [{p.shape[0]}]; got shape {np.shape(labels)}")
    return p


def member_disagreement(member_probs: np.ndarray) -> np.ndarray:
    """Per-example disagreement of the members: the fraction of member pairs ``i < j``
    whose arg-max classes differ on the example, float64 ``[N]`` in [0, 1] (the
    per-example form of :func:`disagreement`, Fort et al. 2019); 0 for a single member.
    Computed from the vote counts ``k_c``: ``1 - sum_c k_c (k_c - 1) / (E (E - 1))``."""
    p = _check_member_probs(member_probs)
    e, n, c = p.shape
    if e < 2:
        return np.zeros(n)
    votes = np.zeros((n, c))
    np.add.at(votes, (np.arange(n)[None, :].repeat(e, 0), np.argmax(p, -1)), 1.0)
    return 1.0 - np.sum(votes * (votes - 1), axis=-1) / (e * (e - 1))


def energy(logits: np.ndarray) -> np.ndarray:
    """The free energy of logits, ``-logsumexp_c z_c`` at temperature 1, float64 ``[...]``
    over the last axis (Liu et al. 2020, "Energy-based Out-of-distribution Detection"):
    higher on out-of-distribution inputs."""
    z = np.asarray(logits, np.float64)
    m = z.max(-1)
    return -(m + np.log(np.exp(z - m[..., None]).sum(-1)))


def ood_scores(member_probs: np.ndarray, member_logits: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Per-example out-of-distribution scores from member probabilities ``[E, N, C]``
    (and their logits ``[E, N, C]``, for the energy).

    Every score is oriented so that HIGHER means "more likely out-of-distribution" (the
    OOD examples are the positives of :func:`detection`):

    - ``"max_prob"``: ``1 - max_c mean_e p_ec``, the maximum softmax probability baseline
      of Hendrycks & Gimpel 2017 ("A Baseline for Detecting Misclassified and
      Out-of-Distribution Examples in Neural Networks"), negated; in ``[0, 1 - 1/C]``.
    - ``"entropy"``: entropy of the ensemble prediction (``predictive_entropy``, nats).
    - ``"mutual_information"``: ``mutual_information`` (nats); exactly the BALD epistemic
      term, so 0 everywhere for a single member (E = 1) and possibly ~-1e-16 from rounding.
    - ``"energy"`` (with ``member_logits``): :func:`energy` of the members' mean logits
      ``mean_e z_e`` (for one member, its own logits), Liu et al. 2020's score ``-E(x)``
      negated so that higher means OOD.
    - ``"disagreement"`` (E >= 2): :func:`member_disagreement`.

    Returns:
      ``{"max_prob", "entropy", "mutual_information"[, "energy"][, "disagreement"]}``,
      each float64 ``[N]``.

    Raises:
      ValueError: member_probs not ``[E, N, C]``, or logits of another shape.
    """
    p = _check_member_probs(member_probs)
    out = {
        "max_prob": 1.0 - ensemble_probs(p).max(-1),
        "entropy": predictive_entropy(p),
        "mutual_information": mutual_information(p),
    }
    if member_logits is not None:
        if np.shape(member_logits) != p.shape:
            raise ValueError(f"member_logits must be {p.shape} like member_probs; got {np.shape(member_logits)}")
        out["energy"] = energy(np.asarray(member_logits, np.float64).mean(axis=0))
    if len(p) >= 2:
        out["disagreement"] = member_disagreement(p)
    return out


def detection(score: np.ndarray, is_ood: np.ndarray) -> dict[str, float]:
    """Threshold-free OOD detection metrics of a score where higher means "more OOD".

    OOD examples are the positive class; an example is flagged OOD at threshold t when
    ``score >= t``; equal scores are one threshold. All four from one scikit-learn
    ``roc_curve`` (its cumulative counts), equal to the functions named:

    - ``"auroc"``: ``roc_auc_score``, the area under the ROC curve = the Mann-Whitney
      statistic ``P(s_ood > s_id) + 0.5 * P(s_ood == s_id)`` (ties counted half).
    - ``"aupr_out"``: ``average_precision_score`` with OOD positive,
      ``sum_k (R_k - R_{k-1}) * P_k`` over distinct thresholds in descending order (the
      step-wise average precision, not the trapezoidal area). Its chance level is the
      OOD fraction.
    - ``"aupr_in"``: the same with the in-distribution examples positive and the score
      negated (Hendrycks & Gimpel 2017's AUPR-In); chance level the in-distribution
      fraction.
    - ``"fpr_at_95_tpr"``: the fraction of in-distribution examples with
      ``score >= t*``, where ``t*`` is the largest threshold flagging at least 95% of the
      OOD examples (Hendrycks & Gimpel 2017): the smallest FPR among the thresholds of
      ``roc_curve`` (all of them, ``drop_intermediate=False``) with TPR >= 0.95.

    Args:
      score: float ``[N]``, finite or +-inf (NaN is rejected).
      is_ood: bool ``[N]`` (or 0/1 integers), True for out-of-distribution examples.

    Raises:
      ValueError: on mismatched shapes, NaN scores, non-0/1 labels, or when either class
        (OOD or in-distribution) is absent, since the metrics are then undefined.
    """
    s = np.asarray(score, np.float64)
    y = np.asarray(is_ood)
    if s.ndim != 1 or y.shape != s.shape:
        raise ValueError(f"score and is_ood must both be [N]; got shapes {s.shape} and {y.shape}")
    if np.isnan(s).any():
        raise ValueError("score contains NaN")
    if y.dtype != bool:
        if not np.isin(y, (0, 1)).all():
            raise ValueError("is_ood must be boolean (or 0/1)")
        y = y.astype(bool)
    n_pos = int(y.sum())
    n_neg = int(y.size - n_pos)
    if n_pos == 0 or n_neg == 0:
        raise ValueError(
            f"detection needs both OOD (positive) and in-distribution examples; got "
            f"{n_pos} OOD and {n_neg} in-distribution"
        )

    # Imported here, not with the module: training imports this module (validation NLL) and
    # never needs scikit-learn, whose import costs about 0.4 s in every training process.
    from sklearn.metrics import auc, roc_curve

    # One sort for all four figures: roc_curve with every distinct threshold (descending,
    # after its (0, 0) point at +inf) gives the cumulative counts the others are built from.
    # roc_auc_score and average_precision_score each sort again and validate their inputs
    # again: four calls took 37 ms for 11,000 scores against 6 ms for this one, and the
    # evaluation scores each OOD set for every member and every score (87 calls a run).
    fpr, tpr, _ = roc_curve(y, s, drop_intermediate=False)
    tps = np.rint(tpr * n_pos)  # OOD examples with score >= threshold k
    fps = np.rint(fpr * n_neg)  # in-distribution examples with score >= threshold k
    return {
        # roc_auc_score's own definition: the trapezoidal area under roc_curve's points
        "auroc": float(auc(fpr, tpr)),
        # average_precision_score's: sum over thresholds, descending, of the recall's step
        # times the precision there
        "aupr_out": _average_precision(tps[1:], fps[1:], n_pos),
        # the same with the in-distribution examples positive and -score: its thresholds are
        # the distinct scores ascending, and at score <= t_k the in-distribution examples
        # flagged are those not above t_k (n_neg - fps[k-1]), the OOD ones n_pos - tps[k-1]
        "aupr_in": _average_precision((n_neg - fps[:-1])[::-1], (n_pos - tps[:-1])[::-1], n_neg),
        "fpr_at_95_tpr": float(fpr[tpr >= 0.95].min()),
    }


def _average_precision(tp: np.ndarray, fp: np.ndarray, n_pos: int) -> float:
    """``sum_k (R_k - R_{k-1}) * P_k`` (R_0 = 0) from the true and false positives float
    ``[K]`` at K thresholds in descending order (scikit-learn's ``average_precision_score``)."""
    recall = tp / n_pos
    precision = tp / np.maximum(tp + fp, 1)
    return float(np.sum(np.diff(recall, prepend=0.0) * precision))


def confident_fraction(probs: np.ndarray, tau: float = 0.9) -> float:
    """Fraction of examples whose top-label confidence ``max_c p_c`` is ``>= tau``.

    On in-distribution data the rate of confident predictions; on OOD inputs (where no
    label is right) the rate of confidently wrong predictions (Ovadia et al. 2019).
    """
    p = _check_probs(probs)
    return float(np.mean(p.max(-1) >= tau))


def risk_coverage(probs: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Risk-coverage curve of selective classification by confidence (Geifman & El-Yaniv
    2017, "Selective Classification for Deep Neural Networks").

    Examples are sorted by top-label confidence ``max_c p_c``, descending, with a STABLE
    sort: among equal confidences the example that comes first in the input is accepted
    first. (Ties change the curve only inside a tie group, never at its end.)

    Returns:
      ``(coverage, risk)``, both float64 ``[N]``: ``coverage[k-1] = k/N`` and
      ``risk[k-1]`` = error rate (1 - accuracy) of the k most confident examples.
    """
    p = _check_probs(probs, labels)
    n = p.shape[0]
    order = np.argsort(-p.max(-1), kind="stable")
    errors = (np.argmax(p, -1) != np.asarray(labels)).astype(np.float64)[order]
    k = np.arange(1, n + 1, dtype=np.float64)
    return k / n, np.cumsum(errors) / k


def aurc(probs: np.ndarray, labels: np.ndarray) -> float:
    """Area under the risk-coverage curve, ``mean_{k=1..N} risk(k/N)`` (Geifman et al.
    2019 "Bias-Reduced Uncertainty Estimation for Deep Neural Classifiers"); lower is better,
    0 for a classifier with no errors. Tie order as in ``risk_coverage``.
    """
    return float(np.mean(risk_coverage(probs, labels)[1]))


def accuracy_above(probs: np.ndarray, labels: np.ndarray, tau: float) -> dict:
    """Accuracy on the examples with top-label confidence ``>= tau`` and the fraction of
    examples they are (the accuracy-vs-confidence view of Ovadia et al. 2019, Fig. 2).

    Returns:
      ``{"accuracy": float | None, "fraction": float}``; accuracy is None when no example
      reaches ``tau``.
    """
    p = _check_probs(probs, labels)
    keep = p.max(-1) >= tau
    correct = np.argmax(p, -1) == np.asarray(labels)
    return {
        "accuracy": float(correct[keep].mean()) if keep.any() else None,
        "fraction": float(keep.mean()),
    }


def shift_scores(
    member_probs: np.ndarray, labels: np.ndarray, num_bins: int = 15, healthy: np.ndarray | None = None
) -> dict:
    """Ensemble, mean-member and best-member ``scores`` on one (e.g. shifted) test set.

    Compares the ensemble to its members under dataset shift (Ovadia et al. 2019, "Can
    You Trust Your Model's Uncertainty?").

    Args:
      member_probs: float ``[E, N, C]``.
      labels: int ``[N]``.
      healthy: bool ``[E]``; only healthy members are used (default: all), as in
        ``evaluate_all``.

    Returns:
      ``{"ensemble": scores, "member_mean": scores, "best_member": scores,
      "best_member_index": int}`` where ``ensemble`` scores the mean prediction of the
      healthy members, ``member_mean`` is the mean of the healthy members' scores, and
      ``best_member`` the scores of the healthy member with the lowest NLL on these
      examples (the first such member on a tie); ``best_member_index`` indexes all E
      members.

    Raises:
      ValueError: when no member is healthy or ``healthy`` is not ``[E]``.
    """
    p = _check_member_probs(member_probs)
    healthy = np.ones(len(p), bool) if healthy is None else np.asarray(healthy, bool)
    if healthy.shape != (len(p),):
        raise ValueError(f"healthy must be [E] = [{len(p)}]; got shape {healthy.shape}")
    idx = np.flatnonzero(healthy)
    if idx.size == 0:
        raise ValueError("shift_scores needs at least one healthy member")
    kept = [scores(p[i], labels, num_bins) for i in idx]
    best = int(np.argmin([m["nll"] for m in kept]))
    return {
        "ensemble": scores(ensemble_probs(p[idx]), labels, num_bins),
        "member_mean": {k: float(np.mean([m[k] for m in kept])) for k in SCORES},
        "best_member": kept[best],
        "best_member_index": int(idx[best]),
    }
