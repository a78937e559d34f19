"""Struct-of-arrays ensemble training: one jitted step updates every member.

The ensemble state is one pytree whose leaves carry a leading member axis ``E``
(``params``, ``opt_state``). The step is a ``jax.shard_map`` over the mesh
``('ensemble', 'data')``: each device holds ``E / ensemble`` members and ``B / data``
examples of each member's batch; gradients are averaged over ``'data'`` (the
data-parallel pattern: a psum of each shard's share of the batch-mean loss gradient).
The training split lives on device (uint8, replicated), so a step only ships its
``[E, B]`` int32 indices: data loading never blocks the accelerator.

One concern per module (after flax ``examples/mnist``: pure steps apart from the loop):

- :mod:`~ensemble_core.train.optimizer`: the optax optimizer, each member's learning-rate
  schedule and the one place member hyperparameters enter the optimizer state.
- :mod:`~ensemble_core.train.members`: how the members on one device are mapped.
- :mod:`~ensemble_core.train.state`: :class:`EnsembleState` and its construction.
- :mod:`~ensemble_core.train.step`: the loss and the jitted, pure train step.
- :mod:`~ensemble_core.train.loop`: the epoch loop :func:`fit` (callbacks, no I/O).
"""

from ensemble_core.train.loop import DataPosition, data_position, fit
from ensemble_core.train.members import STRATEGIES, default_strategy, map_members
from ensemble_core.train.optimizer import (
    learning_rate_schedule,
    learning_rate_table,
    make_optimizer,
    set_hyperparameters,
)
from ensemble_core.train.state import BestTracking, EnsembleState, init_ensemble, state_shardings, unstacked
from ensemble_core.train.step import cross_entropy, default_donate, make_train_step, train_compiler_options

__all__ = [
    "STRATEGIES",
    "BestTracking",
    "DataPosition",
    "EnsembleState",
    "cross_entropy",
    "data_position",
    "default_donate",
    "default_strategy",
    "fit",
    "init_ensemble",
    "learning_rate_schedule",
    "learning_rate_table",
    "make_optimizer",
    "make_train_step",
    "map_members",
    "set_hyperparameters",
    "state_shardings",
    "train_compiler_options",
    "unstacked",
]
