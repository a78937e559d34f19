"""The derived sets' disk cap (``eval.derived_cache_mb``, :mod:`ensemble_core.runs.evaluation.cache`):
the least recently used sets go first, a set larger than the cap is used but not kept, and
every write is logged with the directory's total."""

from __future__ import annotations

import logging
import os

import numpy as np

from ensemble_core.config import PipelineConfig
from ensemble_core.config.eval_section import DEFAULT_DERIVED_CACHE_MB
from ensemble_core.data import DatasetInfo
from ensemble_core.runs.evaluation.cache import cached_arrays, derived_dir, disk_use

KB = 1024


def _info(tmp_path) -> DatasetInfo:
    return DatasetInfo(
        name="digits", data_dir=str(tmp_path / "digits" / "1.0.0"), num_classes=2, image_shape=(8, 8, 1),
        num_train=4, num_test=4,
    )  # fmt: skip


def _set(kb: int, value: int = 0):
    return lambda: {"images": np.full(kb * KB, value, np.uint8)}


def test_the_least_recently_used_sets_make_room(tmp_path, caplog):
    info, cap = _info(tmp_path), 100 * KB
    directory = derived_dir(info)
    for i, key in enumerate(("a", "b", "c")):
        cached_arrays(info, key, _set(30, i), cap_bytes=cap)
        os.utime(directory / f"{key}.npz", (1000 + i, 1000 + i))  # written in this order
    cached_arrays(info, "a", _set(30, 9), cap_bytes=cap)  # a read: "a" is the most recently used now
    assert os.stat(directory / "a.npz").st_mtime > 2000
    with caplog.at_level(logging.INFO, logger="ensemble_core.runs.evaluation.cache"):
        got = cached_arrays(info, "d", _set(30, 3), cap_bytes=cap)
    assert (got["images"] == 3).all()
    assert sorted(p.stem for p in directory.glob("*.npz")) == ["a", "c", "d"]  # "b" was the oldest
    assert disk_use(directory) <= cap
    assert "derived set d: 0.0 MB written" in caplog.text and "1 least recently used removed" in caplog.text
    # the set read back is the one kept, not built again
    assert (cached_arrays(info, "a", _set(30, 7), cap_bytes=cap)["images"] == 0).all()


def test_a_set_larger_than_the_cap_is_used_not_kept(tmp_path, caplog):
    info = _info(tmp_path)
    cached_arrays(info, "small", _set(10), cap_bytes=50 * KB)
    with caplog.at_level(logging.WARNING):
        got = cached_arrays(info, "big", _set(60, 1), cap_bytes=50 * KB)
    assert (got["images"] == 1).all() and got["images"].size == 60 * KB
    assert not (derived_dir(info) / "big.npz").exists()
    assert (derived_dir(info) / "small.npz").exists()  # nothing removed for a set that is not kept
    assert "larger than eval.derived_cache_mb" in caplog.text


def test_without_a_cap_nothing_is_removed(tmp_path):
    info = _info(tmp_path)
    for key in "abc":
        cached_arrays(info, key, _set(30))
    assert sorted(p.stem for p in derived_dir(info).glob("*.npz")) == ["a", "b", "c"]


def test_the_cap_is_a_documented_config_key():
    assert PipelineConfig().eval.derived_cache_mb == DEFAULT_DERIVED_CACHE_MB == 512
    assert PipelineConfig.model_validate({"eval": {"derived_cache_mb": 0}}).eval.derived_cache_mb == 0
