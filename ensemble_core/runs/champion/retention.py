"""The retention policy of an output directory (:class:`~ensemble_core.config.RetentionConfig`).

Kept whole: the champion's run, the ``keep_last_runs`` newest finished runs (finished: it
has ``report.json``; newest by its mtime, ties by the greater name), runs in progress
(their ``.lock`` or a member group's is held) and unfinished runs (they may be resumed;
never touched). Every other finished run is pruned: its checkpoints (``checkpoints/``,
``groups/``, ``corrupt-checkpoints/``), then its predictions (``predictions.npz``,
``eval/``) are deleted; the report, plots, ``selection.json`` and ``data_snapshot.json``
stay, and ``pruned.json`` records what was removed and when.

Crash safety: a run is pruned under its lock (taken without blocking, so no run starts in
it meanwhile) by an ``os.rename`` of each of those entries, in that order, into the hidden
``<run>/.retention-trash/``, then ``pruned.json`` (atomically), then one ``rmtree`` of the
trash. Each rename is atomic and the checkpoints go first, so whatever kills the process, a
run is whole or has lost its checkpoints (and maybe more, each entry whole or gone) with its
report intact: nothing a resume or a restore reads is ever half deleted. The next call
finishes a run left half way and deletes any trash left behind.

Data snapshots (``<root>/snapshots/<name>/<fingerprint>/``) that no kept, in-progress or
unfinished run refers to (``data_snapshot.json`` or ``report.json``'s ``data_snapshot``; a
pruned run cannot be evaluated again) and that no run used for ``snapshot_max_age_days``
are renamed into ``<root>/snapshots/.trash-...`` under the dataset's prepare lock, after
checking their age again there (a run may have reused one meanwhile), then deleted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import logging
import os
import shutil
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from ensemble_core import diskspace
from ensemble_core.atomic import atomic_write_json
from ensemble_core.config.nightly_section import RetentionConfig
from ensemble_core.data import snapshot
from ensemble_core.errors import RunLockedError
from ensemble_core.filelock import LockHeldError, flocked
from ensemble_core.runs.storage.champion_record import read_champion
from ensemble_core.runs.storage.layout import OutputDir, RunDir
from ensemble_core.runs.storage.lock import ensure_unlocked, run_lock

log = logging.getLogger(__name__)

#: Where a run's heavy entries are moved before they are deleted (hidden: no reader looks there).
TRASH = ".retention-trash"
#: The record a pruned run keeps of what was removed and when.
PRUNED_FILE = "pruned.json"
#: A child directory of the output directory (not hidden, not ``corrupt-state`` or
#: ``monitoring``) holding one of these is a run.
_RUN_MARKERS = (".lock", "checkpoints", "report.json", "groups")

KeptReason = Literal["champion", "recent", "in progress", "unfinished"]


class RetentionReport(BaseModel):
    """What :func:`apply_retention` did (JSON-able: ``model_dump(mode="json")``).

    Attributes:
      kept: run name -> why it was kept whole ("champion", "recent", "in progress",
        "unfinished").
      pruned: runs whose checkpoints and predictions were deleted by this call.
      already_pruned: runs due for pruning that had nothing left to delete.
      skipped: runs that could not be read (left alone; a warning names each).
      snapshots_removed: the snapshot directories removed.
      bytes_freed: the size of every file deleted (also of trash left by a crash).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kept: dict[str, KeptReason] = {}
    pruned: tuple[str, ...] = ()
    already_pruned: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    snapshots_removed: tuple[str, ...] = ()
    bytes_freed: int = 0

    def summary(self) -> str:
        """One line: the runs kept (by reason), pruned and skipped, the snapshots removed, the bytes freed."""
        reasons = [r for r in ("champion", "recent", "in progress", "unfinished") if r in self.kept.values()]
        why = ", ".join(f"{sum(v == r for v in self.kept.values())} {r}" for r in reasons)
        kept = f"kept {len(self.kept)} run(s) whole" + (f" ({why})" if why else "")
        skipped = f", skipped {len(self.skipped)} unreadable" if self.skipped else ""
        return (
            f"retention: {kept}, pruned {len(self.pruned)}, {len(self.already_pruned)} already pruned{skipped}, "
            f"removed {len(self.snapshots_removed)} snapshot(s), freed {_human(self.bytes_freed)}"
        )


@dataclasses.dataclass
class _Run:
    """One run directory as scanned: its finish time (None: unfinished) and snapshot references."""

    run: RunDir
    finished_at: float | None
    refs: set[Path]
    fingerprints: set[str]
    refs_known: bool


@diskspace.output_errors("output_dir")
def apply_retention(
    output_dir: str | Path,
    policy: RetentionConfig,
    snapshot_roots: Sequence[str | Path] = (),
    now: float | None = None,
) -> RetentionReport:
    """Apply ``policy`` to the runs of ``output_dir`` and to the data snapshots under ``snapshot_roots``.

    Args:
      output_dir: the output directory (its run directories and ``champion.json``).
      policy: the retention section; ``enabled=False`` does nothing.
      snapshot_roots: TFDS data dirs whose ``snapshots/`` are cleaned (none: no snapshot is removed).
      now: the time snapshot ages are measured at (seconds since the epoch; default: now).

    Returns:
      What was kept, pruned and removed. An output directory that does not exist gives an
      empty report.

    Raises:
      OSError: ``champion.json`` cannot be read, or a deletion failed; what was done before
        is consistent (every run whole or without its checkpoints) and the next call finishes it.
    """
    out = Path(output_dir)
    if not policy.enabled or not out.is_dir():
        return RetentionReport()
    now = time.time() if now is None else now
    champion = read_champion(out)
    champion_dir = Path(champion["run_dir"]).resolve() if champion else None
    champion_name = champion["run_name"] if champion else None

    runs, skipped = _scan(out)
    finished = sorted((r for r in runs if r.finished_at is not None), key=lambda r: (r.finished_at, r.run.name))
    recent = {r.run.name for r in finished[::-1][: policy.keep_last_runs]}
    kept: dict[str, KeptReason] = {}
    pruned: list[str] = []
    already: list[str] = []
    freed = 0
    for r in runs:
        name = r.run.name
        is_champion = name == champion_name or r.run.path.resolve() == champion_dir
        if r.finished_at is None or is_champion or name in recent:
            kept[name] = "unfinished" if r.finished_at is None else "champion" if is_champion else "recent"
            if _in_progress(r.run):
                kept[name] = "in progress"
            elif r.finished_at is not None and _exists(r.run.path / TRASH):  # an interrupted call's, in a kept run
                with contextlib.suppress(RunLockedError), _held(r.run):  # (what is left of the run stays)
                    freed += _size(r.run.path / TRASH)
                    _rmtree(r.run.path / TRASH)
            continue
        try:
            with _held(r.run):
                outcome, size = _prune(r.run, policy)
        except RunLockedError:
            kept[name] = "in progress"
            continue
        freed += size
        (pruned if outcome == "pruned" else already).append(name)
    protecting = [r for r in runs if r.run.name in kept]
    if champion_dir is not None and all(r.run.path.resolve() != champion_dir for r in runs):  # one elsewhere
        protecting.append(_Run(RunDir(champion_dir), None, *_references(RunDir(champion_dir))))
    removed: list[str] = []
    if snapshot_roots and (skipped or not all(r.refs_known for r in protecting)):
        unknown = sorted([*skipped, *(r.run.name for r in protecting if not r.refs_known)])
        log.warning("removing no data snapshot: the snapshots of run(s) %s in %s are unknown", unknown, out)
    elif snapshot_roots:
        refs = {p for r in protecting for p in r.refs}
        fingerprints = {f for r in protecting for f in r.fingerprints}
        cutoff = now - policy.snapshot_max_age_days * 86400
        for root in snapshot_roots:
            paths, size = _remove_snapshots(Path(root), refs, fingerprints, cutoff)
            removed += paths
            freed += size
    report = RetentionReport(
        kept=dict(sorted(kept.items())),
        pruned=tuple(pruned),
        already_pruned=tuple(already),
        skipped=tuple(skipped),
        snapshots_removed=tuple(removed),
        bytes_freed=freed,
    )
    log.info("%s (%s)", report.summary(), out)
    return report


# MARK: runs


def _scan(out: Path) -> tuple[list[_Run], list[str]]:
    """The run directories of ``out`` by name, and the names of those that could not be read."""
    layout = OutputDir(out)
    runs: list[_Run] = []
    skipped: list[str] = []
    for child in sorted(out.iterdir()):
        if child.name.startswith(".") or child in (layout.corrupt_state, layout.monitoring):
            continue
        try:
            if child.is_symlink() or not child.is_dir() or not any((child / m).exists() for m in _RUN_MARKERS):
                continue
            run = RunDir(child)
            try:
                finished_at: float | None = run.report_json.stat().st_mtime
            except FileNotFoundError:
                finished_at = None
            refs, fingerprints, known = _references(run)
        except OSError as err:
            log.warning("skipping run directory %s: it cannot be read (%s)", child, err)
            skipped.append(child.name)
            continue
        runs.append(_Run(run, finished_at, refs, fingerprints, known))
    return runs, skipped


def _references(run: RunDir) -> tuple[set[Path], set[str], bool]:
    """The snapshot directories (resolved) and fingerprints ``run`` refers to, and whether
    every reference could be read (a missing file is no reference; a damaged one is unknown)."""
    refs: set[Path] = set()
    fingerprints: set[str] = set()
    known = True
    for path, key in ((run.data_snapshot, None), (run.report_json, "data_snapshot")):
        try:
            obj = json.loads(path.read_bytes())
        except FileNotFoundError:
            continue
        except (ValueError, RecursionError, OSError) as err:
            log.warning("cannot read the data snapshot %s refers to (%s)", path, err)
            known = False
            continue
        if key is not None:
            if not isinstance(obj, dict) or key not in obj or obj[key] is None:
                continue
            obj = obj[key]
        if not isinstance(obj, dict) or not isinstance(obj.get("path"), str):
            log.warning("%s names no data snapshot path", path)
            known = False
            continue
        refs.add(Path(obj["path"]).resolve())
        if isinstance(obj.get("fingerprint"), str) and obj["fingerprint"]:
            fingerprints.add(obj["fingerprint"])
    return refs, fingerprints, known


def _group_dirs(run: RunDir) -> list[Path]:
    """The directories under ``run`` that train with a lock file of their own: member
    groups, a hyper-deep ensemble's stratified pool (``stratified/``) and its groups."""
    dirs = [*run.existing_groups(), run.stratified, *run.stratified.existing_groups()]
    return [d.path for d in dirs if d.lock.is_file()]


def _in_progress(run: RunDir) -> bool:
    """Whether a process holds ``run``'s lock or one of its member groups' (takes nothing)."""
    try:
        for path in (run.path, *_group_dirs(run)):
            ensure_unlocked(path)
    except RunLockedError:
        return True
    return False


@contextlib.contextmanager
def _held(run: RunDir) -> Iterator[None]:
    """Hold ``run``'s lock and its member groups' locks, without blocking.

    Raises:
      RunLockedError: a run (or a member group) holds one of them: it is in progress.
    """
    with contextlib.ExitStack() as stack:
        stack.enter_context(run_lock(run.path))
        for group in _group_dirs(run):
            stack.enter_context(run_lock(group))
        yield


def _heavy(run: RunDir) -> list[Path]:
    """What pruning deletes, in its order: the checkpoints first (the step that ends a whole run)."""
    heavy = [run.checkpoints, run.groups_dir, run.stratified.path, run.corrupt_checkpoints, run.predictions]
    return [*heavy, run.eval_dir]


def _prune(run: RunDir, policy: RetentionConfig) -> tuple[Literal["pruned", "already pruned"], int]:
    """Delete ``run``'s checkpoints and predictions through its trash (the caller holds its
    lock); ``pruned.json`` is written once every entry is in the trash, before it is deleted.

    Returns:
      Whether anything was deleted, and the bytes freed.
    """
    trash, marker = run.path / TRASH, run.path / PRUNED_FILE
    present = [p for p in _heavy(run) if _exists(p)]
    if not present and not _exists(trash):
        return "already pruned", 0
    leftover = {p.name for p in trash.iterdir()} if trash.is_dir() else set()  # an interrupted call's
    removed = [p.name for p in _heavy(run) if p in present or p.name in leftover]
    size = 0
    if leftover and present:  # start from an empty trash: no name can collide
        size += _size(trash)
        _rmtree(trash)
    trash.mkdir(exist_ok=True)
    for path in present:
        os.rename(path, trash / path.name)
    size += _size(trash)
    if present or not marker.exists():
        when = dt.datetime.now(dt.UTC).isoformat()
        record = {"pruned_at": when, "removed": removed, "bytes": size, "keep_last_runs": policy.keep_last_runs}
        atomic_write_json(marker, record)
    _rmtree(trash)
    log.info("pruned run %s: removed %s (%s)", run.path, removed, _human(size))
    return "pruned", size


# MARK: snapshots


def _remove_snapshots(root: Path, refs: set[Path], fingerprints: set[str], cutoff: float) -> tuple[list[str], int]:
    """Remove the snapshots under ``root/snapshots/`` not in ``refs`` (nor of a fingerprint in
    ``fingerprints``) last used before ``cutoff``; returns their paths and the bytes freed."""
    base = root / snapshot.SNAPSHOTS
    if base.is_symlink() or not base.is_dir():
        return [], 0
    freed = 0
    for stale in sorted(base.iterdir()):  # an interrupted call's trash
        if stale.name.startswith(".trash-") and not stale.is_symlink() and stale.is_dir():
            freed += _size(stale)
            _rmtree(stale)
    removed: list[str] = []
    for name_dir in sorted(base.iterdir()):
        if name_dir.name.startswith(".") or name_dir.is_symlink() or not name_dir.is_dir():
            continue
        for snap in sorted(name_dir.iterdir()):
            if snap.name.startswith(".") or snap.is_symlink() or not snap.is_dir():
                continue
            resolved = snap.resolve()
            if snap.name in fingerprints or any(r.is_relative_to(resolved) for r in refs):
                continue
            if snapshot.last_used(snap) >= cutoff:
                continue
            with flocked(snapshot.prepare_lock_path(root, name_dir.name)):
                if not snap.is_dir() or snapshot.last_used(snap) >= cutoff:  # reused (or removed) meanwhile
                    continue
                try:
                    # a run anywhere on this data dir holds the snapshot's lease while it uses it
                    with flocked(snapshot.lease_path(snap), blocking=False):
                        trash = base / f".trash-{name_dir.name}-{snap.name}-{uuid.uuid4().hex[:8]}"
                        os.rename(snap, trash)
                except LockHeldError:
                    log.info("kept data snapshot %s: a run is using it", snap)
                    continue
            size = _size(trash)
            _rmtree(trash)
            freed += size
            removed.append(str(snap))
            log.info("removed data snapshot %s, unused for the configured age (%s)", snap, _human(size))
    return removed, freed


# MARK: files


def _exists(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def _size(path: Path) -> int:
    """The bytes of every file under ``path`` (or of ``path`` itself); symlinks are not followed."""
    try:
        if not path.is_dir() or path.is_symlink():
            return path.lstat().st_size
    except FileNotFoundError:
        return 0
    total = 0
    for top, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(top, f)).st_size
    return total


def _rmtree(path: Path) -> None:
    """``shutil.rmtree``, where entries another process deleted first are no error."""

    def ignore_missing(exc: BaseException) -> None:
        if not isinstance(exc, FileNotFoundError):
            raise exc

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=lambda func, p, exc: ignore_missing(exc))
    else:
        shutil.rmtree(path, onerror=lambda func, p, info: ignore_missing(info[1]))


def _human(n: int) -> str:
    """``n`` bytes for people: ``512 B``, ``1.5 MB``, ..."""
    power = min(max((len(str(n)) - 1) // 3, 0), 4)
    return f"{n} B" if power == 0 else f"{n / 1000**power:.1f} {('KB', 'MB', 'GB', 'TB')[power - 1]}"
