"""What every caller of training or prediction builds from a config, built in one place.

:func:`build` turns a :class:`~ensemble_core.config.PipelineConfig` and the dataset's
class count into an :class:`EnsembleSetup`: the mesh plan and mesh, the Flax model (by
``model.name``, :mod:`ensemble_core.models`), the optax optimizer, the member strategy,
and from those the member keys, the initial state, the train step and the predict
function. The run layer, the benchmarks and the tests all start here, so "which mesh,
which model, which keys" is decided once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import jax
import numpy as np
import optax
from jax.sharding import Mesh

from ensemble_core.config import PipelineConfig
from ensemble_core.errors import ConfigError
from ensemble_core.mesh import MeshPlan, make_mesh, plan_mesh
from ensemble_core.networks import build_network, members_per_network
from ensemble_core.predict import make_predict
from ensemble_core.rngs import member_keys, stratified_member_keys
from ensemble_core.train import (
    EnsembleState,
    default_strategy,
    init_ensemble,
    learning_rate_table,
    make_optimizer,
    make_train_step,
)
from ensemble_core.train.forward import Network

if TYPE_CHECKING:
    from ensemble_core.stratification import StratificationPlan


def group_size(cfg: PipelineConfig) -> int:
    """Members per group: ``ensemble.size // distributed.member_groups`` (E when G = 1)."""
    return cfg.ensemble.size // cfg.distributed.member_groups


def plan(
    cfg: PipelineConfig, num_devices: int | None = None, *, group: bool = False, processes: int | None = None
) -> MeshPlan:
    """The mesh for ``cfg`` on ``num_devices`` (default: every device JAX sees); with
    ``group``, the mesh of one member group (:func:`group_size` members).

    ``processes``: the JAX processes the devices belong to (default: ``jax.process_count()``
    for every device JAX sees, else 1); a mesh gives each one a device
    (:func:`~ensemble_core.mesh.plan_mesh`). The launcher plans the processes it will
    start with ``processes=distributed.num_processes``.

    Raises:
      MeshError: the layout cannot hold E members and the batch (before any compute).
    """
    return plan_mesh(
        group_size(cfg) if group else cfg.ensemble.size,
        jax.device_count() if num_devices is None else num_devices,
        data=cfg.mesh.data,
        ensemble=cfg.mesh.ensemble,
        pad=cfg.ensemble.pad,
        batch_size=cfg.train.batch_size,
        processes=processes or (jax.process_count() if num_devices is None else 1),
    )


def resolve_strategy(cfg: PipelineConfig) -> str:
    """``mesh.member_strategy``, with 'auto' resolved for the current backend
    (:func:`ensemble_core.train.default_strategy`)."""
    if cfg.mesh.member_strategy != "auto":
        return cfg.mesh.member_strategy
    return default_strategy(jax.default_backend())


@dataclasses.dataclass(frozen=True)
class EnsembleSetup:
    """Everything built from a config that training and prediction share.

    Attributes:
      config: the config it was built from.
      plan: the mesh plan (``padded_members`` members are trained).
      mesh: the ``('ensemble', 'data')`` device mesh.
      model: the Flax module of one member (``num_classes`` logits).
      optimizer: the optax transformation of one member (learning rate in its state).
      strategy: 'vmap' or 'unroll' (how members on one device are mapped).
      first_member: the index of its first member in the whole ensemble: 0, or
        ``g * E/G`` for member group g (its members' keys and hyperparameters are those of
        members ``first_member ..``, so member i is the same network in any group layout).
    """

    config: PipelineConfig
    plan: MeshPlan
    mesh: Mesh
    model: Network
    optimizer: optax.GradientTransformation
    strategy: str
    first_member: int = 0
    #: predict programs already built, by (logits, stochastic): one jitted function each, so
    #: later calls reuse its traces instead of tracing the network again
    _predict_programs: dict = dataclasses.field(default_factory=dict, init=False, compare=False, repr=False)

    @property
    def one_member_per_device(self) -> bool:
        """Whether prediction evaluates the members in groups of one member per device
        (:func:`ensemble_core.predict.member_probs`'s ``one_member_per_device``): with the
        'unroll' strategy, so each device's working set is that of a single network."""
        return self.strategy == "unroll"

    def member_keys(self, stratification: StratificationPlan | None = None) -> dict[str, jax.Array]:
        """Typed keys ``{"init": [E_padded], "data": [E_padded], "stochastic": [E_padded]}`` of
        members ``first_member ..``: from ``(seed, i)`` (:func:`ensemble_core.rngs.member_keys`),
        or, for a hyper-deep ensemble's stratified pool, from ``(seed, setting, j)`` of
        ``stratification`` (:func:`ensemble_core.rngs.stratified_member_keys`). The one
        source of member keys: any member group, process or resume derives the same ones."""
        first, count = self.first_member, self.plan.padded_members
        if stratification is not None:
            return stratified_member_keys(self.config.seed, stratification.pairs(first, count))
        keys = member_keys(self.config.seed, first + count)
        return {purpose: k[first:] for purpose, k in keys.items()}

    def hyperparameters(self) -> list[dict]:
        """Every trained member's hyperparameters (``E_padded`` dicts, members
        ``first_member ..``, :meth:`ensemble_core.config.PipelineConfig.member_hyperparameters`)."""
        return self.config.member_hyperparameters(self.first_member + self.plan.padded_members)[self.first_member :]

    def init_state(self, init_keys: jax.Array, image_shape: tuple[int, ...], abstract: bool = False) -> EnsembleState:
        """Member i initialised from ``init_keys[i]`` with its hyperparameters; leaves
        ``[E_padded, ...]`` sharded over ``'ensemble'``, with best-epoch tracking when the
        config holds out a validation split (:func:`ensemble_core.train.init_ensemble`;
        ``abstract``: its shapes, dtypes and shardings only)."""
        return init_ensemble(
            self.model,
            self.optimizer,
            init_keys,
            tuple(image_shape),
            self.mesh,
            hyperparameters=self.hyperparameters(),
            track_best=self.config.has_validation,
            member_choice=self.config.train.member_choice,
            abstract=abstract,
        )

    def learning_rates(self, num_train: int) -> Callable[[int], np.ndarray]:
        """``rates(epoch) -> float32 [steps, E_padded]`` for a training split of
        ``num_train`` examples (:func:`ensemble_core.train.learning_rate_table`)."""
        steps = num_train // self.config.train.batch_size
        return learning_rate_table(self.hyperparameters(), steps, self.config.train.epochs)

    def validation(self, images: np.ndarray, labels: np.ndarray) -> Callable:
        """The ``end_of_epoch`` hook that validates every member on ``images``/``labels``
        and tracks best epochs and early stopping (:func:`ensemble_core.validation.make_validation`)."""
        from ensemble_core.validation import make_validation

        return make_validation(
            self.predict_fn(),
            images,
            labels,
            self.mesh,
            self.config.eval.batch_size,
            patience=self.config.train.patience,
            one_member_per_device=self.one_member_per_device,
        )

    def abstract_state(self, image_shape: tuple[int, ...]) -> EnsembleState:
        """The state's shapes, dtypes and shardings (``jax.ShapeDtypeStruct`` leaves),
        computed without allocating: the target a checkpoint is restored onto."""
        return self.init_state(self.member_keys()["init"], image_shape, abstract=True)

    def train_step(self, donate: bool | None = None) -> Callable:
        """The jitted step (:func:`ensemble_core.train.make_train_step`) at the compute
        precision ``train.precision``."""
        augment = self.config.data.augment
        return make_train_step(
            self.model,
            self.optimizer,
            self.mesh,
            self.strategy,
            donate=donate,
            crop_padding=augment.crop_padding,
            flip=augment.flip,
            precision=self.config.train.precision,
        )

    def predict_fn(self, *, logits: bool = False, stochastic: bool = False) -> Callable:
        """The jitted ``predict(params, images) -> member_probs`` (or member logits)
        (:func:`ensemble_core.predict.make_predict`), at the compute precision the members
        train at (``train.precision``); float32 outputs. ``stochastic``: one MC dropout
        pass (``make_predict``'s ``stochastic``). Built once per setup and kind: every call
        returns the same function, whose traces and compiled programs JAX keeps."""
        key = (logits, stochastic)
        if key not in self._predict_programs:
            self._predict_programs[key] = make_predict(
                self.model,
                self.mesh,
                self.strategy,
                logits=logits,
                precision=self.config.train.precision,
                stochastic=stochastic,
                outputs=members_per_network(self.config),
            )
        return self._predict_programs[key]


def build(
    cfg: PipelineConfig,
    num_classes: int,
    *,
    strategy: str | None = None,
    num_devices: int | None = None,
    group: int | None = None,
) -> EnsembleSetup:
    """The :class:`EnsembleSetup` of ``cfg`` for a dataset of ``num_classes`` classes.

    Args:
      strategy: overrides ``mesh.member_strategy`` (benchmarks compare both).
      num_devices: use the first ``num_devices`` devices (default: all).
      group: build member group ``group`` of ``distributed.member_groups`` (members
        ``group * E/G .. (group + 1) * E/G - 1``) instead of the whole ensemble.

    Raises:
      MeshError: see :func:`plan`. ConfigError: an unknown model or optimizer, or a
        group index out of range.
    """
    groups = cfg.distributed.member_groups
    if group is not None and not 0 <= group < groups:
        raise ConfigError(f"member group {group} of distributed.member_groups={groups}", fix=f"use 0..{groups - 1}")
    mesh_plan = plan(cfg, num_devices, group=group is not None)
    devices = None if num_devices is None else jax.devices()[:num_devices]
    return EnsembleSetup(
        config=cfg,
        plan=mesh_plan,
        mesh=make_mesh(mesh_plan, devices),
        model=build_network(cfg, num_classes),
        optimizer=make_optimizer(cfg.train),
        strategy=strategy or resolve_strategy(cfg),
        first_member=0 if group is None else group * group_size(cfg),
    )
