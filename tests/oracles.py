"""Independent references the tests compare the ensemble code against."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import numpy as np
import optax

from ensemble_core.train import cross_entropy


def train_member_alone(
    model: nn.Module,
    tx: optax.GradientTransformation,
    params: Any,
    images: np.ndarray,
    labels: np.ndarray,
    order: np.ndarray,
) -> Any:
    """One member trained by its own jitted single-model step (the seed tutorial's loop).

    Args:
      params: one member's params (no member axis).
      images: uint8 ``[N, H, W, C]``; labels int ``[N]``.
      order: int ``[S, B]`` indices, one row per step.

    Returns:
      The member's params after ``S`` steps.
    """

    @jax.jit
    def step(params, opt_state, x, y):
        grads = jax.grad(lambda p: cross_entropy(model, p, x, y)[0].mean())(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    opt_state = tx.init(params)
    for idx in order:
        params, opt_state = step(params, opt_state, images[idx], labels[idx])
    return params
