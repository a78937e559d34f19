"""The stratification stage of a hyper-deep ensemble (Wenzel et al. 2020, Algorithm 2).

After the search pool has trained: the first greedy selection on the validation split
(``ensemble.selection``) keeps D distinct settings; each is trained again from
J = ``ensemble.stratify`` new initialisations, all D x J members in one compiled step
(the training stage's own machinery: checkpoints, resume, early stopping, best epochs,
member groups) under ``<run>/stratified/``; evaluation then selects the final ensemble
from that pool (:mod:`ensemble_core.runs.ensemble.pool`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ensemble_core import diskspace, stopping
from ensemble_core.atomic import atomic_savez
from ensemble_core.config import PipelineConfig
from ensemble_core.data import DatasetInfo
from ensemble_core.runs.ensemble.pool import first_selection_settings, saved_plan
from ensemble_core.runs.ensemble.select import first_selection_on
from ensemble_core.runs.results import StratificationSummary, TrainingSummary
from ensemble_core.runs.storage.layout import RunDir
from ensemble_core.runs.storage.records import write_plan
from ensemble_core.runs.training.groups import train_groups
from ensemble_core.stratification import StratificationPlan, stratified_config


def first_selection(cfg: PipelineConfig, dataset: DatasetInfo, run_dir: str | Path) -> StratificationPlan:
    """The settings the stratified pool trains: ``<run>/stratified/plan.json`` when it
    exists (a resumed run), else the selection ``ensemble.first_selection`` asks for on the
    search pool's validation predictions (best-epoch parameters), written there atomically
    after those predictions (``stratified/search_validation.npz``: ``member_probs`` float32
    ``[E, N_val, C]``, ``labels``, ``healthy``).

    Raises:
      CheckpointError: the search pool has no checkpoint, or the plan file is damaged.
      IncompatibleRunError: the plan was made for another ``ensemble.stratify``.
      DivergenceError: no healthy member, or fewer than the picks without replacement.
    """
    run = RunDir(Path(run_dir))
    inits = cfg.ensemble.stratify
    assert inits is not None
    saved = saved_plan(cfg, run)
    if saved is not None:
        return saved
    picked, record, arrays = first_selection_on(cfg, dataset, run.path)
    settings = list(dict.fromkeys(int(m) for m in picked.members))  # distinct, in order of first pick
    record = {**record, "made_with": first_selection_settings(cfg)}  # checked on resume (saved_plan)
    plan = StratificationPlan(settings=settings, inits=inits, first_selection=record)
    atomic_savez(run.stratified.path / "search_validation.npz", **arrays)  # what the first selection saw
    write_plan(run.stratified.path, plan)
    return plan


@diskspace.output_errors("run_dir")
def stratify(
    cfg: PipelineConfig,
    dataset: DatasetInfo,
    run_dir: str | Path,
    *,
    train: Callable[..., TrainingSummary] = train_groups,
    select: Callable[..., StratificationPlan] | None = None,
    **hooks: Any,
) -> StratificationSummary:
    """The stratification stage of :func:`ensemble_core.runs.run`: ``select`` (default
    :func:`first_selection`; the flow passes its task), then
    ``train(pool_cfg, dataset, <run>/stratified, **hooks)`` (default
    :func:`ensemble_core.runs.training.groups.train_groups`: resumes from the stratified pool's latest
    checkpoint; a stop request stops it after a checkpoint) for the stratified pool's
    config (:func:`ensemble_core.stratification.stratified_config`); the trainer derives
    the members' keys from the plan it finds there (member (setting s, initialisation j)
    depends on ``(seed, s, j)`` only).

    Raises:
      PreemptedError: stopped (rerun the run name to resume); see also :func:`first_selection`.
    """
    plan = (select or first_selection)(cfg, dataset, str(run_dir))
    stopping.check()
    pool_cfg = stratified_config(cfg, plan)
    where = RunDir(Path(run_dir)).stratified
    summary = train(pool_cfg, dataset, str(where.path), **hooks)
    return StratificationSummary(
        settings=plan.settings, inits=plan.inits, first_selection=plan.first_selection, training=summary
    )
