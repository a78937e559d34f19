"""The training stage: the whole ensemble, its member groups, or one program across JAX
processes, and the groups joined into one checkpoint.

With ``distributed.member_groups = G > 1`` the E members are split into G groups of E/G
consecutive members, each trained on its own (:func:`ensemble_core.runs.training.trainer.train`
with ``group``) under ``<run>/groups/<g>/`` and then joined by :func:`gather_groups`. How
the groups are run is the caller's: :func:`map_groups` applies the per-group call through
a *mapper*, by default :func:`sequential` (one after another in this process); the task
layer passes one that submits each call to its Prefect task runner (Dask worker
processes), so this module, like all of ``ensemble_core``, imports neither Prefect nor Dask.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import jax
import numpy as np

from ensemble_core import diskspace
from ensemble_core.config import PipelineConfig
from ensemble_core.data import DatasetInfo
from ensemble_core.ensemble_setup import build, group_size
from ensemble_core.errors import ConfigError
from ensemble_core.runs.results import TrainingSummary
from ensemble_core.runs.storage.checkpoint import EnsembleCheckpointer, checkpoint_meta, training_sessions
from ensemble_core.runs.storage.layout import RunDir
from ensemble_core.runs.storage.lock import run_lock
from ensemble_core.runs.training.launcher import train_processes
from ensemble_core.runs.training.summary import join_summaries
from ensemble_core.runs.training.trainer import train

T = TypeVar("T")
#: ``mapper(fn, calls) -> [fn(*args) for args in calls]``, in the order of ``calls``,
#: however and wherever each call runs.
Mapper = Callable[[Callable[..., T], Sequence[tuple]], Sequence[T]]


def sequential(fn: Callable[..., T], calls: Sequence[tuple]) -> list[T]:
    """The default mapper: each call in turn, in this process."""
    return [fn(*args) for args in calls]


def map_groups(fn: Callable[..., T], calls: Sequence[tuple], mapper: Mapper | None = None) -> list[T]:
    """``fn(*args)`` for each group's ``args`` in ``calls`` through ``mapper`` (default
    :func:`sequential`); the results in group order.

    Raises:
      ValueError: the mapper returned another number of results than calls.
    """
    results = list((mapper or sequential)(fn, calls))
    if len(results) != len(calls):
        raise ValueError(f"the mapper returned {len(results)} results for {len(calls)} member groups")
    return results


def train_group(cfg: PipelineConfig, dataset: DatasetInfo, run_dir: str, group: int, **hooks):
    """The default per-group call: :func:`~ensemble_core.runs.training.trainer.train` of member
    group ``group`` with ``hooks`` (``on_step``, ``on_epoch``, ``should_stop``)."""
    return train(cfg, dataset, run_dir, group=group, **hooks)


@diskspace.output_errors("run_dir")
def train_groups(
    cfg: PipelineConfig,
    dataset: DatasetInfo,
    run_dir: str | Path,
    *,
    group_call: Callable[..., TrainingSummary] | None = None,
    gather: Callable[..., TrainingSummary] | None = None,
    mapper: Mapper | None = None,
    **hooks: Any,
) -> TrainingSummary:
    """The training stage of :func:`ensemble_core.runs.run` (the one loop over groups).

    With ``distributed.num_processes > 1``: one program across JAX processes
    (:func:`~ensemble_core.runs.training.launcher.train_processes`, forwarding ``on_epoch`` and
    ``should_stop``). With one member group: :func:`~ensemble_core.runs.training.trainer.train`.
    Else each group's ``group_call(cfg, dataset, run_dir, g)`` through
    :func:`map_groups`, then ``gather(cfg, dataset, run_dir, summaries)``.

    Args:
      group_call: default :func:`train_group` with ``hooks``.
      gather: default :func:`gather_groups`.
      mapper: how the group calls run (default :func:`sequential`).
      hooks: ``on_step``, ``on_epoch``, ``should_stop`` (:class:`~ensemble_core.runs.training.trainer.Hooks`).

    Returns:
      The run's :class:`~ensemble_core.runs.results.TrainingSummary`.
    """
    dist = cfg.distributed
    if dist.num_processes > 1:
        stop = hooks.get("should_stop")
        return train_processes(cfg, dataset, run_dir, on_epoch=hooks.get("on_epoch"), should_stop=stop)
    if dist.member_groups == 1:
        return train(cfg, dataset, run_dir, **hooks)
    group_call = group_call or functools.partial(train_group, **hooks)
    calls = [(cfg, dataset, str(run_dir), g) for g in range(dist.member_groups)]
    summaries = map_groups(group_call, calls, mapper)
    return (gather or gather_groups)(cfg, dataset, str(run_dir), summaries)


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


def _restore_groups(cfg: PipelineConfig, dataset: DatasetInfo, run: RunDir, step: int) -> tuple[list, list[dict]]:
    """Every group's state at ``step`` on the host, its padding members dropped, and metadata."""
    size, shape = group_size(cfg), tuple(dataset.image_shape)
    parts, metas = [], []
    for g in range(cfg.distributed.member_groups):
        part = build(cfg, dataset.num_classes, group=g)
        with EnsembleCheckpointer(run.group(g).checkpoints, keep=cfg.checkpoint.keep) as ckpt:
            state, meta = ckpt.restore(part.abstract_state(shape), step)
        parts.append(jax.tree.map(lambda x: np.asarray(x)[:size] if np.ndim(x) else np.asarray(x), state))
        metas.append(meta)
    return parts, metas


@diskspace.output_errors("run_dir")
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
      summaries: every group's :func:`~ensemble_core.runs.training.trainer.train` summary, in group order.

    Returns:
      The run's :class:`~ensemble_core.runs.results.TrainingSummary`: members, history
      and diverged members of all E members; ``topology`` one row per group.

    Raises:
      CheckpointError: a group's checkpoint is missing or damaged.
      RunLockedError: another process trains in this run directory.
      ConfigError: the groups stopped at different steps.
    """
    run = RunDir(Path(run_dir))
    groups, size = cfg.distributed.member_groups, group_size(cfg)
    steps = {s.checkpoint_step for s in summaries}
    if len(summaries) != groups or len(steps) != 1 or None in steps:
        raise ConfigError(
            f"{len(summaries)} group summaries at steps {sorted(map(str, steps))} for distributed.member_groups="
            f"{groups}",
            fix="train every group to the end (rerun the run name to resume them)",
        )
    step = steps.pop()
    assert step is not None  # refused above
    whole = build(cfg, dataset.num_classes)
    parts, metas = _restore_groups(cfg, dataset, run, step)
    pad = whole.plan.padded_members - cfg.ensemble.size

    def joined(*leaves):
        if not np.ndim(leaves[0]):  # the step, the same in every group
            return leaves[0]
        rows = np.concatenate(leaves)
        return np.concatenate([rows, rows[:1].repeat(pad, axis=0)]) if pad else rows  # padding: copies of member 0

    target = whole.abstract_state(tuple(dataset.image_shape))
    state = jax.tree.map(lambda t, *xs: jax.device_put(joined(*xs), t.sharding), target, *parts)
    history = _merge_history([list(m["history"]) for m in metas], size)
    sessions = [dict(s, group=g) for g, m in enumerate(metas) for s in training_sessions(m)]
    healthy = np.asarray(state.healthy)
    with run_lock(run.path), EnsembleCheckpointer(run.checkpoints, keep=cfg.checkpoint.keep) as ckpt:
        if ckpt.latest_step() != step:
            meta = checkpoint_meta(
                cfg,
                step=step,
                position=metas[0]["data_position"],
                members_trained=whole.plan.padded_members,
                healthy=healthy.tolist(),
                dataset=metas[0]["dataset"],
                history=history,
                sessions=sessions,
                gathered_from=[str(run.group(g).checkpoints / str(step)) for g in range(groups)],
            )
            ckpt.save(step, state, meta)
            ckpt.wait()
    return join_summaries(
        summaries,
        checkpoint_dir=str(run.checkpoints),
        history=history,
        sessions=sessions,
        members_trained=whole.plan.padded_members,
        diverged_members=np.flatnonzero(~healthy[: cfg.ensemble.size]).tolist(),
        images_per_step=cfg.train.batch_size * size,
    )
