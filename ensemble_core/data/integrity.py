"""Damaged prepared datasets, found before any compute: a garbled ``dataset_info.json``, a
shard file missing, empty, truncated, corrupt or with the wrong record count. Every
finding is one :class:`~ensemble_core.errors.DataError` naming the directory and the fix
(delete it; the next run prepares it anew)."""

from __future__ import annotations

import contextlib
import json
import traceback
from pathlib import Path
from types import CodeType, FrameType

import tensorflow_datasets as tfds
from array_record.python import array_record_module

from ensemble_core.data.sources import EMBEDDED, IDX_SOURCES, one_line
from ensemble_core.errors import DataError

READ_METADATA = tfds.core.DatasetInfo.read_from_directory.__code__
SET_FILE_FORMAT = tfds.core.DatasetInfo.set_file_format.__code__


def frame_of(err: BaseException, code: CodeType) -> FrameType | None:
    """The frame of ``code`` in ``err``'s traceback (None if ``err`` did not pass it).

    Constructing a builder reads the prepared dataset's ``dataset_info.json``
    (``DatasetInfo.read_from_directory(dataset_info_dir)``) and then sets the file format
    (``DatasetInfo.set_file_format``). What those raise (json_format.ParseError,
    UnicodeDecodeError, DatasetInfoFileError, AssertionError for a wrong version;
    ValueError for a dataset stored as tfrecord) does not name the directory, and is
    not of a type that tells it from an unknown dataset name. Whether the error passed
    through one of these calls does, and that frame's locals name the directory.
    """
    for frame, _ in traceback.walk_tb(err.__traceback__):
        if frame.f_code is code:
            return frame
    return None


def damaged_error(name: str, variant_dir, what: str, cause: BaseException | None = None) -> DataError:
    """A one-line DataError for damage in a prepared dataset's directory.

    The fix works because :func:`prepare` treats a directory that does not exist as "not
    prepared" and builds it anew (TFDS skips preparing whenever the directory exists).
    """
    detail = f" ({one_line(cause)})" if cause is not None else ""
    again = "" if name == EMBEDDED or name in IDX_SOURCES else " (for a catalog dataset this downloads it again)"
    return DataError(
        f"dataset '{name}' in {variant_dir} is damaged: {what}{detail}; "
        f"fix: delete {variant_dir} and run again; the dataset is prepared anew{again}"
    )


def _check_shard(path: Path, expected_records: int) -> str | None:
    """What is wrong with one array_record shard, or None if it looks sound.

    Cheap: a missing or empty file is seen from ``stat``; otherwise only the file's footer
    and index are read (a truncated file or one overwritten with other bytes has no
    valid footer), and its record count is compared with ``shardLengths``.
    """
    if not path.is_file():
        return f"shard file {path} is missing"
    if path.stat().st_size == 0:
        return f"shard file {path} is empty (0 bytes)"
    reader = array_record_module.ArrayRecordReader(str(path), "readahead_buffer_size:0")
    try:
        if not reader.ok():
            try:  # the reader keeps its error status; reading raises it as RuntimeError
                reader.read([0])
                cause = "unreadable"
            except RuntimeError as err:
                cause = one_line(err)
            return f"shard file {path} is truncated or corrupt ({cause})"
        if reader.num_records() != expected_records:
            return f"shard file {path} holds {reader.num_records()} records, dataset_info.json lists {expected_records}"
        return None
    finally:
        with contextlib.suppress(RuntimeError):  # close() re-raises the status of a reader that failed to open
            reader.close()


def first_unreadable(paths: list[Path]) -> tuple[Path, RuntimeError] | None:
    """The first of ``paths`` whose records cannot all be read, with the reader's error.

    Reads every record, so it is called only after a read has already failed: it tells
    damage in a file (reported with the file's name) from a failure that is not about
    the files (re-raised as it is).
    """
    for path in paths:
        reader = array_record_module.ArrayRecordReader(str(path))
        try:
            if reader.ok():
                reader.read_all()
            else:
                reader.read([0])  # raises the reader's error status
        except RuntimeError as err:
            return path, err
        finally:
            with contextlib.suppress(RuntimeError):
                reader.close()
    return None


def split_names(split: str) -> list[str]:
    """The split names in a TFDS split spec: ``"train[:10%]+test"`` -> train, test."""
    return [part.split("[", 1)[0].strip() for part in split.split("+")]


def verify_prepared(builder, name: str, splits: list[str] | None = None) -> None:
    """Check a prepared dataset's files against its TFDS metadata, before reading them.

    Checks that ``features.json`` (when present) is valid JSON, that the metadata lists
    splits, that each requested split exists and lists shards, and that every shard file
    listed in ``dataset_info.json`` exists, is not empty, has a readable array_record
    footer and holds as many records as ``shardLengths`` says. ``numBytes`` is not
    compared with file sizes: TFDS records the size of the serialized examples there,
    not of the (compressed) files.

    This reads only footers, so corruption inside a file shows when the records are read
    (:func:`load_split` reports it then).

    Args:
      builder: a prepared TFDS builder (from :func:`_builder`).
      name: the dataset name, for the message.
      splits: split specs to check; None checks every split in the metadata.

    Raises:
      DataError: the first problem, naming the dataset directory and the damaged file,
        with the fix (delete the directory; it is prepared anew on the next run).
    """
    variant_dir = Path(builder.data_dir)
    features_json = variant_dir / "features.json"
    if features_json.exists():
        try:
            json.loads(features_json.read_text())
        except (OSError, ValueError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise damaged_error(name, variant_dir, f"{features_json} cannot be read", err) from err
    available = builder.info.splits
    if not list(available.keys()):
        raise damaged_error(name, variant_dir, f"{variant_dir / 'dataset_info.json'} lists no splits")
    wanted = list(available.keys()) if splits is None else [s for spec in splits for s in split_names(spec)]
    for split in wanted:
        if split not in available:
            raise DataError(
                f"dataset '{name}' has no split '{split}' (it has {sorted(available.keys())}); "
                f"fix: use one of those splits"
            )
        info = available[split]
        if not info.shard_lengths:
            raise damaged_error(name, variant_dir, f"dataset_info.json lists no shard files for split '{split}'")
        for path, length in zip(info.filepaths, info.shard_lengths, strict=True):
            problem = _check_shard(Path(path), int(length))
            if problem is not None:
                raise damaged_error(name, variant_dir, problem)


def manual_files(builder) -> list[str]:
    """The file names a TFDS builder downloads (its ``url_infos``), to name them in an error;
    empty when the builder cannot say."""
    try:
        return sorted({url.rsplit("/", 1)[-1] for url in builder.url_infos or {}})
    except Exception:  # noqa: BLE001  (only to name the files in a message; any failure: none)
        return []
