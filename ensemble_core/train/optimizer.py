"""The optimizer and the learning rate: optax transformations, per-member schedules.

Each member's learning rate at a step is its optax schedule
(:func:`learning_rate_schedule`), evaluated on the host by :func:`learning_rate_table`,
one ``[E]`` column per step. Learning rate and weight decay live in the optimizer state
(``optax.schedules.inject_hyperparams``), one value per member once the state is
stacked; :func:`set_hyperparameters` is the one place member values enter that state.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import optax

from ensemble_core.config import TrainConfig
from ensemble_core.errors import ConfigError

# MARK: the optimizer


def _sgd(learning_rate, weight_decay, momentum):
    return optax.chain(optax.add_decayed_weights(weight_decay), optax.sgd(learning_rate, momentum=momentum))


def _adam(learning_rate, weight_decay):
    return optax.chain(optax.add_decayed_weights(weight_decay), optax.adam(learning_rate))


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
    """The optax optimizer named by ``cfg.optimizer`` (the Flax ensembling guide's default: SGD 0.1, momentum 0.9).

    Weight decay is optax's ``add_decayed_weights`` before SGD or Adam (an L2 term in the
    gradient) and AdamW's own decoupled decay (Loshchilov & Hutter 2019). Wrapped in
    ``optax.schedules.inject_hyperparams`` (the optax way to change hyperparameters during
    training), so learning rate and weight decay live in the optimizer state (float32).
    ``cfg.learning_rate`` and ``cfg.weight_decay`` are only the initial values that
    ``inject_hyperparams`` requires: :func:`set_hyperparameters` replaces them with each
    member's values.

    Raises:
      ConfigError: an unknown ``cfg.optimizer``.
    """
    if cfg.optimizer == "sgd":
        return optax.schedules.inject_hyperparams(_sgd)(
            learning_rate=cfg.learning_rate, weight_decay=cfg.weight_decay, momentum=cfg.momentum or None
        )
    if cfg.optimizer == "adam":
        return optax.schedules.inject_hyperparams(_adam)(learning_rate=cfg.learning_rate, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adamw":
        return optax.schedules.inject_hyperparams(optax.adamw)(
            learning_rate=cfg.learning_rate, weight_decay=cfg.weight_decay
        )
    raise ConfigError(f"unknown train.optimizer '{cfg.optimizer}'", fix="use sgd, adam or adamw")


def set_hyperparameters(opt_state: Any, values: Mapping[str, jax.Array | np.ndarray | None]) -> Any:
    """``opt_state`` with the hyperparameters ``values`` replaced: the one place member
    hyperparameters (learning rate, weight decay) enter the optimizer state.

    Args:
      opt_state: an ``optax.schedules.InjectHyperparamsState`` (of one member, or stacked
        with a leading member axis ``E``).
      values: ``{name: value}``, each value float32 of the shape of ``hyperparams[name]``
        (``[]`` for one member, ``[E]`` stacked). A None value, or a name the optimizer
        does not have (e.g. ``momentum`` without momentum), leaves it as it is.

    Returns:
      The new optimizer state (the old one is not modified).
    """
    given = {name: v for name, v in values.items() if v is not None and name in opt_state.hyperparams}
    if not given:
        return opt_state
    return opt_state._replace(hyperparams={**opt_state.hyperparams, **given})


# MARK: the learning-rate schedule


def learning_rate_schedule(hyperparameters: Mapping[str, Any], steps_per_epoch: int, epochs: int) -> optax.Schedule:
    """One member's learning rate at each step: an optax schedule over ``epochs * steps_per_epoch`` steps.

    ``constant``: ``optax.schedules.constant_schedule``; ``cosine``: ``optax.schedules.cosine_decay_schedule``
    to 0 at the last step; ``warmup_cosine``: ``optax.schedules.warmup_cosine_decay_schedule`` from 0,
    peak ``learning_rate`` after ``round(warmup_epochs * steps_per_epoch)`` steps (at least
    1, fewer than the total), then cosine decay to 0 (Loshchilov & Hutter 2017, SGDR).

    Args:
      hyperparameters: one member's ``learning_rate`` (float), ``schedule`` (str) and
        ``warmup_epochs`` (float, epochs) (:func:`ensemble_core.hyper.member_hyperparameters`).

    Returns:
      ``schedule(step) -> learning rate`` (float32), step a 0-based int or int array.

    Raises:
      ConfigError: an unknown ``schedule``.
    """
    lr, kind = hyperparameters["learning_rate"], hyperparameters["schedule"]
    total = max(1, epochs * steps_per_epoch)
    if kind == "constant":
        return optax.schedules.constant_schedule(lr)
    if kind == "cosine":
        return optax.schedules.cosine_decay_schedule(lr, decay_steps=total)
    if kind == "warmup_cosine":
        warmup = min(max(1, round(hyperparameters["warmup_epochs"] * steps_per_epoch)), total - 1)
        if warmup < 1:
            return optax.schedules.cosine_decay_schedule(lr, decay_steps=total)
        return optax.schedules.warmup_cosine_decay_schedule(0.0, lr, warmup_steps=warmup, decay_steps=total)
    raise ConfigError(f"unknown train.schedule '{kind}'", fix="use constant, cosine or warmup_cosine")


def learning_rate_table(
    hyperparameters: Sequence[Mapping[str, Any]], steps_per_epoch: int, epochs: int
) -> Callable[[int], np.ndarray]:
    """``rates(epoch) -> float32 [steps_per_epoch, E]``: every member's learning rate at
    each step of ``epoch`` (0-based), from its :func:`learning_rate_schedule` evaluated on
    the host at global steps ``epoch * steps_per_epoch + s``.

    Raises:
      ConfigError: a member's ``schedule`` is unknown (raised here, before any step).
    """
    schedules = [learning_rate_schedule(hp, steps_per_epoch, epochs) for hp in hyperparameters]

    def rates(epoch: int) -> np.ndarray:
        t = np.arange(epoch * steps_per_epoch, (epoch + 1) * steps_per_epoch)
        cols = [np.broadcast_to(np.asarray(f(t), np.float32), t.shape) for f in schedules]
        return np.stack(cols, axis=1)

    return rates
