"""Every pixel format an image file may hold decodes with its full range mapped to 0-255, or
is refused in one line naming the file, the mode and the fix (reliability round five,
class 1: pixels converted silently wrong); EXIF orientations are applied before any size
check (``ensemble_core.image_decoding.decode_file``, used by training's image folders,
``flows.predict``, OOD sources and monitoring).

Each test writes real files with Pillow and compares the decoded arrays with an independent
computation (NumPy on the raw values written, or what ``ImageOps.exif_transpose`` shows).
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image, ImageCms, ImageOps

from ensemble_core import image_decoding
from ensemble_core.data import image_folder
from ensemble_core.errors import DataError
from ensemble_core.runs.prediction import inputs

RNG = np.random.default_rng(5)
ORIENTATION = 0x0112


def _decode(path, channels, shape):
    return image_decoding.decode_file(str(path), None, channels, shape)


def _ramp16(h=32, w=48) -> np.ndarray:
    """uint16 values spanning 0..65535, the ends and the bytes' edges included."""
    values = np.linspace(0, 65535, h * w).round().astype(np.uint16)
    values[:6] = [0, 255, 256, 32767, 32768, 65535]
    return values.reshape(h, w)


def _luma(rgb: np.ndarray) -> np.ndarray:
    """ITU-R 601-2 luma of uint8 RGB, as Pillow's ``convert("L")`` computes it (rounded)."""
    r, g, b = (rgb[..., i].astype(np.int64) for i in range(3))
    return ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16).astype(np.uint8)


# --- 16-bit and 32-bit integer grey ------------------------------------------------------


@pytest.mark.parametrize("channels", [1, 3])
def test_16bit_grey_png_is_scaled_by_its_bit_depth_not_clipped(tmp_path, channels):
    raw = _ramp16()
    path = tmp_path / "grey16.png"
    Image.fromarray(raw).save(path)
    assert Image.open(path).mode == "I;16"  # a real 16-bit grey PNG

    out = _decode(path, channels, (*raw.shape, channels))

    expected = (raw >> 8).astype(np.uint8)  # the high byte: 65535 -> 255, 0 -> 0
    for c in range(channels):
        np.testing.assert_array_equal(out[..., c], expected)
    assert out[0, :6, 0].tolist() == [0, 0, 1, 127, 128, 255]
    assert (out == 255).mean() < 0.9, "clipped: most pixels white"
    assert (out == 255).mean() < 0.01


def test_16bit_big_endian_tiff_decodes_as_its_values(tmp_path):
    raw = _ramp16(8, 8)
    path = tmp_path / "big.tif"
    Image.fromarray(raw.astype(">u2")).save(path)
    assert Image.open(path).mode == "I;16B"

    out = _decode(path, 1, (8, 8, 1))

    np.testing.assert_array_equal(out[..., 0], (raw >> 8).astype(np.uint8))


def test_32bit_integer_image_holding_16bit_data_is_scaled_and_beyond_refused(tmp_path):
    raw = _ramp16(8, 8).astype(np.int32)
    path = tmp_path / "int32.tif"
    Image.fromarray(raw).save(path)
    assert Image.open(path).mode == "I"

    out = _decode(path, 1, (8, 8, 1))
    np.testing.assert_array_equal(out[..., 0], (raw >> 8).astype(np.uint8))

    raw[0, 0] = 70000
    Image.fromarray(raw).save(path)
    with pytest.raises(image_decoding.ImageDecodeError) as err:
        _decode(path, 1, (8, 8, 1))
    assert "'I'" in err.value.detail and "[0, 65535]" in err.value.detail and "70000" in err.value.detail
    assert "\n" not in err.value.detail


# --- 32-bit float ------------------------------------------------------------------------


def test_float_tiff_in_0_1_decodes_to_rounded_v_times_255(tmp_path):
    values = RNG.uniform(0, 1, (16, 12)).astype(np.float32)
    values[0, :3] = [0.0, 1.0, 0.5]
    path = tmp_path / "float.tif"
    Image.fromarray(values).save(path)
    assert Image.open(path).mode == "F"

    out = _decode(path, 1, (16, 12, 1))

    np.testing.assert_array_equal(out[..., 0], np.rint(values.astype(np.float64) * 255).astype(np.uint8))
    assert out[0, :3, 0].tolist() == [0, 255, 128]
    assert out.max() > 200  # not all black


@pytest.mark.parametrize("bad", [1.5, -0.25, np.nan])
def test_float_tiff_outside_0_1_is_refused_in_one_line_naming_file_mode_range(tmp_path, bad):
    values = RNG.uniform(0, 1, (6, 6)).astype(np.float32)
    values[2, 3] = bad
    folder = tmp_path / "images"
    folder.mkdir()
    path = folder / "float.tif"
    Image.fromarray(values).save(path)

    with pytest.raises(DataError) as err:
        image_folder.decode_images([path], None, 1, (6, 6, 1), "fail", workers=1)
    message = str(err.value)
    assert str(path) in message and "'F'" in message and "[0, 1]" in message
    assert "\n" not in message


# --- EXIF orientation --------------------------------------------------------------------


def _jpeg_with_orientation(path, orientation: int, size=(40, 24)):
    """A JPEG of ``size`` (W, H) stored pixels with EXIF orientation ``orientation``; a
    smooth picture, so that JPEG's loss is the same whichever way it is turned."""
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w]
    array = np.stack([xx * 255 // w, yy * 255 // h, (xx + yy) * 255 // (w + h)], -1).astype(np.uint8)
    exif = Image.Exif()
    exif[ORIENTATION] = orientation
    Image.fromarray(array).save(path, exif=exif, quality=95)


@pytest.mark.parametrize("orientation", [2, 3, 4, 5, 6, 7, 8])
def test_jpeg_with_exif_orientation_decodes_as_image_viewers_show_it(tmp_path, orientation):
    path = tmp_path / f"o{orientation}.jpg"
    _jpeg_with_orientation(path, orientation)
    viewed = np.asarray(ImageOps.exif_transpose(Image.open(path)))
    assert viewed.shape[:2] == ((40, 24) if orientation in (5, 6, 7, 8) else (24, 40))

    shape = image_folder.image_geometry(path, None, None)
    assert shape == viewed.shape
    np.testing.assert_array_equal(_decode(path, None, shape), viewed)
    np.testing.assert_array_equal(_decode(path, 1, (*viewed.shape[:2], 1))[..., 0], _luma(viewed))


def test_rotated_jpeg_is_not_refused_for_its_stored_size_in_a_folder(tmp_path):
    """An upright 24x40 (HxW) photo and one stored 40x24 with orientation 6: both 24x40
    upright, so the folder decodes without data.image_size."""
    upright, turned = tmp_path / "a.jpg", tmp_path / "b.jpg"
    _jpeg_with_orientation(upright, 1, size=(40, 24))
    _jpeg_with_orientation(turned, 6, size=(24, 40))
    paths = [upright, turned]
    shape = image_folder.image_geometry(paths[0], None, None)
    assert shape == (24, 40, 3)

    images, kept = image_folder.decode_images(paths, None, None, shape, "fail", workers=1)

    assert kept == [0, 1]
    np.testing.assert_array_equal(images[1], np.asarray(ImageOps.exif_transpose(Image.open(turned))))


# --- bilevel, CMYK, LAB, palette, alpha --------------------------------------------------


def test_bilevel_image_decodes_to_0_and_255(tmp_path):
    bits = RNG.integers(0, 2, (10, 14)).astype(bool)
    path = tmp_path / "bits.png"
    Image.fromarray(bits).save(path)
    assert Image.open(path).mode == "1"

    out = _decode(path, 1, (10, 14, 1))

    np.testing.assert_array_equal(out[..., 0], bits.astype(np.uint8) * 255)


def test_cmyk_tiff_converts_as_pillow_documents(tmp_path):
    cmyk = RNG.integers(0, 256, (6, 8, 4), dtype=np.uint8)
    cmyk[0, 0], cmyk[0, 1], cmyk[0, 2] = (255, 0, 0, 0), (0, 0, 0, 255), (0, 0, 0, 0)
    path = tmp_path / "cmyk.tif"
    Image.frombytes("CMYK", (8, 6), cmyk.tobytes()).save(path)
    assert Image.open(path).mode == "CMYK"

    rgb = _decode(path, 3, (6, 8, 3))
    grey = _decode(path, 1, (6, 8, 1))

    assert rgb[0, :3].tolist() == [[0, 255, 255], [0, 0, 0], [255, 255, 255]]  # cyan, black, white
    np.testing.assert_array_equal(rgb, np.asarray(Image.open(path).convert("RGB")))
    np.testing.assert_array_equal(grey[..., 0], _luma(rgb))


def test_lab_tiff_converts_to_srgb(tmp_path):
    # Bytes as Pillow (and TIFF's CIELAB) store them: L* 0..100 as 0..255, a* and b* signed.
    lab = np.array([[[255, 0, 0], [0, 0, 0], [138, 81, 70], [128, 0, 0]]], np.uint8)
    path = tmp_path / "lab.tif"
    Image.frombytes("LAB", (4, 1), lab.tobytes()).save(path)
    assert Image.open(path).mode == "LAB"

    rgb = _decode(path, 3, (1, 4, 3))
    grey = _decode(path, 1, (1, 4, 1))

    transform = ImageCms.buildTransform(ImageCms.createProfile("LAB"), ImageCms.createProfile("sRGB"), "LAB", "RGB")
    expected = np.asarray(transform.apply(Image.frombytes("LAB", (4, 1), lab.tobytes())))
    np.testing.assert_array_equal(rgb, expected)
    assert np.abs(rgb[0, 0].astype(int) - 255).max() <= 2 and rgb[0, 1].max() <= 2  # white, black
    assert rgb[0, 2, 0] > 240 and rgb[0, 2, 1:].max() < 20  # sRGB red
    assert len(set(rgb[0, 3].tolist())) == 1 and 100 < rgb[0, 3, 0] < 140  # mid grey
    np.testing.assert_array_equal(grey[..., 0], _luma(rgb))


def test_palette_and_alpha_images_drop_alpha(tmp_path):
    rgba = RNG.integers(0, 256, (5, 7, 4), dtype=np.uint8)
    rgba[0, 0] = (10, 20, 30, 0)  # fully transparent: keeps the colour it stores
    Image.fromarray(rgba).save(tmp_path / "rgba.png")
    la = RNG.integers(0, 256, (5, 7, 2), dtype=np.uint8)
    Image.fromarray(la).save(tmp_path / "la.png")
    palette = Image.new("P", (3, 1))
    palette.putpalette([10, 20, 30, 200, 100, 50, 0, 255, 0])
    palette.putdata([0, 1, 2])
    palette.save(tmp_path / "p.png")

    rgb = _decode(tmp_path / "rgba.png", 3, (5, 7, 3))
    np.testing.assert_array_equal(rgb, rgba[..., :3])
    assert rgb[0, 0].tolist() == [10, 20, 30]
    np.testing.assert_array_equal(_decode(tmp_path / "la.png", 1, (5, 7, 1))[..., 0], la[..., 0])
    assert _decode(tmp_path / "p.png", 3, (1, 3, 3))[0].tolist() == [[10, 20, 30], [200, 100, 50], [0, 255, 0]]


def test_a_mode_not_converted_is_refused_naming_mode_and_fix():
    with pytest.raises(image_decoding.ImageDecodeError) as err:
        image_decoding.to_8bit(Image.new("La", (2, 2)), "L")
    assert err.value.detail == "Pillow mode 'La', which is not converted; save it as 8-bit grey or RGB (e.g. a PNG)"
    assert "does not convert" in str(image_folder.mode_error("x.tif", "La"))
    assert "data.channels" in str(image_folder.mode_error("x.tif", "I;16"))


# --- end to end: training's image folder and flows.predict's inputs ----------------------


def test_folder_of_16bit_pngs_decodes_scaled_for_training_and_prediction(tmp_path):
    folder = tmp_path / "train" / "a"
    folder.mkdir(parents=True)
    raws, paths = [], []
    for i in range(3):
        raw = RNG.integers(0, 65536, (12, 10), dtype=np.uint16)
        raw[0, 0] = 65535 - i
        raws.append(raw)
        paths.append(folder / f"{i}.png")
        Image.fromarray(raw).save(paths[-1])
    expected = np.stack([(r >> 8).astype(np.uint8) for r in raws])[..., None]

    shape = image_folder.image_geometry(paths[0], None, 1)
    images, kept = image_folder.decode_images(paths, None, 1, shape, "fail", workers=1)
    settings = inputs.DecodeSettings(image_size=None, channels=1, on_bad_image="fail", shape=shape)
    predicted = inputs.decode_inputs(paths, settings)

    assert kept == [0, 1, 2]
    np.testing.assert_array_equal(images, expected)
    assert (images == 255).mean() < 0.05
    np.testing.assert_array_equal(np.asarray(predicted.images), expected)
