"""Temperature scaling of an ensemble (Guo, Pleiss, Sun & Weinberger 2017, "On calibration
of modern neural networks", ICML), applied to the log of the ensemble's mean
probabilities, i.e. pool then calibrate (Rahaman & Thiery 2021, "Uncertainty
quantification and deep ensembles", NeurIPS): ``p_T = softmax(log(p) / T)``."""

from __future__ import annotations

import math

import numpy as np

from ensemble_core.metrics import FLOAT64_TINY

#: The temperatures :func:`fit_temperature` searches between.
MIN_TEMPERATURE = 0.05
MAX_TEMPERATURE = 20.0


def _check(temperature: float) -> None:
    if not (isinstance(temperature, int | float | np.floating) and math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature {temperature!r} must be finite and > 0; fix: pass a fitted temperature")


def _log(probs: np.ndarray) -> np.ndarray:
    return np.log(np.maximum(np.asarray(probs, np.float64), FLOAT64_TINY))


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def apply_temperature(probs: np.ndarray, temperature: float) -> np.ndarray:
    """``softmax(log(p) / T)`` over the last axis.

    Args:
      probs: ``[..., C]`` probabilities (clipped below at the smallest positive float64).
      temperature: T > 0 (T > 1 softens, T < 1 sharpens).

    Returns:
      float32 ``[..., C]`` probabilities.

    Raises:
      ValueError: T not finite or not positive.
    """
    _check(temperature)
    return np.exp(_log_softmax(_log(probs) / temperature)).astype(np.float32)


def temperature_nll(probs: np.ndarray, labels: np.ndarray, temperature: float) -> float:
    """NLL (nats) of ``apply_temperature(probs, T)`` on ``labels``, in float64."""
    _check(temperature)
    logp = _log_softmax(_log(probs) / temperature)
    return float(-np.mean(logp[np.arange(len(labels)), labels]))


def fit_temperature(probs: np.ndarray, labels: np.ndarray) -> float:
    """The T in [:data:`MIN_TEMPERATURE`, :data:`MAX_TEMPERATURE`] minimising
    :func:`temperature_nll` on ``probs`` ``[N, C]`` and ``labels`` int ``[N]``.

    The NLL is convex in ``beta = 1/T`` (a log-sum-exp of ``beta * z`` less the linear
    ``beta * z_y``), so its derivative ``mean(E_{softmax(beta z)}[z] - z_y)`` is increasing
    and the minimiser is found by bisection on its sign (80 halvings of the beta interval);
    a minimum outside the interval gives the boundary.

    Raises:
      ValueError: no examples, labels not ``[N]``, or labels outside ``[0, C)``.
    """
    probs = np.asarray(probs)
    labels = np.asarray(labels)
    if probs.ndim != 2 or len(probs) == 0:
        raise ValueError(f"probs must be a non-empty [N, C] table, got shape {probs.shape}; fix: pass the ensemble's")
    if labels.shape != (len(probs),):
        raise ValueError(f"labels have shape {labels.shape} for {len(probs)} examples; fix: one label per example")
    if labels.min() < 0 or labels.max() >= probs.shape[1]:
        raise ValueError(f"labels outside [0, {probs.shape[1]}); fix: pass class indices")
    z = _log(probs)
    z_y = z[np.arange(len(labels)), labels]

    def slope(beta: float) -> float:
        p = np.exp(_log_softmax(beta * z))
        return float(np.mean((p * z).sum(axis=-1) - z_y))

    lo, hi = 1.0 / MAX_TEMPERATURE, 1.0 / MIN_TEMPERATURE
    if slope(lo) >= 0:
        return MAX_TEMPERATURE
    if slope(hi) <= 0:
        return MIN_TEMPERATURE
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        if slope(mid) > 0:
            hi = mid
        else:
            lo = mid
    return float(1.0 / (0.5 * (lo + hi)))
