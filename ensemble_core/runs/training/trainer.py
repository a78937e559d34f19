"""Training a run: resume from its checkpoints, checkpoint as it goes, stop on a signal.

The math and the epoch loop are :func:`ensemble_core.train.fit` (pure steps, no I/O);
this module adds what needs the run directory, as the loop's callbacks: the lock, orbax
checkpoints with the data position (:class:`_Checkpoints`), the resume policy
(:mod:`ensemble_core.runs.storage.resume`), SIGTERM/SIGINT turned into a checkpoint and a clean
stop, and the sessions of training a run went through. One call trains the whole
ensemble or one member group; :mod:`ensemble_core.runs.training.groups` trains every group and
joins them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np

from ensemble_core import diskspace, stopping
from ensemble_core.config import PipelineConfig
from ensemble_core.data import DatasetInfo
from ensemble_core.ensemble_setup import EnsembleSetup, build, group_size
from ensemble_core.errors import DivergenceError, PreemptedError, resume_fix
from ensemble_core.mesh import host_value, replicated
from ensemble_core.networks import members_per_network
from ensemble_core.runs.dataset import load
from ensemble_core.runs.results import TrainingSummary, TrainingTiming
from ensemble_core.runs.storage.checkpoint import (
    EnsembleCheckpointer,
    checkpoint_meta,
    dataset_record,
    training_sessions,
)
from ensemble_core.runs.storage.layout import RunDir, owning_run
from ensemble_core.runs.storage.lock import run_lock
from ensemble_core.runs.storage.records import read_plan
from ensemble_core.runs.storage.resume import check_resumable, config_changes, resumable_settings
from ensemble_core.runs.training.summary import images_per_s, member_records, where_trained
from ensemble_core.train import DataPosition, EnsembleState, data_position, fit

__all__ = ["Hooks", "TrainingRun", "train"]


@dataclasses.dataclass(frozen=True)
class Hooks:
    """The caller's callbacks of one training call (each optional).

    ``on_step(epoch, step_in_epoch, steps_per_epoch)`` after each step; ``on_epoch(record)``
    after each epoch (its ``history`` record, after its checkpoint); ``should_stop()``
    polled after each step: True stops at that step boundary, after a checkpoint there.
    """

    on_step: Callable[[int, int, int], None] | None = None
    on_epoch: Callable[[dict], None] | None = None
    should_stop: Callable[[], bool] | None = None


@dataclasses.dataclass(frozen=True)
class TrainingRun:
    """What one training call trains, where, and on what (built by :func:`prepare_training`).

    ``run`` is the run directory, or member group ``group``'s directory in it;
    ``own_run_dir``: this call takes the run directory's lock and turns SIGTERM/SIGINT
    into a stop (False in the JAX processes of one program, whose launcher does both);
    ``worker``: the Dask worker's address the task layer passes, recorded in the topology.
    """

    cfg: PipelineConfig
    dataset: DatasetInfo
    run: RunDir
    setup: EnsembleSetup
    group: int | None = None
    worker: str | None = None
    own_run_dir: bool = True

    @property
    def run_name(self) -> str:
        """The name of the run this trains for, the one to rerun (a member group trains in
        ``<run>/groups/<g>/``, a stratified pool in ``<run>/stratified/``: :func:`owning_run`)."""
        return owning_run(self.run.path).name

    @property
    def members(self) -> int:
        """The members this call trains, padding excluded (E, or E/G for a group)."""
        return group_size(self.cfg) if self.group is not None else self.cfg.ensemble.size

    @property
    def pool(self) -> RunDir:
        """The pool's directory: the run directory (a member group's parent), or a
        hyper-deep ensemble's ``<run>/stratified/``."""
        return RunDir(self.run.path.parent.parent) if self.group is not None else self.run

    @property
    def mesh(self) -> dict[str, int]:
        """``{"ensemble": axis size, "data": axis size}`` of this call's mesh."""
        return {"ensemble": self.setup.plan.ensemble, "data": self.setup.plan.data}


def prepare_training(
    cfg: PipelineConfig,
    dataset: DatasetInfo,
    run_dir: str | Path,
    *,
    group: int | None = None,
    strategy: str | None = None,
    worker: str | None = None,
    own_run_dir: bool = True,
) -> TrainingRun:
    """Build the mesh, model and step of one training call (the config was checked
    against the dataset by the preflight, :func:`ensemble_core.runs.preflight.preflight`).

    Raises:
      MeshError: the mesh cannot hold the members or the batch.
    """
    run = RunDir(Path(run_dir))
    setup = build(cfg, dataset.num_classes, strategy=strategy, group=group)
    return TrainingRun(cfg, dataset, run if group is None else run.group(group), setup, group, worker, own_run_dir)


@dataclasses.dataclass
class _Record:
    """What a checkpoint carries besides the state: where training is, what it did."""

    position: DataPosition
    history: list[dict] = dataclasses.field(default_factory=list)
    sessions: list[dict] = dataclasses.field(default_factory=list)
    resumed_from: int | None = None  # the epoch of the checkpoint this call resumed from


def _resume(ckpt: EnsembleCheckpointer, state: EnsembleState, training: TrainingRun) -> tuple[EnsembleState, _Record]:
    """The newest readable compatible checkpoint (or ``state`` from scratch), and a new
    training session: the keys that may change on resume, what changed since the
    checkpoint, and the devices."""
    record, changed = _Record(data_position(0)), {}
    if ckpt.latest_step() is not None:
        padded = training.setup.plan.padded_members
        state, meta, _ = ckpt.restore_latest_valid(
            state, check=lambda m: check_resumable(m, training.cfg, training.run.path, padded)
        )
        sessions = training_sessions(meta)
        record = _Record(meta["data_position"], list(meta["history"]), sessions, int(meta["epoch"]))
        changed = {k: [old, new] for k, (old, new) in config_changes(meta["config"], training.cfg).items()}
    record.sessions.append(
        {
            "start_epoch": record.position["epoch"],
            "start_step": int(state.step),
            "end_epoch": None,
            "end_step": None,
            "settings": resumable_settings(training.cfg),
            "changed": changed,
            "mesh": training.mesh,
            "strategy": training.setup.strategy,
            "backend": jax.default_backend(),
            "devices": jax.device_count(),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
    )
    return state, record


class _Checkpoints:
    """The epoch loop's I/O: a checkpoint every ``checkpoint.every_epochs``, at the end, on
    divergence with ``train.on_divergence=fail`` and at a stop; the caller's ``on_epoch``."""

    def __init__(self, ckpt: EnsembleCheckpointer, training: TrainingRun, record: _Record, on_epoch) -> None:
        self.ckpt, self.training, self.record, self.on_epoch = ckpt, training, record, on_epoch
        self.saved: set[int] = set()
        self.seconds = 0.0  # wall time of the saves and of waiting for the last one to be written

    def save(self, state, position: DataPosition) -> None:
        t0 = time.perf_counter()
        try:
            self._save(state, position)
        finally:
            self.seconds += time.perf_counter() - t0

    def _save(self, state, position: DataPosition) -> None:
        step = int(state.step)
        if step in self.saved:  # e.g. a stop right after an epoch's checkpoint
            return
        self.saved.add(step)
        self.record.sessions[-1].update(end_epoch=position["epoch"], end_step=step)
        meta = checkpoint_meta(
            self.training.cfg,
            step=step,
            position=position,
            members_trained=self.training.setup.plan.padded_members,
            healthy=host_value(state.healthy).tolist(),
            dataset=dataset_record(self.training.dataset),
            history=self.record.history,
            sessions=self.record.sessions,
        )
        self.ckpt.save(step, state, meta)

    def end_of_epoch(self, epoch: int, state, record: dict) -> None:
        """``fit``'s ``on_epoch_end``: record the epoch, checkpoint when due, report it.

        Raises:
          DivergenceError: a member diverged and ``train.on_divergence`` is ``fail``
            (after a checkpoint of this epoch).
        """
        cfg = self.training.cfg
        healthy = host_value(state.healthy)
        record["diverged_members"] = np.flatnonzero(~healthy).tolist()
        self.record.history.append(record)
        done = epoch + 1
        fail = cfg.train.on_divergence == "fail" and not healthy.all()
        if done % cfg.checkpoint.every_epochs == 0 or done == cfg.train.epochs or fail:
            self.save(state, data_position(done))
        if self.on_epoch is not None:
            self.on_epoch(record)
        if fail:
            self.ckpt.wait()
            raise DivergenceError(
                f"member(s) {record['diverged_members']} diverged (non-finite loss or parameters) in epoch "
                f"{done}; train.on_divergence=fail stops the run",
                fix="lower train.learning_rate, or set train.on_divergence=freeze to train on without them",
            )

    def finish(self, state, timing: dict) -> int | None:
        """After the loop: a checkpoint where a stop ended it; returns the newest step.

        Raises:
          PreemptedError: training was stopped (the checkpoint there is saved).
        """
        session, stop = self.record.sessions[-1], timing["stopped_at"]
        if session["end_step"] is None and stop is None:
            self.record.sessions.pop()  # a finished run re-run: nothing was trained
        if stop is not None:
            self.save(state, stop)
            self.ckpt.wait()
            raise PreemptedError(
                f"training stopped at epoch {stop['epoch'] + 1}, step {stop['step_in_epoch']} (global step "
                f"{int(state.step)}); a checkpoint was saved there",
                fix=resume_fix(self.training.run_name),
            )
        t0 = time.perf_counter()
        self.ckpt.wait()
        self.seconds += time.perf_counter() - t0
        timing["checkpoint_seconds"] = self.seconds
        return self.ckpt.latest_step()


def _member_keys(training: TrainingRun) -> dict[str, jax.Array]:
    """The keys of the members this call trains, derived where they are used: from
    ``(seed, i)``, or ``(seed, setting, j)`` in a stratified pool (a pool directory with
    a ``plan.json``, :func:`ensemble_core.runs.storage.records.read_plan`)."""
    return training.setup.member_keys(read_plan(training.pool.path))


def _lock_wait(training: TrainingRun) -> float:
    """A member group waits for its lock (a trainer cut off from the cluster stopping,
    ``distributed.group_lock_wait_s``); a whole run refuses at once."""
    return training.cfg.distributed.group_lock_wait_s if training.group is not None else 0.0


def execute_training(training: TrainingRun, hooks: Hooks = Hooks()) -> TrainingSummary:
    """:func:`train` on a built :class:`TrainingRun`: load, resume, the epoch loop with the
    checkpoint callbacks, the summary. Arguments, results and errors as :func:`train`."""
    cfg, setup = training.cfg, training.setup
    t0 = time.perf_counter()
    member_key = _member_keys(training)
    images, labels = load(cfg, training.dataset, "train")
    validate = setup.validation(*load(cfg, training.dataset, "validation")) if cfg.has_validation else None
    data_seconds = time.perf_counter() - t0
    validation_seconds = 0.0

    def validated(epoch: int, state):  # the validation hook, timed (fit's end_of_epoch)
        nonlocal validation_seconds
        t0 = time.perf_counter()
        try:
            return validate(epoch, state)  # type: ignore[misc]  # only passed when validate is set
        finally:
            validation_seconds += time.perf_counter() - t0

    t0 = time.perf_counter()
    state = setup.init_state(member_key["init"], training.dataset.image_shape)
    with (
        run_lock(training.run.path, _lock_wait(training)) if training.own_run_dir else contextlib.nullcontext(),
        EnsembleCheckpointer(training.run.checkpoints, keep=cfg.checkpoint.keep) as ckpt,
        stopping.stop_signals() if training.own_run_dir else contextlib.nullcontext(),
        stopping.outside_stage(),  # validation batches must not stop training before its checkpoint
    ):
        state, record = _resume(ckpt, state, training)
        initialisation_seconds = time.perf_counter() - t0  # the checkpointer opened, and any restore
        checkpoints = _Checkpoints(ckpt, training, record, hooks.on_epoch)
        t0 = time.perf_counter()
        on_devices = (jax.device_put(images, replicated(setup.mesh)), jax.device_put(labels, replicated(setup.mesh)))
        data_seconds += time.perf_counter() - t0
        state, timing = fit(
            state,
            setup.train_step(),
            *on_devices,
            member_key["data"],
            setup.mesh,
            stochastic_keys=member_key["stochastic"],
            epochs=cfg.train.epochs,
            batch_size=cfg.train.batch_size,
            start=record.position,
            learning_rates=setup.learning_rates(len(images)),
            end_of_epoch=validated if validate is not None else None,
            on_step=hooks.on_step,
            on_epoch_end=checkpoints.end_of_epoch,
            # A stop request from a signal in any thread's run (a member group on a thread
            # pool never receives one itself), or the caller's.
            should_stop=lambda: stopping.requested() is not None or bool(hooks.should_stop and hooks.should_stop()),
        )
        timing["validation_seconds"] = validation_seconds
        timing["data_seconds"] = data_seconds
        timing["initialisation_seconds"] = initialisation_seconds
        step = checkpoints.finish(state, timing)
        t0 = time.perf_counter()
    timing["checkpoint_seconds"] += time.perf_counter() - t0  # closing the checkpointer: its last writes
    return _summary(training, state, timing, record, step)


def _summary(training: TrainingRun, state, timing: dict, record: _Record, step: int | None) -> TrainingSummary:
    setup, members = training.setup, training.members
    # a network of M members (batch_ensemble, packed) trains M member-images per image
    timing["train_member_images_per_s"] = images_per_s(
        timing["steps"],
        training.cfg.train.batch_size,
        members * members_per_network(training.cfg),
        timing["train_seconds"],
    )
    trained = range(setup.first_member, setup.first_member + members)
    return TrainingSummary(
        checkpoint_dir=str(training.run.checkpoints),
        checkpoint_step=step,
        history=record.history,
        timing=TrainingTiming(**timing),
        mesh=training.mesh,
        members_trained=setup.plan.padded_members,
        strategy=setup.strategy,
        backend=jax.default_backend(),
        devices=jax.device_count(),
        resumed_from=record.resumed_from,
        sessions=record.sessions,
        diverged_members=(setup.first_member + np.flatnonzero(~host_value(state.healthy)[:members])).tolist(),
        members=member_records(state, setup.hyperparameters()[:members], setup.first_member),
        topology=[where_trained(training.group, trained, training.mesh, setup.strategy, timing, training.worker)],
    )


@diskspace.output_errors("run_dir")
def train(
    cfg: PipelineConfig,
    dataset: DatasetInfo,
    run_dir: str | Path,
    *,
    group: int | None = None,
    strategy: str | None = None,
    worker: str | None = None,
    on_step: Callable[[int, int, int], None] | None = None,
    on_epoch: Callable[[dict], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    own_run_dir: bool = True,
) -> TrainingSummary:
    """Train (or resume) the ensemble, checkpointing under ``run_dir/checkpoints``; with
    ``group``, train member group ``group`` only, under ``run_dir/groups/<group>/``
    (its own lock and checkpoints: groups train and resume independently, and
    :func:`ensemble_core.runs.training.groups.gather_groups` joins them).

    Holds the run directory's lock for the whole training. If ``run_dir`` already holds a
    checkpoint of a compatible config, training resumes from its data position (epoch
    and step) with the same data order. Checkpoint names are global optimizer steps.
    SIGTERM or SIGINT (in the main thread) or ``should_stop()`` stops training at the next
    step boundary, after a checkpoint there has been written.

    Args:
      group: a member group index ``0..distributed.member_groups-1``.
      strategy: overrides ``mesh.member_strategy``.
      worker: the Dask worker's address running this call (the task layer's), recorded
        in the topology.
      on_step, on_epoch, should_stop: the :class:`Hooks`.
      own_run_dir: take the run directory's lock and turn SIGTERM/SIGINT into a stop (on
        by default; off in the JAX processes of one program, whose launcher holds the
        lock and stops them all, :mod:`ensemble_core.runs.training.processes`).

    Returns:
      The :class:`~ensemble_core.runs.results.TrainingSummary`.

    Raises:
      IncompatibleRunError: the run directory holds checkpoints of another config.
      RunLockedError: another process trains in this run directory.
      PreemptedError: stopped by SIGTERM / SIGINT / ``should_stop`` (a checkpoint was saved).
      DivergenceError: a member diverged and ``train.on_divergence`` is ``fail``.
    """
    run_name = owning_run(run_dir).name
    sig = stopping.requested()
    if sig is not None:  # e.g. a member group queued behind one that stopped
        what = "training" if group is None else f"member group {group}"
        raise PreemptedError(f"stopped by {sig.name} before {what} started", fix=resume_fix(run_name))
    t0 = time.perf_counter()
    training = prepare_training(
        cfg, dataset, run_dir, group=group, strategy=strategy, worker=worker, own_run_dir=own_run_dir
    )
    setup_seconds = time.perf_counter() - t0
    summary = execute_training(training, Hooks(on_step=on_step, on_epoch=on_epoch, should_stop=should_stop))
    timing = summary.timing.model_copy(
        update={"setup_seconds": setup_seconds, "call_seconds": time.perf_counter() - t0}
    )
    return summary.model_copy(update={"timing": timing})
