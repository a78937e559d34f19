"""The class map checked before preparation: an image folder's classes read from its folder
names alone (ensemble_core.runs.champion.retraining.folder_class_names), and the classes
without test images named (ensemble_core.runs.preflight.warn_classes_without_test_images).
The refusal of a new class folder through the command line, before anything is decoded, is
in tests/test_own_data.py."""

from __future__ import annotations

import logging

from ensemble_core.config import load_config
from ensemble_core.data import DatasetInfo
from ensemble_core.data.snapshot import DataSnapshot
from ensemble_core.runs.champion.retraining import class_map_refusal, folder_class_names
from ensemble_core.runs.preflight import warn_classes_without_test_images


def _folder(root, names):
    for name in names:
        (root / "train" / name).mkdir(parents=True)
        (root / "train" / name / "0.png").write_bytes(b"")


def test_folder_class_names_read_the_folder_names_as_the_scan_sorts_them(tmp_path):
    _folder(tmp_path, ["nut", "bolt", ".hidden", "washer"])
    (tmp_path / "train" / "stray.txt").write_text("not a class")
    cfg = load_config(None, ["data.source=image_folder", f"data.path={tmp_path}"])
    assert folder_class_names(cfg) == ("bolt", "nut", "washer")
    kept = load_config(None, ["data.source=image_folder", f"data.path={tmp_path}", "data.classes=[washer, bolt]"])
    assert folder_class_names(kept) == ("bolt", "washer")
    # what preparation itself refuses is left to it: a missing folder, one class, unknown classes
    assert folder_class_names(load_config(None, ["data.source=image_folder", f"data.path={tmp_path}/no"])) is None
    odd = load_config(None, ["data.source=image_folder", f"data.path={tmp_path}", "data.classes=[spring, bolt]"])
    assert folder_class_names(odd) is None
    assert folder_class_names(load_config(None, [])) is None  # not an image folder


def test_the_refusal_names_the_new_class_both_maps_and_the_fix():
    err = class_map_refusal("first", ("bolt", "nut"), ("bolt", "nut", "spring"))
    assert "class 'spring' is new since champion first (2 classes: bolt, nut; now 3: bolt, nut, spring)" in str(err)
    assert "nightly.when_classes_change: retrain" in str(err)
    assert "class 'nut' is gone" in str(class_map_refusal("first", ("bolt", "nut", "x"), ("bolt", "x")))


def _dataset(test_counts, class_indices=None, names=("bolt", "nut", "spring")):
    snap = DataSnapshot(
        fingerprint="f",
        name="shelf",
        kind="image_folder",
        source="s",
        version="1.0.0",
        path="/p",
        splits={"train": 30, "test": sum(test_counts)},
        class_counts={"train": [10] * len(test_counts), "test": list(test_counts)},
        prepared_at="2026-01-01T00:00:00+00:00",
        class_names=names,
    )
    kept = names if class_indices is None else tuple(names[i] for i in class_indices)
    return DatasetInfo(
        name="shelf",
        data_dir="/p",
        num_classes=len(kept),
        image_shape=(12, 12, 1),
        num_train=30,
        num_test=sum(test_counts),
        class_names=kept,
        snapshot=snap,
        class_indices=class_indices,
    )


def test_classes_without_test_images_are_named(caplog):
    with caplog.at_level(logging.WARNING):
        assert warn_classes_without_test_images(_dataset([3, 4, 0])) == ["spring"]
    assert "class 'spring' has no test images" in caplog.text and "fix:" in caplog.text
    assert warn_classes_without_test_images(_dataset([3, 4, 5])) == []
    assert warn_classes_without_test_images(_dataset([3, 0, 0], class_indices=(0, 2))) == ["spring"]
