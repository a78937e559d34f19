"""Retraining against the champion: does this run have anything new to learn, and how far
has the data moved from what the champion learned?

Both are decided before training, from the champion record (``champion.json``, which
carries the champion's data snapshot and config) and the new data snapshot:

- :func:`unchanged_since_champion`: ``nightly.when_unchanged=skip`` and the same snapshot
  and config -> the run trains nothing (:class:`~ensemble_core.runs.results.SkipDecision`);
- :func:`detect_drift`: the champion scores the new training split
  (:mod:`ensemble_core.drift`; :class:`~ensemble_core.runs.results.DriftReport`).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from ensemble_core import diskspace
from ensemble_core import drift as drift_lib
from ensemble_core.atomic import atomic_write_json
from ensemble_core.config import PipelineConfig
from ensemble_core.data import DatasetInfo, DataSnapshot, keep_classes, load_split, resolve_classes
from ensemble_core.drift_tests import drift_tests
from ensemble_core.errors import DataError, EnsembleError
from ensemble_core.runs.champion.promotion import (
    champion_class_indices,
    champion_class_names,
    champion_snapshot,
    class_map_changed,
)
from ensemble_core.runs.dataset import load
from ensemble_core.runs.results import DriftReport, SkipDecision
from ensemble_core.runs.storage.champion_record import read_champion
from ensemble_core.runs.storage.layout import RunDir
from ensemble_core.runs.storage.records import read_drift_reference
from ensemble_core.runs.storage.resume import flat

log = logging.getLogger(__name__)

#: Config keys that do not change what a run trains: the policies of this module and of
#: retention, and where the data lives (the snapshot's fingerprint says what it is).
NOT_TRAINING_IDENTITY = ("nightly.", "retention.", "data.data_dir", "data.manual_dir")


def training_identity(config: dict[str, Any]) -> dict[str, Any]:
    """The flat config (``{"train.epochs": 10, ...}``) less :data:`NOT_TRAINING_IDENTITY`:
    what must equal the champion's for a run to count as unchanged."""
    full = PipelineConfig.model_validate(config).model_dump(mode="json")  # today's defaults for older records
    return {k: v for k, v in flat(full).items() if not k.startswith(NOT_TRAINING_IDENTITY)}


@diskspace.output_errors("output_dir")
def unchanged_since_champion(cfg: PipelineConfig, dataset: DatasetInfo, output_dir: str | Path) -> SkipDecision | None:
    """Whether this run would retrain the champion on the same data with the same config.

    Returns:
      A :class:`SkipDecision` when ``nightly.when_unchanged`` is ``skip``, promotion is
      enabled, the output directory has a champion, and both its data snapshot's
      fingerprint and its config (:func:`training_identity`) equal this run's; None
      otherwise (also for a champion record that predates snapshots: it trains).
    """
    if cfg.nightly.when_unchanged != "skip" or not cfg.promotion.enabled or dataset.snapshot is None:
        return None
    current = read_champion(output_dir)
    if current is None or champion_snapshot(current) != dataset.snapshot.fingerprint:
        return None
    try:
        same = training_identity(current.get("config") or {}) == training_identity(cfg.model_dump(mode="json"))
    except ValueError:  # a champion config today's schema refuses: not the same config
        same = False
    if not same:
        return None
    return SkipDecision(
        champion_run=current["run_name"],
        champion_run_dir=current["run_dir"],
        fingerprint=dataset.snapshot.fingerprint,
        reason=(
            f"skipped: data snapshot {dataset.snapshot.fingerprint} and the config equal those of champion "
            f"{current['run_name']}; nothing trained (nightly.when_unchanged=skip)"
        ),
    )


@diskspace.output_errors("run_dir")
def check_class_map(cfg: PipelineConfig, dataset: DatasetInfo, output_dir: str | Path) -> None:
    """Refuse a run whose class map differs from the champion's (a class folder appeared or
    disappeared, ``data.class_names`` changed, or ``data.classes`` keeps other classes: each
    side's class map is that of the classes it trains on): its members would be compared with, and
    replace, a champion that predicts other classes. Never remapped silently; training a
    new head is the user's choice, ``nightly.when_classes_change: retrain``.

    Nothing is checked without promotion, without a champion, or for a champion record
    that predates class maps.

    Raises:
      DataError: one line naming the first class that appeared (or else disappeared, or
        moved to another label), the champion's run and the fix.
    """
    current = read_champion(output_dir) if cfg.promotion.enabled else None
    if current is None or not class_map_changed(current, dataset):
        return
    before, now = champion_class_names(current) or (), dataset.class_names
    if cfg.nightly.when_classes_change == "retrain":
        log.warning("class map %s -> %s: a new head (nightly.when_classes_change=retrain)", before, now)
        return
    raise class_map_refusal(current["run_name"], before, now)


def folder_class_names(cfg: PipelineConfig) -> tuple[str, ...] | None:
    """The class map an image folder (``data.source: image_folder``) will have, from its
    folder names alone (nothing opened or decoded): the visible folders of
    ``<data.path>/train``, sorted by name as the folder's scan sorts them, of the classes
    ``data.classes`` keeps. None for another source, or a folder the scan itself will
    refuse (missing, unreadable, fewer than two classes, ``data.classes`` that do not
    resolve): preparation then says why."""
    if cfg.data.source != "image_folder" or cfg.data.path is None:
        return None
    try:
        with os.scandir(Path(cfg.data.path) / "train") as it:
            names = tuple(sorted(e.name for e in it if not e.name.startswith(".") and e.is_dir()))
    except OSError:
        return None
    if len(names) < 2:
        return None
    if not cfg.data.classes:
        return names
    try:
        return tuple(names[i] for i in resolve_classes(cfg.data.classes, names, len(names)))
    except EnsembleError:
        return None


@diskspace.output_errors("output_dir")
def check_folder_class_map(cfg: PipelineConfig, output_dir: str | Path) -> None:
    """:func:`check_class_map` for an image folder *before* anything is decoded: its class
    map read from its folder names (:func:`folder_class_names`), so a class folder that
    appeared is refused in a second, not after the whole folder is decoded and snapshotted.
    Refuses only (``nightly.when_classes_change: retrain`` is left to :func:`check_class_map`,
    which also covers every other source after preparation).

    Raises:
      DataError: as :func:`check_class_map`.
    """
    if cfg.nightly.when_classes_change != "refuse" or not cfg.promotion.enabled:
        return
    now = folder_class_names(cfg)
    current = read_champion(output_dir) if now is not None else None
    before = None if current is None else champion_class_names(current)
    if now is None or current is None or before is None or tuple(before) == now:
        return
    raise class_map_refusal(current["run_name"], tuple(before), now)


def class_map_refusal(champion_run: str, before: tuple[str, ...], now: tuple[str, ...]) -> DataError:
    """The one-line refusal of a class map that differs from the champion's: the first
    class that appeared (or else disappeared, or moved to another label), both maps, the fix."""
    added, removed = [c for c in now if c not in before], [c for c in before if c not in now]
    if added:
        what = f"class '{added[0]}' is new"
    elif removed:
        what = f"class '{removed[0]}' is gone"
    else:
        moved = next(c for i, c in enumerate(now) if i >= len(before) or before[i] != c)
        what = f"class '{moved}' has another label"
    return DataError(
        f"{what} since champion {champion_run} ({len(before)} classes: {', '.join(before)}; now "
        f"{len(now)}: {', '.join(now)}), so this run's members would predict other classes than the champion's",
        fix="restore the class folders (or data.class_names, data.classes), or set "
        "nightly.when_classes_change: retrain to train a new head that replaces the champion",
    )


def record_snapshot(run_dir: str | Path, dataset: DatasetInfo) -> None:
    """Write the run's data snapshot to ``<run>/data_snapshot.json`` (before training), so
    that retention keeps the snapshot while the run may still need it."""
    if dataset.snapshot is not None:
        run = RunDir(Path(run_dir))
        run.path.mkdir(parents=True, exist_ok=True)
        atomic_write_json(run.data_snapshot, dataset.snapshot.model_dump(mode="json"))


@diskspace.output_errors("output_dir")
def detect_drift(cfg: PipelineConfig, dataset: DatasetInfo, output_dir: str | Path) -> DriftReport:
    """The champion's view of the new data snapshot (:mod:`ensemble_core.drift`).

    - label shift: the class counts of the new training split (the whole split, from the
      snapshot's lineage record) against those of the champion's snapshot, each of the
      classes its run trains on (``data.classes``);
    - uncertainty shift: the champion ensemble (its selection, without temperature) on
      the first ``nightly.drift.max_examples`` examples of this run's training split,
      against the champion on the first ``nightly.drift.max_examples`` examples of its own
      test split (read from its snapshot; this run's test split when that snapshot is
      gone). Each side is a mean over its own examples, so the counts may differ.

    A figure that cannot be computed (no champion, a champion that predates snapshots,
    another image shape or class count) is named in ``not_computed``; nothing raises for
    it, and a champion whose checkpoints cannot be read only loses the uncertainty figures.
    """
    from ensemble_core.runs.prediction.predict import predict_images

    new_fp = None if dataset.snapshot is None else dataset.snapshot.fingerprint
    current = read_champion(output_dir) if cfg.nightly.drift.enabled else None
    if current is None:
        why = "no champion in the output directory" if cfg.nightly.drift.enabled else "nightly.drift.enabled=false"
        return DriftReport(champion_run=None, snapshot=new_fp, champion_snapshot=None, not_computed=[why])
    champion = _snapshot_of(current)
    report: dict[str, Any] = {"label_shift": None, "uncertainty": None, "not_computed": []}
    if champion is None or dataset.snapshot is None:
        report["not_computed"].append("label shift: the champion's record has no data snapshot (older release)")
    elif class_map_changed(current, dataset):
        report["not_computed"].append("label shift: the class map changed since the champion")
    elif "train" not in champion.class_counts or "train" not in dataset.snapshot.class_counts:
        report["not_computed"].append("label shift: class counts of a training split are missing")
    else:  # of the classes each side trained on (data.classes): the class maps are equal here
        report["label_shift"] = drift_lib.label_shift(
            _kept(dataset.snapshot.class_counts["train"], dataset.class_indices),
            _kept(champion.class_counts["train"], champion_class_indices(current)),
        )
    n = cfg.nightly.drift.max_examples
    try:
        images = load(cfg, dataset, "train")[0][:n]
        reference = _champion_test_images(champion, cfg, dataset, n, champion_class_indices(current))
        probs = predict_images(current["run_dir"], np.concatenate([images, reference]))["member_probs"]
        report["uncertainty"] = drift_lib.uncertainty_shift(probs[:, : len(images)], probs[:, len(images) :])
    except Exception as err:  # noqa: BLE001  (another shape, damaged checkpoints: a figure less, not a failed run)
        first = str(err).splitlines()[0] if str(err) else ""
        report["not_computed"].append(f"uncertainty: {type(err).__name__}: {first}"[:300])
        probs = None
    report["tests"] = champion_drift_tests(cfg, current, probs, len(images) if probs is not None else 0, report)
    thresholds = cfg.nightly.drift.model_dump()
    exceeded = drift_lib.exceeded(report, thresholds)
    alpha, tests = cfg.nightly.drift.test_alpha, report["tests"]
    if alpha is not None and tests is not None and tests["drifted"]:
        rejected = [f"{name} (p {t['p_adjusted']:.2g})" for name, t in tests["tests"].items() if t["rejected"]]
        exceeded.append(
            f"two-sample drift tests against the champion's calibration split reject at nightly.drift.test_alpha "
            f"{alpha:g} (Holm): {', '.join(rejected)}"
        )
    return DriftReport(
        champion_run=current["run_name"],
        snapshot=new_fp,
        champion_snapshot=None if champion is None else champion.fingerprint,
        exceeded=exceeded,
        **report,
    )


def champion_drift_tests(
    cfg: PipelineConfig, current: dict, probs: np.ndarray | None, n_new: int, report: dict
) -> dict | None:
    """The two-sample drift tests (:func:`ensemble_core.drift_tests.drift_tests`) of the
    champion's member probabilities on the new training split (``probs[:, :n_new]``,
    float ``[E, N, C]``) against its calibration split (its ``drift_reference.json``), at
    ``nightly.drift.test_alpha`` (0.05 when None: the p-values are reported either way).
    None, with the reason in ``report["not_computed"]``, when the champion has no
    reference or the predictions failed."""
    if probs is None:
        report["not_computed"].append("drift tests: the champion's predictions on the new data failed")
        return None
    reference = read_drift_reference(RunDir(Path(current["run_dir"])))
    if reference is None:
        report["not_computed"].append("drift tests: the champion has no calibration split (no drift_reference.json)")
        return None
    alpha = cfg.nightly.drift.test_alpha or 0.05
    try:
        return drift_tests(reference, probs[:, :n_new], alpha, reference.temperature)
    except EnsembleError as err:  # another member count or class count than the reference's
        report["not_computed"].append(f"drift tests: {err.problem}"[:300])
        return None


def _snapshot_of(record: dict) -> DataSnapshot | None:
    try:
        return DataSnapshot.model_validate(record.get("snapshot"))
    except ValueError:
        return None


def _kept(counts: list[int], class_indices: tuple[int, ...] | None) -> list[int]:
    """Class counts of the classes a run kept (``data.classes``; None: all of them)."""
    return list(counts) if class_indices is None else [counts[i] if i < len(counts) else 0 for i in class_indices]


def _champion_test_images(
    champion: DataSnapshot | None,
    cfg: PipelineConfig,
    dataset: DatasetInfo,
    n: int,
    class_indices: tuple[int, ...] | None = None,
):
    """The first ``n`` test images of the champion's snapshot, of the classes it trained on
    (``class_indices``; None: every class); this run's test split when the champion
    predates snapshots or its snapshot was removed."""
    if champion is not None and Path(champion.path, champion.name).is_dir():
        if class_indices is not None:
            return keep_classes(*load_split(champion.name, "test", champion.path), class_indices, n)[0]
        return load_split(champion.name, "test", champion.path, n)[0]
    log.warning("the champion's data snapshot is not available; its uncertainty is measured on this run's test split")
    return load(cfg, dataset, "test")[0][:n]
