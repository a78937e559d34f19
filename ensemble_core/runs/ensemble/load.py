"""A run's ensemble, loaded: restore the pool's checkpoint, then the members the run's
``selection.json`` names (every trained member without one). The one definition of "a
run's ensemble" that evaluation, prediction, the drift check and the champion's
re-evaluation share."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from ensemble_core import mc_dropout
from ensemble_core.config import PipelineConfig
from ensemble_core.decisions import DecisionRules
from ensemble_core.ensemble_setup import EnsembleSetup, build
from ensemble_core.errors import DivergenceError
from ensemble_core.mesh import member_sharding
from ensemble_core.networks import members_per_network
from ensemble_core.predict import compile_member_probs, member_probs
from ensemble_core.runs.ensemble.pool import final_pool
from ensemble_core.runs.storage.checkpoint import EnsembleCheckpointer
from ensemble_core.runs.storage.layout import RunDir
from ensemble_core.runs.storage.records import read_decisions, read_selection
from ensemble_core.train import EnsembleState


def restore(
    cfg: PipelineConfig, run_dir: str | Path, num_classes: int, image_shape, *, strategy: str | None = None
) -> tuple[EnsembleState, EnsembleSetup]:
    """Restore the latest checkpoint of ``run_dir`` onto the mesh ``cfg`` asks for
    (``strategy`` overrides ``mesh.member_strategy``).

    Returns:
      ``(state, setup)``: the :class:`~ensemble_core.train.EnsembleState` (leaves
      ``[E_trained, ...]``) and the :class:`~ensemble_core.ensemble_setup.EnsembleSetup` it lives on.

    Raises:
      CheckpointError: no checkpoint, or one that does not fit ``cfg``.
    """
    setup = build(cfg, num_classes, strategy=strategy)
    run = RunDir(Path(run_dir))
    with EnsembleCheckpointer(run.checkpoints, read_only=True) as ckpt:
        state, _ = ckpt.restore(setup.abstract_state(tuple(image_shape)))
    return state, setup


@dataclasses.dataclass(frozen=True)
class Members:
    """Members of a pool, ready to predict.

    Every trained member (:func:`all_members`: padding dropped, diverged ones marked in
    ``healthy``) or a selection's multiset (:func:`selected_members`: one row per pick, so
    a member picked twice has two equal rows and the mean over rows is the selection's
    weighted ensemble).

    Attributes:
      variables: the Flax variables (parameters and mutable collections) of the distinct
        members that are predicted (leaves ``[U, ...]`` on ``setup``'s mesh; each member's
        best epoch with a validation split).
      setup: the :class:`~ensemble_core.ensemble_setup.EnsembleSetup` they live on.
      rows: pool index of every row, int ``[K]``.
      healthy: bool ``[K]``.
      expand: int ``[K]``: row k is ``variables`` member ``expand[k]``.
      outputs: int ``[K]`` or None: row k is output ``outputs[k]`` of its network
        (:func:`all_members`): with ``ensemble.method=mc_dropout`` its MC dropout pass
        (:mod:`ensemble_core.mc_dropout`, ``ensemble.mc_samples`` per network), with
        ``batch_ensemble`` or ``packed`` its member inside the network
        (:mod:`ensemble_core.networks`, ``ensemble.members_per_network``); None: each row is
        its network's one deterministic prediction.
    """

    variables: Any
    setup: EnsembleSetup
    rows: np.ndarray
    healthy: np.ndarray
    expand: np.ndarray
    outputs: np.ndarray | None = None
    #: the programs already compiled and run once ((logits, batch size, image shape, dtype))
    warm: set = dataclasses.field(default_factory=set, compare=False, repr=False)

    def predict(self, cfg: PipelineConfig, images: np.ndarray, *, logits: bool = False) -> tuple[np.ndarray, float]:
        """Probabilities float32 ``[K, N, C]`` (``logits``: the logits before the softmax)
        of every row on ``images`` (float or uint8 ``[N, H, W, C]``) and the steady-state
        throughput in member-images/s (a program not used before is compiled and run first,
        on one chunk of ``images`` (:func:`~ensemble_core.predict.compile_member_probs`), and
        that run is not timed)."""
        if cfg.ensemble.method == "mc_dropout":
            return self._predict_passes(cfg, images, logits=logits)
        predict = self.setup.predict_fn(logits=logits)
        one = self.setup.one_member_per_device
        batch = cfg.eval.batch_size
        program = (logits, batch, images.shape[1:], images.dtype.str)
        if program not in self.warm:
            compile_member_probs(predict, self.variables, images, self.setup.mesh, batch, one_member_per_device=one)
            self.warm.add(program)
        t0 = time.perf_counter()
        probs = member_probs(predict, self.variables, images, self.setup.mesh, batch, one_member_per_device=one)
        seconds = time.perf_counter() - t0
        distinct = int(self.expand.max()) + 1
        throughput = distinct * probs.shape[-2] / seconds
        if self.outputs is not None:  # [U, M, N, C]: networks of M members
            return probs[self.expand, self.outputs], throughput * probs.shape[1]
        return probs[self.expand], throughput

    def _predict_passes(self, cfg: PipelineConfig, images: np.ndarray, *, logits: bool) -> tuple[np.ndarray, float]:
        """:meth:`predict` of MC dropout rows: every member's passes ``0 .. max(outputs)``
        (one program, each pass's keys :func:`ensemble_core.mc_dropout.pass_keys` from
        ``cfg.seed``), then row k's ``(expand[k], outputs[k])``; the throughput counts passes."""
        assert self.outputs is not None
        predict = self.setup.predict_fn(logits=logits, stochastic=True)
        one, batch, mesh = self.setup.one_member_per_device, cfg.eval.batch_size, self.setup.mesh
        members = jax.tree.leaves(self.variables)[0].shape[0]
        sharding = member_sharding(mesh)

        def pass_variables(t: int) -> tuple[Any, jax.Array]:
            return self.variables, jax.device_put(mc_dropout.pass_keys(cfg.seed, members, t), sharding)

        def one_pass(t: int, x: np.ndarray) -> np.ndarray:
            return member_probs(predict, pass_variables(t), x, mesh, batch, one_member_per_device=one, indexed=True)

        program = ("passes", logits, batch, images.shape[1:], images.dtype.str)
        if program not in self.warm:
            compile_member_probs(
                predict, pass_variables(0), images, mesh, batch, one_member_per_device=one, indexed=True
            )
            self.warm.add(program)
        t0 = time.perf_counter()
        probs = np.stack([one_pass(t, images) for t in range(int(self.outputs.max()) + 1)], axis=1)  # [U, T, N, C]
        seconds = time.perf_counter() - t0
        throughput = (int(self.expand.max()) + 1) * probs.shape[1] * probs.shape[2] / seconds
        return probs[self.expand, self.outputs], throughput


def all_members(cfg: PipelineConfig, state: EnsembleState, setup: EnsembleSetup) -> Members:
    """Every trained member of ``state`` (padding dropped at prediction); with
    ``ensemble.method=mc_dropout`` each network's ``ensemble.mc_samples`` passes, with
    ``batch_ensemble`` or ``packed`` each network's ``members_per_network`` members, network
    by network (rows ``u * T + t``; ``rows`` holds the network's index)."""
    e = cfg.ensemble.size
    per = cfg.ensemble.mc_samples if cfg.ensemble.method == "mc_dropout" else members_per_network(cfg)
    if cfg.ensemble.method != "deep":
        return Members(
            variables=state.final_variables,
            setup=setup,
            rows=np.repeat(np.arange(e), per),
            healthy=np.repeat(np.asarray(state.healthy)[:e], per),
            expand=np.repeat(np.arange(e), per),
            outputs=np.tile(np.arange(per), e),
        )
    return Members(
        variables=state.final_variables,
        setup=setup,
        rows=np.arange(e),
        healthy=np.asarray(state.healthy)[:e],
        expand=np.arange(e),
    )


def selected_members(cfg: PipelineConfig, pool: Members, rows, num_classes: int) -> Members:
    """The members ``rows`` (indices into ``pool``, every trained member of the pool
    ``cfg`` configures; repeats allowed): the distinct ones are moved onto a mesh of their
    own (:func:`ensemble_core.ensemble_setup.build` for that many members)."""
    rows = np.asarray(rows, np.int64)
    distinct, expand = np.unique(rows, return_inverse=True)
    sub_cfg = cfg.model_copy(
        update={
            "ensemble": cfg.ensemble.model_copy(
                update={"size": len(distinct), "pad": False, "search": None, "select_size": None}
            ),
            "mesh": cfg.mesh.model_copy(update={"ensemble": None}),
        }
    )
    sub = build(sub_cfg, num_classes, strategy=pool.setup.strategy)
    sharding = member_sharding(sub.mesh)
    variables = jax.tree.map(lambda x: jax.device_put(np.asarray(x)[distinct], sharding), pool.variables)
    return Members(variables=variables, setup=sub, rows=rows, healthy=np.ones(len(rows), bool), expand=expand)


@dataclasses.dataclass(frozen=True)
class Ensemble:
    """A run's ensemble (:func:`load_ensemble`).

    Attributes:
      config: the config of its pool (a hyper-deep ensemble's stratified pool config).
      members: the :class:`Members` it averages.
      temperature: the temperature fitted by the select stage (None: not fitted).
      decisions: its prediction sets and abstention threshold, fitted by the select stage
        on the calibration split (:class:`ensemble_core.decisions.DecisionRules`; None: a
        run without them).
    """

    config: PipelineConfig
    members: Members
    temperature: float | None
    decisions: DecisionRules | None = None


def load_pool(
    cfg: PipelineConfig, run_dir: str | Path, num_classes: int, image_shape, *, strategy: str | None = None
) -> tuple[PipelineConfig, Members]:
    """The pool a run's ensemble is chosen from, restored: ``(pool config, every trained
    member)`` (a hyper-deep ensemble's stratified pool,
    :func:`ensemble_core.runs.ensemble.pool.final_pool`).

    Raises:
      CheckpointError: see :func:`restore` and :func:`~ensemble_core.runs.ensemble.pool.final_pool`.
      DivergenceError: every member diverged (there is no ensemble).
    """
    run = RunDir(Path(run_dir))
    pool_cfg, pool, _ = final_pool(cfg, run)
    state, setup = restore(pool_cfg, pool.path, num_classes, image_shape, strategy=strategy)
    if not np.asarray(state.healthy)[: pool_cfg.ensemble.size].any():
        raise DivergenceError(
            f"every member of '{run.path}' diverged, there is no ensemble",
            fix="lower train.learning_rate and train again",
        )
    members = all_members(pool_cfg, state, setup)
    return pool_cfg, members


def load_ensemble(
    cfg: PipelineConfig, run_dir: str | Path, num_classes: int, image_shape, *, strategy: str | None = None
) -> Ensemble:
    """The run's ensemble: the members and temperature its ``selection.json`` (the select
    stage's record, :func:`ensemble_core.runs.ensemble.select.select`) names, from its
    pool (:func:`load_pool`), with the prediction sets and abstention threshold of its
    ``decisions.json``; every trained member, no temperature, when the run has no
    ``selection.json`` (no validation split, or a damaged file set aside) or it names a
    selection ``cfg`` does not ask for (no ``ensemble.select_size``).

    Args:
      cfg: the run's config.
      num_classes, image_shape: the dataset's (``image_shape`` ``(H, W, C)``).

    Raises:
      CheckpointError, DivergenceError: see :func:`load_pool`.
    """
    run = RunDir(Path(run_dir))
    pool_cfg, members = load_pool(cfg, run.path, num_classes, image_shape, strategy=strategy)
    chosen = read_selection(run, len(members.rows))  # its indices are rows (E x M or E x T of other methods)
    if chosen is not None and cfg.ensemble.select_size is not None:
        members = selected_members(pool_cfg, members, chosen["members"], num_classes)
    temperature = None if chosen is None else chosen.get("temperature")
    # The rules were fitted on the ensemble selection.json names: without it (set aside) they do not apply.
    decisions = read_decisions(run) if chosen is not None or not cfg.has_validation else None
    return Ensemble(config=pool_cfg, members=members, temperature=temperature, decisions=decisions)
