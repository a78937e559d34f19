"""The fixes the round-five input sweep (``tests/system/sweep_round5_inputs.py``) led to, each
with real files: values outside a pixel mode's range are a refusal of their own (not an
unreadable file), class folder names that are not UTF-8 and ``data.classes`` names in NFD or
with control characters, unambiguous source settings in the fingerprint, array headers
claiming a negative dimension or (for ``flows.predict``) more than the file holds, an
``ood`` image folder decoded as the run decodes, and translation shifts the images' width
cannot hold. Each test fails with its fix reverted.
"""

from __future__ import annotations

import hashlib
import io
import os
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ensemble_core import image_decoding
from ensemble_core.config import load_config
from ensemble_core.data import UserSource, carve_test_split, fingerprint_source, read_user_source, resolve_classes
from ensemble_core.data.image_folder import decode_images, scan_image_folder
from ensemble_core.data.npz_arrays import array_headers
from ensemble_core.data.user_source import TEST_SPLIT_SEED
from ensemble_core.errors import ConfigError, DataError
from ensemble_core.evaluators import ood, translation
from ensemble_core.runs.prediction import inputs
from ensemble_core.runs.prediction.files import read_images
from ensemble_core.runs.prediction.table import build_table, write_table
from ensemble_core.runs.preflight import preflight

ROOT = Path(__file__).resolve().parents[1]
RNG = np.random.default_rng(59)


def _npy_header(shape: tuple[int, ...], descr: str = "|u1") -> bytes:
    """A ``.npy`` header claiming ``shape`` (written by NumPy itself)."""
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, {"descr": descr, "fortran_order": False, "shape": shape})
    return out.getvalue()


def _npz(path: Path, members: dict[str, bytes | np.ndarray]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        for name, value in members.items():
            if isinstance(value, np.ndarray):
                buffer = io.BytesIO()
                np.save(buffer, value)
                value = buffer.getvalue()
            archive.writestr(f"{name}.npy", value)


# MARK: values outside a mode's range: a refusal of their own


@pytest.mark.parametrize(
    ("values", "found"),
    [
        (np.linspace(0, 255, 36, dtype=np.float32).reshape(6, 6), "0..255, outside [0, 1]"),
        (np.linspace(0, 70000, 36).astype(np.int32).reshape(6, 6), "0..70000, outside [0, 65535]"),
    ],
)
def test_values_outside_the_range_of_their_mode_are_refused_even_with_skip(tmp_path, values, found):
    good, bad = tmp_path / "a.tif", tmp_path / "b.tif"
    Image.fromarray(np.zeros((6, 6), values.dtype)).save(good)
    Image.fromarray(values).save(bad)
    with pytest.raises(image_decoding.ImageDecodeError) as decoded:
        image_decoding.decode_file(str(bad), None, 1, (6, 6, 1))
    assert decoded.value.kind == image_decoding.RANGE

    with pytest.raises(DataError) as err:  # skip leaves out unreadable files, not an export's convention
        decode_images([good, bad], None, 1, (6, 6, 1), "skip", workers=1)
    message = str(err.value)
    mode = "'F' (32-bit float)" if values.dtype == np.float32 else "'I' (32-bit integer, taken as 16-bit)"
    assert message == (
        f"{bad} is a Pillow mode {mode} image with values {found}, the range mapped to 0-255; "
        f"fix: {image_decoding.RANGE_FIX}"
    )
    assert "cannot be decoded" not in message


def test_prediction_names_the_range_not_an_undecodable_file(tmp_path):
    path = tmp_path / "x.tif"
    Image.fromarray(np.full((4, 4), 2.5, np.float32)).save(path)
    settings = inputs.DecodeSettings(image_size=None, channels=1, on_bad_image="fail", shape=(4, 4, 1))
    with pytest.raises(DataError) as err:
        inputs.decode_inputs([path], settings)
    message = str(err.value)
    assert f"{str(path)!r} is a Pillow mode 'F' (32-bit float) image with values 2.5..2.5, outside [0, 1]" in message
    assert "cannot be decoded" not in message and "\n" not in message


# MARK: names


def test_a_class_folder_whose_name_is_not_utf8_is_refused_in_one_line(tmp_path):
    for name in (b"a\xff", b"b"):
        folder = os.path.join(os.fsencode(tmp_path / "train"), name)
        os.makedirs(folder)
        for i in range(2):
            Image.fromarray(np.zeros((4, 4), np.uint8)).save(os.path.join(folder, b"%d.png" % i))
    with pytest.raises(DataError) as err:
        scan_image_folder(tmp_path)
    message = str(err.value)
    assert message.startswith(
        f"class folder b'a\\xff' in {str(tmp_path / 'train')!r} is not valid UTF-8 (byte 0xff at 1)"
    )
    assert message.isascii() and "\n" not in message and "fix: rename the folder" in message


def _not_utf8_images(folder: Path, n: int) -> list[Path]:
    """``n`` grey PNGs in ``folder`` whose names are not UTF-8 (Latin-1 ``é``, byte 0xe9)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        raw = os.path.join(os.fsencode(folder), b"%03d-caf\xe9.png" % i)
        Image.fromarray(RNG.integers(0, 256, (4, 4), np.uint8)).save(raw)
        paths.append(Path(os.fsdecode(raw)))
    return paths


def test_image_files_whose_names_are_not_utf8_are_carved_and_predicted(tmp_path):
    for c in ("a", "b"):
        _not_utf8_images(tmp_path / "train" / c, 5)
    splits = read_user_source(UserSource(kind="image_folder", path=str(tmp_path)))
    assert len(splits.train[1]) + len(splits.test[1]) == 10 and splits.test_carved
    # a UTF-8 key is carved exactly as it always was
    keys = [f"{i:03d}-café.png" for i in range(6)]
    old = sorted(range(6), key=lambda i: hashlib.sha256(f"{TEST_SPLIT_SEED}:{keys[i]}".encode()).hexdigest())[:1]
    assert np.flatnonzero(carve_test_split(keys, np.zeros(6, int), 0.2)).tolist() == old

    files = sorted((tmp_path / "train" / "a").iterdir())
    settings = inputs.DecodeSettings(image_size=None, channels=None, on_bad_image="fail", shape=(4, 4, 1))
    decoded = inputs.decode_inputs(files, settings)
    assert decoded.sources[0] == f"{tmp_path / 'train' / 'a'}/000-caf\\xe9.png"
    table = build_table(
        {
            "ensemble_probs": np.full((5, 2), 0.5, np.float32),
            "predictive_entropy": np.zeros(5, np.float32),
            "mutual_information": np.zeros(5, np.float32),
            "member_probs": np.full((2, 5, 2), 0.5, np.float32),
            "class_names": np.asarray(["a", "b"]),
        },
        decoded.sources,
    )
    write_table(table, tmp_path / "p.csv")  # UTF-8: raised UnicodeEncodeError on the name
    assert "000-caf\\xe9.png" in (tmp_path / "p.csv").read_text(encoding="utf-8")


def test_an_input_path_that_is_not_utf8_is_refused_and_a_glob_matching_it_is_taken(tmp_path):
    folder = tmp_path / os.fsdecode(b"caf\xe9")
    _not_utf8_images(folder, 2)
    with pytest.raises(DataError) as err:  # it would reach Prefect's flow run parameters (JSON)
        inputs.expand_inputs([str(folder)])
    message = str(err.value)
    assert message.startswith(f"the input path {os.fsencode(str(folder))!r} is not valid UTF-8") and message.isascii()
    assert len(inputs.expand_inputs([str(tmp_path / "caf*")]).files) == 2


def test_data_classes_names_are_compared_in_nfc_and_control_characters_refused():
    names = ("b", "\u00e9t\u00e9", "c")  # as class folders are stored: NFC
    assert resolve_classes(["e\u0301te\u0301", "c"], names, 3) == (1, 2)  # typed in NFD
    with pytest.raises(ConfigError) as err:
        resolve_classes(["\u00e9t\u00e9", "e\u0301te\u0301"], names, 3)
    assert "as '\\xe9t\\xe9' and 'e\\u0301te\\u0301', one name in Unicode NFC" in str(err.value)
    with pytest.raises(ConfigError) as err:
        resolve_classes(["b\tc", "c"], names, 3)
    assert str(err.value).startswith("data.classes: 'b\\tc' has the control character '\\t', which no class name holds")
    assert "\n" not in str(err.value) and "\t" not in str(err.value)


def test_class_names_with_a_separator_give_distinct_fingerprints_and_others_keep_theirs(tmp_path):
    arrays = tmp_path / "arr"
    _npz(arrays / "train.npz", {"image": np.zeros((4, 4, 4), np.uint8), "label": np.arange(4) % 2})

    def source(names):
        return UserSource(kind="arrays", path=str(arrays), class_names=names)

    first, second = source(("a|b", "c")), source(("a", "b|c"))
    assert first.settings() != second.settings()
    prints = [fingerprint_source("arr", str(tmp_path / "tfds"), None, s).fingerprint for s in (first, second)]
    assert prints[0] != prints[1]
    # names without the separator keep the form (and so the fingerprints) they always had
    assert source(("cat", "dog")).settings().endswith(",on_bad_image=fail,names=cat|dog")
    assert source(None).settings() == "arrays:size=as-is,channels=as-is,test_fraction=0.2,on_bad_image=fail"


# MARK: array headers


def test_an_image_header_with_a_negative_dimension_is_refused_as_such(tmp_path):
    images = np.zeros((8, 4, 4, 1), np.uint8)
    _npz(tmp_path / "train.npz", {"image": _npy_header((-8, 4, 4, 1)) + images.tobytes(), "label": np.arange(8) % 2})
    with pytest.raises(DataError) as err:
        array_headers(tmp_path / "train.npz")
    assert "'image': its header claims uint8 of shape (-8, 4, 4, 1), a negative dimension" in str(err.value)


def test_16bit_arrays_are_told_to_convert_by_their_bit_depth(tmp_path):
    _npz(tmp_path / "train.npz", {"image": np.zeros((8, 4, 4), np.uint16), "label": np.arange(8) % 2})
    with pytest.raises(DataError) as err:
        array_headers(tmp_path / "train.npz")
    assert str(err.value).endswith(
        "fix: convert 16-bit pixels by their bit depth, (x >> 8).astype(np.uint8), before saving"
    )


@pytest.mark.parametrize("suffix", [".npy", ".npz"])
def test_prediction_bounds_an_array_header_by_the_bytes_stored_before_allocating(tmp_path, suffix):
    claim = _npy_header((10**12, 28, 28, 1)) + bytes(64)
    path = tmp_path / f"x{suffix}"
    if suffix == ".npy":
        path.write_bytes(claim)
    else:
        _npz(path, {"images": claim})
    tracemalloc.start()
    try:
        with pytest.raises(DataError) as err:
            read_images(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "its header claims uint8 of shape (1000000000000, 28, 28, 1)" in str(err.value)
    assert peak < 32 * 2**20
    negative = tmp_path / "neg.npy"
    negative.write_bytes(_npy_header((-1, 28, 28, 1)) + bytes(784))
    with pytest.raises(DataError, match="a negative dimension"):
        read_images(negative)


# MARK: an ood evaluator's image folder, decoded as the run decodes


def test_an_ood_image_folder_of_16bit_pngs_is_decoded_to_the_models_geometry(tmp_path):
    raws = {}
    for split, n in (("train", 2), ("test", 3)):
        for c in ("a", "b"):
            (tmp_path / "far" / split / c).mkdir(parents=True)
            for i in range(n):
                raw = RNG.integers(0, 65536, (10, 10)).astype(np.uint16)
                Image.fromarray(raw).save(tmp_path / "far" / split / c / f"{i}.png")
                raws[(split, i, c)] = raw
    opts = ood.Options(source="image_folder", path=str(tmp_path / "far"))
    images = ood.dataset_images(opts, (10, 10, 1), 6, str(tmp_path / "tfds"))
    expected = [(raws[("test", i, c)] >> 8).astype(np.uint8) for i in range(3) for c in ("a", "b")]
    np.testing.assert_array_equal(images[..., 0], np.stack(expected))


def test_a_loose_ood_image_that_cannot_be_scored_is_refused_before_training(tmp_path):
    far = tmp_path / "far"
    far.mkdir()
    for i in range(7):
        Image.fromarray(RNG.integers(0, 256, (16, 16), np.uint8)).save(far / f"{i}.png")
    Image.fromarray(np.full((16, 16), 200.0, np.float32)).save(far / "z.tif")  # scored: 8 test images, 8 files
    cfg = _arrays_config(
        tmp_path, 16, f"eval.evaluators={{test: {{}}, far: {{type: ood, source: image_folder, path: {far}}}}}"
    )
    with pytest.raises(DataError) as err:
        preflight(cfg, tmp_path / "runs", "r")
    assert str(err.value).startswith(f"eval.evaluators.far: {far / 'z.tif'} is a Pillow mode 'F' (32-bit float) image")
    assert not (tmp_path / "runs" / "r" / "checkpoints").exists()


# MARK: translation


def _arrays_config(tmp_path: Path, side: int, *extra: str):
    _npz(
        tmp_path / "arr" / "train.npz",
        {"image": RNG.integers(0, 256, (32, side, side), np.uint8), "label": np.arange(32) % 2},
    )
    _npz(
        tmp_path / "arr" / "test.npz",
        {"image": RNG.integers(0, 256, (8, side, side), np.uint8), "label": np.arange(8) % 2},
    )
    overrides = [
        "data.source=arrays",
        f"data.path={tmp_path / 'arr'}",
        "data.name=small",
        f"data.data_dir={tmp_path / 'tfds'}",
        "model.hidden_sizes=[8]",
        "ensemble.size=2",
        "train.batch_size=8",
        *extra,
    ]
    return load_config(ROOT / "configs" / "tiny.yaml", overrides)


def test_a_translation_named_beyond_the_images_width_is_refused_before_training(tmp_path):
    cfg = _arrays_config(tmp_path, 16, "eval.evaluators={test: {}, shift: {type: translation, pixels: [0, 4, 20]}}")
    with pytest.raises(DataError) as err:
        preflight(cfg, tmp_path / "runs", "r")
    message = str(err.value)
    assert "eval.evaluators.shift (translation) cannot run" in message
    assert "a translation by 20 pixels of the 16-pixel-wide images is a roll by 4" in message
    assert not (tmp_path / "runs" / "r" / "checkpoints").exists()


def test_default_translations_are_the_shifts_below_the_width():
    assert translation.shifts_for(translation.Options(), 6) == (0, 1, 2, 3, 4, 5)
    assert translation.shifts_for(translation.Options(), 28) == tuple(range(15))
    assert translation.shifts_for(translation.Options(pixels=(0, 20)), 6) == (0, 20)  # given: checked, not cut
