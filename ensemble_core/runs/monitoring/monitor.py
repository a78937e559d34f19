"""The monitor flow's steps on files: check everything first, then score one unlabelled drop
with a run (the champion) and record the night under ``<output_dir>/monitoring/``
(:mod:`ensemble_core.runs.monitoring.history`).

:func:`preflight` refuses bad input before the model runs (the command line calls it
before Prefect starts); :func:`monitor_drop` predicts the drop
(:func:`ensemble_core.runs.prediction.files.predict_inputs`: the per-image ``.npz`` and
table), reduces it to the night's figures (:func:`ensemble_core.runs.monitoring.drop.summarize`),
and writes ``<night>.json``, ``<night>.md``, the history row and ``history.png``, each
atomically.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ensemble_core import diskspace
from ensemble_core.atomic import atomic_write_json, atomic_write_text
from ensemble_core.errors import DataError
from ensemble_core.runs.monitoring import drop, history
from ensemble_core.runs.prediction import files as prediction
from ensemble_core.runs.prediction.inputs import input_list, output_stem
from ensemble_core.runs.storage.champion_record import read_champion


@dataclasses.dataclass(frozen=True)
class MonitorPlan:
    """What :func:`preflight` settled: the run (``run_dir``; ``champion_run``: its name when
    it is the output directory's champion, else None), the night's id and the paths it
    writes (``npz``, ``table``, ``record``: ``<night>.json``, ``report``: ``<night>.md``)."""

    run_dir: str
    champion_run: str | None
    output_dir: str
    night: str
    npz: Path
    table: Path
    record: Path
    report: Path


def preflight(
    images: str | Sequence[str] | None,
    run_dir: str | None = None,
    output_dir: str | Path = "runs",
    alpha: float = drop.DEFAULT_ALPHA,
    estimator: str = drop.AUTO,
    night: str | None = None,
) -> MonitorPlan:
    """Every check of a monitored night that can fail before the model runs: ``alpha`` and
    ``estimator`` (:func:`~ensemble_core.runs.monitoring.drop.check_settings`; an estimator
    the run cannot compute, :func:`~ensemble_core.runs.monitoring.drop.choose_estimator`),
    the night's id, the run (given, or the champion under ``output_dir``) and the inputs
    (:func:`ensemble_core.runs.prediction.files.preflight`: they exist, decode to the run's
    geometry, and the outputs can be written).

    Returns:
      the :class:`MonitorPlan`.

    Raises:
      ConfigError, DataError, CheckpointError: the first problem, in one line with its fix.
    """
    drop.check_settings(alpha, estimator)
    raws = input_list(images)
    if not raws:
        raise DataError(
            "no input to monitor", fix="pass the drop's images (a folder, files, globs or one .npy/.npz of images)"
        )
    night = night or drop.night_id(output_stem(raws))
    drop.check_night(night)
    run, champion = prediction.resolve_run(run_dir, output_dir)
    folder = history.monitoring_dir(output_dir)
    npz, table = folder / f"{night}.npz", folder / f"{night}.csv"
    prediction.preflight(raws, None, run, output_dir, str(npz), str(table))
    drift_reference, accuracy_reference = drop.references(run)
    members = next(
        (r.members for r in (drift_reference,) if r is not None),
        None if accuracy_reference is None else accuracy_reference.n_members,
    )
    if members is not None:
        drop.choose_estimator(estimator, members, accuracy_reference)
    return MonitorPlan(
        run_dir=str(run),
        champion_run=champion,
        output_dir=str(output_dir),
        night=night,
        npz=npz,
        table=table,
        record=folder / f"{night}.json",
        report=folder / f"{night}.md",
    )


@diskspace.output_errors(lambda plan, *_, **__: plan.output_dir)
def monitor_drop(
    plan: MonitorPlan,
    images: str | Sequence[str],
    alpha: float = drop.DEFAULT_ALPHA,
    estimator: str = drop.AUTO,
) -> dict[str, Any]:
    """Score the drop with the plan's run and record the night.

    Returns:
      the night's record: :func:`~ensemble_core.runs.monitoring.drop.summarize`'s figures
      plus ``night``, ``time`` (UTC, ISO 8601), ``inputs``, ``champion_run`` (the run's
      directory name), ``run_dir``, ``n_skipped`` (files ``data.on_bad_image: skip``
      left out), ``predictions`` and ``table`` (the per-image files), ``report``.

    Raises:
      DataError: inputs refused, or nothing decoded; CheckpointError: the run cannot be read;
      DiskFullError, OutputError: the monitoring directory cannot be written.
    """
    raws = input_list(images)
    result, rows = prediction.predict_inputs(plan.run_dir, raws, plan.npz, plan.table)
    drift_reference, accuracy_reference = drop.references(plan.run_dir)
    summary = drop.summarize(result, drift_reference, accuracy_reference, alpha, estimator)
    record = {
        "night": plan.night,
        "time": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "inputs": raws,
        "champion_run": plan.champion_run or Path(plan.run_dir).name,
        "run_dir": plan.run_dir,
        "n_skipped": int(rows["error"].notna().sum()),
        **summary,
        "predictions": str(plan.npz),
        "table": str(plan.table),
        "report": str(plan.report),
    }
    atomic_write_json(plan.record, record)
    atomic_write_text(plan.report, drop.report_markdown(record))
    rows_so_far = history.append_history(plan.output_dir, history.history_row(record))
    history.plot_history(rows_so_far, history.monitoring_dir(plan.output_dir) / history.PLOT_FILE)
    return record


def retrain_config(plan: MonitorPlan) -> dict[str, Any]:
    """The config a retraining after this night trains with: the champion record's (the
    config of the session that made it champion, which also fitted its decision rules) when
    the night was scored by the champion, else the run's checkpoint config."""
    if plan.champion_run is not None:
        record = read_champion(plan.output_dir)
        if record is not None and record.get("run_name") == plan.champion_run and record.get("config"):
            return dict(record["config"])
    return dict(prediction.run_meta(plan.run_dir)["config"])
