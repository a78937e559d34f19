"""The IDX builder (``mnist``, ``fashion_mnist``): the reader against a parse of its own,
the real Fashion-MNIST files of Debian's ``dataset-fashion-mnist``, the missing-files
error, and a ``manual_dir`` of small synthetic files."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

from ensemble_core import data
from ensemble_core.data import preparation
from ensemble_core.errors import DataError

FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")


def _idx_bytes(array: np.ndarray, code: int = 0x08) -> bytes:
    """The IDX encoding of ``array``, written with struct (independent of read_idx)."""
    big = array.astype(array.dtype.newbyteorder(">"))
    header = struct.pack(">BBBB", 0, 0, code, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + big.tobytes()


def _reference_parse(path: Path) -> np.ndarray:
    """Parse a uint8 IDX file with struct and np.frombuffer: the test's own oracle."""
    raw = path.read_bytes()
    if path.suffix == ".gz":
        raw = gzip.decompress(raw)
    zero, code, ndim = struct.unpack(">HBB", raw[:4])
    assert zero == 0 and code == 0x08
    shape = struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim])
    return np.frombuffer(raw[4 + 4 * ndim :], np.uint8).reshape(shape)


def _write_idx_dir(directory: Path, n_train: int, n_test: int, seed: int = 0) -> dict:
    """The four IDX files of a synthetic dataset (train gzipped, test plain)."""
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for prefix, n, gz in (("train", n_train, True), ("t10k", n_test, False)):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = (np.arange(n) % 10).astype(np.uint8)
        for kind, array in (("images-idx3", images), ("labels-idx1", labels)):
            name = f"{prefix}-{kind}-ubyte"
            raw = _idx_bytes(array)
            if gz:
                (directory / f"{name}.gz").write_bytes(gzip.compress(raw))
            else:
                (directory / name).write_bytes(raw)
        arrays[prefix] = (images, labels)
    return arrays


# (a) the reader


@pytest.mark.parametrize("gz", [True, False], ids=["gzip", "plain"])
def test_read_idx_matches_an_independent_parse(tmp_path, gz):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (7, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, 7).astype(np.uint8)
    for name, array in (("img", images), ("lab", labels)):
        raw = _idx_bytes(array)
        path = tmp_path / (f"{name}.gz" if gz else name)
        path.write_bytes(gzip.compress(raw) if gz else raw)
        got = data.read_idx(path)
        assert got.dtype == np.uint8 and got.shape == array.shape
        np.testing.assert_array_equal(got, _reference_parse(path))
        np.testing.assert_array_equal(got, array)


def test_read_idx_other_dtypes_are_big_endian(tmp_path):
    values = np.array([[1, -2, 300], [70000, -5, 0]], np.int32)
    path = tmp_path / "ints"
    path.write_bytes(_idx_bytes(values, 0x0C))
    got = data.read_idx(path)
    assert got.dtype == np.dtype("int32") and got.dtype.isnative
    np.testing.assert_array_equal(got, values)


@pytest.mark.parametrize(
    "case, fragment",
    [
        ("bad_magic", "magic number"),
        ("bad_dtype", "dtype code 0x07"),
        ("truncated", "truncated or padded"),
        ("padded", "truncated or padded"),
        ("short_header", "header"),
        ("empty", "magic number missing"),
        ("truncated_gzip", "cannot be read or decompressed"),
        ("missing", "does not exist"),
    ],
)
def test_read_idx_refuses_damaged_files_with_one_line(tmp_path, case, fragment):
    raw = _idx_bytes(np.arange(2 * 28 * 28, dtype=np.uint8).reshape(2, 28, 28) % 251)
    content = {
        "bad_magic": b"\x01\x02" + raw[2:],
        "bad_dtype": raw[:2] + b"\x07" + raw[3:],
        "truncated": raw[:-1],
        "padded": raw + b"\0",
        "short_header": raw[:9],
        "empty": b"",
        "truncated_gzip": gzip.compress(raw)[:-30],
        "missing": None,
    }[case]
    path = tmp_path / "file-idx3-ubyte.gz"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(DataError) as err:
        data.read_idx(path)
    message = str(err.value)
    assert fragment in message and str(path) in message and "fix:" in message and "\n" not in message


# (b) the real Fashion-MNIST files


@pytest.fixture(scope="module")
def fashion_dir(tmp_path_factory):
    if data.idx_files_available("fashion_mnist") is None:
        pytest.skip(f"the Fashion-MNIST IDX files are not in {FASHION_DIR}; fix: apt-get install dataset-fashion-mnist")
    tfds_dir = tmp_path_factory.mktemp("tfds")
    return tfds_dir, data.prepare("fashion_mnist", str(tfds_dir))


@pytest.mark.slow
def test_fashion_mnist_prepares_from_the_debian_files(fashion_dir):
    tfds_dir, info = fashion_dir
    assert (info.num_train, info.num_test, info.num_classes, info.image_shape) == (60000, 10000, 10, (28, 28, 1))
    assert (
        Path(info.data_dir)
        == tfds_dir / "snapshots" / "fashion_mnist" / info.snapshot.fingerprint / "fashion_mnist" / "1.0.0"
    )
    assert data.idx_files_available("fashion_mnist") == FASHION_DIR
    assert data.prepare("fashion_mnist", str(tfds_dir)) == info  # prepared once, then reused
    names = preparation.tfds_builder("fashion_mnist", info.tfds_data_dir).info.features["label"].names
    assert names == list(data.FASHION_MNIST_CLASSES) and names[0] == "T-shirt/top" and names[9] == "Ankle boot"


@pytest.mark.slow
def test_fashion_mnist_test_split_equals_the_gz_files(fashion_dir):
    _, info = fashion_dir
    images, labels = data.load_split("fashion_mnist", "test", info.tfds_data_dir)
    ref_images = _reference_parse(FASHION_DIR / "t10k-images-idx3-ubyte.gz")
    ref_labels = _reference_parse(FASHION_DIR / "t10k-labels-idx1-ubyte.gz")
    assert images.shape == (10000, 28, 28, 1) and images.dtype == np.uint8 and labels.dtype == np.int32
    for i in (0, 1, 9999):  # in file order
        np.testing.assert_array_equal(images[i, ..., 0], ref_images[i])
        assert labels[i] == ref_labels[i]
    np.testing.assert_array_equal(labels, ref_labels)
    np.testing.assert_array_equal(images[..., 0], ref_images)
    assert np.bincount(labels, minlength=10).tolist() == [1000] * 10
    train_images, train_labels = data.load_split("fashion_mnist", "train", info.tfds_data_dir, limit=5)
    np.testing.assert_array_equal(train_labels, _reference_parse(FASHION_DIR / "train-labels-idx1-ubyte.gz")[:5])
    assert train_images.shape == (5, 28, 28, 1)


# (c) missing files


def test_missing_files_error_names_the_directory_and_the_fix(tmp_path, monkeypatch):
    apt = "apt-get install dataset-fashion-mnist"
    monkeypatch.setitem(data.IDX_SOURCES, "fashion_mnist", (str(tmp_path / "nowhere"), apt))
    assert data.idx_files_available("fashion_mnist") is None
    with pytest.raises(DataError) as err:
        data.prepare("fashion_mnist", str(tmp_path / "tfds"))
    message = str(err.value)
    assert message.startswith(f"the IDX files of 'fashion_mnist' are not in {tmp_path / 'nowhere'} (")
    assert "fix: apt-get install dataset-fashion-mnist, or set data.manual_dir to a directory holding" in message
    assert all(f in message for f in data.IDX_FILES) and "\n" not in message
    assert not (tmp_path / "tfds" / "fashion_mnist").exists()


def test_missing_mnist_files_say_to_set_manual_dir(tmp_path):
    partial = tmp_path / "partial"
    _write_idx_dir(partial, 3, 2)
    (partial / "t10k-labels-idx1-ubyte").unlink()
    assert data.idx_files_available("mnist", partial) is None
    with pytest.raises(DataError) as err:
        data.prepare("mnist", str(tmp_path / "tfds"), str(partial))
    message = str(err.value)
    assert f"are not in {partial} (data.manual_dir; missing: t10k-labels-idx1-ubyte.gz)" in message
    assert "fix: set data.manual_dir to a directory holding" in message and "apt-get" not in message


# (d) manual_dir with synthetic files


def test_manual_dir_with_synthetic_files_prepares_mnist(tmp_path):
    src = tmp_path / "idx"
    arrays = _write_idx_dir(src, 50, 20)
    assert data.idx_files_available("mnist", str(src)) == src
    tfds_dir = str(tmp_path / "tfds")
    info = data.prepare("mnist", tfds_dir, str(src))
    assert (info.name, info.num_train, info.num_test, info.image_shape) == ("mnist", 50, 20, (28, 28, 1))
    assert Path(info.data_dir) == Path(info.tfds_data_dir) / "mnist" / "1.0.0"
    assert Path(info.tfds_data_dir) == tmp_path / "tfds" / "snapshots" / "mnist" / info.snapshot.fingerprint
    for split, prefix in (("train", "train"), ("test", "t10k")):
        images, labels = data.load_split("mnist", split, info.tfds_data_dir)
        np.testing.assert_array_equal(images[..., 0], arrays[prefix][0])  # file order
        np.testing.assert_array_equal(labels, arrays[prefix][1])


def test_bad_idx_file_in_manual_dir_is_refused_before_anything_is_written(tmp_path):
    src = tmp_path / "idx"
    _write_idx_dir(src, 5, 4)
    raw = (src / "t10k-images-idx3-ubyte").read_bytes()
    (src / "t10k-images-idx3-ubyte").write_bytes(raw[:-10])
    with pytest.raises(DataError, match=r"t10k-images-idx3-ubyte is not a valid IDX file: .*truncated or padded"):
        data.prepare("mnist", str(tmp_path / "tfds"), str(src))
    assert not (tmp_path / "tfds" / "mnist" / "1.0.0").exists()
    labels = tmp_path / "labels"
    _write_idx_dir(labels, 5, 4)
    (labels / "t10k-labels-idx1-ubyte").write_bytes(_idx_bytes(np.array([0, 1, 2, 12], np.uint8)))
    with pytest.raises(DataError, match=r"1 labels in .*t10k-labels-idx1-ubyte are outside \[0, 10\)"):
        data.prepare("mnist", str(tmp_path / "tfds2"), str(labels))


def test_idx_names_take_precedence_over_the_catalog():
    for name in ("mnist", "fashion_mnist"):
        builder = preparation.tfds_builder(name, None)
        assert builder.name == name and str(builder.version) == "1.0.0"
        assert builder.info.features["image"].shape == (28, 28, 1)
    with pytest.raises(DataError, match="not an IDX dataset"):
        data.idx_files_available("cifar10")
