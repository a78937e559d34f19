"""Independent references the tests compare the ensemble code against."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
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


def train_stateful_member_alone(
    model: nn.Module,
    tx: optax.GradientTransformation,
    variables: dict,
    images: np.ndarray,
    labels: np.ndarray,
    order: np.ndarray,
    step_keys: list,
    augment=None,
) -> tuple[Any, Any]:
    """One member with BatchNorm and Dropout trained alone with Flax's own pattern: a
    ``flax.training.train_state.TrainState`` with a ``batch_stats`` field, ``mutable=['batch_stats']``
    and a ``'dropout'`` rng per step (Flax's ImageNet example, without its pmap).

    Args:
      variables: the member's initial ``{"params", "batch_stats"}``.
      order: int ``[S, B]`` indices, one row per step.
      step_keys: S pairs ``(dropout_key, augment_key)``, the member's keys of each step.
      augment: ``augment(key, images) -> images`` (uint8) or None.

    Returns:
      ``(params, batch_stats)`` after S steps.
    """
    from flax.training import train_state

    class TrainState(train_state.TrainState):
        batch_stats: Any

    @jax.jit
    def step(state, x, y, dropout_key):
        def loss_fn(p):
            logits, updates = state.apply_fn(
                {"params": p, "batch_stats": state.batch_stats},
                to_float(x),
                train=True,
                rngs={"dropout": dropout_key},
                mutable=["batch_stats"],
            )
            # a network of M members (logits [M, B, C]: BatchEnsemble, Packed-Ensembles)
            # trains on the mean of its members' losses (Wen et al. 2020, Sec. 3)
            labels = jnp.broadcast_to(y, logits.shape[:-1])
            return optax.losses.softmax_cross_entropy_with_integer_labels(logits, labels).mean(), updates

        grads, updates = jax.grad(loss_fn, has_aux=True)(state.params)
        return state.apply_gradients(grads=grads).replace(batch_stats=updates["batch_stats"])

    state = TrainState.create(
        apply_fn=model.apply, params=variables["params"], tx=tx, batch_stats=variables["batch_stats"]
    )
    for idx, (dropout_key, augment_key) in zip(order, step_keys, strict=True):
        x = images[idx] if augment is None else augment(augment_key, images[idx])
        state = step(state, x, labels[idx], dropout_key)
    return state.params, state.batch_stats
