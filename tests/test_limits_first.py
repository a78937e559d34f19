"""Limits checked before allocating (reliability round five, class 3).

Every array header of an arrays source (images and labels, inside the ``.npz``) is bounded
before anything is loaded; a label that cannot be a class index is refused before any
per-class allocation; every evaluator's requirements on the data are checked in the
preflight, before training: a default evaluator that cannot run is skipped with one logged
line, one the user named is refused in one line. Real files in ``tmp_path``, through the
real entry points (data preparation, the run's preflight).
"""

from __future__ import annotations

import io
import logging
import time
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest

from ensemble_core import data
from ensemble_core.config import load_config
from ensemble_core.data import UserSource
from ensemble_core.data.npz_arrays import npy_header
from ensemble_core.errors import DataError
from ensemble_core.evaluators import EvalContext, common_corruptions
from ensemble_core.runs.preflight import preflight

ROOT = Path(__file__).resolve().parents[1]
#: What a refusal may allocate (Python and NumPy, traced): far below any array it refuses.
PEAK_BYTES = 32 * 2**20
SECONDS = 5.0


def _npz(path: Path, **arrays) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **arrays)


def _huge_npy(shape: tuple[int, ...], dtype=np.int64) -> bytes:
    """A valid ``.npy`` header claiming ``shape`` (written by NumPy itself), then 16 bytes."""
    out = io.BytesIO()
    np.lib.format.write_array_header_2_0(
        out, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": shape}
    )
    return out.getvalue() + bytes(16)


def _npz_with(path: Path, members: dict[str, bytes | np.ndarray], compression=zipfile.ZIP_STORED) -> None:
    """A ``.npz`` written member by member (a raw ``bytes`` member as it is)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", compression=compression) as archive:
        for name, value in members.items():
            if isinstance(value, np.ndarray):
                buf = io.BytesIO()
                np.lib.format.write_array(buf, value)
                value = buf.getvalue()
            archive.writestr(f"{name}.npy", value)


def _refused(source: UserSource, tfds_dir: Path) -> str:
    """Prepare ``source``, which must be refused quickly, allocating nothing large, in one line."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(DataError) as err:
            data.prepare("arr", str(tfds_dir), None, source)
        seconds = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    msg = str(err.value)
    assert "\n" not in msg and "fix:" in msg, msg
    assert seconds < SECONDS, (seconds, msg)
    assert peak < PEAK_BYTES, (peak, msg)
    base = tfds_dir / "snapshots" / "arr"
    assert not base.is_dir() or not any(p.is_dir() for p in base.iterdir())  # nothing prepared
    return msg


def _pixels(n: int, side: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, side, side), dtype=np.uint8)


# MARK: labels bound the classes


def test_a_label_of_a_billion_is_refused_before_any_class_is_allocated(tmp_path):
    labels = np.array([0, 1, 0, 1, 0, 1, 0, 10**9])
    _npz(tmp_path / "arr" / "train.npz", image=_pixels(len(labels), 8), label=labels)
    msg = _refused(UserSource(kind="arrays", path=str(tmp_path / "arr")), tmp_path / "tfds")
    assert "label 1,000,000,000" in msg and "on 1 example(s), first at index 7" in msg, msg
    assert "not below the 8 examples" in msg and "data.class_names" in msg, msg


def test_a_label_beyond_the_class_names_is_refused_with_its_count(tmp_path):
    labels = np.array([0, 1, 2, 0, 1, 7, 7])
    _npz(tmp_path / "arr" / "train.npz", image=_pixels(len(labels), 8), label=labels)
    source = UserSource(kind="arrays", path=str(tmp_path / "arr"), class_names=("a", "b", "c"))
    msg = _refused(source, tmp_path / "tfds")
    assert "outside [0, 3) (first: 7 at index 5)" in msg and "label 7 is on 2 example(s)" in msg, msg


def test_labels_up_to_the_example_count_are_still_classes(tmp_path):
    # classes 0, 1 and 5 of 6 examples: names 0..5, the unused ones kept (as before)
    labels = np.array([0, 1, 0, 1, 5, 5])
    _npz(tmp_path / "arr" / "train.npz", image=_pixels(len(labels), 8), label=labels)
    info = data.prepare("arr", str(tmp_path / "tfds"), None, UserSource(kind="arrays", path=str(tmp_path / "arr")))
    assert info.class_names == tuple(str(i) for i in range(6))


# MARK: every header bounded before loading


@pytest.mark.parametrize("compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED], ids=["stored", "deflated"])
def test_a_label_member_claiming_a_trillion_entries_is_refused_from_its_header(tmp_path, compression):
    path = tmp_path / "arr" / "train.npz"
    _npz_with(path, {"image": _pixels(8, 8), "label": _huge_npy((10**12,))}, compression)
    msg = _refused(UserSource(kind="arrays", path=str(tmp_path / "arr")), tmp_path / "tfds")
    assert "'label': its header claims int64 of shape (1000000000000,)" in msg and "bytes are stored" in msg, msg


def test_an_image_member_claiming_more_than_is_stored_is_refused_even_when_resized_small(tmp_path):
    # data.image_size would make the decoded images small: the raw array is bounded too
    path = tmp_path / "arr" / "train.npz"
    _npz_with(path, {"image": _huge_npy((8, 10**6, 10**6), np.uint8), "label": np.arange(8) % 2})
    source = UserSource(kind="arrays", path=str(tmp_path / "arr"), image_size=(8, 8))
    msg = _refused(source, tmp_path / "tfds")
    assert "'image': its header claims uint8 of shape (8, 1000000, 1000000)" in msg, msg


def test_a_label_array_larger_than_memory_is_refused_before_loading(tmp_path, monkeypatch):
    from ensemble_core import memory

    _npz(tmp_path / "arr" / "train.npz", image=_pixels(64, 2), label=np.arange(64) % 2)  # 256 B of pixels
    monkeypatch.setattr(memory, "host_available_bytes", lambda: (2 * 64 * 8 - 1, "this test's memory"))
    msg = _refused(UserSource(kind="arrays", path=str(tmp_path / "arr")), tmp_path / "tfds")
    assert "'label' of shape (64,) takes 512 B, more than half" in msg, msg


def test_a_npy_file_header_is_bounded_by_the_bytes_stored(tmp_path):
    path = tmp_path / "label.npy"
    path.write_bytes(_huge_npy((10**12,)))
    with path.open("rb") as f, pytest.raises(DataError, match=r"claims int64 of shape \(1000000000000,\)"):
        npy_header(f, str(path), path.stat().st_size)
    np.save(path, np.arange(5))
    with path.open("rb") as f:
        assert npy_header(f, str(path), path.stat().st_size) == ((5,), np.dtype(np.int64))


# MARK: evaluator requirements in the preflight


def _tiny_images_config(tmp_path: Path, *extra: str):
    """A config over an arrays source of 4x4 grey images of two classes."""
    rng = np.random.default_rng(1)
    _npz(tmp_path / "arr" / "train.npz", image=_pixels(48, 4), label=np.arange(48) % 2)
    _npz(tmp_path / "arr" / "test.npz", image=_pixels(16, 4, 2), label=rng.permutation(np.arange(16) % 2))
    overrides = [
        "data.source=arrays",
        f"data.path={tmp_path / 'arr'}",
        "data.name=tiny4",
        f"data.data_dir={tmp_path / 'tfds'}",
        "data.max_train_examples=null",
        "data.max_test_examples=null",
        "model.hidden_sizes=[8]",
        "ensemble.size=2",
        "train.batch_size=8",
        *extra,
    ]
    return load_config(ROOT / "configs" / "tiny.yaml", overrides)


def test_default_evaluators_that_cannot_run_on_4x4_images_are_skipped_with_one_line_before_training(tmp_path, caplog):
    cfg = _tiny_images_config(tmp_path)
    assert "common_corruptions" in cfg.eval.evaluators  # the dataset's defaults
    with caplog.at_level(logging.WARNING, logger="ensemble_core.evaluators"):
        dataset = preflight(cfg, tmp_path / "runs", "r")
    assert tuple(dataset.image_shape) == (4, 4, 1)
    lines = [r.getMessage() for r in caplog.records if r.name == "ensemble_core.evaluators"]
    assert lines == [
        "evaluator common_corruptions (a default) is skipped on dataset 'tiny4': the common corruptions need "
        "images of at least 8x8 pixels, not 4x4"
    ], lines
    assert not (tmp_path / "runs" / "r" / "checkpoints").exists()
    # evaluation skips it the same way instead of failing after training
    ctx = EvalContext(
        config=cfg,
        dataset=dataset,
        healthy=np.ones(2, bool),
        predict=None,
        load=None,
        predict_split=None,
        cached=None,
        predict_logits=None,
        predict_split_logits=None,
    ).for_evaluator("common_corruptions", cfg.eval.evaluators["common_corruptions"])
    assert "at least 8x8" in common_corruptions.evaluate(ctx).skipped


def test_an_evaluator_the_user_named_that_cannot_run_is_refused_in_one_line_before_training(tmp_path):
    cfg = _tiny_images_config(tmp_path, "eval.evaluators=[test, rotation, common_corruptions]")
    with pytest.raises(DataError) as err:
        preflight(cfg, tmp_path / "runs", "r")
    msg = str(err.value)
    assert "\n" not in msg and "fix:" in msg, msg
    assert msg.startswith("eval.evaluators.common_corruptions (common_corruptions) cannot run on dataset 'tiny4'"), msg
    assert "at least 8x8 pixels, not 4x4" in msg and "remove common_corruptions from eval.evaluators" in msg, msg
    assert not (tmp_path / "runs" / "r" / "checkpoints").exists()


def test_a_named_28x28_only_evaluator_is_refused_on_other_images(tmp_path):
    cfg = _tiny_images_config(tmp_path, "eval.evaluators=[test, letters]")
    with pytest.raises(DataError, match=r"eval\.evaluators\.letters \(letters\) cannot run .*28x28x1, not \(4, 4, 1\)"):
        preflight(cfg, tmp_path / "runs", "r")
