"""How the members on one device are mapped: ``jax.vmap`` or one trace per member."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from ensemble_core.errors import ConfigError

STRATEGIES = ("vmap", "unroll")


def default_strategy(backend: str) -> str:
    """How members on one device are mapped: 'unroll' on CPU, 'vmap' elsewhere.

    On XLA:CPU a vmapped convolution becomes a grouped convolution, several times slower
    than separate convolutions; on GPU/TPU vmap batches members into bigger kernels.
    """
    return "unroll" if backend == "cpu" else "vmap"


def map_members(fn: Callable, strategy: str) -> Callable:
    """Map ``fn`` over the leading member axis of all its arguments and outputs.

    ``'vmap'`` uses ``jax.vmap``; ``'unroll'`` traces ``fn`` once per member and stacks
    the results (separate, ungrouped kernels).

    Raises:
      ConfigError: ``strategy`` is not one of :data:`STRATEGIES`.
    """
    if strategy == "vmap":
        return jax.vmap(fn)
    if strategy != "unroll":
        raise ConfigError(f"unknown member strategy '{strategy}'", fix=f"use one of {STRATEGIES}")

    def unrolled(*args):
        n = jax.tree.leaves(args)[0].shape[0]
        outs = [fn(*jax.tree.map(lambda x, i=i: x[i], args)) for i in range(n)]
        return jax.tree.map(lambda *xs: jnp.stack(xs), *outs)

    return unrolled
