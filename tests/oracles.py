"""Independent references the tests compare the ensemble code against."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import numpy as np
import optax

from ensemble_core.data import to_float


def train_member_alone(
    model: nn.Module,
    tx: optax.GradientTransformation,
    params: Any,
    images: np.ndarray,
    labels: np.ndarray,
    order: np.ndarray,
    label_smoothing: float = 0.0,
) -> Any:
    """One member trained by its own jitted single-model step (the seed tutorial's loop).

    Args:
      params: one member's params (no member axis).
      images: uint8 ``[N, H, W, C]``; labels int ``[N]``.
      order: int ``[S, B]`` indices, one row per step.
      label_smoothing: smooth the one-hot targets with ``optax.losses.smooth_labels`` (the
        textbook form of the loss, not the project's rewriting of it).

    Returns:
      The member's params after ``S`` steps.
    """

    @jax.jit
    def step(params, opt_state, x, y):
        def loss_fn(p):  # written here, not taken from ensemble_core.train: an independent reference
            logits = model.apply({"params": p}, to_float(x))
            if label_smoothing:
                targets = optax.losses.smooth_labels(jax.nn.one_hot(y, logits.shape[-1]), label_smoothing)
                return optax.losses.softmax_cross_entropy(logits, targets).mean()
            return optax.losses.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        grads = jax.grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    opt_state = tx.init(params)
    for idx in order:
        params, opt_state = step(params, opt_state, images[idx], labels[idx])
    return params
