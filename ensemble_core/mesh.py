"""The device mesh ``('ensemble', 'data')`` and how members and batches lie on it.

Flax's ensembling guide pins one member per device with ``jax.pmap`` (so E must equal the device
count). Here the member axis of every state leaf is sharded over mesh axis ``'ensemble'``
and each batch over ``'data'``; any E runs on any number of devices.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ensemble_core.errors import MeshError

ENSEMBLE_AXIS = "ensemble"
DATA_AXIS = "data"


@dataclasses.dataclass(frozen=True)
class MeshPlan:
    """Axis sizes and the (possibly padded) number of members actually trained."""

    ensemble: int
    data: int
    num_members: int  # E asked for
    padded_members: int  # E rounded up to a multiple of `ensemble`

    @property
    def members_per_device(self) -> int:
        return self.padded_members // self.ensemble


def plan_mesh(
    num_members: int,
    num_devices: int,
    data: int = 1,
    ensemble: int | None = None,
    pad: bool = False,
    batch_size: int | None = None,
    processes: int = 1,
) -> MeshPlan:
    """Choose mesh axis sizes.

    With ``ensemble=None`` the ensemble axis is the largest divisor of E that fits in
    ``num_devices // data``, so no padding is ever needed.

    With ``processes`` JAX processes sharing the ``num_devices`` (one program across
    processes), every process must hold at least one device of the mesh
    (:func:`make_mesh` spreads the mesh's devices evenly over them): a mesh of fewer
    devices than processes has its data axis widened to the smallest size that gives
    each process one (a divisor of the devices that splits the batch), e.g. one member
    on two processes trains on ``ensemble 1 x data 2``.

    Raises:
      MeshError: ``data`` does not divide the devices, the axes need more devices than
        exist, E does not divide over an explicit ensemble axis (and ``pad`` is off), the
        batch does not divide over the data axis, or no data axis gives every JAX
        process a device.
    """
    if num_devices % data:
        raise MeshError(
            f"mesh.data={data} does not divide the {num_devices} devices",
            fix=f"set mesh.data to a divisor of {num_devices}",
        )
    room = num_devices // data
    if ensemble is None:
        ensemble = max(d for d in range(1, min(room, num_members) + 1) if num_members % d == 0)
    if ensemble * data > num_devices:
        raise MeshError(
            f"mesh.ensemble={ensemble} x mesh.data={data} needs {ensemble * data} devices but only {num_devices} exist",
            fix=f"lower them or set XLA_FLAGS=--xla_force_host_platform_device_count={ensemble * data} on CPU",
        )
    if ensemble * data < processes:
        data = _widened_data(ensemble, data, num_devices, batch_size, processes)
    padded = -(-num_members // ensemble) * ensemble
    if padded != num_members and not pad:
        raise MeshError(
            f"ensemble.size={num_members} does not split evenly over mesh.ensemble={ensemble}; "
            f"fix: choose a size divisible by {ensemble}, leave mesh.ensemble unset, or set "
            f"ensemble.pad=true to train {padded - num_members} extra member(s)"
        )
    if batch_size is not None and batch_size % data:
        raise MeshError(
            f"train.batch_size={batch_size} does not split over mesh.data={data}", fix=f"use a multiple of {data}"
        )
    return MeshPlan(ensemble=ensemble, data=data, num_members=num_members, padded_members=padded)


def _widened_data(ensemble: int, data: int, num_devices: int, batch_size: int | None, processes: int) -> int:
    """The smallest data axis, a multiple of ``data`` dividing ``num_devices`` and the
    batch, with ``ensemble x data`` devices for ``processes`` processes (see :func:`plan_mesh`)."""
    for wider in range(data + 1, num_devices // ensemble + 1):
        if num_devices % wider or wider % data or (batch_size is not None and batch_size % wider):
            continue
        if ensemble * wider >= processes:
            return wider
    raise MeshError(
        f"the mesh (ensemble {ensemble} x data {data}) has {ensemble * data} device(s) for {processes} JAX "
        f"processes, and no wider mesh.data that divides the {num_devices} devices"
        + (f" and train.batch_size={batch_size}" if batch_size is not None else "")
        + " gives each process one",
        fix=f"use a train.batch_size divisible by {processes}, an ensemble.size of at least {processes}, "
        f"or distributed.num_processes=1",
    )


def mesh_devices(devices: list, count: int) -> list:
    """``count`` of ``devices`` for a mesh, spread as evenly as possible over their JAX
    processes (``device.process_index``): the first ``ceil`` or ``floor(count / P)`` of
    each process's devices, process by process. With one process (or ``count`` covering
    every device) the first ``count``, in order.

    The mesh of one program across JAX processes (``distributed.num_processes``) must hold
    devices of every process: a process with none of them cannot take part (JAX's
    collectives and checkpoint writes wait for it). Consecutive devices of one process
    make the ``data`` axis of a member lie within a process where it can.
    """
    by_process: dict[int, list] = {}
    for device in devices:
        by_process.setdefault(device.process_index, []).append(device)
    if len(by_process) == 1 or count >= len(devices):
        return list(devices)[:count]
    n = len(by_process)
    shares = [count // n + (1 if i < count % n else 0) for i in range(n)]
    chosen = [d for share, local in zip(shares, by_process.values(), strict=True) for d in local[:share]]
    if len(chosen) < count:  # processes with unequal devices: fill from the rest, in order
        chosen += [d for d in devices if d not in chosen][: count - len(chosen)]
    return chosen


def make_mesh(plan: MeshPlan, devices=None) -> Mesh:
    """A ``Mesh`` of shape ``(plan.ensemble, plan.data)`` over ``plan.ensemble * plan.data``
    of ``devices`` (default ``jax.devices()``), spread over their JAX processes by
    :func:`mesh_devices`."""
    devices = mesh_devices(list(devices if devices is not None else jax.devices()), plan.ensemble * plan.data)
    return jax.make_mesh(
        (plan.ensemble, plan.data),
        (ENSEMBLE_AXIS, DATA_AXIS),
        axis_types=(jax.sharding.AxisType.Auto,) * 2,
        devices=devices,
    )


def member_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (member) axis over ``'ensemble'``, the rest replicated."""
    return NamedSharding(mesh, P(ENSEMBLE_AXIS))


def host_value(x) -> np.ndarray:
    """``x`` as one numpy array on this host: ``np.asarray`` for a value this process holds
    whole; for a ``jax.Array`` spread over devices of other JAX processes (a mesh across
    processes, :mod:`ensemble_core.runs.training.processes`) every process must call this at the same
    point: the value is gathered with ``jax.experimental.multihost_utils.process_allgather``
    (a collective)."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())
