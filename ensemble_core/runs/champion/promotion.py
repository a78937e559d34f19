"""Champion/challenger for nightly retraining: the promotion policy.

The challenger (the run just evaluated) is promoted if it is not worse than the champion
(the promoted run of the output directory) on ``promotion.metric``, both measured on the
same test split. The state files it reads and writes (``champion.json``,
``history.jsonl``, ``corrupt-state/``) are :mod:`ensemble_core.runs.storage.champion_record`.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pydantic

from ensemble_core import diskspace
from ensemble_core.config import PipelineConfig
from ensemble_core.data.class_subset import resolve_classes
from ensemble_core.errors import ConfigError, EnsembleError
from ensemble_core.figures import TEST_METRICS, decide_promotion
from ensemble_core.runs.results import Evaluation, PromotionDecision
from ensemble_core.runs.storage.champion_record import (
    NO_CHAMPION,
    append_history,
    read_champion,
    set_aside,
    write_champion,
)
from ensemble_core.runs.storage.checkpoint import EnsembleCheckpointer
from ensemble_core.runs.storage.layout import CHAMPION_FILE, RunDir

if TYPE_CHECKING:
    from ensemble_core.data import DatasetInfo

__all__ = [
    "champion_class_indices",
    "champion_class_names",
    "champion_snapshot",
    "class_map_changed",
    "figure_value",
    "promote",
]

log = logging.getLogger(__name__)


#: What re-evaluating a champion's run raises when the run, not the code, is at fault: the
#: project's own errors (a damaged or incompatible checkpoint, missing data), a saved config
#: that no longer validates, unreadable files, and what orbax and tensorstore raise for a
#: damaged array (ValueError, KeyError). A TypeError or AttributeError propagates.
UNEVALUABLE = (EnsembleError, pydantic.ValidationError, OSError, ValueError, KeyError)


# MARK: the promotion policy


@diskspace.output_errors("output_dir")
def promote(
    cfg: PipelineConfig,
    dataset: DatasetInfo,
    run_name: str,
    run_dir: str | Path,
    evaluation: Evaluation,
    output_dir: str | Path,
) -> PromotionDecision:
    """Champion/challenger: promote this run if it is not worse than the champion on
    ``promotion.metric`` (:func:`ensemble_core.figures.decide_promotion`).

    When the class map changed since the champion (``nightly.when_classes_change=retrain``;
    otherwise the run was refused before training), there is no common label space: the
    challenger is judged as if there were no champion, and the reason says so. Otherwise
    both are scored on this run's test split: when the champion was measured on another
    data config or another data snapshot (the same config, new source files), its
    checkpoint is re-evaluated on this one first, and the reason says so. The champion
    record carries this run's data snapshot and config (what ``nightly.when_unchanged``
    and the drift signal compare with). The champion pointer
    is replaced atomically and this run's row of ``history.jsonl`` is written (replaced
    when a retry writes it again). A damaged champion pointer, or a champion whose run
    cannot be read back, is set aside in ``<output_dir>/corrupt-state/`` with a warning and
    the run is judged as if there were no champion.

    Raises:
      OSError: the output directory cannot be written.
    """
    from ensemble_core.runs.evaluation.evaluate import evaluate  # the champion's re-evaluation

    metric = cfg.promotion.metric
    data_key = cfg.data.model_dump(mode="json")
    try:
        challenger_value = figure_value(evaluation, metric)
    except LookupError as err:
        return _not_promoted(cfg, run_name, evaluation, output_dir, f"{metric} is not available: {err}")
    current = read_champion(output_dir)
    champion_metrics, champion_value = None, None
    snapshot = None if dataset is None else dataset.snapshot
    snapshots = (_fingerprint(snapshot), None if current is None else champion_snapshot(current))
    replaced = current if current is not None and class_map_changed(current, dataset) else None
    if replaced is not None:  # nightly.when_classes_change=retrain: no common label space to compare on
        log.warning("the class map changed since champion %s: the challenger is judged alone", replaced["run_name"])
        current = None
    if current is not None:
        figures = {**current["metrics"], **(current.get("figures") or {})}
        same_snapshot = snapshots[0] == snapshots[1]  # both None: no lineage known, the data config decides
        if current["data"] == data_key and metric in figures and same_snapshot:
            champion_metrics, champion_value = current["metrics"], figures[metric]
        else:
            try:
                with EnsembleCheckpointer(RunDir(Path(current["run_dir"])).checkpoints, read_only=True) as ckpt:
                    meta = ckpt.read_meta()
                # the champion on this run's data, with only the evaluators the comparison needs
                needed = ["test"] + ([metric.split(".")[0]] if metric not in TEST_METRICS else [])
                saved = {**meta["config"], "data": data_key, "promotion": cfg.promotion.model_dump(mode="json")}
                # each with this run's options, so that both sides are measured alike
                specs = {name: cfg.eval.evaluators[name].model_dump(mode="json") for name in dict.fromkeys(needed)}
                saved["eval"] = {**saved.get("eval", {}), "evaluators": specs}
                champion_cfg = PipelineConfig.model_validate(saved)
                champion_eval = evaluate(champion_cfg, dataset, current["run_dir"], write=False)
                champion_metrics, champion_value = champion_eval.ensemble, figure_value(champion_eval, metric)
            except UNEVALUABLE as err:
                # The champion's run cannot be re-evaluated (checkpoints damaged or of an
                # older format): set the pointer aside, as a damaged pointer is. Any other
                # exception is a programming error and leaves champion.json where it is.
                set_aside(
                    output_dir,
                    CHAMPION_FILE,
                    f"its run {current['run_dir']} cannot be re-evaluated on this data config "
                    f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})",
                    consequence=NO_CHAMPION,
                )
                current, champion_metrics, champion_value = None, None, None
    promoted, reason = decide_promotion(challenger_value, champion_value, metric)
    if replaced is not None and dataset is not None:
        reason += (
            f" (the class map changed since champion {replaced['run_name']}: "
            f"{', '.join(champion_class_names(replaced) or ())} -> {', '.join(dataset.class_names)}; "
            "nightly.when_classes_change=retrain trains a new head, which replaces the champion)"
        )
    elif current is not None and snapshots[0] != snapshots[1]:
        reason += (
            f" (trained on different data snapshots: challenger {snapshots[0] or 'unknown'}, champion "
            f"{snapshots[1] or 'unknown'}; both measured on the challenger's test split)"
        )
    if promoted:
        write_champion(
            output_dir,
            {
                "run_name": run_name,
                "run_dir": str(Path(run_dir).absolute()),
                "data": data_key,
                "metrics": evaluation.ensemble,
                "figures": {metric: challenger_value},
                "snapshot": None if snapshot is None else snapshot.model_dump(mode="json"),
                "config": cfg.model_dump(mode="json"),
            },
        )
    pair = (challenger_value, champion_value)
    decision = _decision(promoted, reason, metric, run_name, evaluation, output_dir, champion_metrics, current, pair)
    return decision.model_copy(update={"challenger_snapshot": snapshots[0], "champion_snapshot": snapshots[1]})


def _fingerprint(snapshot) -> str | None:
    return None if snapshot is None else snapshot.fingerprint


def champion_snapshot(record: dict) -> str | None:
    """The fingerprint of the data snapshot the champion was trained on (None: the record
    predates snapshots, or its ``snapshot`` is not readable)."""
    snap = record.get("snapshot")
    fp = snap.get("fingerprint") if isinstance(snap, dict) else None
    return fp if isinstance(fp, str) and fp else None


def champion_class_names(record: dict) -> tuple[str, ...] | None:
    """The champion's class map: its data snapshot's class names, of the classes its
    ``data.classes`` kept (label ``i`` is the ``i``-th name; None: a record that predates
    class maps)."""
    snap = record.get("snapshot")
    names = snap.get("class_names") if isinstance(snap, dict) else None
    if not (isinstance(names, list | tuple) and names):
        return None
    kept = champion_class_indices(record)
    return tuple(str(names[i]) for i in kept) if kept is not None else tuple(str(n) for n in names)


def champion_class_indices(record: dict) -> tuple[int, ...] | None:
    """The classes of its data snapshot the champion trained on (``data.classes`` of its
    record, resolved against the snapshot's class names, ascending); None: every class (or
    a record without class names to resolve them against)."""
    data = record.get("data") if isinstance(record.get("data"), dict) else (record.get("config") or {}).get("data")
    classes = data.get("classes") if isinstance(data, dict) else None
    snap = record.get("snapshot")
    names = snap.get("class_names") if isinstance(snap, dict) else None
    if not classes or not isinstance(names, list | tuple) or not names:
        return None
    try:
        return resolve_classes(classes, [str(n) for n in names], len(names))
    except ConfigError:  # a record that no longer resolves: no subset the comparison can trust
        return None


def class_map_changed(record: dict, dataset: DatasetInfo | None) -> bool:
    """Whether ``dataset``'s class map differs from that of the champion ``record`` (False
    when either is unknown)."""
    names = champion_class_names(record)
    return names is not None and dataset is not None and bool(dataset.class_names) and names != dataset.class_names


def figure_value(evaluation: Evaluation, metric: str) -> float:
    """The figure ``promotion.metric`` names: an ensemble test metric, or the value at the
    dotted path ``<evaluator>.<key>...`` of that evaluator's metrics (a digit indexes a list).

    Raises:
      LookupError: the evaluator did not run (or was skipped), or the path does not lead to
        a finite number.
    """
    if metric in TEST_METRICS:
        return float(evaluation.ensemble[metric])
    name, *path = metric.split(".")
    if name not in evaluation.results:
        raise LookupError(f"the evaluator '{name}' did not run")
    node = evaluation.results[name].metrics
    if node.get("skipped"):
        raise LookupError(f"the evaluator '{name}' was skipped ({node['skipped']})")
    for part in path:
        try:
            node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, ValueError, TypeError):
            raise LookupError(f"evaluations.{name}.metrics has no '{'.'.join(path)}'") from None
    if isinstance(node, bool) or not isinstance(node, int | float) or not math.isfinite(node):
        raise LookupError(f"evaluations.{name}.metrics.{'.'.join(path)} is {node!r}, not a finite number")
    return float(node)


def _not_promoted(
    cfg: PipelineConfig, run_name: str, evaluation: Evaluation, output_dir: str | Path, reason: str
) -> PromotionDecision:
    log.warning("not promoted: %s", reason)
    champion = read_champion(output_dir)
    champion_metrics = champion["metrics"] if champion else None
    metric = cfg.promotion.metric
    return _decision(
        False, reason, metric, run_name, evaluation, output_dir, champion_metrics, champion, (None, None)
    ).model_copy(update={"champion_snapshot": None if champion is None else champion_snapshot(champion)})


def _decision(
    promoted: bool,
    reason: str,
    metric: str,
    run_name: str,
    evaluation: Evaluation,
    output_dir: str | Path,
    champion_metrics: dict | None,
    current: dict | None,
    figures: tuple[float | None, float | None],
) -> PromotionDecision:
    """Append this run's history row and return the decision."""
    history = append_history(
        output_dir,
        {
            "run_name": run_name,
            **{k: round(v, 6) for k, v in evaluation.ensemble.items()},
            "promoted": promoted,
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        },
    )
    return PromotionDecision(
        promoted=promoted,
        reason=reason,
        metric=metric,
        challenger=evaluation.ensemble,
        champion=champion_metrics,
        champion_run=current["run_name"] if current else None,
        challenger_figure=figures[0],
        champion_figure=figures[1],
        history=history,
    )
