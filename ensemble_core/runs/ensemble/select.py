"""The select stage: the only place that predicts the validation split, selects members,
fits the temperature and the decision rules (prediction sets, abstention, on the
calibration split), and the only writer of a run's ``selection.json`` and ``decisions.json``.

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

import dataclasses
import logging
from pathlib import Path
from typing import Any

import numpy as np

from ensemble_core import diskspace
from ensemble_core import metrics as metrics_lib
from ensemble_core.accuracy_estimation import fit_reference
from ensemble_core.atomic import atomic_savez
from ensemble_core.calibration import fit_temperature, temperature_nll
from ensemble_core.config import PipelineConfig
from ensemble_core.data import DatasetInfo
from ensemble_core.decisions import DecisionRules, ensemble_probs, fit_rules
from ensemble_core.drift_tests import reference_from
from ensemble_core.runs.dataset import load, split_lineage
from ensemble_core.runs.ensemble.load import Members, all_members, load_pool, restore
from ensemble_core.runs.storage.layout import RunDir
from ensemble_core.runs.storage.records import (
    write_accuracy_reference,
    write_decisions,
    write_drift_reference,
    write_selection,
)
from ensemble_core.selection import Selection, select_members, selection_record

log = logging.getLogger(__name__)


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
    member, ``labels``, ``healthy``), ``selection.json`` (``members``: pool indices, one
    per pick; ``temperature``: float or null) and ``decisions.json`` (the chosen ensemble's
    prediction sets and abstention threshold, :func:`fit_decisions`), each atomically.
    Without a validation split nothing is chosen (the ensemble is every healthy member);
    its ``decisions.json`` is still fitted on the calibration split.

    Returns:
      None without a validation split, else the selection record:
      :func:`ensemble_core.selection.selection_record` plus ``temperature`` (None when
      ``eval.temperature_scaling`` is off), ``validation_nll_temperature_scaled`` and
      ``decisions`` (``decisions.json``'s record, or None).

    Raises:
      CheckpointError, DivergenceError: see :func:`ensemble_core.runs.ensemble.load.load_pool`;
        DivergenceError also for fewer healthy members than picks without replacement.
    """
    run = RunDir(Path(run_dir))
    if not cfg.has_validation:
        if cfg.decision_split is None:
            warn_without_decisions(cfg)
            write_decisions(run, None)
            write_drift_reference(run, None)
            write_accuracy_reference(run, None)
            return None
        pool_cfg, members = load_pool(cfg, run.path, dataset.num_classes, dataset.image_shape, strategy=strategy)
        rules = fit_decisions(
            pool_cfg, dataset, members, np.flatnonzero(members.healthy).tolist(), None, None, run.path
        )
        write_decisions(run, None if rules is None else rules.to_dict())
        return None
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
    rules = fit_decisions(pool_cfg, dataset, members, list(picked.members), temperature, (probs, labels), run.path)
    write_selection(run, record["members"], temperature)
    write_decisions(run, None if rules is None else rules.to_dict())
    record["decisions"] = None if rules is None else rules.to_dict()
    return record


def warn_without_decisions(cfg: PipelineConfig) -> None:
    """One warning when the config asks for prediction sets (``prediction_sets.calibrate_on``
    not ``none``) but holds out no such split, so the run will have none."""
    where = cfg.prediction_sets.calibrate_on
    if where == "none" or cfg.decision_split is not None:
        return
    key = "data.calibration_fraction" if where == "calibration" else "data.validation_fraction"
    log.warning(
        "no prediction sets and no abstention: prediction_sets.calibrate_on=%s but %s=0 holds no %s split out "
        "(set it, e.g. to 0.1, to have them, or prediction_sets.calibrate_on=none to say so)",
        where,
        key,
        where,
    )


def fit_decisions(
    cfg: PipelineConfig,
    dataset: DatasetInfo,
    members: Members,
    picks: list[int],
    temperature: float | None,
    validation: tuple[np.ndarray, np.ndarray] | None,
    run_dir: str | Path,
) -> DecisionRules | None:
    """The chosen ensemble's prediction sets and abstention threshold
    (:func:`ensemble_core.decisions.fit_rules`), fitted on ``cfg.decision_split``: the
    calibration split, predicted here by every pool member, or the validation split's
    predictions ``validation`` (``(member_probs [E, N_val, C], labels)``). None when the
    config asks for none (and the run's ``drift_reference.json`` is removed). Writes the
    same predictions' drift reference (:func:`ensemble_core.drift_tests.reference_from`)
    to ``drift_reference.json``, what later drift tests compare new data with, and the
    label-free accuracy estimators fitted on them
    (:func:`ensemble_core.accuracy_estimation.fit_reference`) to ``accuracy_reference.json``.

    Args:
      picks: the pool rows of the ensemble, one per pick (a member picked twice counts twice,
        as in the ensemble's mean). temperature: the ensemble's, or None.
    """
    split = cfg.decision_split
    if split is None:
        warn_without_decisions(cfg)
        write_drift_reference(RunDir(Path(run_dir)), None)
        write_accuracy_reference(RunDir(Path(run_dir)), None)
        return None
    if split == "validation" and validation is not None:
        probs, labels = validation
    else:
        images, labels = load(cfg, dataset, split)
        probs, _ = members.predict(cfg, images)
    chosen = probs[np.asarray(picks, np.int64)]
    ensemble = ensemble_probs(chosen, np.ones(len(chosen), bool), temperature)
    rules = fit_rules(ensemble, labels, cfg.prediction_sets, cfg.abstention, split, member_probs=chosen)
    # The same predictions are the reference of later drift tests and accuracy estimates.
    write_drift_reference(RunDir(Path(run_dir)), reference_from(chosen, temperature).to_dict())
    write_accuracy_reference(RunDir(Path(run_dir)), fit_reference(chosen, labels, temperature).to_dict())
    return dataclasses.replace(rules, lineage=split_lineage(cfg, dataset, split))


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
