"""How much memory training needs, estimated before anything is compiled or allocated.

The estimate is a *lower bound* of what every device must hold at once while training:

- the members' persistent state: parameters and the optimizer's slots (SGD with
  momentum: 1, Adam/AdamW: 2), float32, for every member on the device, plus the
  gradients of one member (XLA may apply each member's update before the next member's
  gradients exist), and every member's mutable collections (BatchNorm's ``batch_stats``;
  twice with a validation split, which keeps the best epoch's);
- the on-device augmentation of one batch (a padded and an augmented uint8 copy,
  :func:`ensemble_core.train.augment.augmentation_bytes`), per member mapped at once;
- one batch of forward activations (the outputs of every layer, from Flax's
  ``capture_intermediates`` or NNX's ``nnx.capture``), float32, of one member when the members on a device are
  unrolled (they may run one after the other) or of all of them when vmapped (one batched
  computation); backpropagation keeps at least these;
- the training split, which is placed on every device (uint8 images, int32 labels).

XLA's temporaries, the compiled program and the runtime come on top, so a config refused
on this bound cannot fit; one accepted may still be tight. Shapes come from
``jax.eval_shape`` (tracing only: no compile, no allocation).
"""

from __future__ import annotations

import dataclasses
import math
import os

import jax
import jax.numpy as jnp
import numpy as np

from ensemble_core.config import PipelineConfig
from ensemble_core.errors import ConfigError
from ensemble_core.mesh import MeshPlan
from ensemble_core.networks import build_network
from ensemble_core.train.augment import augmentation_bytes
from ensemble_core.train.forward import Network, activation_elements, init_variables, split_variables

GIB = 1024**3
OPTIMIZER_SLOTS = {"adam": 2, "adamw": 2}  # sgd: 1 with momentum, 0 without


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one device needs at least (see the module docstring), and the devices used."""

    params_per_member: int  # parameter count (elements)
    members_per_device: int
    state_bytes: int  # parameters + optimizer slots + mutable collections of every member, one member's gradients
    activation_bytes: int  # one batch of forward activations (one member, or all when vmapped)
    data_bytes: int  # the training split (uint8 images + int32 labels)
    devices: int  # devices the mesh uses
    collection_elements: int = 0  # mutable collections (e.g. batch_stats) per member (elements)
    augmentation_bytes: int = 0  # the augmented copies of one batch, for the members mapped at once

    @property
    def per_device_bytes(self) -> int:
        return self.state_bytes + self.activation_bytes + self.data_bytes + self.augmentation_bytes


def estimate(
    cfg: PipelineConfig,
    plan: MeshPlan,
    num_classes: int,
    image_shape,
    num_train: int,
    strategy: str = "unroll",
    model: Network | None = None,
) -> MemoryEstimate:
    """Lower bound of the training memory per device for ``cfg`` on ``plan``.

    Args:
      plan: the mesh (:func:`ensemble_core.ensemble_setup.plan`).
      strategy: ``mesh.member_strategy`` resolved (``unroll`` or ``vmap``).
      num_classes, image_shape ``(H, W, C)``, num_train: the dataset's (after
        ``data.max_train_examples``).
      model: the member network when the caller has built it already (None: built from ``cfg``,
        :func:`ensemble_core.networks.build_network`).

    With a validation split the state holds a second copy of every member's parameters
    (its best epoch's), counted with the optimizer slots.
    """
    model = model if model is not None else build_network(cfg, num_classes)
    variables = jax.eval_shape(lambda: init_variables(model, jax.random.key(0), tuple(image_shape)))
    params, model_state = split_variables(variables)
    count = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(params))
    collections = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(model_state))
    slots = OPTIMIZER_SLOTS.get(cfg.train.optimizer, 1 if cfg.train.momentum else 0)
    slots += 1 if cfg.has_validation else 0  # each member's best-epoch parameters (train.BestTracking)
    copies = 2 if cfg.has_validation else 1  # the latest and the best epoch's collections
    m = plan.members_per_device
    mapped = m if strategy == "vmap" else 1  # members whose step runs as one computation
    per_device_batch = max(1, cfg.train.batch_size // plan.data)
    batch = jax.ShapeDtypeStruct((per_device_batch, *image_shape), jnp.float32)
    act = activation_elements(model, variables, batch)
    augment, (height, width, channels) = cfg.data.augment, tuple(image_shape)
    return MemoryEstimate(
        params_per_member=count,
        members_per_device=m,
        state_bytes=m * count * 4 * (1 + slots) + count * 4 + m * collections * 4 * copies,
        activation_bytes=mapped * act * 4,
        data_bytes=num_train * (int(np.prod(image_shape)) + 4),
        devices=plan.ensemble * plan.data,
        collection_elements=collections,
        augmentation_bytes=mapped
        * augmentation_bytes(per_device_batch * plan.data, height, width, channels, augment.crop_padding, augment.flip),
    )


def available_bytes() -> tuple[int, str]:
    """(bytes, what) the estimate is compared with: on CPU the host's available memory
    (``MemAvailable`` of ``/proc/meminfo``; every simulated device shares it), else the
    first device's ``memory_stats()["bytes_limit"]``. ``(0, ...)`` when unknown."""
    device = jax.devices()[0]
    if device.platform != "cpu":
        stats = device.memory_stats() or {}
        return int(stats.get("bytes_limit", 0)), f"{device.device_kind} memory per device"
    return host_available_bytes()


def host_available_bytes() -> tuple[int, str]:
    """(bytes, what): the host's available memory (``MemAvailable`` of ``/proc/meminfo``,
    else the free pages), whatever the accelerator. ``(0, ...)`` when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "available host memory"
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "free host memory"
    except (OSError, ValueError):
        return 0, "host memory"


def check(est: MemoryEstimate, cfg: PipelineConfig, available: tuple[int, str] | None = None) -> None:
    """Refuse a config whose lower bound does not fit.

    On CPU the devices share the host's memory, so the bound of every device used counts;
    on an accelerator, one device's.

    Raises:
      ConfigError: with the estimate, its parts and the memory there is.
    """
    have, what = available if available is not None else available_bytes()
    if have <= 0:
        return
    shared = jax.devices()[0].platform == "cpu"
    need = est.per_device_bytes * (est.devices if shared else 1)
    if need <= have:
        return
    where = f"on each of {est.devices} devices that share it" if shared and est.devices > 1 else "per device"
    raise ConfigError(
        f"training ensemble.size={cfg.ensemble.size} ({est.members_per_device} member(s) per device, "
        f"{est.params_per_member:,} parameters each) needs at least {need / GIB:.1f} GiB of memory "
        f"({est.state_bytes / GIB:.2f} GiB parameters, collections and optimizer state, "
        f"{est.activation_bytes / GIB:.2f} GiB activations of one batch, {est.augmentation_bytes / GIB:.2f} GiB "
        f"augmented batch, {est.data_bytes / GIB:.2f} GiB training split, {where}) but the {what} is "
        f"{have / GIB:.1f} GiB",
        fix="lower ensemble.size, the model's size or train.batch_size, or spread the members over more devices",
    )
