"""Training a run: resume from its checkpoints, checkpoint as it goes, stop on a signal.

The math is :func:`ensemble_core.train.fit`; this module adds what needs the run
directory: the lock, orbax checkpoints with the data position, the resume policy
(:mod:`ensemble_core.runs.resume`), SIGTERM/SIGINT turned into a checkpoint and a clean
stop, and the stretches of training a run went through.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import jax
import numpy as np

from ensemble_core.config import PipelineConfig
from ensemble_core.data import DatasetInfo
from ensemble_core.errors import ConfigError, DivergenceError, PreemptedError
from ensemble_core.mesh import host_value, replicated
from ensemble_core.rngs import key_layout, keys_from_layout, member_keys
from ensemble_core.runs.checkpoint import EnsembleCheckpointer
from ensemble_core.runs.dataset import load
from ensemble_core.runs.layout import RunDir
from ensemble_core.runs.lock import run_lock
from ensemble_core.runs.preflight import check_against_dataset
from ensemble_core.runs.results import TrainingSummary, TrainingTiming
from ensemble_core.runs.resume import check_resumable, config_changes, resumable_settings
from ensemble_core.setup import build, group_size, plan
from ensemble_core.train import DataPosition, data_position, fit

MemberKeyData = dict[str, list[list[int]]]


def split_keys(cfg: PipelineConfig, num_members: int, first: int = 0) -> MemberKeyData:
    """Per-member keys (init, data order) for members ``first..first+num_members-1``, as
    raw uint32 key data ``{purpose: [[k0, k1]] * num_members}`` (small and JSON-able: what
    the flow shows and hands to training). Member i's keys depend on ``(seed, i)`` only
    (:func:`ensemble_core.rngs.member_keys`)."""
    layout = key_layout(member_keys(cfg.seed, first + num_members))
    return {purpose: rows[first:] for purpose, rows in layout.items()}


def group_keys(cfg: PipelineConfig, keys: MemberKeyData, group: int) -> MemberKeyData:
    """Member group ``group``'s slice of the ensemble's ``keys`` (:func:`split_keys`),
    extended from the seed when the group's mesh trains padding members past them."""
    first = group * group_size(cfg)
    padded = plan(cfg, group=True).padded_members
    if all(len(rows) >= first + padded for rows in keys.values()):
        return {purpose: rows[first : first + padded] for purpose, rows in keys.items()}
    return split_keys(cfg, padded, first)


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
    group: int | None = None,
    on_step: Callable[[int, int, int], None] | None = None,
    on_epoch: Callable[[dict], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    lock: bool = True,
    handle_signals: bool = True,
) -> TrainingSummary:
    """Train (or resume) the ensemble, checkpointing under ``run_dir/checkpoints``; with
    ``group``, train member group ``group`` only, under ``run_dir/groups/<group>/``
    (its own lock and checkpoints: groups train and resume independently, and
    :func:`gather_groups` joins them).

    Holds the run directory's lock for the whole training. If ``run_dir`` already holds a
    checkpoint of a compatible config, training resumes from its data position (epoch
    and step) with the same data order. Checkpoint names are global optimizer steps.
    SIGTERM or SIGINT (in the main thread) or ``should_stop()`` stops training at the next
    step boundary, after a checkpoint there has been written.

    Args:
      keys: :func:`split_keys` for the mesh's ``padded_members`` members (with
        ``group``: :func:`group_keys`).
      strategy: overrides ``mesh.member_strategy``.
      group: a member group index ``0..distributed.member_groups-1``.
      lock, handle_signals: take the run directory's lock and turn SIGTERM/SIGINT into
        a stop (both on by default; off in the JAX processes of one program, whose
        launcher holds the lock and stops them all, :mod:`ensemble_core.runs.processes`).
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
    if group is not None:
        run = run.group(group)
    check_against_dataset(cfg, dataset)  # a batch larger than the split would train nothing
    setup = build(cfg, dataset.num_classes, strategy=strategy, group=group)
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
        run_lock(run.path) if lock else contextlib.nullcontext(),
        EnsembleCheckpointer(run.checkpoints, keep=cfg.checkpoint.keep) as ckpt,
        stop_signals() if handle_signals else contextlib.nullcontext(threading.Event()) as term,
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
                    "healthy": host_value(st.healthy).tolist(),
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
            healthy = host_value(st.healthy)
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
    members = group_size(cfg) if group is not None else cfg.ensemble.size
    images_seen = timing["steps"] * cfg.train.batch_size * members
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
        diverged_members=(setup.first_member + np.flatnonzero(~host_value(state.healthy)[:members])).tolist(),
        members=member_records(state, setup.hyperparameters()[:members], setup.first_member),
        topology=[
            where_trained(
                group,
                range(setup.first_member, setup.first_member + members),
                where,
                setup.strategy,
                timing,
            )
        ],
    )


def dask_worker():
    """The ``distributed.Worker`` running the caller, or None outside a Dask worker."""
    try:
        from distributed import get_worker

        return get_worker()
    except (ImportError, ValueError):
        return None


def where_trained(group: int | None, members: range, mesh: dict, strategy: str, timing: dict) -> dict:
    """One row of a run's topology: which process on which host trained which members.

    Returns:
      ``{"group", "members": [first, last], "host", "pid", "worker", "backend",
      "devices", "processes", "cpu_cores", "mesh", "strategy", "train_seconds",
      "train_member_images_per_s"}``; ``worker`` is the Dask worker's address, or None
      outside a Dask worker; ``cpu_cores`` the CPU cores the process may run on.
    """
    worker = dask_worker()
    return {
        "group": group or 0,
        "members": [members.start, members.stop - 1],
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "worker": None if worker is None else worker.address,
        "backend": jax.default_backend(),
        "devices": jax.device_count(),
        "processes": jax.process_count(),
        "cpu_cores": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "mesh": mesh,
        "strategy": strategy,
        "train_seconds": timing["train_seconds"],
        "train_member_images_per_s": timing.get("train_member_images_per_s"),
    }


def member_records(state, hyperparameters: list[dict], first: int = 0) -> list[dict]:
    """Per member: ``member`` (index, counted from ``first``), ``hyperparameters``, ``best_epoch`` (1-based, by
    validation NLL; None without a validation split), ``best_validation_nll`` (nats),
    ``stopped_epoch`` (early stopping; None when it trained to the end) and ``healthy``."""
    healthy = host_value(state.healthy)
    best = state.best
    if best is not None:
        best_epoch, stopped_epoch, best_nll = (host_value(x) for x in (best.epoch, best.stopped_epoch, best.nll))
    rows = []
    for i, hp in enumerate(hyperparameters):
        row = {"member": first + i, "hyperparameters": hp, "healthy": bool(healthy[i])}
        if best is None:
            row.update(best_epoch=None, best_validation_nll=None, stopped_epoch=None)
        else:
            epoch, stopped = int(best_epoch[i]), int(stopped_epoch[i])
            row.update(
                best_epoch=epoch or None,
                best_validation_nll=float(best_nll[i]) if epoch else None,
                stopped_epoch=stopped or None,
            )
        rows.append(row)
    return rows


def _merge_history(groups: list[list[dict]], size: int) -> list[dict]:
    """The groups' epoch records joined member-wise: per-member lists (``train_loss``, ...)
    concatenated in member order, member indices (``diverged_members``) made global."""
    merged = []
    for records in zip(*groups, strict=True):
        out: dict = {}
        for key, first_value in records[0].items():
            if key == "diverged_members":
                out[key] = [g * size + i for g, rec in enumerate(records) for i in rec[key] if i < size]
            elif isinstance(first_value, list):
                out[key] = [x for rec in records for x in rec[key][:size]]
            else:
                out[key] = first_value
        merged.append(out)
    return merged


def gather_groups(
    cfg: PipelineConfig, dataset: DatasetInfo, run_dir: str | Path, summaries: list[TrainingSummary]
) -> TrainingSummary:
    """Join the member groups' final checkpoints into one checkpoint of the whole ensemble.

    Group g's members ``g*E/G ..`` (its padding dropped) are restored from
    ``run_dir/groups/<g>/checkpoints``, concatenated in member order on the host, placed
    on the whole ensemble's mesh and saved under ``run_dir/checkpoints`` at the groups'
    step, so evaluation, prediction and promotion read one checkpoint as for G = 1. A
    run whose gathered checkpoint is already there is not saved again.

    Args:
      summaries: every group's :func:`train` summary, in group order.

    Returns:
      The run's :class:`~ensemble_core.runs.results.TrainingSummary`: members, history
      and diverged members of all E members; ``topology`` one row per group.

    Raises:
      CheckpointError: a group's checkpoint is missing or damaged.
      RunLockedError: another process trains in this run directory.
      ConfigError: the groups stopped at different steps.
    """
    run = RunDir(Path(run_dir))
    groups = cfg.distributed.member_groups
    size = group_size(cfg)
    steps = {s.checkpoint_step for s in summaries}
    if len(summaries) != groups or len(steps) != 1:
        raise ConfigError(
            f"{len(summaries)} group summaries at steps {sorted(map(str, steps))} for distributed.member_groups="
            f"{groups}; fix: train every group to the end (rerun the run name to resume them)"
        )
    step = steps.pop()
    whole = build(cfg, dataset.num_classes)
    shape = tuple(dataset.image_shape)
    parts, metas = [], []
    for g in range(groups):
        part = build(cfg, dataset.num_classes, group=g)
        with EnsembleCheckpointer(run.group(g).checkpoints, keep=cfg.checkpoint.keep) as ckpt:
            state, meta = ckpt.restore(part.abstract_state(shape), step)
        parts.append(jax.tree.map(lambda x: np.asarray(x)[:size] if np.ndim(x) else np.asarray(x), state))
        metas.append(meta)
    pad = whole.plan.padded_members - cfg.ensemble.size

    def joined(*leaves):
        if not np.ndim(leaves[0]):  # the step, the same in every group
            return leaves[0]
        rows = np.concatenate(leaves)
        return np.concatenate([rows, rows[:1].repeat(pad, axis=0)]) if pad else rows  # padding: copies of member 0

    target = whole.abstract_state(shape)
    state = jax.tree.map(lambda t, *xs: jax.device_put(joined(*xs), t.sharding), target, *parts)
    history = _merge_history([list(m["history"]) for m in metas], size)
    stretches = [dict(s, group=g) for g, m in enumerate(metas) for s in m.get("stretches") or []]
    healthy = np.asarray(state.healthy)
    with run_lock(run.path), EnsembleCheckpointer(run.checkpoints, keep=cfg.checkpoint.keep) as ckpt:
        if ckpt.latest_step() != step:
            ckpt.save(
                step,
                state,
                {
                    "config": cfg.model_dump(mode="json"),
                    "epoch": metas[0]["epoch"],
                    "step": step,
                    "data_position": metas[0]["data_position"],
                    "members_trained": whole.plan.padded_members,
                    "healthy": healthy.tolist(),
                    "dataset": metas[0]["dataset"],
                    "history": history,
                    "stretches": stretches,
                    "gathered_from": [str(run.group(g).checkpoints / str(step)) for g in range(groups)],
                },
            )
            ckpt.wait()
    first = summaries[0]
    seconds = max(s.timing.train_seconds for s in summaries)
    images = sum(s.timing.steps for s in summaries) * cfg.train.batch_size * size
    return TrainingSummary(
        checkpoint_dir=str(run.checkpoints),
        checkpoint_step=step,
        history=history,
        timing=TrainingTiming(
            compile_seconds=max(s.timing.compile_seconds for s in summaries),
            train_seconds=seconds,
            steps=first.timing.steps,
            train_member_images_per_s=images / seconds if seconds else None,
        ),
        mesh=first.mesh,
        members_trained=whole.plan.padded_members,
        strategy=first.strategy,
        backend=first.backend,
        devices=first.devices,
        resumed_from=min((s.resumed_from for s in summaries if s.resumed_from is not None), default=None),
        stretches=stretches,
        diverged_members=np.flatnonzero(~healthy[: cfg.ensemble.size]).tolist(),
        members=[row for s in summaries for row in s.members],
        topology=[row for s in summaries for row in s.topology],
    )


def train_groups(
    cfg: PipelineConfig,
    dataset: DatasetInfo,
    keys: MemberKeyData,
    run_dir: str | Path,
    train_group: Callable[..., TrainingSummary] = train,
    **kwargs,
) -> TrainingSummary:
    """Train every member group of ``distributed.member_groups`` one after another in this
    process (the flow submits them to a task runner instead), then :func:`gather_groups`.
    With one group this is :func:`train`; with ``distributed.num_processes > 1``,
    :func:`ensemble_core.runs.processes.train_processes`.

    Args:
      keys: :func:`split_keys` for the whole ensemble's mesh.
      train_group: called as ``train_group(cfg, dataset, group_keys, run_dir, group=g, **kwargs)``.
    """
    if cfg.distributed.num_processes > 1:
        from ensemble_core.runs.processes import train_processes

        return train_processes(cfg, dataset, keys, run_dir, on_epoch=kwargs.get("on_epoch"))
    if cfg.distributed.member_groups == 1:
        return train_group(cfg, dataset, keys, run_dir, **kwargs)
    summaries = [
        train_group(cfg, dataset, group_keys(cfg, keys, g), run_dir, group=g, **kwargs)
        for g in range(cfg.distributed.member_groups)
    ]
    return gather_groups(cfg, dataset, run_dir, summaries)
