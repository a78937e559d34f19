"""Selective prediction: abstain below a confidence threshold chosen for a target risk.

A *selective classifier* predicts only where its confidence ``kappa(x) >= threshold`` and
abstains elsewhere; its *coverage* is the accepted fraction and its *selective risk* the
error rate (0/1 loss) among the accepted (Geifman & El-Yaniv 2017, "Selective
Classification for Deep Neural Networks", NeurIPS; the risk-coverage curve of
``metrics.risk_coverage``).

:func:`select_threshold` is their Algorithm 1, SGR (selection with guaranteed risk): from
a labelled calibration split it picks the threshold whose risk is, with probability at
least ``1 - delta`` over the calibration draw, at most the target risk ``r*``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np
from scipy import special

from ensemble_core.errors import ConfigError, DataError
from ensemble_core.metrics import entropy, mutual_information

#: The confidence criteria :func:`confidence` knows; higher = more confident.
CRITERIA = ("max_probability", "entropy", "mutual_information")


def confidence(criterion: str, probs: np.ndarray, member_probs: np.ndarray | None = None) -> np.ndarray:
    """The confidence ``kappa`` of each example (higher = more confident).

    - ``"max_probability"``: ``max_c p_c`` of the ensemble's probabilities (softmax
      response, Geifman & El-Yaniv 2017; Hendrycks & Gimpel 2017), in [1/C, 1].
    - ``"entropy"``: minus the predictive entropy ``-H(p)`` (nats, ``metrics.entropy``),
      in [-log C, 0].
    - ``"mutual_information"``: minus the members' mutual information (nats,
      ``metrics.mutual_information``, the BALD epistemic term) from ``member_probs``;
      ``probs`` only sets N.

    Args:
      criterion: one of :data:`CRITERIA`.
      probs: float ``[N, C]`` ensemble probabilities (the member mean, possibly
        temperature scaled).
      member_probs: float ``[E, N, C]``, needed by ``"mutual_information"``.

    Returns:
      float64 ``[N]``.

    Raises:
      ConfigError: unknown criterion, or mutual information without ``member_probs``.
      DataError: probs not ``[N, C]``, member_probs not ``[E, N, C]`` with the same N, C.
    """
    if criterion not in CRITERIA:
        raise ConfigError(f"selective criterion {criterion!r} is unknown", f"use one of {', '.join(CRITERIA)}")
    p = np.asarray(probs, np.float64)
    if p.ndim != 2:
        raise DataError(f"probs must be [N, C]; got shape {p.shape}", "pass the ensemble's probabilities")
    if criterion == "max_probability":
        return p.max(axis=1) if p.shape[0] else np.zeros(0)
    if criterion == "entropy":
        return -entropy(p)
    if member_probs is None:
        raise ConfigError(
            "criterion mutual_information needs member_probs [E, N, C]", "pass the members' probabilities"
        )
    m = np.asarray(member_probs, np.float64)
    if m.ndim != 3 or m.shape[1:] != p.shape or m.shape[0] == 0:
        raise DataError(f"member_probs must be [E, {p.shape[0]}, {p.shape[1]}]; got {m.shape}", "pass [E, N, C]")
    return -mutual_information(m)


def risk_upper_bound(errors: int, accepted: int, delta: float) -> float:
    """Geifman & El-Yaniv 2017's ``B*(r_hat, delta, g)``: the ``b`` solving
    ``sum_{j=0}^{errors} C(accepted, j) b^j (1 - b)^(accepted - j) = delta``, i.e. the exact
    one-sided (1 - delta) Clopper-Pearson upper confidence bound on the risk (Clopper &
    Pearson 1934), ``scipy.stats.beta.ppf(1 - delta, errors + 1, accepted - errors)``;
    1 when every accepted example is an error (or none is accepted).

    Raises:
      ConfigError: delta outside (0, 1), or counts with ``0 <= errors <= accepted`` false.
    """
    if not 0 < delta < 1:
        raise ConfigError(f"delta {delta!r} is outside (0, 1)", "pass a confidence parameter such as 0.001")
    if not 0 <= errors <= accepted:
        raise ConfigError(f"errors {errors} not in [0, accepted = {accepted}]", "pass counts of the accepted examples")
    if errors == accepted:
        return 1.0
    # beta.ppf(q, a, b) is the inverse regularised incomplete beta function, which scipy.stats
    # calls; scipy.special alone is imported because scipy.stats takes 0.6 s to import.
    return float(special.betaincinv(errors + 1, accepted - errors, 1 - delta))


@dataclass(frozen=True)
class SelectiveThreshold:
    """The outcome of :func:`select_threshold`.

    Attributes:
      criterion: the confidence criterion (one of :data:`CRITERIA`).
      threshold: accept iff ``confidence >= threshold``; ``+inf`` when infeasible
        (abstain on everything).
      target_risk: ``r*``, the selective risk (error rate of the accepted) aimed at.
      delta: the bound holds with probability >= 1 - delta over the calibration draw.
      coverage: fraction of the calibration examples accepted (0 when infeasible).
      risk: the error rate of the accepted calibration examples (0 when none is).
      risk_bound: ``B*`` of the chosen threshold (< target_risk when feasible); when
        infeasible, the smallest bound any tested threshold reached (>= target_risk).
      feasible: False when no tested threshold, down to the most confident calibration
        example, has a bound below the target.
      n_calibration: m, the calibration examples.
    """

    criterion: str
    threshold: float
    target_risk: float
    delta: float
    coverage: float
    risk: float
    risk_bound: float
    feasible: bool
    n_calibration: int

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of the fields; an infinite ``threshold`` is written as None."""
        out = asdict(self)
        if math.isinf(self.threshold):
            out["threshold"] = None
        return out

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> SelectiveThreshold:
        """The inverse of :meth:`to_dict` (``threshold`` None means ``+inf``).

        Raises:
          ConfigError: missing or unknown keys, or an unknown criterion.
        """
        names = {f.name for f in fields(cls)}
        missing, unknown = names - set(record), set(record) - names
        if missing or unknown:
            raise ConfigError(
                f"selective threshold record has missing keys {sorted(missing)} and unknown keys {sorted(unknown)}",
                "pass a dict written by SelectiveThreshold.to_dict",
            )
        if record["criterion"] not in CRITERIA:
            raise ConfigError(f"selective criterion {record['criterion']!r} is unknown", f"use one of {CRITERIA}")
        return cls(
            criterion=record["criterion"],
            threshold=math.inf if record["threshold"] is None else float(record["threshold"]),
            target_risk=float(record["target_risk"]),
            delta=float(record["delta"]),
            coverage=float(record["coverage"]),
            risk=float(record["risk"]),
            risk_bound=float(record["risk_bound"]),
            feasible=bool(record["feasible"]),
            n_calibration=int(record["n_calibration"]),
        )


def _check_calibration(confidence: np.ndarray, correct: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    kappa = np.asarray(confidence, np.float64)
    ok = np.asarray(correct)
    if kappa.ndim != 1 or ok.shape != kappa.shape:
        raise DataError(f"confidence and correct must both be [m]; got {kappa.shape} and {ok.shape}", "pass [m] each")
    if kappa.size == 0:
        raise DataError("the calibration split is empty (m = 0)", "calibrate on at least one labelled example")
    if np.isnan(kappa).any():
        raise DataError("a confidence is NaN", "pass finite probabilities")
    if ok.dtype != bool:
        if not np.isin(ok, (0, 1)).all():
            raise DataError("correct must be boolean (or 0/1)", "pass argmax(probs) == labels")
        ok = ok.astype(bool)
    return kappa, ok


def select_threshold(
    confidence: np.ndarray,
    correct: np.ndarray,
    target_risk: float,
    delta: float = 0.001,
    *,
    criterion: str,
) -> SelectiveThreshold:
    """Geifman & El-Yaniv 2017's SGR (Algorithm 1): a threshold with guaranteed risk.

    The calibration examples are sorted by confidence, ascending; a binary search with
    ``z_min = 1, z_max = m`` runs ``k = ceil(log2 m)`` iterations (1 when m = 1): it tests
    ``theta = kappa_(z)`` at ``z = ceil((z_min + z_max) / 2)`` (accept iff
    ``kappa >= theta``, ties accepted together), computes the bound
    ``b* = B*(r_hat, delta / k)`` (:func:`risk_upper_bound`) of the accepted, and sets
    ``z_max = z`` if ``b* < target_risk`` (accept more) else ``z_min = z``. With the union
    bound over the k tests, every tested bound holds at once with probability >= 1 - delta,
    so choosing among them keeps the guarantee: this returns the tested threshold of
    largest coverage whose bound is below the target (the paper outputs the last tested,
    which can be one that failed); none passing -> infeasible, threshold ``+inf``.

    Args:
      confidence: float ``[m]`` confidences of the calibration examples (:func:`confidence`).
      correct: bool ``[m]``, whether the prediction was right (0/1 loss).
      target_risk: r* in (0, 1), the selective error rate allowed.
      delta: in (0, 1); default 0.001, the paper's experiments' value.
      criterion: the criterion ``confidence`` came from, recorded.

    Returns:
      the :class:`SelectiveThreshold`.

    Raises:
      ConfigError: target_risk or delta outside (0, 1), unknown criterion.
      DataError: empty or malformed calibration arrays.
    """
    if criterion not in CRITERIA:
        raise ConfigError(f"selective criterion {criterion!r} is unknown", f"use one of {', '.join(CRITERIA)}")
    if not (isinstance(target_risk, int | float | np.floating) and 0 < target_risk < 1):
        raise ConfigError(f"target_risk {target_risk!r} is outside (0, 1)", "pass an error rate such as 0.02")
    if not (isinstance(delta, int | float | np.floating) and 0 < delta < 1):
        raise ConfigError(f"delta {delta!r} is outside (0, 1)", "pass a confidence parameter such as 0.001")
    kappa, ok = _check_calibration(confidence, correct)
    m = kappa.size
    order = np.argsort(kappa, kind="stable")
    sorted_kappa = kappa[order]
    errors_sorted = (~ok[order]).astype(np.int64)
    iterations = max(1, math.ceil(math.log2(m)))
    z_min, z_max = 1, m
    best: tuple[float, int, int, float] | None = None  # threshold, accepted, errors, bound
    smallest_bound = math.inf
    for _ in range(iterations):
        z = math.ceil((z_min + z_max) / 2)
        theta = float(sorted_kappa[z - 1])
        first = int(np.searchsorted(sorted_kappa, theta, side="left"))  # ties with theta accepted
        accepted = m - first
        errors = int(errors_sorted[first:].sum())
        bound = risk_upper_bound(errors, accepted, delta / iterations)
        smallest_bound = min(smallest_bound, bound)
        if bound < target_risk:
            z_max = z
            if best is None or accepted > best[1]:
                best = (theta, accepted, errors, bound)
        else:
            z_min = z
    if best is None:
        return SelectiveThreshold(
            criterion, math.inf, float(target_risk), float(delta), 0.0, 0.0, smallest_bound, False, m
        )
    theta, accepted, errors, bound = best
    return SelectiveThreshold(
        criterion, theta, float(target_risk), float(delta), accepted / m, errors / accepted, bound, True, m
    )


def accept(confidence: np.ndarray, threshold: float) -> np.ndarray:
    """Which examples a selective classifier predicts on: bool ``[N]``,
    ``confidence >= threshold`` (none for ``threshold = +inf``)."""
    return np.asarray(confidence, np.float64) >= threshold


def selective_risk_coverage(accepted: np.ndarray, correct: np.ndarray) -> tuple[float, float]:
    """``(risk, coverage)`` of a selection: the error rate among the accepted and the
    accepted fraction (Geifman & El-Yaniv 2017). The risk of an empty acceptance is
    defined as 0 (nothing predicted, nothing wrong).

    Args:
      accepted, correct: bool ``[N]`` each.

    Raises:
      DataError: shapes differ, non-boolean values, or N = 0.
    """
    a, ok = np.asarray(accepted), np.asarray(correct)
    if a.dtype != bool or ok.dtype != bool or a.ndim != 1 or ok.shape != a.shape:
        raise DataError(
            f"accepted and correct must both be bool [N]; got {a.dtype} {a.shape}, {ok.dtype} {ok.shape}",
            "pass accept()'s output and argmax(probs) == labels",
        )
    if a.size == 0:
        raise DataError("no examples (N = 0)", "pass at least one example")
    n_accepted = int(a.sum())
    risk = float((a & ~ok).sum() / n_accepted) if n_accepted else 0.0
    return risk, n_accepted / a.size
