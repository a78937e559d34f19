"""Per-member random keys that depend only on ``(seed, member index)``.

``root = jax.random.key(seed)``; for each purpose (init, data order)
``purpose_key = fold_in(root, PURPOSES[purpose])`` and member i gets
``fold_in(purpose_key, i)``. Member i is therefore the same network whatever the
ensemble size and however many devices the members are spread over (unlike the Flax ensembling guide's
``split(rng, device_count)``, where every key changes with the device count).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

PURPOSES = {"init": 0, "data": 1, "stochastic": 2}  # ids are fixed: a new purpose takes a new id


def member_keys(seed: int, num_members: int) -> dict[str, jax.Array]:
    """Typed PRNG keys, one per member and purpose.

    Args:
      seed: the run's root seed (non-negative int).
      num_members: E.

    Returns:
      ``{"init": key[E], "data": key[E]}`` (typed key arrays).
    """
    root = jax.random.key(seed)
    members = jnp.arange(num_members, dtype=jnp.uint32)
    out = {}
    for purpose, ident in PURPOSES.items():
        purpose_key = jax.random.fold_in(root, ident)
        out[purpose] = jax.vmap(lambda i, k=purpose_key: jax.random.fold_in(k, i))(members)
    return out


#: The fold-in id of the stratified pool's keys (hyper-deep ensembles): apart from every purpose id.
STRATIFIED = 1000


def stratified_member_keys(seed: int, pairs: list[tuple[int, int]]) -> dict[str, jax.Array]:
    """Typed PRNG keys of the stratified pool's members, one per ``(setting, init)`` pair.

    Member (setting s, initialisation j) of a hyper-deep ensemble (Wenzel et al. 2020,
    Algorithm 2) is ``base = fold_in(fold_in(fold_in(root, STRATIFIED), s), j)`` and, for
    each purpose, ``fold_in(base, PURPOSES[purpose])``: it depends on ``(seed, s, j)`` only,
    so it is the same network whatever the pool's size, order or topology, and differs
    from search-pool member s (keyed by ``(seed, s)``).

    Args:
      seed: the run's root seed.
      pairs: ``[(s, j), ...]``: s the setting's search-pool member index, j the
        initialisation (both non-negative ints below 2**32).

    Returns:
      ``{purpose: key[len(pairs)]}`` (typed key arrays), purposes as :func:`member_keys`.
    """
    root = jax.random.fold_in(jax.random.key(seed), STRATIFIED)
    s = jnp.asarray([p[0] for p in pairs], dtype=jnp.uint32)
    j = jnp.asarray([p[1] for p in pairs], dtype=jnp.uint32)
    base = jax.vmap(lambda a, b: jax.random.fold_in(jax.random.fold_in(root, a), b))(s, j)
    return {purpose: jax.vmap(lambda k, i=ident: jax.random.fold_in(k, i))(base) for purpose, ident in PURPOSES.items()}


def key_layout(keys: dict[str, jax.Array]) -> dict[str, list[list[int]]]:
    """Raw uint32 key data as nested lists (small, JSON-able, what Prefect tasks pass)."""
    return {p: np.asarray(jax.random.key_data(k)).tolist() for p, k in keys.items()}


def keys_from_layout(layout: dict[str, list[list[int]]]) -> dict[str, jax.Array]:
    """Inverse of :func:`key_layout`."""
    return {p: jax.random.wrap_key_data(jnp.asarray(v, dtype=jnp.uint32)) for p, v in layout.items()}


def epoch_order(data_keys: jax.Array, epoch: int, num_examples: int, batch_size: int) -> np.ndarray:
    """Each member's example order for one epoch, as the Flax ensembling guide's ``train_epoch`` does it.

    Member i's permutation is ``permutation(fold_in(data_keys[i], epoch), N)``, truncated
    to ``steps * batch_size`` (the remainder is dropped) and reshaped.

    Args:
      data_keys: typed keys ``[E]``.
      epoch: 0-based epoch index.
      num_examples: N, size of the training split.
      batch_size: B, examples per member per step.

    Returns:
      int32 ``[steps, E, B]`` indices into the training split.
    """
    steps = num_examples // batch_size
    # One program for every epoch (the epoch is an argument): a function closing over it
    # was traced and compiled again at each epoch's start (0.5 s an epoch on 2 CPU cores).
    perms = np.asarray(_permutations(data_keys, np.uint32(epoch), num_examples, steps * batch_size), dtype=np.int32)
    return perms.reshape(len(perms), steps, batch_size).transpose(1, 0, 2)


@functools.partial(jax.jit, static_argnums=(2, 3))
def _permutations(data_keys: jax.Array, epoch: jax.Array, num_examples: int, kept: int) -> jax.Array:
    """``[E, kept]``: member i's ``permutation(fold_in(data_keys[i], epoch), num_examples)[:kept]``."""
    return jax.vmap(lambda k: jax.random.permutation(jax.random.fold_in(k, epoch), num_examples)[:kept])(data_keys)
