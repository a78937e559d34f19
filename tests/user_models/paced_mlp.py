"""An MLP whose training steps take a set wall time without using the CPU: each training
forward pass waits ``pause_s`` seconds in a host callback (``jax.pure_callback``) and adds
the zero it returns to the input. For the kill-and-resume tests, whose training must last
seconds (a kill has to land mid-training) but whose CPU seconds are the suite's budget
(a CNN took the same seconds by computing). Evaluation does not wait. Used as a user's own
model: ``model.name: tests.user_models.paced_mlp:build``."""

from __future__ import annotations

import functools
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


def _pause(seconds: float, value: np.ndarray) -> np.ndarray:
    time.sleep(seconds)
    return np.zeros_like(value)


def paced(x: jnp.ndarray, seconds: float) -> jnp.ndarray:
    """``x`` (float ``[B, ...]``) plus a zero that a host callback returns after waiting
    ``seconds`` (once per member and step, also under ``vmap``); ``x`` when ``seconds`` is 0."""
    if seconds <= 0:
        return x
    shape = jax.ShapeDtypeStruct((), x.dtype)
    zero = jax.pure_callback(functools.partial(_pause, seconds), shape, x.reshape(-1)[0], vmap_method="sequential")
    return x + zero


class PacedMLP(nn.Module):
    """Flatten - Dense(hidden) - ReLU - Dense(num_classes); training waits ``pause_s`` s a step."""

    num_classes: int = 10
    hidden: int = 64
    pause_s: float = 0.1

    @nn.compact
    def __call__(self, x: jnp.ndarray, train: bool) -> jnp.ndarray:
        x = x.reshape((x.shape[0], -1))
        if train:
            x = paced(x, self.pause_s)
        x = nn.relu(nn.Dense(self.hidden)(x))
        return nn.Dense(self.num_classes)(x)


def build(cfg, num_classes: int) -> PacedMLP:
    """``model.options``: ``hidden`` (int), ``pause_s`` (float, seconds per training step)."""
    unknown = set(cfg.options) - {"hidden", "pause_s"}
    if unknown:
        raise ValueError(f"unknown option(s) {sorted(unknown)}; this model takes hidden, pause_s")
    return PacedMLP(num_classes=num_classes, **cfg.options)
