"""Dropout over a member's whole batch when the batch is split over mesh axis ``'data'``.

A member's batch of ``data_shards * b`` examples may be split into ``data_shards`` shards
of ``b`` rows. So that an example gets the same dropout mask whatever the split (a
member's trajectory does not depend on the topology), the mask is drawn for the whole
batch from the member's key and each shard keeps its own rows. On one shard this is
exactly ``flax.linen.Dropout`` / ``flax.nnx.Dropout`` (flax 0.12): the same key, shape
and ``jax.random.bernoulli``. Used by the Linen interception
(:mod:`ensemble_core.train.forward`) and the NNX one (:mod:`ensemble_core.train.nnx_member`).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Float, Key

from ensemble_core.mesh import DATA_AXIS


def dropout(
    inputs: Float[Array, "b ..."], key: Key[Array, ""], rate: float, broadcast_dims: Sequence[int], data_shards: int
) -> Float[Array, "b ..."]:
    """Inverted dropout (Srivastava et al. 2014) of this shard's rows ``inputs`` (float,
    ``[b, ...]``, rows ``axis_index('data') * b ...`` of the member's batch): units kept
    with probability ``1 - rate`` and scaled by ``1 / (1 - rate)``, the mask drawn for all
    ``data_shards * b`` rows (dimensions in ``broadcast_dims`` share one mask). Must run
    where axis ``'data'`` is bound when ``data_shards > 1``. ``rate`` in [0, 1]: 0 returns
    ``inputs``, 1 zeros."""
    if rate == 0.0:
        return inputs
    if rate == 1.0:
        return jnp.zeros_like(inputs)
    keep_prob = 1.0 - rate
    shape = list(inputs.shape)
    broadcast = {d % inputs.ndim for d in broadcast_dims}
    for dim in broadcast:
        shape[dim] = 1
    rows = inputs.shape[0]
    split = data_shards > 1 and 0 not in broadcast
    if split:
        shape[0] = rows * data_shards
    mask = jax.random.bernoulli(key, p=keep_prob, shape=shape)
    if split:
        mask = lax.dynamic_slice_in_dim(mask, lax.axis_index(DATA_AXIS) * rows, rows, axis=0)
    mask = jnp.broadcast_to(mask, inputs.shape)
    return lax.select(mask, inputs / keep_prob, jnp.zeros_like(inputs))
