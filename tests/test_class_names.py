"""Class names that would break the class map (one name per line in TFDS's
``label.labels.txt``), Unicode normalisation of class folders, and image folders whose
test split would be empty: each refused in one line naming the cause, or handled as one
class, through ``ensemble_core.data.prepare`` on real folders of PNGs."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import numpy as np
import pydantic
import pytest

from ensemble_core import data
from ensemble_core.config import DataConfig
from ensemble_core.data import UserSource
from ensemble_core.errors import DataError
from tests.test_own_data import folder_source, snapshots_of, write_folder

NFC_E = unicodedata.normalize("NFC", "\u00e9")  # é, one code point
NFD_E = unicodedata.normalize("NFD", "\u00e9")  # e + combining acute accent


def refused(root: Path, tfds: Path, source: UserSource | None = None, name: str = "bad") -> str:
    """The one-line message of the refusal to prepare ``root``; nothing left prepared."""
    with pytest.raises(DataError) as err:
        data.prepare(name, str(tfds), None, source or folder_source(root))
    msg = str(err.value)
    assert "\n" not in msg and "\r" not in msg and "fix:" in msg, msg
    assert "writable" not in msg and "No examples were yielded" not in msg, msg
    assert snapshots_of(tfds, name) == []
    return msg


# MARK: names that break the class map


@pytest.mark.parametrize(
    ("folder", "cause"),
    [
        ("cat\ndog", r"'cat\\ndog' .*control character '\\n'"),
        ("cat\tdog", r"'cat\\tdog' .*control character '\\t'"),
        ("cat\rdog", r"'cat\\rdog' .*control character '\\r'"),
        ("cat\x7f", r"'cat\\x7f' .*control character '\\x7f'"),
        ("cat\u2028dog", r"'cat\\u2028dog' .*control character '\\u2028'"),
        (" cat", r"' cat' .*begins or ends with white space.*fix: rename the folder to 'cat'"),
        ("cat ", r"'cat ' .*begins or ends with white space"),
    ],
)
def test_a_class_folder_name_that_breaks_the_class_map_is_refused_in_one_line(tmp_path, folder, cause):
    root = tmp_path / "pets"
    write_folder(root, {folder: 3, "fish": 3})
    msg = refused(root, tmp_path / "tfds")
    assert re.search(cause, msg), msg
    assert "class folder" in msg and "fix: rename the folder" in msg, msg


def test_a_newline_folder_in_test_is_refused_too(tmp_path):
    root = tmp_path / "pets"
    write_folder(root, {"cat": 3, "fish": 3})
    write_folder(root, {"cat\nx": 1, "fish": 1}, split="test")
    assert re.search(r"'cat\\nx' in '.*/test' has the control character", refused(root, tmp_path / "tfds"))


def test_nfc_in_train_and_nfd_in_test_are_one_class(tmp_path):
    root = tmp_path / "cafe"
    write_folder(root, {NFC_E: 3, "b": 2})
    write_folder(root, {NFD_E: 2, "b": 1}, split="test", seed=1)
    assert sorted(p.name for p in (root / "test").iterdir()) == sorted(["b", NFD_E])  # the file system keeps NFD
    info = data.prepare("cafe", str(tmp_path / "tfds"), None, folder_source(root))
    assert info.class_names == ("b", NFC_E) and info.num_classes == 2
    assert (info.num_train, info.num_test) == (5, 3)
    _, labels = data.load_split("cafe", "test", info.tfds_data_dir)
    assert sorted(labels.tolist()) == [0, 1, 1]  # the NFD folder's images are class 'é'


def test_nfd_in_train_is_named_in_nfc(tmp_path):
    root = tmp_path / "cafe"
    write_folder(root, {NFD_E: 2, "b": 2})
    write_folder(root, {NFC_E: 1, "b": 1}, split="test", seed=1)
    info = data.prepare("cafe", str(tmp_path / "tfds"), None, folder_source(root))
    assert info.class_names == ("b", NFC_E) and info.num_test == 2


def test_two_folders_one_name_in_nfc_are_refused_as_duplicates(tmp_path):
    root = tmp_path / "cafe"
    write_folder(root, {NFC_E: 2, NFD_E: 2, "b": 2})
    msg = refused(root, tmp_path / "tfds")
    assert "are one name" in msg and "two folders of one class" in msg and "fix: merge them" in msg, msg
    assert repr(NFC_E) in msg and repr(NFD_E) in msg, msg


def test_a_prepared_class_map_has_one_name_per_class(tmp_path):
    root = tmp_path / "parts"
    write_folder(root, {"bolt": 2, "nut washer": 2, NFD_E: 2})
    info = data.prepare("parts", str(tmp_path / "tfds"), None, folder_source(root))
    assert info.class_names == ("bolt", "nut washer", NFC_E) and info.num_classes == 3
    lines = (Path(info.data_dir) / "label.labels.txt").read_text().splitlines()
    assert lines == list(info.class_names)


def test_a_prepared_class_map_with_more_names_than_classes_is_refused_when_read(tmp_path):
    root, tfds = tmp_path / "parts", tmp_path / "tfds"
    write_folder(root, {"bolt": 2, "nut": 2})
    info = data.prepare("parts", str(tfds), None, folder_source(root))
    labels_txt = Path(info.data_dir) / "label.labels.txt"
    labels_txt.write_text("bolt\nnut\nextra\n")  # what a name with a newline left behind
    with pytest.raises(DataError) as err:
        data.prepare("parts", str(tfds), None, folder_source(root))
    msg = str(err.value)
    assert "\n" not in msg and "is damaged" in msg and "3 class names for 2 classes" in msg, msg
    assert f"fix: delete {info.data_dir}" in msg, msg


def test_arrays_class_names_that_break_the_class_map_are_refused_before_writing(tmp_path):
    arrays, tfds = tmp_path / "arr", tmp_path / "tfds"
    arrays.mkdir()
    rng = np.random.default_rng(0)
    for split, n in (("train", 6), ("test", 4)):
        images = rng.integers(0, 256, (n, 4, 4), dtype=np.uint8)
        np.savez(arrays / f"{split}.npz", image=images, label=np.arange(n) % 2)
    source = UserSource(kind="arrays", path=str(arrays), class_names=("cat\ndog", "fish"))
    msg = refused(arrays, tfds, source, name="arr")
    assert "'cat\\ndog'" in msg and "class map" in msg, msg


def test_config_class_names_are_nfc_and_refused_with_control_characters_or_outer_spaces():
    config = DataConfig(source="arrays", path="/data/arr", class_names=[NFD_E, "b"])
    assert config.class_names == (NFC_E, "b")
    for bad, cause in (("cat\ndog", "control character"), ("a\tb", "control character"), (" cat", "white space")):
        with pytest.raises(pydantic.ValidationError) as err:
            DataConfig(source="arrays", path="/data/arr", class_names=[bad, "b"])
        assert cause in str(err.value) and repr(bad) in str(err.value), str(err.value)
    with pytest.raises(pydantic.ValidationError, match="distinct names"):
        DataConfig(source="arrays", path="/data/arr", class_names=[NFD_E, NFC_E])


# MARK: an empty test split


def test_one_image_per_class_and_no_test_folder_is_refused_in_the_scan(tmp_path):
    root = tmp_path / "tiny"
    write_folder(root, {"a": 1, "b": 1, "c": 1})
    msg = refused(root, tmp_path / "tfds")
    assert "no test folder" in msg and "holds one file" in msg and "test split" in msg, msg
    assert "fix: add test images" in msg, msg


def test_a_test_folder_holding_only_ds_store_is_refused_in_the_scan(tmp_path):
    root = tmp_path / "mac"
    write_folder(root, {"a": 2, "b": 2})
    (root / "test").mkdir()
    (root / "test" / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    msg = refused(root, tmp_path / "tfds")
    assert "test folder" in msg and "holds no class folder" in msg and ".DS_Store" in msg, msg
    assert "to hold out data.test_fraction" in msg, msg


def test_a_carved_test_split_left_empty_by_skipped_images_is_refused_before_writing(tmp_path):
    root = tmp_path / "skip"
    write_folder(root, {"a": 2, "b": 2})
    for name in ("a", "b"):  # one undecodable file per class: each class keeps one image
        (root / "train" / name / "0001.png").write_bytes(b"not a png")
    msg = refused(root, tmp_path / "tfds", folder_source(root, on_bad_image="skip"))
    assert "test split held out from train" in msg and "is empty" in msg and "fewer than two" in msg, msg
