"""The select stage: the only place that predicts the validation split, selects members
and fits the temperature, and the only writer of a run's ``selection.json``.

A run with a validation split has every member of its pool predict it
(``eval/validation.npz``); with ``ensemble.select_size`` the greedy selection
``ensemble.selection`` asks for picks the members among the healthy ones
(:func:`ensemble_core.selection.select_members`); with ``eval.temperature_scaling`` one
temperature is fitted to the chosen ensemble's validation NLL
(:func:`ensemble_core.calibration.fit_temperature`, Guo et al. 2017). What was chosen is
``selection.json``, which :func:`ensemble_core.runs.ensemble.load.load_ensemble` reads for
every later use of the run's ensemble. A hyper-deep ensemble selects twice: its first
selection on the search pool (:func:`first_selection`) and this stage on the stratified pool.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ensemble_core import diskspace
from ensemble_core import metrics as metrics_lib
from ensemble_core.atomic import atomic_savez
from ensemble_core.calibration import fit_temperature, temperature_nll
from ensemble_core.config import PipelineConfig
from ensemble_core.data import DatasetInfo
from ensemble_core.runs.dataset import load
from ensemble_core.runs.ensemble.load import Members, all_members, load_pool, restore
from ensemble_core.runs.storage.layout import RunDir
from ensemble_core.runs.storage.records import write_selection
from ensemble_core.selection import Selection, select_members, selection_record


def validation_predictions(
    cfg: PipelineConfig, dataset: DatasetInfo, members: Members
) -> tuple[np.ndarray, np.ndarray]:
    """Every row of ``members`` on the validation split: ``(member_probs float32
    [K, N_val, C], labels int [N_val])``."""
    images, labels = load(cfg, dataset, "validation")
    probs, _ = members.predict(cfg, images)
    return probs, labels


def choose(
    cfg: PipelineConfig, probs: np.ndarray, labels: np.ndarray, healthy: np.ndarray, *, first: bool = False
) -> Selection:
    """The members ``cfg`` asks for, given the pool's validation predictions ``probs``
    (float ``[E, N_val, C]``) and ``healthy`` (bool ``[E]``): the greedy selection
    (``first``: ``ensemble.first_selection``) with ``ensemble.select_size``, else every
    healthy member (``validation_nll``: that ensemble's, one value).

    Raises:
      DivergenceError: see :func:`ensemble_core.selection.select_members`.
    """
    if cfg.ensemble.select_size is not None:
        return select_members(cfg, probs, labels, healthy, first=first)
    chosen = np.flatnonzero(healthy).tolist()
    return Selection(chosen, [metrics_lib.nll(metrics_lib.ensemble_probs(probs[chosen]), labels)])


@diskspace.output_errors("run_dir")
def select(
    cfg: PipelineConfig, dataset: DatasetInfo, run_dir: str | Path, *, strategy: str | None = None
) -> dict[str, Any] | None:
    """The select stage of :func:`ensemble_core.runs.run`, after training (and
    stratification): choose the run's ensemble on the validation split.

    Writes ``eval/validation.npz`` (``member_probs`` float32 ``[E, N_val, C]`` of every pool
    member, ``labels``, ``healthy``) and ``selection.json`` (``members``: pool indices, one
    per pick; ``temperature``: float or null), each atomically. Without a validation split
    nothing is chosen or written (the ensemble is every healthy member).

    Returns:
      None without a validation split, else the selection record:
      :func:`ensemble_core.selection.selection_record` plus ``temperature`` (None when
      ``eval.temperature_scaling`` is off) and ``validation_nll_temperature_scaled``.

    Raises:
      CheckpointError, DivergenceError: see :func:`ensemble_core.runs.ensemble.load.load_pool`;
        DivergenceError also for fewer healthy members than picks without replacement.
    """
    if not cfg.has_validation:
        return None
    run = RunDir(Path(run_dir))
    pool_cfg, members = load_pool(cfg, run.path, dataset.num_classes, dataset.image_shape, strategy=strategy)
    probs, labels = validation_predictions(pool_cfg, dataset, members)
    atomic_savez(run.evaluator_arrays("validation"), member_probs=probs, labels=labels, healthy=members.healthy)
    picked = choose(pool_cfg, probs, labels, members.healthy)
    ensemble = metrics_lib.ensemble_probs(probs[picked.members])
    temperature = fit_temperature(ensemble, labels) if cfg.eval.temperature_scaling else None
    record = selection_record(picked, probs, labels)
    record["temperature"] = temperature
    record["validation_nll_temperature_scaled"] = (
        None if temperature is None else temperature_nll(ensemble, labels, temperature)
    )
    write_selection(run, record["members"], temperature)
    return record


def first_selection_on(
    cfg: PipelineConfig, dataset: DatasetInfo, run_dir: str | Path
) -> tuple[Selection, dict[str, Any], dict[str, np.ndarray]]:
    """A hyper-deep ensemble's first selection: ``ensemble.first_selection`` on the
    validation predictions of the search pool (the run's own checkpoint, best-epoch
    parameters).

    Returns:
      ``(selection, record, arrays)``: the :class:`~ensemble_core.selection.Selection`, its
      :func:`~ensemble_core.selection.selection_record`, and what it saw
      (``member_probs`` float32 ``[E, N_val, C]``, ``labels``, ``healthy``).

    Raises:
      CheckpointError: the search pool has no checkpoint.
      DivergenceError: no healthy member, or fewer than the picks without replacement.
    """
    state, setup = restore(cfg, run_dir, dataset.num_classes, dataset.image_shape)
    members = all_members(cfg, state, setup)
    probs, labels = validation_predictions(cfg, dataset, members)
    picked = choose(cfg, probs, labels, members.healthy, first=True)
    record = selection_record(picked, probs, labels)
    return picked, record, {"member_probs": probs, "labels": labels, "healthy": members.healthy}
