"""Split conformal prediction sets for classification.

A *conformity score* (here a nonconformity score: higher = the label fits the prediction
worse) ``s(x, y)`` is computed on a held-out calibration split of ``n`` examples; its
finite-sample quantile ``qhat`` (the ``ceil((n + 1)(1 - alpha))``-th smallest calibration
score) makes the set ``C(x) = {y : s(x, y) <= qhat}`` cover the true label with
probability at least ``1 - alpha`` on exchangeable data, and (for continuous scores, no
ties) at most ``1 - alpha + 1 / (n + 1)`` (Vovk et al. 2005; Lei et al. 2018, Thm. 2.2;
Angelopoulos & Bates 2023, "Conformal Prediction: A Gentle Introduction", Sec. 1-2).

Scores (:data:`METHODS`), from probabilities ``p`` float ``[N, C]`` (the ensemble's mean
softmax, optionally temperature scaled), classes sorted by decreasing probability (a
stable sort: among equal probabilities the lower class index comes first, as the
reference codes' ``argsort``), ``rank_y`` the 1-based position of class ``y`` in that
order and ``U ~ Uniform[0, 1)`` one draw per example:

- ``"lac"`` (a.k.a. THR): ``s = 1 - p_y`` (Sadinle, Lei & Wasserman 2019, "Least
  Ambiguous Set-Valued Classifiers with Bounded Error Levels", JASA). Never randomised.
- ``"aps"``: the mass of the classes ranked before ``y`` plus ``U * p_y``, i.e.
  ``sum_{rank_j < rank_y} p_j + U * p_y``; non-randomised ``U = 1`` (the cumulative mass up
  to and including ``y``) (Romano, Sesia & Candes 2020, "Classification with Valid and
  Adaptive Coverage", NeurIPS, Eq. 7 randomised).
- ``"raps"``: the APS score plus ``lam * max(0, rank_y - k_reg)`` (Angelopoulos, Bates,
  Malik & Jordan 2021, "Uncertainty Sets for Image Classifiers using Conformal
  Prediction", ICLR, Algorithm 2 and their reference code
  github.com/aangelopoulos/conformal_classification, whose penalty vector is
  ``lam`` from 0-based position ``k_reg`` on).

Prediction sets follow that reference code (``gcq``): every class whose score, with the
example's one ``U`` shared by all its classes, is ``<= qhat``. For randomised APS/RAPS
this is exactly their set (the classes up to the one that crosses ``qhat``, the last kept
with probability ``V``), and it may be EMPTY; for LAC a set is empty when every
``1 - p_c > qhat``. Empty sets are kept by default (``allow_zero_sets=True``, what their
calibration and experiments use, and what makes the coverage exact: at most
``1 - alpha + 1/(n+1)``); ``allow_zero_sets=False`` (their ``ConformalModel`` default)
puts the top class into an empty set, which only raises coverage.

Randomness is deterministic given ``seed``: calibration draws its ``U`` from
``numpy.random.default_rng([seed, 0])`` and prediction from
``numpy.random.default_rng([seed, 1])`` (row i gets the i-th draw), so the same seed never
reuses a calibration draw for a test example (which would break exchangeability).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from ensemble_core.errors import ConfigError, DataError

#: The conformity scores :func:`calibrate` knows.
METHODS = ("lac", "aps", "raps")

#: RAPS's defaults when ``k_reg`` / ``lam`` are not given: the values of the reference
#: code's experiments (``experiments/figure2.py`` and ``figure4.py``: ``kreg = 5``;
#: ``lam = 0.01`` is on their lambda grids ``[0.001, 0.01, 0.1, 0.2, 0.5]`` and
#: ``[0.01, 0.1, 1]``). The paper's tuning of both on a split of the calibration data is
#: not done here: pass tuned values explicitly.
RAPS_DEFAULT_K_REG = 5
RAPS_DEFAULT_LAM = 0.01

#: Stream tags of ``numpy.random.default_rng([seed, tag])``.
_CALIBRATION_STREAM = 0
_PREDICTION_STREAM = 1


@dataclass(frozen=True)
class ConformalCalibration:
    """A calibrated split-conformal predictor: what :func:`prediction_sets` needs.

    Attributes:
      method: one of :data:`METHODS`.
      alpha: the miscoverage level in (0, 1); the sets cover with probability >= 1 - alpha.
      threshold: ``qhat``, the ``ceil((n + 1)(1 - alpha))``-th smallest calibration score
        (unitless, the score's scale); ``+inf`` when that rank exceeds ``n`` (every class in
        every set).
      n_calibration: n, the calibration examples.
      randomized: whether APS/RAPS scores use ``U``; always False for LAC.
      k_reg, lam: RAPS's rank from which the penalty starts and the penalty per rank
        (None for LAC and APS).
    """

    method: str
    alpha: float
    threshold: float
    n_calibration: int
    randomized: bool
    k_reg: int | None = None
    lam: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of the fields; an infinite ``threshold`` is written as None
        (JSON has no infinity)."""
        out = asdict(self)
        if math.isinf(self.threshold):
            out["threshold"] = None
        return out

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> ConformalCalibration:
        """The inverse of :meth:`to_dict` (``threshold`` None means ``+inf``).

        Raises:
          ConfigError: missing or unknown keys, or a value out of range.
        """
        names = {f.name for f in fields(cls)}
        missing, unknown = names - set(record), set(record) - names
        if missing or unknown:
            raise ConfigError(
                f"conformal calibration record has missing keys {sorted(missing)} and unknown keys {sorted(unknown)}",
                "pass a dict written by ConformalCalibration.to_dict",
            )
        threshold = math.inf if record["threshold"] is None else float(record["threshold"])
        method = _check_method(record["method"])
        k_reg, lam = record["k_reg"], record["lam"]
        if method == "raps":
            k_reg, lam = _check_raps(k_reg, lam)
        return cls(
            method=method,
            alpha=_check_alpha(record["alpha"]),
            threshold=threshold,
            n_calibration=int(record["n_calibration"]),
            randomized=bool(record["randomized"]),
            k_reg=k_reg,
            lam=lam,
        )


def _check_method(method: str) -> str:
    if method not in METHODS:
        raise ConfigError(f"conformal method {method!r} is unknown", f"use one of {', '.join(METHODS)}")
    return method


def _check_alpha(alpha: float) -> float:
    if not (isinstance(alpha, int | float | np.floating) and 0 < alpha < 1):
        raise ConfigError(f"alpha {alpha!r} is outside (0, 1)", "pass a miscoverage level such as 0.1")
    return float(alpha)


def _check_raps(k_reg: Any, lam: Any) -> tuple[int, float]:
    k = RAPS_DEFAULT_K_REG if k_reg is None else k_reg
    la = RAPS_DEFAULT_LAM if lam is None else lam
    if not (isinstance(k, int | np.integer) and not isinstance(k, bool) and k >= 0):
        raise ConfigError(f"RAPS k_reg {k_reg!r} is not an integer >= 0", "pass a rank such as 5")
    if not (isinstance(la, int | float | np.floating) and math.isfinite(la) and la >= 0):
        raise ConfigError(f"RAPS lam {lam!r} is not a finite number >= 0", "pass a penalty such as 0.01")
    return int(k), float(la)


def _check_probs(probs: np.ndarray, allow_empty: bool) -> np.ndarray:
    p = np.asarray(probs, np.float64)
    if p.ndim != 2 or p.shape[1] == 0:
        raise DataError(f"probs must be a [N, C] table with C >= 1; got shape {p.shape}", "pass [N, C] probabilities")
    if not allow_empty and p.shape[0] == 0:
        raise DataError("the calibration split is empty (N = 0)", "calibrate on at least one labelled example")
    if not np.isfinite(p).all() or (p < 0).any():
        raise DataError("probs hold negative or non-finite values", "pass softmax probabilities")
    return p


def _check_labels(labels: np.ndarray, n: int, c: int) -> np.ndarray:
    y = np.asarray(labels)
    if y.shape != (n,) or (n and not np.issubdtype(y.dtype, np.integer)):
        raise DataError(f"labels must be integer [N] = [{n}]; got {y.dtype} {y.shape}", "one class index per example")
    if n and (y.min() < 0 or y.max() >= c):
        raise DataError(f"labels outside [0, {c})", "pass class indices of the probability table's columns")
    return y.astype(np.intp)


def class_scores(
    probs: np.ndarray,
    method: str,
    *,
    uniforms: np.ndarray | None = None,
    k_reg: int | None = None,
    lam: float | None = None,
) -> np.ndarray:
    """The nonconformity score of every class of every example (the module docstring's
    definitions).

    Args:
      probs: float ``[N, C]`` probabilities.
      method: one of :data:`METHODS`.
      uniforms: float ``[N]`` in [0, 1], the ``U`` of each example (shared by its classes);
        None for the non-randomised score (``U = 1``). Ignored by LAC.
      k_reg, lam: RAPS's penalty (defaults :data:`RAPS_DEFAULT_K_REG`,
        :data:`RAPS_DEFAULT_LAM`); refused for LAC and APS.

    Returns:
      float64 ``[N, C]`` scores (unitless: probability mass plus penalty).

    Raises:
      ConfigError: unknown method, RAPS parameters out of range or given to another method.
      DataError: probs not a finite non-negative ``[N, C]`` table, uniforms not ``[N]``.
    """
    method = _check_method(method)
    p = _check_probs(probs, allow_empty=True)
    if method != "raps" and (k_reg is not None or lam is not None):
        raise ConfigError(f"k_reg and lam are RAPS parameters, given to {method!r}", "drop them or use method 'raps'")
    if method == "lac":
        return 1.0 - p
    n, c = p.shape
    order = np.argsort(-p, axis=1, kind="stable")
    sorted_p = np.take_along_axis(p, order, axis=1)
    cumsum = np.cumsum(sorted_p, axis=1)
    if uniforms is None:
        sorted_scores = cumsum
    else:
        u = np.asarray(uniforms, np.float64)
        if u.shape != (n,) or not ((u >= 0) & (u <= 1)).all():
            raise DataError(f"uniforms must be [N] = [{n}] in [0, 1]; got shape {u.shape}", "one U per example")
        sorted_scores = cumsum - sorted_p + u[:, None] * sorted_p
    if method == "raps":
        k, la = _check_raps(k_reg, lam)
        sorted_scores = sorted_scores + la * np.maximum(0, np.arange(1, c + 1) - k)
    scores = np.empty_like(sorted_scores)
    np.put_along_axis(scores, order, sorted_scores, axis=1)
    return scores


def conformity_scores(
    probs: np.ndarray,
    labels: np.ndarray,
    method: str,
    *,
    uniforms: np.ndarray | None = None,
    k_reg: int | None = None,
    lam: float | None = None,
) -> np.ndarray:
    """The score of each example's label: :func:`class_scores` at ``labels``, float64 ``[N]``.

    Raises:
      as :func:`class_scores`; DataError on labels not integer ``[N]`` in ``[0, C)``.
    """
    scores = class_scores(probs, method, uniforms=uniforms, k_reg=k_reg, lam=lam)
    y = _check_labels(labels, *scores.shape)
    return scores[np.arange(len(y)), y]


def conformal_quantile(scores: np.ndarray, alpha: float) -> float:
    """``qhat``: the ``ceil((n + 1)(1 - alpha))``-th smallest of ``n`` calibration scores
    (float ``[n]``), ``+inf`` when that rank exceeds n (Angelopoulos & Bates 2023, Thm. 1;
    equal to ``np.quantile(scores, k / n, method="inverted_cdf")`` and to MAPIE's
    ``method="lower"``, not to ``method="higher"``, which takes the (k+1)-th for k < n).

    Raises:
      ConfigError: alpha outside (0, 1).
      DataError: no scores, or a NaN score.
    """
    alpha = _check_alpha(alpha)
    s = np.asarray(scores, np.float64).ravel()
    if s.size == 0:
        raise DataError("the calibration split is empty (n = 0)", "calibrate on at least one labelled example")
    if np.isnan(s).any():
        raise DataError("a calibration score is NaN", "pass finite probabilities")
    n = s.size
    # 1e-9: (n + 1)(1 - alpha) an integer up to rounding (n = 9, alpha = 0.1) is not rounded up.
    k = math.ceil((n + 1) * (1 - alpha) - 1e-9)
    if k > n:
        return math.inf
    return float(np.partition(s, k - 1)[k - 1])


def calibrate(
    probs: np.ndarray,
    labels: np.ndarray,
    method: str,
    alpha: float,
    *,
    randomized: bool = True,
    k_reg: int | None = None,
    lam: float | None = None,
    seed: int = 0,
) -> ConformalCalibration:
    """Calibrate a split-conformal predictor on a held-out calibration split.

    Args:
      probs: float ``[n, C]`` probabilities of the calibration examples (never the
        examples the model was trained or temperature-scaled on).
      labels: int ``[n]`` their labels.
      method: one of :data:`METHODS`.
      alpha: miscoverage level in (0, 1).
      randomized: APS/RAPS with ``U`` (the papers' versions); LAC ignores it (stored False).
      k_reg, lam: RAPS only; defaults :data:`RAPS_DEFAULT_K_REG`, :data:`RAPS_DEFAULT_LAM`.
      seed: the ``U`` of the calibration examples come from
        ``numpy.random.default_rng([seed, 0])``.

    Returns:
      the :class:`ConformalCalibration`.

    Raises:
      ConfigError: unknown method, alpha outside (0, 1), RAPS parameters out of range.
      DataError: an empty calibration split, or malformed probs / labels.
    """
    method = _check_method(method)
    alpha = _check_alpha(alpha)
    p = _check_probs(probs, allow_empty=False)
    randomized = bool(randomized) and method != "lac"
    if method == "raps":
        k_reg, lam = _check_raps(k_reg, lam)
    uniforms = np.random.default_rng([seed, _CALIBRATION_STREAM]).random(len(p)) if randomized else None
    scores = conformity_scores(p, labels, method, uniforms=uniforms, k_reg=k_reg, lam=lam)
    return ConformalCalibration(
        method=method,
        alpha=alpha,
        threshold=conformal_quantile(scores, alpha),
        n_calibration=len(p),
        randomized=randomized,
        k_reg=k_reg,
        lam=lam,
    )


def prediction_sets(
    probs: np.ndarray, calibration: ConformalCalibration, *, seed: int = 0, allow_zero_sets: bool = True
) -> np.ndarray:
    """The prediction sets ``{c : s(x, c) <= qhat}`` of new examples.

    Args:
      probs: float ``[N, C]`` probabilities (C as at calibration).
      calibration: from :func:`calibrate`.
      seed: randomised APS/RAPS draw row i's ``U`` as the i-th draw of
        ``numpy.random.default_rng([seed, 1])``: the same table and seed give the same sets.
      allow_zero_sets: keep empty sets (default; exact coverage). False puts the top class
        (highest probability, lowest index on a tie) into every empty set, as the
        reference code's ``allow_zero_sets=False``; coverage can then exceed
        ``1 - alpha + 1/(n+1)``.

    Returns:
      bool ``[N, C]``: True where class c is in example n's set.

    Raises:
      DataError: malformed probs.
    """
    p = _check_probs(probs, allow_empty=True)
    uniforms = np.random.default_rng([seed, _PREDICTION_STREAM]).random(len(p)) if calibration.randomized else None
    k_reg, lam = (calibration.k_reg, calibration.lam) if calibration.method == "raps" else (None, None)
    sets = class_scores(p, calibration.method, uniforms=uniforms, k_reg=k_reg, lam=lam) <= calibration.threshold
    if not allow_zero_sets:
        empty = ~sets.any(axis=1)
        sets[np.flatnonzero(empty), np.argmax(p[empty], axis=1)] = True
    return sets


def _check_sets(sets: np.ndarray) -> np.ndarray:
    s = np.asarray(sets)
    if s.ndim != 2 or s.dtype != bool:
        raise DataError(f"sets must be bool [N, C]; got {s.dtype} {s.shape}", "pass prediction_sets' output")
    return s


def set_sizes(sets: np.ndarray) -> np.ndarray:
    """The size of each prediction set: int64 ``[N]`` from bool ``[N, C]`` sets.

    Raises:
      DataError: sets not bool ``[N, C]``.
    """
    return _check_sets(sets).sum(axis=1).astype(np.int64)


def coverage(sets: np.ndarray, labels: np.ndarray) -> float:
    """Empirical coverage: the fraction of examples whose label is in their set (bool
    ``[N, C]`` sets, int ``[N]`` labels), in [0, 1].

    Raises:
      DataError: malformed sets or labels, or N = 0.
    """
    s = _check_sets(sets)
    if s.shape[0] == 0:
        raise DataError("coverage of no examples (N = 0)", "pass at least one example")
    y = _check_labels(labels, *s.shape)
    return float(s[np.arange(len(y)), y].mean())


def mean_set_size(sets: np.ndarray) -> float:
    """The mean prediction-set size (classes per example) of bool ``[N, C]`` sets.

    Raises:
      DataError: malformed sets, or N = 0.
    """
    sizes = set_sizes(sets)
    if sizes.size == 0:
        raise DataError("mean set size of no examples (N = 0)", "pass at least one example")
    return float(sizes.mean())
