"""Training a run: resume from its checkpoints, checkpoint as it goes, stop on a signal.

The math is :func:`ensemble_core.train.fit`; this module adds what needs the run
directory: the lock, orbax checkpoints with the data position, the resume policy
(:mod:`ensemble_core.runs.resume`), SIGTERM/SIGINT turned into a checkpoint and a clean
stop, and the stretches of training a run went through.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import jax
import numpy as np

from ensemble_core.config import PipelineConfig
from ensemble_core.data import DatasetInfo
from ensemble_core.errors import ConfigError, DivergenceError, PreemptedError
from ensemble_core.mesh import replicated
from ensemble_core.rngs import key_layout, keys_from_layout, member_keys
from ensemble_core.runs.checkpoint import EnsembleCheckpointer
from ensemble_core.runs.dataset import load
from ensemble_core.runs.layout import RunDir
from ensemble_core.runs.lock import run_lock
from ensemble_core.runs.preflight import check_against_dataset
from ensemble_core.runs.results import TrainingSummary, TrainingTiming
from ensemble_core.runs.resume import check_resumable, config_changes, resumable_settings
from ensemble_core.setup import build
from ensemble_core.train import DataPosition, data_position, fit

MemberKeyData = dict[str, list[list[int]]]


def split_keys(cfg: PipelineConfig, num_members: int) -> MemberKeyData:
    """Per-member keys (init, data order) for members ``0..num_members-1``, as raw uint32
    key data ``{purpose: [[k0, k1]] * num_members}`` (small and JSON-able: what the flow
    shows and hands to training). Member i's keys depend on ``(seed, i)`` only
    (:func:`ensemble_core.rngs.member_keys`)."""
    return key_layout(member_keys(cfg.seed, num_members))


@contextlib.contextmanager
def stop_signals() -> Iterator[threading.Event]:
    """While active (main thread only), SIGTERM and SIGINT (Ctrl-C) set the yielded event
    instead of killing: training stops at the next step boundary after a checkpoint.
    The previous handlers come back on exit."""
    event = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield event
        return
    previous = {sig: signal.signal(sig, lambda *_: event.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield event
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def train(
    cfg: PipelineConfig,
    dataset: DatasetInfo,
    keys: MemberKeyData,
    run_dir: str | Path,
    *,
    strategy: str | None = None,
    on_step: Callable[[int, int, int], None] | None = None,
    on_epoch: Callable[[dict], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> TrainingSummary:
    """Train (or resume) the ensemble, checkpointing under ``run_dir/checkpoints``.

    Holds the run directory's lock for the whole training. If ``run_dir`` already holds a
    checkpoint of a compatible config, training resumes from its data position (epoch
    and step) with the same data order. Checkpoint names are global optimizer steps.
    SIGTERM or SIGINT (in the main thread) or ``should_stop()`` stops training at the next
    step boundary, after a checkpoint there has been written.

    Args:
      keys: :func:`split_keys` for the mesh's ``padded_members`` members.
      strategy: overrides ``mesh.member_strategy``.
      on_step: ``on_step(epoch, step_in_epoch, steps_per_epoch)`` after each step.
      on_epoch: ``on_epoch(record)`` after each epoch (the ``history`` record).

    Returns:
      The :class:`~ensemble_core.runs.results.TrainingSummary`.

    Raises:
      ConfigError: ``keys`` are for another number of members, or the batch is larger
        than the training split.
      IncompatibleRunError: the run directory holds checkpoints of another config.
      RunLockedError: another process trains in this run directory.
      PreemptedError: stopped by SIGTERM / SIGINT / ``should_stop`` (a checkpoint was saved).
      DivergenceError: a member diverged and ``train.on_divergence`` is ``fail``.
    """
    run = RunDir(Path(run_dir))
    check_against_dataset(cfg, dataset)  # a batch larger than the split would train nothing
    setup = build(cfg, dataset.num_classes, strategy=strategy)
    mesh_plan = setup.plan
    member_key = keys_from_layout(keys)
    if len(member_key["init"]) != mesh_plan.padded_members:
        raise ConfigError(
            f"{len(member_key['init'])} member keys for {mesh_plan.padded_members} members; "
            f"fix: split_keys with num_members={mesh_plan.padded_members}"
        )
    images, labels = load(cfg, dataset, "train")
    validate = None
    if cfg.has_validation:
        validate = setup.validation(*load(cfg, dataset, "validation"))

    state = setup.init_state(member_key["init"], dataset.image_shape)
    history: list[dict] = []
    position: DataPosition = data_position(0)
    resumed_from = None
    stretches: list[dict] = []
    where = {"ensemble": mesh_plan.ensemble, "data": mesh_plan.data}
    with (
        run_lock(run.path),
        EnsembleCheckpointer(run.checkpoints, keep=cfg.checkpoint.keep) as ckpt,
        stop_signals() as term,
    ):
        changed: dict[str, list] = {}
        if ckpt.latest_step() is not None:
            state, meta, _ = ckpt.restore_latest_valid(
                state, check=lambda m: check_resumable(m, cfg, run.path, mesh_plan.padded_members)
            )
            position = meta["data_position"]
            resumed_from = int(meta["epoch"])
            history = list(meta["history"])
            stretches = list(meta.get("stretches") or [])
            changed = {k: [old, new] for k, (old, new) in config_changes(meta["config"], cfg).items()}
        # What this stretch of training uses (each resume starts one): the keys that may
        # change on resume, what changed since the checkpoint, and the devices.
        stretches.append(
            {
                "start_epoch": position["epoch"],
                "start_step": int(state.step),
                "end_epoch": None,
                "end_step": None,
                "settings": resumable_settings(cfg),
                "changed": changed,
                "mesh": where,
                "strategy": setup.strategy,
                "backend": jax.default_backend(),
                "devices": jax.device_count(),
                "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
        )

        saved_steps: set[int] = set()

        def save(st, pos: DataPosition) -> None:
            if int(st.step) in saved_steps:  # e.g. a stop right after an epoch's checkpoint
                return
            saved_steps.add(int(st.step))
            stretches[-1].update(end_epoch=pos["epoch"], end_step=int(st.step))
            ckpt.save(
                int(st.step),
                st,
                {
                    "config": cfg.model_dump(mode="json"),
                    "epoch": pos["epoch"],
                    "step": int(st.step),
                    "data_position": pos,
                    "members_trained": mesh_plan.padded_members,
                    "healthy": np.asarray(st.healthy).tolist(),
                    "dataset": {
                        "name": dataset.name,
                        "num_classes": dataset.num_classes,
                        "image_shape": list(dataset.image_shape),
                    },
                    "history": history,
                    "stretches": stretches,
                },
            )

        def on_epoch_end(epoch: int, st, record: dict) -> None:
            healthy = np.asarray(st.healthy)
            record["diverged_members"] = np.flatnonzero(~healthy).tolist()
            history.append(record)
            done = epoch + 1
            fail = cfg.train.on_divergence == "fail" and not healthy.all()
            if done % cfg.checkpoint.every_epochs == 0 or done == cfg.train.epochs or fail:
                save(st, data_position(done))
            if on_epoch is not None:
                on_epoch(record)
            if fail:
                ckpt.wait()
                raise DivergenceError(
                    f"member(s) {record['diverged_members']} diverged (non-finite loss or parameters) in epoch "
                    f"{done}; train.on_divergence=fail stops the run; fix: lower train.learning_rate, or set "
                    f"train.on_divergence=freeze to train on without them"
                )

        dev_images = jax.device_put(images, replicated(setup.mesh))
        dev_labels = jax.device_put(labels, replicated(setup.mesh))
        state, timing = fit(
            state,
            setup.train_step(),
            dev_images,
            dev_labels,
            member_key["data"],
            setup.mesh,
            epochs=cfg.train.epochs,
            batch_size=cfg.train.batch_size,
            start=position,
            learning_rates=setup.learning_rates(len(images)),
            end_of_epoch=validate,
            on_step=on_step,
            on_epoch_end=on_epoch_end,
            should_stop=lambda: term.is_set() or (should_stop is not None and should_stop()),
        )
        if stretches[-1]["end_step"] is None and timing["stopped_at"] is None:
            stretches.pop()  # a finished run re-run: nothing was trained
        if timing["stopped_at"] is not None:
            save(state, timing["stopped_at"])
            ckpt.wait()
            stop = timing["stopped_at"]
            raise PreemptedError(
                f"training stopped at epoch {stop['epoch'] + 1}, step {stop['step_in_epoch']} (global step "
                f"{int(state.step)}); a checkpoint was saved there; fix: rerun with the same run name "
                f"(run_name {run.name}) to resume"
            )
        ckpt.wait()
        step = ckpt.latest_step()
    images_seen = timing["steps"] * cfg.train.batch_size * cfg.ensemble.size
    timing["train_member_images_per_s"] = images_seen / timing["train_seconds"] if timing["train_seconds"] else None
    return TrainingSummary(
        checkpoint_dir=str(run.checkpoints),
        checkpoint_step=step,
        history=history,
        timing=TrainingTiming(**timing),
        mesh=where,
        members_trained=mesh_plan.padded_members,
        strategy=setup.strategy,
        backend=jax.default_backend(),
        devices=jax.device_count(),
        resumed_from=resumed_from,
        stretches=stretches,
        diverged_members=np.flatnonzero(~np.asarray(state.healthy)[: cfg.ensemble.size]).tolist(),
        members=member_records(state, setup.hyperparameters()[: cfg.ensemble.size]),
    )


def member_records(state, hyperparameters: list[dict]) -> list[dict]:
    """Per member: ``member`` (index), ``hyperparameters``, ``best_epoch`` (1-based, by
    validation NLL; None without a validation split), ``best_validation_nll`` (nats),
    ``stopped_epoch`` (early stopping; None when it trained to the end) and ``healthy``."""
    healthy = np.asarray(state.healthy)
    best = state.best
    rows = []
    for i, hp in enumerate(hyperparameters):
        row = {"member": i, "hyperparameters": hp, "healthy": bool(healthy[i])}
        if best is None:
            row.update(best_epoch=None, best_validation_nll=None, stopped_epoch=None)
        else:
            epoch, stopped = int(np.asarray(best.epoch)[i]), int(np.asarray(best.stopped_epoch)[i])
            row.update(
                best_epoch=epoch or None,
                best_validation_nll=float(np.asarray(best.nll)[i]) if epoch else None,
                stopped_epoch=stopped or None,
            )
        rows.append(row)
    return rows
