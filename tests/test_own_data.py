"""A user's own images as a dataset: image folders and arrays built in a temporary
directory (PNG and JPEG, grey and RGB, mixed sizes), prepared as snapshots, refused with
one line when bad, and trained through the command line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ensemble_core import data, image_decoding
from ensemble_core.config import DataConfig
from ensemble_core.data import UserSource, carve_test_split
from ensemble_core.errors import DataError
from ensemble_core.runs.dataset import prepare as prepare_config
from tests.prefect_api import cli_env

ROOT = Path(__file__).resolve().parents[1]


def _pixels(rng, shape) -> np.ndarray:
    return rng.integers(0, 256, shape, dtype=np.uint8)


def write_folder(
    root: Path, per_class: dict[str, int], split: str = "train", size=(12, 10), mode="L", ext="png", seed=0
):
    """``per_class`` images of ``size`` (H, W) per class folder; returns {relative path: array}."""
    rng = np.random.default_rng(seed)
    written = {}
    for name, n in per_class.items():
        directory = root / split / name
        directory.mkdir(parents=True, exist_ok=True)
        for i in range(n):
            shape = size if mode == "L" else (*size, 3)
            array = _pixels(rng, shape)
            path = directory / f"{i:04d}.{ext}"
            Image.fromarray(array, mode).save(path)
            written[str(path.relative_to(root))] = array
    return written


def snapshots_of(tfds_dir: Path, name: str) -> list[str]:
    """The snapshot directories of ``name`` (none when nothing was prepared)."""
    base = tfds_dir / "snapshots" / name
    return sorted(p.name for p in base.iterdir() if p.is_dir()) if base.is_dir() else []


def folder_source(path: Path, **kw) -> UserSource:
    return UserSource(kind="image_folder", path=str(path), **kw)


# MARK: preparing a folder


def test_png_folder_decodes_to_the_pixels_written_in_file_order(tmp_path):
    written = write_folder(tmp_path / "parts", {"bolt": 5, "nut": 4, "washer": 3})
    written |= write_folder(tmp_path / "parts", {"bolt": 2, "nut": 2, "washer": 2}, split="test", seed=1)
    info = data.prepare("parts", str(tmp_path / "tfds"), None, folder_source(tmp_path / "parts"))
    assert info.class_names == ("bolt", "nut", "washer") and info.num_classes == 3
    assert info.image_shape == (12, 10, 1) and (info.num_train, info.num_test) == (12, 6)
    images, labels = data.load_split("parts", "train", info.tfds_data_dir)
    # file-name order across classes, then class: 0000 of bolt, nut, washer, 0001 of ...
    keys = sorted((k for k in written if k.startswith("train/")), key=lambda k: (k.split("/")[2], k.split("/")[1]))
    expected = np.stack([written[k] for k in keys])[..., None]
    assert np.array_equal(images, expected)  # PNG is lossless: the very pixels written
    assert labels.tolist() == [["bolt", "nut", "washer"].index(k.split("/")[1]) for k in keys]
    lineage = info.snapshot
    assert lineage.kind == "image_folder" and lineage.file_count == 18 and lineage.class_names == info.class_names
    assert lineage.class_counts == {"train": [5, 4, 3], "test": [2, 2, 2]}
    assert lineage.source_path == str(tmp_path / "parts")


def test_jpeg_and_png_grey_and_rgb_of_mixed_sizes_with_image_size_and_channels(tmp_path):
    root = tmp_path / "mixed"
    write_folder(root, {"a": 3}, size=(20, 16), mode="RGB", ext="jpg")
    write_folder(root, {"b": 3}, size=(9, 30), mode="L", ext="png", seed=2)
    # Images with structure (gradients, a checkerboard, varying alpha) in the other modes a
    # folder may hold: grey, grey with alpha, palette, RGBA.
    r, c = np.mgrid[0:13, 0:17]
    ramp = (r * 17 + c).astype(np.uint8)  # 0..220, every pixel different
    checker = np.where((r // 2 + c // 3) % 2 == 1, 230, 20).astype(np.uint8)
    rgb = np.stack([r * 19, c * 15, 255 - (r + c) * 8], -1).astype(np.uint8)
    extra = {
        "ramp.png": Image.fromarray(ramp[:5, :7], "L"),  # 5x7, upsampled
        "la.png": Image.fromarray(np.stack([checker, ramp], -1), "LA"),
        "palette.png": Image.fromarray(rgb).quantize(12),
        "rgba.png": Image.fromarray(np.concatenate([rgb, ramp[..., None]], -1)[:11, :6], "RGBA"),
    }
    for name, image in extra.items():
        image.save(root / "train" / "a" / name)
        assert Image.open(root / "train" / "a" / name).mode == image.mode
    source = folder_source(root, image_size=(8, 8), channels=3)
    info = data.prepare("mixed", str(tmp_path / "tfds"), None, source)
    assert info.image_shape == (8, 8, 3) and info.num_train + info.num_test == 10
    train, test = (data.load_split("mixed", s, info.tfds_data_dir) for s in ("train", "test"))
    images, labels = np.concatenate([train[0], test[0]]), np.concatenate([train[1], test[1]])
    # The reference: Pillow itself, in the test: the file converted to RGB (luma replicated,
    # alpha dropped, the palette's colours), then resized bilinearly to 8x8.
    want = {}
    for path in sorted((root / "train").rglob("*.*")):
        with Image.open(path) as opened:
            pixels = np.asarray(opened.convert("RGB").resize((8, 8), Image.Resampling.BILINEAR))
        want[pixels.tobytes()] = (path.name, "ab".index(path.parent.name), pixels)
    assert len(want) == 10  # every reference distinct: each decoded image names its file
    found = {}
    for image, label in zip(images, labels, strict=True):
        if image.tobytes() not in want:
            pytest.fail(f"a decoded image (label {label}) is no file's Pillow conversion: {image[..., 0].tolist()}")
        name, klass, pixels = want[image.tobytes()]
        np.testing.assert_array_equal(image, pixels)
        assert label == klass and name not in found, name
        found[name] = image
    assert len(found) == 10
    assert len(np.unique(found["ramp.png"][..., 0])) > 20  # a gradient, not a constant
    for grey in ("ramp.png", "la.png"):  # grey: the three channels equal
        assert (found[grey] == found[grey][..., :1]).all()
    assert not (found["rgba.png"] == found["rgba.png"][..., :1]).all()  # colour stays colour


def test_mixed_sizes_without_image_size_name_the_first_file_that_differs(tmp_path):
    root = tmp_path / "sizes"
    write_folder(root, {"a": 2, "b": 2})
    Image.fromarray(np.zeros((13, 10), np.uint8)).save(root / "train" / "b" / "0001.png")
    with pytest.raises(DataError) as err:
        data.prepare("sizes", str(tmp_path / "tfds"), None, folder_source(root))
    msg = str(err.value)
    assert "train/b/0001.png is 13x10 pixels, the images before it 12x10" in msg and "data.image_size" in msg
    assert "\n" not in msg and snapshots_of(tmp_path / "tfds", "sizes") == []


def test_mixed_channels_without_channels_are_refused(tmp_path):
    root = tmp_path / "chan"
    write_folder(root, {"a": 2, "b": 2})
    Image.fromarray(np.zeros((12, 10, 3), np.uint8), "RGB").save(root / "train" / "b" / "0000.png")
    with pytest.raises(DataError, match=r"has 3 channel\(s\) \(RGB\), the images before it 1.*data\.channels"):
        data.prepare("chan", str(tmp_path / "tfds"), None, folder_source(root))


def test_a_palette_image_needs_channels(tmp_path):
    root = tmp_path / "pal"
    write_folder(root, {"a": 2, "b": 2})
    Image.new("P", (10, 12)).save(root / "train" / "a" / "0000.png")
    with pytest.raises(DataError, match=r"0000\.png is a Pillow 'P' image.*data\.channels"):
        data.prepare("pal", str(tmp_path / "tfds"), None, folder_source(root))
    info = data.prepare("pal", str(tmp_path / "tfds"), None, folder_source(root, channels=1))
    assert info.image_shape == (12, 10, 1)


# MARK: snapshots of a folder


def test_unchanged_folder_is_reused_and_every_change_is_a_new_snapshot(tmp_path):
    root, tfds = tmp_path / "parts", str(tmp_path / "tfds")
    write_folder(root, {"bolt": 4, "nut": 4})
    first = data.prepare("parts", tfds, None, folder_source(root))
    stamp = Path(first.data_dir).stat().st_mtime_ns
    assert data.prepare("parts", tfds, None, folder_source(root)) == first
    assert Path(first.data_dir).stat().st_mtime_ns == stamp  # reused, not prepared again
    seen = {first.snapshot.fingerprint}

    def changed() -> data.DatasetInfo:
        info = data.prepare("parts", tfds, None, folder_source(root))
        assert info.snapshot.fingerprint not in seen
        seen.add(info.snapshot.fingerprint)
        return info

    write_folder(root, {"nut": 5}, seed=3)  # rewrites nut/0000-0003 with new pixels, adds nut/0004.png
    assert sum(changed().snapshot.splits.values()) == 9
    shutil.move(root / "train" / "nut" / "0004.png", root / "train" / "bolt" / "0099.png")  # to another class
    changed()
    (root / "train" / "bolt" / "0099.png").unlink()  # removed
    changed()
    resized = data.prepare("parts", tfds, None, folder_source(root, image_size=(6, 6)))  # same files, new setting
    assert resized.snapshot.fingerprint not in seen and resized.image_shape == (6, 6, 1)
    assert len(snapshots_of(Path(tfds), "parts")) == len(seen) + 1


def test_a_file_moved_to_another_class_changes_the_labels(tmp_path):
    root, tfds = tmp_path / "parts", str(tmp_path / "tfds")
    write_folder(root, {"bolt": 4, "nut": 4}, split="train")
    write_folder(root, {"bolt": 1, "nut": 1}, split="test", seed=5)
    before = data.prepare("parts", tfds, None, folder_source(root))
    shutil.move(root / "train" / "nut" / "0003.png", root / "train" / "bolt" / "0003b.png")
    after = data.prepare("parts", tfds, None, folder_source(root))
    assert after.snapshot.fingerprint != before.snapshot.fingerprint
    assert (before.snapshot.class_counts["train"], after.snapshot.class_counts["train"]) == ([4, 4], [5, 3])


# MARK: the test split carved from train


def test_carved_test_split_is_stratified_fixed_and_stable_when_files_are_added(tmp_path):
    labels = np.repeat(np.arange(3), [50, 30, 20])
    keys = [f"c{c}/{i:04d}.png" for c, i in zip(labels, range(100), strict=True)]
    test = carve_test_split(keys, labels, 0.2)
    assert np.bincount(labels[test]).tolist() == [10, 6, 4]
    assert np.array_equal(test, carve_test_split(keys, labels, 0.2))  # the same every night
    more_labels = np.concatenate([labels, np.zeros(50, int)])
    more_keys = keys + [f"c0/new{i}.png" for i in range(50)]
    again = carve_test_split(more_keys, more_labels, 0.2)
    kept = {k for k, t in zip(keys, test, strict=True) if t} & {k for k, t in zip(more_keys, again, strict=True) if t}
    assert len(kept) >= 18  # classes 1 and 2 keep theirs exactly; class 0's quota only grows
    # an independent check of "stratified": every class within one example of its share
    for c in range(3):
        assert abs(int(test[labels == c].sum()) - 0.2 * int((labels == c).sum())) <= 1


def test_folder_without_test_split_gets_one_of_test_fraction(tmp_path):
    root = tmp_path / "parts"
    write_folder(root, {"bolt": 10, "nut": 10, "washer": 5})
    info = data.prepare("parts", str(tmp_path / "tfds"), None, folder_source(root, test_fraction=0.2))
    assert info.snapshot.class_counts == {"train": [8, 8, 4], "test": [2, 2, 1]}
    assert "test_fraction=0.2" in info.snapshot.builder_config


# MARK: bad input: one line, exit before compute, nothing left behind

BAD_FOLDERS = {
    "truncated image": (
        lambda r: (r / "train/a/0000.png").write_bytes((r / "train/a/0000.png").read_bytes()[:40]),
        r"train/a/0000\.png cannot be decoded as an image .*data\.on_bad_image: skip",
    ),
    "not an image": (
        lambda r: (r / "train/b/notes.txt").write_text("hello"),
        r"train/b/notes\.txt cannot be decoded as an image",
    ),
    "empty class folder": (lambda r: (r / "train/c").mkdir(), r"class folder .*train/c holds no files"),
    "one class": (lambda r: shutil.rmtree(r / "train/b"), r"has 1 class folder\(s\) \['a'\]: a classifier needs two"),
    "no train folder": (lambda r: shutil.rmtree(r / "train"), r"has no train folder"),
    "stray file": (lambda r: (r / "train/readme.md").write_text("x"), r"train/readme\.md lies outside every class"),
    "symlink loop": (
        lambda r: os.symlink(r / "train/a", r / "train/a/loop"),
        r"symlink loop: .*train/a/loop leads back",
    ),
    "broken link": (
        lambda r: os.symlink(r / "nowhere.png", r / "train/a/gone.png"),
        r"train/a/gone\.png is a broken symlink",
    ),
    "test class unknown": (
        lambda r: (r / "test/z").mkdir(parents=True) or shutil.copy(r / "train/a/0000.png", r / "test/z/x.png"),
        r"test/z is a class that .*train does not have",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_FOLDERS))
def test_bad_folder_is_refused_in_one_line_with_nothing_left(tmp_path, case):
    root, tfds = tmp_path / "bad", tmp_path / "tfds"
    write_folder(root, {"a": 3, "b": 3})
    spoil, pattern = BAD_FOLDERS[case]
    spoil(root)
    with pytest.raises(DataError) as err:
        data.prepare("bad", str(tfds), None, folder_source(root))
    msg = str(err.value)
    assert "\n" not in msg and "fix:" in msg, msg
    assert __import__("re").search(pattern, msg), msg
    assert snapshots_of(tfds, "bad") == []


def test_on_bad_image_skip_leaves_out_and_counts_the_undecodable(tmp_path):
    root = tmp_path / "bad"
    write_folder(root, {"a": 4, "b": 4})
    (root / "train/a/0001.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    (root / "train/b/junk.jpg").write_bytes(b"not a jpeg")
    info = data.prepare("bad", str(tmp_path / "tfds"), None, folder_source(root, on_bad_image="skip"))
    assert info.num_train + info.num_test == 7
    assert sorted(Path(p).name for p in info.snapshot.skipped_files) == ["0001.png", "junk.jpg"]
    assert info.snapshot.file_count == 9


def test_a_file_that_changes_while_the_folder_is_read_is_refused(tmp_path, monkeypatch):
    root, tfds = tmp_path / "busy", tmp_path / "tfds"
    write_folder(root, {"a": 3, "b": 3})
    real = image_decoding.decode_file
    victim = root / "train/b/0002.png"

    def decode_while_exporting(path, *args):
        if path.endswith("a/0000.png"):
            Image.fromarray(np.full((12, 10), 7, np.uint8)).save(victim)  # the export rewrites a file meanwhile
            os.utime(victim, ns=(1, 1))
        return real(path, *args)

    monkeypatch.setattr(image_decoding, "decode_file", decode_while_exporting)
    with pytest.raises(DataError, match=r"changed while it was read: .*0002\.png .*rerun once the files are complete"):
        data.prepare("busy", str(tfds), None, folder_source(root))
    assert snapshots_of(tfds, "busy") == []


def test_a_folder_too_large_for_memory_is_refused_before_decoding(tmp_path, monkeypatch):
    from ensemble_core import memory

    root = tmp_path / "big"
    write_folder(root, {"a": 2, "b": 2})
    monkeypatch.setattr(memory, "host_available_bytes", lambda: (600, "available host memory"))
    monkeypatch.setattr(image_decoding, "decode_block", lambda *a, **k: pytest.fail("decoded"))
    with pytest.raises(
        DataError,
        match=r"4 images of 12x10x1 decode to 480 B, more than half the 600 B of available host memory"
        r".*data\.image_size",
    ):
        data.prepare("big", str(tmp_path / "tfds"), None, folder_source(root))


def test_a_dataset_name_tfds_knows_is_refused(tmp_path):
    write_folder(tmp_path / "f", {"a": 2, "b": 2})
    with pytest.raises(DataError, match=r"data\.name 'mnist' is the name of a TFDS dataset.*data\.name: my_mnist"):
        data.prepare("mnist", str(tmp_path / "tfds"), None, folder_source(tmp_path / "f"))


# MARK: arrays


def _npz(path: Path, **arrays) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **arrays)


def test_arrays_with_class_names_and_without_a_channel_axis(tmp_path):
    rng = np.random.default_rng(0)
    train = _pixels(rng, (30, 9, 11))
    labels = np.tile(np.arange(3), 10)
    _npz(tmp_path / "arr" / "train.npz", image=train, label=labels)
    _npz(tmp_path / "arr" / "test.npz", image=_pixels(rng, (6, 9, 11)), label=np.arange(6) % 3)
    source = UserSource(kind="arrays", path=str(tmp_path / "arr"), class_names=("cat", "dog", "eel"))
    info = data.prepare("pets", str(tmp_path / "tfds"), None, source)
    assert info.class_names == ("cat", "dog", "eel") and info.image_shape == (9, 11, 1)
    images, got = data.load_split("pets", "train", info.tfds_data_dir)
    assert np.array_equal(images[..., 0], train) and np.array_equal(got, labels)
    assert info.snapshot.kind == "arrays" and info.snapshot.file_count == 2


BAD_ARRAYS = {
    "label outside the classes": (
        {"image": np.zeros((6, 4, 4), np.uint8), "label": np.array([0, 1, 2, 0, 1, 5])},
        r"1 label\(s\) in .*train\.npz are outside \[0, 3\) \(first: 5 at index 5\)",
    ),
    "negative label": (
        {"image": np.zeros((4, 4, 4), np.uint8), "label": np.array([0, 1, -1, 0])},
        r"1 label\(s\) in .*train\.npz are outside \[0, 3\)",
    ),
    "float images": (
        {"image": np.zeros((4, 4, 4), np.float32), "label": np.array([0, 1, 1, 0])},
        r"'image' is float32 of shape \(4, 4, 4\), not uint8",
    ),
    "pickled objects": (
        {"image": np.array([object()] * 4, dtype=object), "label": np.array([0, 1, 1, 0])},
        r"cannot be read as a \.npz of arrays .*pickle",
    ),
    "no label": ({"image": np.zeros((4, 4, 4), np.uint8)}, r"has arrays \['image'\], no label"),
}


@pytest.mark.parametrize("case", sorted(BAD_ARRAYS))
def test_bad_arrays_are_refused_in_one_line_with_nothing_left(tmp_path, case):
    arrays, pattern = BAD_ARRAYS[case]
    _npz(tmp_path / "arr" / "train.npz", **arrays)
    source = UserSource(kind="arrays", path=str(tmp_path / "arr"), class_names=("a", "b", "c"))
    with pytest.raises(DataError) as err:
        data.prepare("arr", str(tmp_path / "tfds"), None, source)
    msg = str(err.value)
    assert "\n" not in msg and "fix:" in msg and __import__("re").search(pattern, msg), msg
    assert snapshots_of(tmp_path / "tfds", "arr") == []


def test_arrays_of_one_class_are_refused(tmp_path):
    _npz(tmp_path / "arr" / "train.npz", image=np.zeros((4, 4, 4), np.uint8), label=np.zeros(4, int))
    with pytest.raises(DataError, match=r"holds one class \(0\): a classifier needs two or more"):
        data.prepare("arr", str(tmp_path / "tfds"), None, UserSource(kind="arrays", path=str(tmp_path / "arr")))


# MARK: the config section


def test_config_derives_the_name_and_refuses_settings_of_other_sources():
    assert DataConfig(source="image_folder", path="/data/Parts 2024").name == "parts_2024"
    assert DataConfig(source="arrays", path="/x/y", name="mine").name == "mine"
    assert DataConfig(builder="my_pkg.datasets:ShelfParts").name == "shelf_parts"
    for bad, pattern in (
        ({"source": "image_folder"}, "needs data.path"),
        ({"path": "/x"}, "only read by data.source image_folder or arrays"),
        ({"image_size": [8, 8]}, "applies to image_folder and arrays"),
        ({"source": "image_folder", "path": "/x", "class_names": ["a", "b"]}, "names the labels of an arrays source"),
        ({"source": "arrays", "path": "/x", "name": "My Data"}, "not a TFDS dataset name.*'my_data'"),
        ({"source": "arrays", "path": "/x", "image_size": [0, 8]}, "two sides in 1..16384"),
        ({"source": "arrays", "path": "/x", "class_names": ["a", "a"]}, "two or more distinct names"),
    ):
        with pytest.raises(ValueError, match=pattern):
            DataConfig.model_validate(bad)


def test_a_user_tfds_builder_is_imported_from_its_class_path(tmp_path, monkeypatch):
    package = tmp_path / "shelf_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "datasets.py").write_text(
        "import numpy as np\nimport tensorflow_datasets as tfds\n\n\n"
        "class ShelfParts(tfds.core.GeneratorBasedBuilder):\n"
        "    VERSION = tfds.core.Version('1.0.0')\n\n"
        "    def _info(self):\n"
        "        return self.dataset_info_from_configs(features=tfds.features.FeaturesDict({\n"
        "            'image': tfds.features.Tensor(shape=(4, 4, 1), dtype=np.uint8),\n"
        "            'label': tfds.features.ClassLabel(names=['left', 'right'])}))\n\n"
        "    def _split_generators(self, dl_manager):\n"
        "        return {s: self._generate_examples(n) for s, n in (('train', 8), ('test', 4))}\n\n"
        "    def _generate_examples(self, n):\n"
        "        for i in range(n):\n"
        "            yield i, {'image': np.full((4, 4, 1), i, np.uint8), 'label': i % 2}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = DataConfig(builder="shelf_pkg.datasets:ShelfParts", data_dir=str(tmp_path / "tfds"))
    info = prepare_config(cfg)
    assert (info.name, info.num_train, info.class_names) == ("shelf_parts", 8, ("left", "right"))
    with pytest.raises(DataError, match=r"builds dataset 'shelf_parts', not data.name 'other'.*data.name: shelf_parts"):
        prepare_config(cfg.model_copy(update={"name": "other"}))
    with pytest.raises(DataError, match=r"cannot import shelf_pkg.nothing"):
        prepare_config(cfg.model_copy(update={"builder": "shelf_pkg.nothing:X"}))


# MARK: through the command line

TINY = [
    "--config",
    str(ROOT / "configs" / "tiny.yaml"),
    "--set",
    "model.hidden_sizes=[16]",
    "--set",
    "ensemble.size=2",
    "--set",
    "train.epochs=1",
    "--set",
    "train.batch_size=8",
    "--set",
    "eval.evaluators=[test]",
    "--set",
    "data.max_train_examples=null",
    "--set",
    "data.max_test_examples=null",
]


def _cli(args: list[str], api_url: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flows.train_ensemble", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=cli_env(api_url),
    )


@pytest.mark.slow  # two command-line runs and one in-process run (about 30 s)
def test_an_image_folder_trains_through_the_cli_and_a_new_class_is_refused(tmp_path, prefect_api):
    """Train on a folder of PNG and JPEG, grey and RGB images of mixed sizes (resized and
    converted); the report names the classes; a class folder added later is refused with
    one line (exit 2, before training), and trained with a new head when the config says so."""
    root = tmp_path / "shelf"
    write_folder(root, {"bolt": 12, "nut": 12}, size=(14, 14), mode="L", ext="png")
    write_folder(root, {"washer": 12}, size=(20, 18), mode="RGB", ext="jpg", seed=4)
    common = [
        *TINY,
        "--set",
        "data.source=image_folder",
        "--set",
        f"data.path={root}",
        "--set",
        f"data.data_dir={tmp_path / 'tfds'}",
        "--set",
        "data.image_size=[12, 12]",
        "--set",
        "data.channels=1",
        "--output-dir",
        str(tmp_path / "runs"),
    ]
    first = _cli([*common, "--run-name", "first"], prefect_api)
    assert first.returncode == 0, first.stderr[-3000:]
    report = json.loads((tmp_path / "runs" / "first" / "report.json").read_text())
    lineage = report["data_snapshot"]
    assert lineage["name"] == "shelf" and lineage["class_names"] == ["bolt", "nut", "washer"]
    assert lineage["file_count"] == 36 and sum(lineage["splits"].values()) == 36
    assert "bolt: " in (tmp_path / "runs" / "first" / "report.md").read_text()

    write_folder(root, {"spring": 12}, size=(14, 14), seed=9)
    snapshots = tmp_path / "tfds" / "snapshots" / "shelf"
    prepared = sorted(p.name for p in snapshots.iterdir())
    refused = _cli([*common, "--run-name", "second"], prefect_api)
    assert refused.returncode == 2, refused.stderr[-3000:]
    (line,) = [ln for ln in refused.stderr.splitlines() if ln.startswith("error:")]
    assert "class 'spring' is new since champion first" in line and "nightly.when_classes_change: retrain" in line
    assert not (tmp_path / "runs" / "second" / "checkpoints").exists()
    # refused from the folder names alone: the changed folder was never decoded into a snapshot
    assert sorted(p.name for p in snapshots.iterdir()) == prepared

    # the same config with when_classes_change=retrain, in this process (the command line's
    # part, the one-line refusal, is above): a new head that replaces the champion
    from ensemble_core import runs
    from ensemble_core.config import load_config

    sets = [common[i + 1] for i, arg in enumerate(common) if arg == "--set"]
    cfg = load_config(ROOT / "configs" / "tiny.yaml", [*sets, "nightly.when_classes_change=retrain"])
    runs.run(cfg, tmp_path / "runs", "third")
    third = json.loads((tmp_path / "runs" / "third" / "report.json").read_text())
    assert third["data_snapshot"]["class_names"] == ["bolt", "nut", "spring", "washer"]
    assert third["promotion"]["promoted"] is True and "class map changed" in third["promotion"]["reason"]
    assert json.loads((tmp_path / "runs" / "champion.json").read_text())["run_name"] == "third"


# MARK: the same data from three sources


def _export_three_ways(tmp: Path, n_train: int, n_test: int) -> dict[str, list[str]]:
    """The first digits of the embedded dataset as MNIST IDX files, as a PNG image folder
    (``<split>/<digit>/<index>.png``, numbered in IDX order) and as arrays; the config
    overrides of each."""
    from tests._idx_export import write_mnist_export

    images, labels = data.read_mnist5k_csv()
    train_idx, test_idx = data.mnist5k_split_indices(labels)
    splits = {"train": train_idx[:n_train], "test": test_idx[:n_test]}
    write_mnist_export(tmp / "idx", n_train, n_test)
    for split, idx in splits.items():
        for i, j in enumerate(idx):
            path = tmp / "folder" / split / str(labels[j]) / f"{i:05d}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(images[j, ..., 0], "L").save(path)
        _npz(tmp / "arrays" / f"{split}.npz", image=images[idx, ..., 0], label=labels[idx])
    tfds = f"data.data_dir={tmp / 'tfds'}"
    return {
        "idx": ["data.name=mnist", f"data.manual_dir={tmp / 'idx'}", tfds],
        "image_folder": ["data.source=image_folder", f"data.path={tmp / 'folder'}", tfds],
        "arrays": ["data.source=arrays", f"data.path={tmp / 'arrays'}", tfds],
    }


# make test: the same pixels, labels and order from each source
# (test_png_folder_decodes_to_the_pixels_written_in_file_order, the arrays tests) on a
# deterministic trainer; the full Fashion-MNIST version is benchmarks/own_data.py.
@pytest.mark.soak  # three trainings (about 12 s)
def test_idx_image_folder_and_arrays_of_the_same_digits_train_bit_for_bit_alike(tmp_path):
    """The same 600 training and 200 test digits from three sources: the same snapshot
    counts and, with one config, the same ensemble and member figures, bit for bit."""
    from ensemble_core import runs
    from ensemble_core.config import load_config

    config = [
        "model.name=mlp",
        "model.hidden_sizes=[32]",
        "ensemble.size=2",
        "train.epochs=1",
        "train.batch_size=32",
        "eval.evaluators=[test]",
        "promotion.enabled=false",
    ]
    reports = {}
    for source, overrides in _export_three_ways(tmp_path, 600, 200).items():
        result = runs.run(load_config(None, [*config, *overrides]), tmp_path / f"runs-{source}", "r")
        reports[source] = json.loads((result.run_dir.path / "report.json").read_text())
    lineage = {s: r["data_snapshot"] for s, r in reports.items()}
    assert lineage["image_folder"]["class_names"] == [str(d) for d in range(10)]
    counts = {s: (snap["splits"], snap["class_counts"]) for s, snap in lineage.items()}
    assert counts["idx"] == counts["image_folder"] == counts["arrays"]
    assert sum(counts["idx"][0].values()) == 800
    figures = {s: (r["ensemble"], r["members"]) for s, r in reports.items()}
    assert figures["idx"] == figures["image_folder"] == figures["arrays"]  # exact floats


def test_a_folder_smaller_than_one_batch_is_refused_before_training(tmp_path):
    from ensemble_core.config import load_config
    from ensemble_core.errors import ConfigError
    from ensemble_core.runs.preflight import check_against_dataset

    write_folder(tmp_path / "few", {"a": 5, "b": 5})
    cfg = load_config(
        None, ["data.source=image_folder", f"data.path={tmp_path / 'few'}", f"data.data_dir={tmp_path / 'tfds'}"]
    )
    dataset = prepare_config(cfg.data)
    # 8 training examples (2 of the 10 carved as test), less 1 validation and 1 calibration example
    with pytest.raises(ConfigError, match=r"train.batch_size=128 is larger than the 6 training examples"):
        check_against_dataset(cfg, dataset)


def test_a_file_added_while_the_folder_is_read_is_refused(tmp_path, monkeypatch):
    root, tfds = tmp_path / "busy", tmp_path / "tfds"
    write_folder(root, {"a": 3, "b": 3})
    real = image_decoding.decode_file

    def decode_while_exporting(path, *args):
        late = root / "train/b/late.png"
        if not late.exists():
            shutil.copy(root / "train/b/0000.png", late)  # the export adds a file meanwhile
        return real(path, *args)

    monkeypatch.setattr(image_decoding, "decode_file", decode_while_exporting)
    with pytest.raises(DataError, match=r"changed while it was read: .*late\.png \(added\)"):
        data.prepare("busy", str(tfds), None, folder_source(root))
    assert snapshots_of(tfds, "busy") == []


def test_arrays_are_resized_and_converted_like_image_files(tmp_path):
    rng = np.random.default_rng(1)
    rgba = _pixels(rng, (8, 10, 12, 4))
    _npz(tmp_path / "arr" / "train.npz", image=rgba, label=np.arange(8) % 2)
    source = UserSource(kind="arrays", path=str(tmp_path / "arr"), image_size=(5, 6), channels=1)
    info = data.prepare("rgba", str(tmp_path / "tfds"), None, source)
    images = np.concatenate([data.load_split("rgba", s, info.tfds_data_dir)[0] for s in ("train", "test")])
    assert info.image_shape == (5, 6, 1) and len(images) == 8
    # the same conversion of the same pixels through an image file gives the same bytes
    Image.fromarray(rgba[0]).save(tmp_path / "one.png")
    with Image.open(tmp_path / "one.png") as f:
        expected = np.asarray(f.convert("L").resize((6, 5), Image.Resampling.BILINEAR))
    assert any(np.array_equal(im[..., 0], expected) for im in images)


def test_swapped_class_folder_links_are_a_new_snapshot(tmp_path):
    """Class folders that are symlinks name their files by the class: swapping the links
    swaps the labels, so it must not reuse the snapshot (nor the cached hashes)."""
    write_folder(tmp_path / "store", {"x": 3, "y": 4})
    root, tfds = tmp_path / "linked", str(tmp_path / "tfds")
    (root / "train").mkdir(parents=True)
    os.symlink(tmp_path / "store/train/x", root / "train/cat")
    os.symlink(tmp_path / "store/train/y", root / "train/dog")
    before = data.prepare("linked", tfds, None, folder_source(root))
    for link in ("cat", "dog"):
        (root / "train" / link).unlink()
    os.symlink(tmp_path / "store/train/y", root / "train/cat")
    os.symlink(tmp_path / "store/train/x", root / "train/dog")
    after = data.prepare("linked", tfds, None, folder_source(root))
    assert after.snapshot.fingerprint != before.snapshot.fingerprint
    counts = before.snapshot.class_counts, after.snapshot.class_counts
    total = [sum(c[s][i] for s in ("train", "test")) for c in counts for i in (0, 1)]
    assert total == [3, 4, 4, 3]


def test_worker_processes_decode_what_one_process_decodes(tmp_path, monkeypatch):
    """The process pool (a large folder, several cores) against the in-process loop: the
    same images, the same files skipped, the same refusal."""
    from ensemble_core.data import image_folder

    written = write_folder(tmp_path / "f", {"a": 9, "b": 8})
    paths = sorted(tmp_path / "f" / k for k in written)
    paths[5].write_bytes(b"not an image")
    inline = image_folder.decode_images(paths, None, None, (12, 10, 1), "skip", workers=1)
    monkeypatch.setattr(image_folder, "PROCESS_POOL_MIN", 1)
    monkeypatch.setattr(image_folder, "BLOCK", 4)
    pooled = image_folder.decode_images(paths, None, None, (12, 10, 1), "skip", workers=2)
    assert np.array_equal(inline[0], pooled[0]) and inline[1] == pooled[1] == [i for i in range(17) if i != 5]
    assert np.array_equal(pooled[0][0][..., 0], written[str(paths[0].relative_to(tmp_path / "f"))])
    with pytest.raises(DataError, match=r"not an image|cannot be decoded as an image"):
        image_folder.decode_images(paths, None, None, (12, 10, 1), "fail", workers=2)
