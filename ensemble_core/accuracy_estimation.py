"""Label-free estimates of an ensemble's accuracy on an unlabelled set.

Every estimator reads the members' probabilities float ``[E, N, C]`` (the healthy members
only) of an unlabelled *target* set; the ensemble's prediction is their mean, temperature
scaled when a temperature is given (``calibration.apply_temperature``: pool, then
calibrate), and its top class the arg-max of that prediction (a temperature never changes
it). The fitted estimators also read a labelled *reference* set given the same way: the
run's calibration split, which neither trains nor selects the ensemble. Every estimate and
error is an accuracy, a fraction in [0, 1] (not percent).

The estimators (:data:`ESTIMATORS`, the keys of :func:`estimate_all`):

- ``"average_confidence"``: ``mean_n max_c p_nc`` (:func:`average_confidence`), the naive
  baseline; with a temperature-scaled ensemble it is Guo et al. 2017's calibrated
  confidence ("On Calibration of Modern Neural Networks", ICML). Needs no reference.
- ``"atc_negative_entropy"``, ``"atc_max_confidence"``: Average Thresholded Confidence
  (Garg et al. 2022, "Leveraging Unlabeled Data to Predict Out-of-Distribution
  Performance", ICLR) with their two scores, ATC-NE and ATC-MC (:func:`fit_atc`,
  :func:`atc_estimate`).
- ``"doc"``: Difference of Confidences (Guillory et al. 2021, "Predicting with Confidence
  on Unseen Distributions", ICCV): ``acc_ref - (conf_ref - conf_target)``
  (:func:`doc_estimate`).
- ``"agreement_with_ensemble"``: the fraction of (member, example) pairs on which the
  member's top class is the ensemble's (:func:`agreement_with_ensemble`); no reference.
- ``"disagreement"``: ``1 - `` the mean pairwise disagreement of the members
  (``metrics.disagreement``), the Generalization Disagreement Equality of Jiang et al.
  2022 ("Assessing Generalization of SGD via Disagreement", ICLR)
  (:func:`disagreement_estimate`); no reference.
- ``"agreement_corrected"``: ``acc_ref - (agr_ref - agr_target)`` on the agreement with
  the ensemble, DoC applied to agreement: this project's estimator, inspired by Baek et
  al. 2022 ("Agreement-on-the-line: Predicting the Performance of Neural Networks under
  Distribution Shift", NeurIPS) (:func:`agreement_estimate`).

The three member-agreement estimators need E >= 2 members; :func:`estimate_all` leaves
them out for a single member. :func:`fit_reference` fits once on the calibration split what
the fitted estimators need (:class:`Reference`); :func:`estimate_all` then estimates any
number of sets, and :func:`estimation_errors` scores the estimates against the true
accuracies of labelled (e.g. shifted) sets.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from ensemble_core.calibration import apply_temperature
from ensemble_core.errors import ConfigError, DataError
from ensemble_core.metrics import disagreement, entropy

#: The scores of ATC (Garg et al. 2022), higher = more confident: ``"negative_entropy"``
#: (``-H(p)``, nats, in [-log C, 0]; their ATC-NE, the default) and ``"max_confidence"``
#: (``max_c p_c``, in [1/C, 1]; their ATC-MC).
ATC_SCORES = ("negative_entropy", "max_confidence")

#: The names :func:`estimate_all` returns, in this order (the last three only for E >= 2).
ESTIMATORS = (
    "average_confidence",
    "atc_negative_entropy",
    "atc_max_confidence",
    "doc",
    "agreement_with_ensemble",
    "disagreement",
    "agreement_corrected",
)

#: The estimators that read the members' agreement, left out for a single member.
AGREEMENT_ESTIMATORS = ("agreement_with_ensemble", "disagreement", "agreement_corrected")

#: The estimators that need no labelled reference (``estimate_all(None, ...)``).
REFERENCE_FREE = ("average_confidence", "agreement_with_ensemble", "disagreement")

#: How far a row of probabilities may sum from 1 (float32 softmax outputs, averaged).
SUM_TOLERANCE = 1e-3


# --- input checks -----------------------------------------------------------------------


def _check_table(p: np.ndarray, name: str) -> np.ndarray:
    """Shared checks of a float64 ``[..., N, C]`` array already of the right rank."""
    n, c = p.shape[-2:]
    if n == 0:
        raise DataError(f"{name} has no examples (N = 0)", "pass a non-empty set")
    if c < 2:
        raise DataError(f"{name} has {c} class(es)", "pass probabilities over C >= 2 classes")
    if not np.isfinite(p).all():
        raise DataError(f"{name} holds NaN or infinite values", "pass finite probabilities (healthy members only)")
    if (p < 0).any() or np.abs(p.sum(-1) - 1.0).max() > SUM_TOLERANCE:
        raise DataError(
            f"{name} is not probabilities (negative values or rows not summing to 1)",
            "pass softmax outputs, not logits",
        )
    return p


def _check_probs(probs: np.ndarray, name: str = "probs") -> np.ndarray:
    p = np.asarray(probs, np.float64)
    if p.ndim != 2:
        raise DataError(f"{name} must be [N, C]; got shape {p.shape}", "pass the ensemble's probabilities")
    return _check_table(p, name)


def _check_members(member_probs: np.ndarray, name: str = "member_probs") -> np.ndarray:
    p = np.asarray(member_probs, np.float64)
    if p.ndim != 3:
        raise DataError(f"{name} must be [E, N, C]; got shape {p.shape}", "pass the members' probabilities")
    if p.shape[0] == 0:
        raise DataError(f"{name} has no members (E = 0)", "pass the healthy members' probabilities")
    return _check_table(p, name)


def _check_several_members(member_probs: np.ndarray, what: str) -> np.ndarray:
    p = _check_members(member_probs)
    if len(p) < 2:
        raise DataError(f"{what} needs at least 2 members; got E = 1", "pass E >= 2 healthy members")
    return p


def _check_labels(labels: np.ndarray, n: int, c: int) -> np.ndarray:
    y = np.asarray(labels)
    if y.shape != (n,):
        raise DataError(f"labels must be [N] = [{n}]; got shape {y.shape}", "pass one label per reference example")
    if not np.issubdtype(y.dtype, np.integer):
        raise DataError(f"labels must be integers; got dtype {y.dtype}", "pass class indices")
    if y.min() < 0 or y.max() >= c:
        raise DataError(f"labels outside [0, {c})", "pass class indices of the probabilities' C classes")
    return y


def _check_classes(target: np.ndarray, c_reference: int) -> None:
    if target.shape[-1] != c_reference:
        raise DataError(
            f"the target has C = {target.shape[-1]} classes, the reference {c_reference}",
            "pass probabilities of the same ensemble over the same classes",
        )


def _check_temperature(temperature: float | None) -> float | None:
    if temperature is None:
        return None
    if not (
        isinstance(temperature, int | float | np.floating)
        and not isinstance(temperature, bool)
        and math.isfinite(temperature)
        and temperature > 0
    ):
        raise ConfigError(f"temperature {temperature!r} must be finite and > 0", "pass the fitted temperature or None")
    return float(temperature)


def _check_score(score: str) -> None:
    if score not in ATC_SCORES:
        raise ConfigError(f"ATC score {score!r} is unknown", f"use one of {', '.join(ATC_SCORES)}")


def _check_keys(cls: type, record: dict[str, Any], what: str) -> None:
    if not isinstance(record, dict):
        raise ConfigError(f"{what} record is a {type(record).__name__}, not a dict", f"pass {what}.to_dict()'s output")
    names = {f.name for f in fields(cls)}
    missing, unknown = names - set(record), set(record) - names
    if missing or unknown:
        raise ConfigError(
            f"{what} record has missing keys {sorted(missing)} and unknown keys {sorted(unknown)}",
            f"pass a dict written by {what}.to_dict",
        )


def _clip(value: float) -> float:
    return float(min(1.0, max(0.0, value)))


# --- the ensemble's prediction and the unfitted estimators -------------------------------


def ensemble_prediction(member_probs: np.ndarray, temperature: float | None = None) -> np.ndarray:
    """The ensemble's probabilities: the member mean (Lakshminarayanan et al. 2017),
    ``softmax(log(mean_e p_e) / T)`` when a temperature T is given (Guo et al. 2017;
    ``calibration.apply_temperature``, pool then calibrate).

    Args:
      member_probs: float ``[E, N, C]``, the healthy members' softmax outputs.
      temperature: T > 0, or None for no scaling.

    Returns:
      float64 ``[N, C]`` (computed in float32 when scaled, as ``apply_temperature``).

    Raises:
      DataError: not ``[E, N, C]`` probabilities, E or N = 0, C < 2, NaN or infinity.
      ConfigError: T not finite or not positive.
    """
    t = _check_temperature(temperature)
    mean = _check_members(member_probs).mean(axis=0)
    return mean if t is None else apply_temperature(mean, t).astype(np.float64)


def average_confidence(probs: np.ndarray) -> float:
    """The mean top-label confidence ``mean_n max_c p_nc``, in [1/C, 1]: the naive
    estimate of the accuracy, unbiased for a calibrated model (with a temperature-scaled
    ensemble, Guo et al. 2017's calibrated confidence).

    Args:
      probs: float ``[N, C]`` ensemble probabilities.

    Raises:
      DataError: not ``[N, C]`` probabilities, N = 0, C < 2, NaN or infinity.
    """
    return float(_check_probs(probs).max(axis=-1).mean())


def atc_scores(probs: np.ndarray, score: str = "negative_entropy") -> np.ndarray:
    """ATC's per-example score, higher = more confident (Garg et al. 2022):
    ``"negative_entropy"`` ``-H(p)`` (nats, ``metrics.entropy``, in [-log C, 0]) or
    ``"max_confidence"`` ``max_c p_c`` (in [1/C, 1]).

    Args:
      probs: float ``[N, C]`` ensemble probabilities; score: one of :data:`ATC_SCORES`.

    Returns:
      float64 ``[N]``.

    Raises:
      ConfigError: unknown score. DataError: bad probabilities (as :func:`average_confidence`).
    """
    _check_score(score)
    p = _check_probs(probs)
    return p.max(axis=-1) if score == "max_confidence" else -entropy(p)


def agreement_with_ensemble(member_probs: np.ndarray) -> float:
    """The members' agreement with the ensemble: the fraction of (member, example) pairs
    whose member top class ``argmax_c p_enc`` equals the ensemble's ``argmax_c mean_e
    p_enc``, i.e. ``mean_e mean_n 1[...]``, in [0, 1]; 1 when all members agree.

    As an accuracy estimate it reads the ensemble's vote as the label; it is this
    project's (no paper proposes it raw); :func:`agreement_estimate` corrects it on a
    labelled reference.

    Args:
      member_probs: float ``[E, N, C]``, E >= 2.

    Raises:
      DataError: bad member probabilities, or a single member (E = 1).
    """
    p = _check_several_members(member_probs, "agreement")
    top = np.argmax(p.mean(axis=0), axis=-1)  # [N]
    return float(np.mean(np.argmax(p, axis=-1) == top[None, :]))


def disagreement_estimate(member_probs: np.ndarray) -> float:
    """``1 - metrics.disagreement(member_probs)``: one minus the fraction of examples on
    which two members' top classes differ, averaged over the pairs i < j.

    Jiang et al. 2022 ("Assessing Generalization of SGD via Disagreement", ICLR,
    the Generalization Disagreement Equality): for an ensemble that is class-aggregated
    calibrated, the expected test error of a member drawn from the ensemble equals the
    expected disagreement of two members drawn independently. So this estimates the
    accuracy of the *average member*, which is usually below the ensemble's (the ensemble
    is more accurate than its members); their experiments pair independently trained
    runs, as the pairs i < j here do.

    Args:
      member_probs: float ``[E, N, C]``, E >= 2.

    Raises:
      DataError: bad member probabilities, or a single member (E = 1).
    """
    p = _check_several_members(member_probs, "disagreement")
    return float(1.0 - disagreement(p))


# --- ATC ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class AtcThreshold:
    """ATC's threshold, fitted on a labelled reference set by :func:`fit_atc`.

    The estimate of a set with scores s is ``mean(s > threshold) + tie_weight *
    mean(s == threshold)``: the fraction above the threshold, with examples exactly at it
    counted ``tie_weight`` each (a randomised tie-break in expectation), so that on the
    reference set it equals ``reference_accuracy`` exactly, ties or none.

    Attributes:
      score: one of :data:`ATC_SCORES`.
      threshold: t, a score of a reference example (finite).
      reference_accuracy: the ensemble's accuracy on the reference set, a fraction.
      n_reference: the reference examples.
      tie_weight: in [0, 1]; 0 unless reference scores tie at t (then also 1 when the
        reference accuracy is 1). This field is this project's, not the paper's.
    """

    score: str
    threshold: float
    reference_accuracy: float
    n_reference: int
    tie_weight: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of the fields."""
        return asdict(self)

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> AtcThreshold:
        """The inverse of :meth:`to_dict`.

        Raises:
          ConfigError: missing or unknown keys, an unknown score, a non-finite threshold,
            or an accuracy or tie weight outside [0, 1].
        """
        _check_keys(cls, record, "AtcThreshold")
        _check_score(record["score"])
        out = cls(
            score=record["score"],
            threshold=float(record["threshold"]),
            reference_accuracy=float(record["reference_accuracy"]),
            n_reference=int(record["n_reference"]),
            tie_weight=float(record["tie_weight"]),
        )
        if not (
            math.isfinite(out.threshold)
            and 0 <= out.reference_accuracy <= 1
            and 0 <= out.tie_weight <= 1
            and out.n_reference > 0
        ):
            raise ConfigError(f"AtcThreshold record {record} is out of range", "pass a dict written by fit_atc")
        return out


def fit_atc(ref_probs: np.ndarray, ref_labels: np.ndarray, score: str = "negative_entropy") -> AtcThreshold:
    """Fit ATC's threshold on a labelled reference set (Garg et al. 2022).

    The threshold t is chosen so that the fraction of reference examples with score > t
    equals the reference accuracy ``k / n`` (k correct of n). With the scores sorted
    descending, ``s_(1) >= ... >= s_(n)``, t = ``s_(k+1)`` (the most confident example
    the rule counts wrong), and ``s_(n)`` when k = n; the reference examples at t are
    counted with the tie weight ``w = (k - #{s > t}) / #{s = t}``, so the fitted rule
    reproduces ``k / n`` exactly. Without ties at t, w = 0 and this is the paper's rule
    (and its code's: a threshold among the reference scores, counting ``s > t``). The edge
    cases follow from the same formula:

    - accuracy 0 (k = 0): t = the largest reference score, w = 0: a target example counts
      as right only when more confident than every reference example.
    - accuracy 1 (k = n): t = the smallest reference score, w = 1: a target example counts
      as right when at least as confident as some reference example.

    Args:
      ref_probs: float ``[n, C]`` ensemble probabilities of the reference set (scaled as
        the target's will be).
      ref_labels: int ``[n]`` in [0, C).
      score: one of :data:`ATC_SCORES`; default ``"negative_entropy"`` (ATC-NE, the
        better of the two in the paper's experiments).

    Raises:
      ConfigError: unknown score.
      DataError: bad probabilities (empty, NaN, not ``[n, C]``) or labels.
    """
    _check_score(score)
    p = _check_probs(ref_probs, "ref_probs")
    y = _check_labels(ref_labels, *p.shape)
    s = atc_scores(p, score)
    n = len(s)
    k = int(np.sum(np.argmax(p, axis=-1) == y))
    t = float(np.sort(s)[::-1][min(k, n - 1)])
    above, at = int(np.sum(s > t)), int(np.sum(s == t))
    return AtcThreshold(score, t, k / n, n, (k - above) / at)


def atc_estimate(probs: np.ndarray, threshold: AtcThreshold) -> float:
    """ATC's estimate of the accuracy on a target set: the fraction of its examples whose
    score exceeds the fitted threshold, ``mean(s > t) + w * mean(s == t)``
    (:class:`AtcThreshold`), in [0, 1].

    Args:
      probs: float ``[N, C]`` target ensemble probabilities, scaled as the reference's.
      threshold: from :func:`fit_atc`.

    Raises:
      DataError: bad probabilities.
    """
    s = atc_scores(probs, threshold.score)
    return float(np.mean(s > threshold.threshold) + threshold.tie_weight * np.mean(s == threshold.threshold))


# --- DoC and the reference-corrected agreement --------------------------------------------


def doc_estimate(ref_probs: np.ndarray, ref_labels: np.ndarray, probs: np.ndarray) -> float:
    """Difference of Confidences (Guillory et al. 2021, ICCV):
    ``acc_ref - (conf_ref - conf_target)``, where conf is :func:`average_confidence`;
    clipped to [0, 1] (an accuracy; the paper does not clip). Equals the reference
    accuracy when the target is the reference.

    Args:
      ref_probs: float ``[n, C]`` reference ensemble probabilities; ref_labels: int ``[n]``.
      probs: float ``[N, C]`` target ensemble probabilities, scaled as the reference's.

    Raises:
      DataError: bad probabilities or labels, or class counts that differ.
    """
    p = _check_probs(ref_probs, "ref_probs")
    y = _check_labels(ref_labels, *p.shape)
    q = _check_probs(probs)
    _check_classes(q, p.shape[1])
    acc = float(np.mean(np.argmax(p, axis=-1) == y))
    return _clip(acc - (average_confidence(p) - average_confidence(q)))


def agreement_estimate(ref_member_probs: np.ndarray, ref_labels: np.ndarray, member_probs: np.ndarray) -> float:
    """DoC on agreement: ``acc_ref - (agr_ref - agr_target)``, agr being
    :func:`agreement_with_ensemble` and acc_ref the ensemble's (member mean's) reference
    accuracy; clipped to [0, 1]. This project's estimator, inspired by Baek et al. 2022
    ("Agreement-on-the-line", NeurIPS), who find agreement and accuracy drop together
    under shift (linearly in probit scale; this uses the identity line, no fit).

    Args:
      ref_member_probs: float ``[E, n, C]``; ref_labels: int ``[n]``.
      member_probs: float ``[E, N, C]`` of the same E members on the target set.

    Raises:
      DataError: bad probabilities or labels, E = 1, or member or class counts that differ.
    """
    r = _check_members(ref_member_probs, "ref_member_probs")
    y = _check_labels(ref_labels, r.shape[1], r.shape[2])
    m = _check_members(member_probs)
    _check_classes(m, r.shape[2])
    if len(m) != len(r):
        raise DataError(f"the target has E = {len(m)} members, the reference {len(r)}", "pass the same members")
    acc = float(np.mean(np.argmax(r.mean(axis=0), axis=-1) == y))
    return _clip(acc - (agreement_with_ensemble(r) - agreement_with_ensemble(m)))


# --- fit once, estimate many ---------------------------------------------------------------


@dataclass(frozen=True)
class Reference:
    """What the fitted estimators need, fitted once on a labelled reference set (the run's
    calibration split) by :func:`fit_reference`.

    Attributes:
      n_members: E, the members it was fitted with (a target must have as many).
      n_classes: C.
      n_reference: n, the reference examples.
      temperature: the T the ensemble's probabilities were scaled with, or None.
      accuracy: the ensemble's accuracy on the reference set, a fraction.
      mean_confidence: its :func:`average_confidence` there.
      agreement: its :func:`agreement_with_ensemble` there; None when E = 1.
      atc: one :class:`AtcThreshold` per score of :data:`ATC_SCORES`, in that order.
    """

    n_members: int
    n_classes: int
    n_reference: int
    temperature: float | None
    accuracy: float
    mean_confidence: float
    agreement: float | None
    atc: tuple[AtcThreshold, ...]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of the fields (``atc`` a list of :meth:`AtcThreshold.to_dict`)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["atc"] = [a.to_dict() for a in self.atc]
        return out

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> Reference:
        """The inverse of :meth:`to_dict`.

        Raises:
          ConfigError: missing or unknown keys, ATC thresholds not one per score of
            :data:`ATC_SCORES` in order, or values out of range.
        """
        _check_keys(cls, record, "Reference")
        if not isinstance(record["atc"], list | tuple):
            raise ConfigError("Reference record's atc is not a list", "pass a dict written by Reference.to_dict")
        atc = tuple(AtcThreshold.from_dict(a) for a in record["atc"])
        if tuple(a.score for a in atc) != ATC_SCORES:
            raise ConfigError(
                f"Reference record has ATC thresholds for {[a.score for a in atc]}",
                f"pass one per score of {list(ATC_SCORES)} (a dict written by Reference.to_dict)",
            )
        out = cls(
            n_members=int(record["n_members"]),
            n_classes=int(record["n_classes"]),
            n_reference=int(record["n_reference"]),
            temperature=None if record["temperature"] is None else float(record["temperature"]),
            accuracy=float(record["accuracy"]),
            mean_confidence=float(record["mean_confidence"]),
            agreement=None if record["agreement"] is None else float(record["agreement"]),
            atc=atc,
        )
        if not (
            out.n_members > 0
            and out.n_classes >= 2
            and out.n_reference > 0
            and 0 <= out.accuracy <= 1
            and 0 <= out.mean_confidence <= 1
            and (out.agreement is None) == (out.n_members == 1)
            and (out.agreement is None or 0 <= out.agreement <= 1)
        ):
            raise ConfigError(f"Reference record {record} is out of range", "pass a dict written by fit_reference")
        _check_temperature(out.temperature)
        return out


def fit_reference(ref_member_probs: np.ndarray, ref_labels: np.ndarray, temperature: float | None = None) -> Reference:
    """Fit every fitted estimator on a labelled reference set (the calibration split).

    Args:
      ref_member_probs: float ``[E, n, C]``, the healthy members' probabilities.
      ref_labels: int ``[n]`` in [0, C).
      temperature: T > 0 applied to the member mean (:func:`ensemble_prediction`), or None.

    Returns:
      the :class:`Reference`: accuracy and mean confidence of the (scaled) ensemble, the
      agreement with the ensemble (E >= 2), one ATC threshold per score.

    Raises:
      DataError: bad probabilities (empty, NaN, not ``[E, n, C]``) or labels.
      ConfigError: T not finite or not positive.
    """
    t = _check_temperature(temperature)
    m = _check_members(ref_member_probs, "ref_member_probs")
    probs = ensemble_prediction(m, t)
    y = _check_labels(ref_labels, *probs.shape)
    atc = tuple(fit_atc(probs, y, score) for score in ATC_SCORES)
    return Reference(
        n_members=len(m),
        n_classes=probs.shape[1],
        n_reference=probs.shape[0],
        temperature=t,
        accuracy=atc[0].reference_accuracy,
        mean_confidence=average_confidence(probs),
        agreement=agreement_with_ensemble(m) if len(m) >= 2 else None,
        atc=atc,
    )


def estimate_all(
    reference: Reference | None, member_probs: np.ndarray, temperature: float | None = None
) -> dict[str, float]:
    """Every estimate of :data:`ESTIMATORS` of the ensemble's accuracy on one unlabelled set.

    Args:
      reference: from :func:`fit_reference` on the calibration split; None (a run without
        one): only the estimators that need no reference (:data:`REFERENCE_FREE`).
      member_probs: float ``[E, N, C]``, the same E healthy members on the target set.
      temperature: T > 0 or None; must be the one the reference was fitted with.

    Returns:
      ``{name: estimate}``, fractions in [0, 1], in :data:`ESTIMATORS` order; without the
      :data:`AGREEMENT_ESTIMATORS` when E = 1, without the fitted ones when ``reference``
      is None.

    Raises:
      DataError: bad probabilities, or E or C not the reference's.
      ConfigError: T not finite, not positive, or not the reference's.
    """
    t = _check_temperature(temperature)
    m = _check_members(member_probs)
    if reference is None:
        probs = ensemble_prediction(m, t)
        free = {"average_confidence": average_confidence(probs)}
        if len(m) >= 2:
            free["agreement_with_ensemble"] = agreement_with_ensemble(m)
            free["disagreement"] = disagreement_estimate(m)
        return free
    if t != reference.temperature:
        raise ConfigError(
            f"temperature {t} differs from the reference's {reference.temperature}",
            f"pass temperature={reference.temperature}, the one the reference was fitted with",
        )
    _check_classes(m, reference.n_classes)
    if len(m) != reference.n_members:
        raise DataError(
            f"the target has E = {len(m)} members, the reference {reference.n_members}",
            "pass the same healthy members the reference was fitted with",
        )
    probs = ensemble_prediction(m, t)
    confidence = average_confidence(probs)
    out = {"average_confidence": confidence}
    for a in reference.atc:
        out[f"atc_{a.score}"] = atc_estimate(probs, a)
    out["doc"] = _clip(reference.accuracy - (reference.mean_confidence - confidence))
    if reference.agreement is not None:
        agreement = agreement_with_ensemble(m)
        out["agreement_with_ensemble"] = agreement
        out["disagreement"] = disagreement_estimate(m)
        out["agreement_corrected"] = _clip(reference.accuracy - (reference.agreement - agreement))
    return {name: out[name] for name in ESTIMATORS if name in out}


def estimation_errors(estimates: list[dict[str, float]], true_accuracies: list[float]) -> dict[str, dict[str, Any]]:
    """How far each estimator's estimates are from the true accuracies of labelled sets
    (e.g. the shifted test sets), in accuracy units (fractions: 0.01 = one point).

    Args:
      estimates: one :func:`estimate_all` dict per set.
      true_accuracies: the ensemble's true accuracy on each set, fractions in [0, 1].

    Returns:
      ``{name: {"mae": mean |estimate - truth|, "max_abs_error": max |estimate - truth|,
      "worst_index": the set (index into the lists) of the max, the first on a tie}}``
      for each estimator present in every dict, in the first dict's order.

    Raises:
      DataError: no sets, lists of different lengths, a true accuracy outside [0, 1] or
        NaN, a non-finite estimate, or no estimator common to every dict.
    """
    if len(estimates) == 0:
        raise DataError("no estimates to score", "pass one estimate_all dict per labelled set")
    if len(estimates) != len(true_accuracies):
        raise DataError(
            f"{len(estimates)} estimates for {len(true_accuracies)} true accuracies",
            "pass one true accuracy per estimate dict",
        )
    truth = np.asarray(true_accuracies, np.float64)
    if truth.ndim != 1 or not (np.isfinite(truth).all() and (truth >= 0).all() and (truth <= 1).all()):
        raise DataError("a true accuracy is not a fraction in [0, 1]", "pass accuracies as fractions, not percent")
    names = [name for name in estimates[0] if all(name in e for e in estimates)]
    if not names:
        raise DataError("no estimator is in every estimate dict", "pass estimate_all dicts of one reference")
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        values = np.asarray([e[name] for e in estimates], np.float64)
        if not np.isfinite(values).all():
            raise DataError(f"estimator {name!r} has a non-finite estimate", "pass estimate_all's output")
        errors = np.abs(values - truth)
        worst = int(np.argmax(errors))
        out[name] = {"mae": float(errors.mean()), "max_abs_error": float(errors[worst]), "worst_index": worst}
    return out
