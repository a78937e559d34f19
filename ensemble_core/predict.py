"""Struct-of-arrays evaluation: all members over the test set, no Python loop over members."""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ensemble_core import stopping
from ensemble_core.data import to_float
from ensemble_core.mesh import DATA_AXIS, ENSEMBLE_AXIS, host_value
from ensemble_core.output_capture import captured_output
from ensemble_core.train import map_members
from ensemble_core.train.forward import Network, apply_inference, check_precision, network_name, user_network


def make_predict(
    model: Network,
    mesh: Mesh,
    strategy: str = "vmap",
    *,
    logits: bool = False,
    precision: str = "float32",
    stochastic: bool = False,
    outputs: int = 1,
):
    """Build ``predict(variables, images) -> member_probs`` (``logits``: the member logits
    instead, before the softmax), every member in inference mode
    (:func:`~ensemble_core.train.forward.apply_inference`: BatchNorm's running averages, no dropout)
    at compute precision ``precision`` (``train.precision``, as the members trained).

    ``variables``: every member's Flax variables (``EnsembleState.variables`` or
    ``final_variables``), leaves ``[E, ...]`` sharded over ``'ensemble'``; ``images`` uint8
    ``[B, H, W, C]`` sharded over ``'data'`` (every member sees the same batch, the
    the Flax ensembling guide's ``in_axes=(0, None)``). Returns float32 ``[E, B, C]``
    softmax probabilities (or logits), whatever ``precision``: the softmax is computed
    from float32 logits.

    ``stochastic``: one MC dropout pass of every member instead
    (:func:`ensemble_core.mc_dropout.apply_stochastic`, Linen networks):
    ``predict((variables, keys), images, index)`` with ``keys`` uint32 ``[E, 2]`` (the
    pass's raw keys, :func:`ensemble_core.mc_dropout.pass_keys`, sharded like the
    variables) and ``index`` int32 ``[B]`` (each image's number in the whole set, sharded
    like the images).

    ``outputs``: a network of that many members (BatchEnsemble, Packed-Ensembles:
    :mod:`ensemble_core.networks`), whose logits are ``[M, B, C]``: the result is
    ``[E, M, B, C]``.

    Raises:
      ConfigError: an unknown ``precision``.
    """
    check_precision(precision)
    out_specs = P(ENSEMBLE_AXIS, DATA_AXIS) if outputs == 1 else P(ENSEMBLE_AXIS, None, DATA_AXIS)

    def member(variables, images):
        z = apply_inference(model, variables, to_float(images), precision)
        return z.astype(jnp.float32) if logits else jax.nn.softmax(z, axis=-1)

    def local(variables, images):
        return map_members(lambda v: member(v, images), strategy)(variables)

    def one_pass(variables_keys, images, index):
        from ensemble_core.mc_dropout import apply_stochastic

        def member_pass(v, key_data):
            key = jax.random.wrap_key_data(key_data)
            z = apply_stochastic(model, v, to_float(images), key, index, precision)
            return z if logits else jax.nn.softmax(z, axis=-1)

        return map_members(member_pass, strategy)(*variables_keys)

    if stochastic:
        fn = jax.jit(
            jax.shard_map(
                one_pass,
                mesh=mesh,
                in_specs=(P(ENSEMBLE_AXIS), P(DATA_AXIS), P(DATA_AXIS)),
                out_specs=out_specs,
            )
        )
    else:
        fn = jax.jit(
            jax.shard_map(
                local,
                mesh=mesh,
                in_specs=(P(ENSEMBLE_AXIS), P(DATA_AXIS)),
                out_specs=out_specs,
            )
        )
    # member_probs captures what a user's network prints while it runs (read with getattr)
    fn.network = model  # type: ignore[attr-defined]
    return fn


def member_probs(
    predict,
    variables: Any,
    images: np.ndarray,
    mesh: Mesh,
    batch_size: int,
    *,
    one_member_per_device: bool = False,
    indexed: bool = False,
) -> np.ndarray:
    """Every member's probabilities on ``images`` (uint8 ``[N, H, W, C]``), in chunks;
    ``variables`` as :func:`make_predict`'s.

    ``batch_size`` is the number of examples one device pushes through at once. With
    several members per device, either each chunk is ``batch_size / members_per_device``
    examples (vmap), or, with ``one_member_per_device`` (the 'unroll' strategy on CPU),
    the members are evaluated in groups of one member per device, which keeps each
    device's working set that of a single network. The last chunk is padded to the chunk
    size (so one compiled program serves all chunks) and the padding is cut off.

    ``indexed``: ``predict(variables, images, index)`` also takes each image's number in
    ``images`` (int32, sharded like the images; a stochastic pass's, :func:`make_predict`).

    Returns:
      float32 ``[E, N, C]`` on the host (``[E, M, N, C]`` for a network of M members).

    Raises:
      ValueError: ``images`` is empty (N = 0).
    """
    _require_images(images)
    groups, per_device = _member_groups(variables, mesh, one_member_per_device)
    out = []
    for group in groups:
        with _captured_network_output(predict):
            out.append(_chunks(predict, group, images, mesh, batch_size, per_device, indexed))
    if len(out) == 1:
        return out[0]
    # group j's row d is member d * len(groups) + j: [D, groups, ...] is the members in order
    return np.stack(out, axis=1).reshape(-1, *out[0].shape[1:])


def compile_member_probs(
    predict,
    variables: Any,
    images: np.ndarray,
    mesh: Mesh,
    batch_size: int,
    *,
    one_member_per_device: bool = False,
    indexed: bool = False,
) -> None:
    """Compile, and run once, every program :func:`member_probs` runs on ``images`` with the
    same arguments, on the least input that compiles them: the first chunk of ``images``
    and, with ``one_member_per_device``, the first member group only (every group runs the
    same program; the other groups' member slices are compiled too, without predicting).
    A timed :func:`member_probs` after it compiles nothing.

    Running ``member_probs`` itself on the first ``batch_size`` images, as evaluation did,
    compiled the same programs at the cost of up to ``members_per_device`` chunks (vmap) or
    every member group (``one_member_per_device``): forward passes that grow with the
    network and the members per device (docs/benchmarks.md, "The fixed cost of a run").

    Raises:
      ValueError: ``images`` is empty (N = 0).
    """
    _require_images(images)
    groups, per_device = _member_groups(variables, mesh, one_member_per_device)
    first = images[: _chunk_size(batch_size, per_device, len(images), mesh)]
    with _captured_network_output(predict):
        _chunks(predict, groups[0], first, mesh, batch_size, per_device, indexed)


def _member_groups(variables: Any, mesh: Mesh, one_member_per_device: bool) -> tuple[list[Any], int]:
    # The variables of each call of the network's program, and the members per device in
    # each: all members in one call, or, one_member_per_device, one group per member slot.
    # Device d holds members [d * per_device, (d + 1) * per_device): group j takes member
    # d * per_device + j from every device d, so the slice stays on its device.
    per_device = jax.tree.leaves(variables)[0].shape[0] // mesh.shape[ENSEMBLE_AXIS]
    if one_member_per_device and per_device > 1:
        return [_take_members(variables, j, per_device, mesh) for j in range(per_device)], 1
    return [variables], per_device


def _require_images(images: np.ndarray) -> None:
    if len(images) == 0:
        raise ValueError(
            "no images to predict (an array of 0 images); fix: pass at least one image, or skip the prediction"
        )


def _captured_network_output(predict):
    # What a user's network prints while it predicts (jax.debug.print, callbacks, prints
    # while it is traced) is captured and logged (read with getattr: make_predict's tag).
    network = getattr(predict, "network", None)
    if network is None or not user_network(network):
        return contextlib.nullcontext()
    return captured_output(
        f"network {network_name(network)} printed while it predicted (jax.debug.print, callbacks)", fds=False
    )


def _chunk_size(batch_size: int, per_device: int, n: int, mesh: Mesh) -> int:
    # Examples per chunk: batch_size / members per device, at most n, a multiple of the
    # data axis (so every device gets the same share).
    data = mesh.shape[DATA_AXIS]
    chunk = max(1, min(batch_size // per_device, n))
    return -(-chunk // data) * data


def _chunks(predict, variables, images, mesh, batch_size, per_device, indexed) -> np.ndarray:
    n = len(images)
    chunk = _chunk_size(batch_size, per_device, n, mesh)
    sharding = NamedSharding(mesh, P(DATA_AXIS))
    out = []
    for start in range(0, n, chunk):
        stopping.check()  # a stop request ends evaluation/prediction here (inside a stage)
        part = images[start : start + chunk]
        pad = chunk - len(part)
        if pad:
            part = np.concatenate([part, np.zeros((pad, *part.shape[1:]), part.dtype)])
        if indexed:
            index = jax.device_put(np.arange(start, start + chunk, dtype=np.int32), sharding)
            probs = predict(variables, jax.device_put(part, sharding), index)
        else:
            probs = predict(variables, jax.device_put(part, sharding))
        out.append(probs)
    return _joined(out, n)


def _joined(chunks: list[jax.Array], n: int) -> np.ndarray:
    # The chunks' outputs ([..., chunk, C] each) as one float32 host array [..., n, C], the
    # last chunk's padding cut. Joined and cut on the host where this process holds them
    # whole: on the device, each new (number of chunks, n) compiled a concatenation and a
    # slice inside the timed pass (0.6 s of a default run's evaluation). A mesh across
    # processes gathers once, after joining on the devices.
    if any(isinstance(c, jax.Array) and not c.is_fully_addressable for c in chunks):
        joined = host_value(jnp.concatenate(chunks, axis=-2))
    else:
        joined = np.concatenate([np.asarray(c) for c in chunks], axis=-2)
    return joined[..., :n, :].astype(np.float32, copy=False)


def _take_members(tree: Any, j: int, step: int, mesh: Mesh) -> Any:
    """Members ``j, j + step, ...`` of a struct-of-arrays pytree, one per device."""
    return _member_taker(j, step, mesh)(tree)


@functools.lru_cache(maxsize=256)
def _member_taker(j: int, step: int, mesh: Mesh):
    # One jitted function per (j, step, mesh), so repeated evaluations reuse its compilation.
    return jax.jit(lambda t: jax.tree.map(lambda x: x[j::step], t), out_shardings=NamedSharding(mesh, P(ENSEMBLE_AXIS)))
