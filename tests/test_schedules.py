"""Each member's learning rate (ensemble_core.train.optimizer) against the textbook formulas.

The schedules are optax's (``constant_schedule``, ``cosine_decay_schedule``,
``warmup_cosine_decay_schedule``); the oracle here is written from Loshchilov & Hutter
2017 (SGDR, eq. 5 with ``eta_min = 0`` and no restart) and a linear warm-up from 0, in
float64, and compared at every step of the training. And the one place member values
enter the optimizer state, :func:`set_hyperparameters`.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from ensemble_core.config import load_config
from ensemble_core.errors import ConfigError
from ensemble_core.train import learning_rate_schedule, learning_rate_table, make_optimizer, set_hyperparameters


def _textbook(lr: float, kind: str, warmup_epochs: float, steps_per_epoch: int, epochs: int, t: int) -> float:
    total = max(1, epochs * steps_per_epoch)
    if kind == "constant":
        return lr
    warmup = 0
    if kind == "warmup_cosine":  # at least one step of warm-up, and fewer than the total
        warmup = min(max(1, round(warmup_epochs * steps_per_epoch)), total - 1)
    if t < warmup:
        return lr * t / warmup
    decay = total - warmup
    return lr * 0.5 * (1 + math.cos(math.pi * min(t - warmup, decay) / decay))


SETTINGS = [
    # learning_rate, schedule, warmup_epochs, steps_per_epoch, epochs
    (0.1, "constant", 0.0, 7, 3),
    (0.1, "cosine", 0.0, 7, 3),
    (0.03, "cosine", 0.0, 1, 1),  # one step in all
    (0.05, "warmup_cosine", 0.5, 8, 3),
    (0.3, "warmup_cosine", 1.5, 5, 2),
    (0.2, "warmup_cosine", 0.0, 4, 2),  # no warm-up asked: still one step from 0
    (0.2, "warmup_cosine", 0.01, 3, 2),  # warm-up rounds to 0 steps: one step from 0
    (0.1, "warmup_cosine", 0.9, 1, 1),  # one step in all: no room for a warm-up, cosine
]


@pytest.mark.parametrize(("lr", "kind", "warmup_epochs", "steps_per_epoch", "epochs"), SETTINGS)
def test_schedule_is_the_textbook_one_at_every_step(lr, kind, warmup_epochs, steps_per_epoch, epochs):
    hp = {"learning_rate": lr, "schedule": kind, "warmup_epochs": warmup_epochs}
    schedule = learning_rate_schedule(hp, steps_per_epoch, epochs)
    total = steps_per_epoch * epochs
    got = np.asarray([schedule(t) for t in range(total)], np.float64)
    want = np.asarray([_textbook(lr, kind, warmup_epochs, steps_per_epoch, epochs, t) for t in range(total)])
    # optax computes in float32: a few ulp of lr
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7 * lr)
    # the host table the train step receives (float32, all steps of an epoch at once)
    rates = learning_rate_table([hp, {**hp, "learning_rate": 2 * lr}], steps_per_epoch, epochs)
    table = np.concatenate([rates(k) for k in range(epochs)])
    assert table.shape == (total, 2) and table.dtype == np.float32
    np.testing.assert_allclose(table[:, 0], want, rtol=1e-6, atol=1e-7 * lr)
    np.testing.assert_allclose(table[:, 1], 2 * want, rtol=1e-6, atol=2e-7 * lr)


def test_an_unknown_schedule_is_refused():
    with pytest.raises(ConfigError, match=r"unknown train.schedule 'linear'"):
        learning_rate_schedule({"learning_rate": 0.1, "schedule": "linear", "warmup_epochs": 0.0}, 4, 2)


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
def test_set_hyperparameters_replaces_only_what_it_is_given(optimizer):
    train = load_config(None, [f"train.optimizer={optimizer}", "train.weight_decay=0.001"]).train
    state = make_optimizer(train).init({"w": jnp.ones(2)})
    assert float(state.hyperparams["learning_rate"]) == pytest.approx(train.learning_rate)
    new = set_hyperparameters(state, {"learning_rate": jnp.float32(0.25), "weight_decay": None, "nonexistent": 1.0})
    assert float(new.hyperparams["learning_rate"]) == 0.25
    assert float(new.hyperparams["weight_decay"]) == pytest.approx(0.001)
    assert "nonexistent" not in new.hyperparams
    assert float(state.hyperparams["learning_rate"]) == pytest.approx(train.learning_rate)  # not modified
    assert set_hyperparameters(state, {"weight_decay": None}) is state
