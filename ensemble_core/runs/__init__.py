"""The run layer: everything that knows a run directory, and the sequence of a run.

No Prefect and no Dask here: arrays and files; orchestration is in ``flows/`` and
``tasks/``. Packages by concern, each importing only the ones above it in this table
(``tests/test_import_graph.py`` enforces it):

==================  =======================================================================
``results``,        the typed values stages hand each other; the config's data section
``dataset``         applied (prepare, load a split)
``storage``         the run directory on disk: paths, lock, orbax checkpoints, the resume
                    policy, the JSON records and their set-aside rule, the champion record
``training``        the trainer (one run's context: config, mesh, checkpoints, hooks) and
                    its topologies: member groups, JAX processes
``ensemble``        a run's ensemble: its pool (a hyper-deep ensemble's stratified pool),
                    the select stage, stratification, :func:`load_ensemble`
``evaluation``      the evaluation stage: the evaluators on the loaded ensemble
``prediction``      the ensemble on new images; the prediction flow's files
``champion``        promotion, retraining signals (unchanged data, drift), retention
``report``          ``report.json``, ``report.md``, the training curves
``preflight``       every check before any compute or write
(this module)       :func:`run`, the sequence
==================  =======================================================================

:func:`run` is the one sequence: preflight -> prepare the dataset (a data snapshot) ->
unchanged since the champion? (then skip) -> drift signal -> train -> stratify
(hyper-deep ensembles only) -> select -> evaluate -> champion/challenger -> report ->
retention. The Prefect flow runs it with each stage replaced by its task
(:class:`Stages`); the benchmarks and tests run it as is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ensemble_core import startup_gc, stopping
from ensemble_core.config import PipelineConfig
from ensemble_core.data.snapshot import DataSnapshot, snapshot_dir
from ensemble_core.data.snapshot import in_use as snapshot_in_use
from ensemble_core.errors import resume_fix
from ensemble_core.runs.champion.promotion import promote
from ensemble_core.runs.champion.retention import RetentionReport, apply_retention
from ensemble_core.runs.champion.retraining import (
    check_class_map,
    detect_drift,
    record_snapshot,
    unchanged_since_champion,
)
from ensemble_core.runs.dataset import fingerprint as dataset_fingerprint
from ensemble_core.runs.dataset import prepare
from ensemble_core.runs.ensemble.load import Ensemble, load_ensemble
from ensemble_core.runs.ensemble.select import select
from ensemble_core.runs.ensemble.stratify import stratify
from ensemble_core.runs.evaluation.evaluate import evaluate
from ensemble_core.runs.prediction.predict import predict_images
from ensemble_core.runs.preflight import preflight
from ensemble_core.runs.report.write import write_report
from ensemble_core.runs.results import (
    DriftReport,
    Evaluation,
    PromotionDecision,
    SkipDecision,
    StratificationSummary,
    TrainingSummary,
)
from ensemble_core.runs.storage.layout import OutputDir, RunDir
from ensemble_core.runs.training.groups import gather_groups, train_groups
from ensemble_core.runs.training.trainer import train

log = logging.getLogger(__name__)

__all__ = [
    "DriftReport",
    "Ensemble",
    "Evaluation",
    "OutputDir",
    "PromotionDecision",
    "RetentionReport",
    "RunDir",
    "RunResult",
    "SkipDecision",
    "Stages",
    "StratificationSummary",
    "TrainingSummary",
    "apply_retention",
    "check_class_map",
    "dataset_fingerprint",
    "detect_drift",
    "evaluate",
    "gather_groups",
    "load_ensemble",
    "predict_images",
    "preflight",
    "prepare",
    "promote",
    "retain",
    "run",
    "select",
    "stratify",
    "train",
    "train_groups",
    "unchanged_since_champion",
    "write_report",
]


def retain(cfg: PipelineConfig, output_dir: str | Path) -> RetentionReport | None:
    """Apply ``retention`` to the output directory (None when ``retention.enabled`` is
    false), with the TFDS data dir of ``data.data_dir`` as the snapshots' root."""
    if not cfg.retention.enabled:
        return None
    from ensemble_core.data import tfds_root

    return apply_retention(output_dir, cfg.retention, [tfds_root(cfg.data.name, cfg.data.data_dir)])


@dataclasses.dataclass(frozen=True)
class Stages:
    """The callables :func:`run` chains, each with the signature of its default.

    The Prefect flow passes its tasks here (thin wrappers over the defaults), a caller
    that wants progress passes its own ``train`` (e.g. ``functools.partial(train_groups,
    on_epoch=...)``).
    """

    preflight: Callable[..., Any] = preflight
    prepare: Callable[..., Any] = prepare
    check_unchanged: Callable[..., Any] = unchanged_since_champion
    detect_drift: Callable[..., Any] = detect_drift
    train: Callable[..., Any] = train_groups
    stratify: Callable[..., Any] = stratify
    select: Callable[..., Any] = select
    evaluate: Callable[..., Any] = evaluate
    promote: Callable[..., Any] = promote
    report: Callable[..., Any] = write_report
    retain: Callable[..., Any] = retain


@dataclasses.dataclass(frozen=True)
class RunResult:
    """What :func:`run` did: the run directory and every stage's result. A run skipped by
    ``nightly.when_unchanged=skip`` has ``skipped`` set, ``run_dir`` the champion's and
    no training, evaluation or promotion."""

    run_dir: RunDir
    training: TrainingSummary | None
    evaluation: Evaluation | None
    promotion: PromotionDecision | None
    skipped: SkipDecision | None = None
    drift: DriftReport | None = None
    retention: RetentionReport | None = None
    stratification: StratificationSummary | None = None
    selection: dict[str, Any] | None = None  # the select stage's record (None: no validation split)
    timing: dict[str, Any] | None = None  # report.json's timing (stages...), and retention_seconds


def run(cfg: PipelineConfig, output_dir: str | Path, run_name: str, stages: Stages = Stages()) -> RunResult:
    """Train, checkpoint, evaluate, judge against the champion and report one run.

    Re-using a run name resumes that run (from its latest checkpoint; a finished run is
    evaluated and reported again). The run directory is ``<output_dir>/<run_name>``.

    SIGTERM and SIGINT (main thread) are stop requests (:mod:`ensemble_core.stopping`):
    training stops at its next step after a checkpoint, evaluation at its next batch,
    every other stage when it ends; a request that arrives once the report is written
    stops nothing (the run is complete: retention runs, and the run is returned).

    From the dataset's preparation to its end the run holds a lease on its data snapshot
    (:func:`ensemble_core.data.snapshot.in_use`): no retention, of any output directory on
    that data dir, removes the snapshot meanwhile.

    Raises:
      EnsembleError: preflight refused the run (nothing computed or written), or a stage
        failed (ConfigError, MeshError, DataError, RunLockedError, IncompatibleRunError,
        CheckpointError, DivergenceError), or the run was stopped (PreemptedError; rerun
        with the same name to resume).
    """
    with stopping.stop_signals(), contextlib.ExitStack() as leases:
        return _run(cfg, output_dir, run_name, stages, leases)


def _run(
    cfg: PipelineConfig, output_dir: str | Path, run_name: str, stages: Stages, leases: contextlib.ExitStack
) -> RunResult:
    fix = resume_fix(run_name)
    started_at = time.time()
    seconds: dict[str, float] = {}  # every stage's wall time, report.json's timing.stages

    def timed(name: str, call: Callable[..., Any], *args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return call(*args)
        finally:
            seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - t0

    def stage(name: str, what: str, call: Callable[..., Any], *args: Any) -> Any:
        with stopping.stage(what, fix):
            startup_gc.freeze_survivors()  # what the stages before left lives until the command ends
            return timed(name, call, *args)

    timed("preflight", stages.preflight, cfg, output_dir, run_name)
    run_dir = OutputDir(Path(output_dir)).run(run_name)
    dataset = stage("prepare", "dataset preparation", stages.prepare, cfg.data)
    if dataset.snapshot is not None:
        _lease(leases, cfg, dataset.snapshot)
    skipped = None
    if not run_dir.has_checkpoint():
        stage("class_map_check", "the class-map check", check_class_map, cfg, dataset, str(output_dir))
        skipped = stage(
            "unchanged_check", "the unchanged-data check", stages.check_unchanged, cfg, dataset, str(output_dir)
        )
    if skipped is not None:
        retention = stages.retain(cfg, str(output_dir))
        champion = RunDir(Path(skipped.champion_run_dir))
        return RunResult(champion, None, None, None, skipped=skipped, retention=retention)
    drift = None
    if cfg.promotion.enabled:
        drift = stage("drift_check", "the drift check", stages.detect_drift, cfg, dataset, str(output_dir))
    record_snapshot(run_dir.path, dataset)
    training = stage("train", "training", stages.train, cfg, dataset, str(run_dir.path))
    stratification = None
    if cfg.ensemble.stratify is not None:
        stratification = stage("stratify", "stratification", stages.stratify, cfg, dataset, str(run_dir.path))
    selection = stage("select", "member selection", stages.select, cfg, dataset, str(run_dir.path))
    evaluation = stage("evaluate", "evaluation", stages.evaluate, cfg, dataset, str(run_dir.path))
    decision = None
    if cfg.promotion.enabled:
        args = (cfg, dataset, run_name, str(run_dir.path), evaluation, str(output_dir))
        decision = stage("promote", "the champion/challenger comparison", stages.promote, *args)
    with stopping.stage("the report", fix):
        pass  # a stop before the report stops there; once it is written, the run is complete
    config = cfg.model_dump(mode="json")
    report_args = (run_name, config, training, evaluation, str(run_dir.path), decision, dataset, drift)
    report = stages.report(*report_args, stratification, selection, {"started_at": started_at, "stages": seconds})
    t0 = time.perf_counter()
    retention = stages.retain(cfg, str(output_dir))
    timing = _report_timing(report, run_dir)
    if timing is not None:
        timing = {**timing, "retention_seconds": time.perf_counter() - t0}
    return RunResult(
        run_dir,
        training,
        evaluation,
        decision,
        drift=drift,
        retention=retention,
        stratification=stratification,
        selection=selection,
        timing=timing,
    )


def _lease(leases: contextlib.ExitStack, cfg: PipelineConfig, lineage: DataSnapshot) -> None:
    """Hold the lease on the run's data snapshot (the directory retention would remove:
    ``<TFDS data dir>/snapshots/<name>/<fingerprint>``) until ``leases`` closes, at the end of
    the run: no retention, of any output directory, removes it meanwhile. A lease that
    cannot be taken (a read-only data dir) is a warning, never the run's failure."""
    from ensemble_core.data import tfds_root

    where = snapshot_dir(tfds_root(cfg.data.name, cfg.data.data_dir), lineage.name, lineage.fingerprint)
    try:
        leases.enter_context(snapshot_in_use(where))
    except OSError as err:
        log.warning("no lease on data snapshot %s (%s): retention elsewhere could remove it meanwhile", where, err)


def _report_timing(report: Any, run_dir: RunDir) -> dict[str, Any] | None:
    """``report.json -> timing`` of the report stage's result: the report dict itself, or
    (the Prefect task returns the path) read back from the run directory."""
    if isinstance(report, dict):
        return report.get("timing")
    try:
        return json.loads(run_dir.report_json.read_text()).get("timing")
    except (OSError, ValueError):
        return None
