"""Decoding image files to uint8 arrays with Pillow, block by block.

Kept apart from :mod:`ensemble_core.data` (which imports TFDS) so that the worker processes
:func:`ensemble_core.data.image_folder.decode_images` starts import only NumPy and Pillow;
what a worker returns is plain data (arrays, strings), so it crosses processes as is.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PIL import ExifTags, Image, ImageOps

#: Pillow's modes taken as they are: grey and RGB. Any other (palette, alpha, CMYK,
#: 16-bit, bilevel) needs ``data.channels``, which converts (:func:`to_8bit`).
MODE_CHANNELS = {"L": 1, "RGB": 3}
#: Pillow's mode for each ``data.channels``.
CHANNEL_MODES = {1: "L", 3: "RGB"}

#: 16-bit grey modes (unsigned): scaled to 8 bits by their bit depth, ``v >> 8`` (the high
#: byte, as Pillow itself reduces a 16-bit RGB PNG to ``RGB``): 0 -> 0, 65535 -> 255.
SIXTEEN_BIT_MODES = frozenset({"I;16", "I;16L", "I;16B", "I;16N"})
#: Pillow's 32-bit integer mode, taken as holding 16-bit data (a 16-bit grey PNG or TIFF
#: read by some Pillow versions): values 0..65535 scaled as :data:`SIXTEEN_BIT_MODES`,
#: others refused.
INT_MODE, INT_RANGE = "I", (0, 65535)
#: Pillow's 32-bit float mode: values in ``[0, 1]`` mapped to ``round(v * 255)``, others
#: (or NaN) refused.
FLOAT_MODE, FLOAT_RANGE = "F", (0.0, 1.0)
#: Modes converted by Pillow's ``Image.convert`` as it documents: bilevel ``1`` to 0/255,
#: palette by its colours, ``CMYK``/``YCbCr``/``HSV`` to RGB, ``LAB`` through littleCMS's
#: LAB -> sRGB transform (grey: that RGB's luma), alpha (``LA``, ``PA``, ``RGBA``) and
#: padding (``RGBX``) dropped: a transparent pixel keeps the colour it stores.
PILLOW_CONVERTED_MODES = frozenset({"1", "L", "P", "PA", "LA", "RGB", "RGBA", "RGBX", "CMYK", "YCbCr", "LAB", "HSV"})
#: Every mode :func:`to_8bit` converts; any other is refused with :data:`UNCONVERTED_FIX`.
CONVERTED_MODES = PILLOW_CONVERTED_MODES | SIXTEEN_BIT_MODES | {INT_MODE, FLOAT_MODE}
UNCONVERTED_FIX = "save it as 8-bit grey or RGB (e.g. a PNG)"
#: The fix of a :data:`RANGE` refusal, whichever of ``I`` and ``F`` it concerns.
RANGE_FIX = "scale its values into that range (a float image to [0, 1]) or save it as 8- or 16-bit"
#: EXIF orientations that swap width and height (transposed or turned a quarter).
SWAPPING_ORIENTATIONS = frozenset({5, 6, 7, 8})

#: The kinds of :class:`ImageDecodeError`. :data:`RANGE` is a file that decodes but whose
#: values lie outside the range its mode maps to 0-255: no unreadable file that
#: ``data.on_bad_image: skip`` leaves out, but a convention of the export to fix.
UNREADABLE, MISSING, MODE, CHANNELS, SIZE, RANGE = "unreadable", "missing", "mode", "channels", "size", "range"
#: Exceptions that mean Pillow cannot decode a file (truncated, damaged, not an image).
PILLOW_ERRORS = (OSError, SyntaxError, ValueError, Image.DecompressionBombError)


class ImageDecodeError(Exception):
    """One file that did not decode to the expected geometry: ``kind`` (:data:`UNREADABLE`,
    :data:`MISSING`, :data:`MODE` (a mode that needs ``data.channels``), :data:`CHANNELS`,
    :data:`SIZE` (other than the first image's) or :data:`RANGE` (values outside the range
    its mode maps to 0-255)) and ``detail`` (Pillow's error as ``Type: message``, the mode,
    ``HxW``, or the mode with the values found and the range, one line)."""

    def __init__(self, kind: str, detail: str):
        super().__init__(kind, detail)
        self.kind, self.detail = kind, detail


def orientation(image: Image.Image) -> int:
    """The EXIF orientation of ``image`` (1, upright, where it has none or an invalid one)."""
    value = image.getexif().get(ExifTags.Base.Orientation, 1)
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def upright_size(image: Image.Image) -> tuple[int, int]:
    """``(H, W)`` of ``image`` once turned upright by its EXIF orientation (as
    ``ImageOps.exif_transpose`` does in :func:`decode_file`)."""
    width, height = image.size
    return (width, height) if orientation(image) in SWAPPING_ORIENTATIONS else (height, width)


def _range_error(mode: str, kind: str, found: tuple[float, float], allowed: tuple[float, float]) -> ImageDecodeError:
    """The one-line :data:`RANGE` refusal of an ``I`` or ``F`` image with values ``found``
    outside ``allowed`` (``fix``: :data:`RANGE_FIX`, given by the caller's message)."""
    low, high = found
    return ImageDecodeError(
        RANGE,
        f"Pillow mode '{mode}' ({kind}) image with values {low:g}..{high:g}, outside [{allowed[0]:g}, {allowed[1]:g}], "
        "the range mapped to 0-255",
    )


def to_8bit(image: Image.Image, target: str) -> Image.Image:
    """``image`` in Pillow mode ``target`` (``L`` or ``RGB``), its full range mapped to 0-255:

    - ``L``, ``RGB``: as they are (``L`` <-> ``RGB`` by ``Image.convert``: ITU-R 601-2 luma);
    - 16-bit grey (:data:`SIXTEEN_BIT_MODES`) and ``I`` holding 0..65535: ``v >> 8``;
    - ``F``: values in ``[0, 1]`` to ``round(v * 255)``;
    - :data:`PILLOW_CONVERTED_MODES`: ``Image.convert``, alpha dropped.

    Raises:
      ImageDecodeError: (:data:`RANGE`) an ``I`` or ``F`` image with values outside its
        range (NaN included), one line naming the mode, the values found and the range
        (the fix: :data:`RANGE_FIX`); (:data:`UNREADABLE`) a mode none of these is, naming
        the mode and the fix.
    """
    mode = image.mode
    if mode in SIXTEEN_BIT_MODES:
        image = Image.fromarray((np.asarray(image).astype(np.uint16) >> 8).astype(np.uint8))
    elif mode == INT_MODE:
        values = np.asarray(image)
        found = (int(values.min()), int(values.max())) if values.size else INT_RANGE
        if found[0] < INT_RANGE[0] or found[1] > INT_RANGE[1]:
            raise _range_error(mode, "32-bit integer, taken as 16-bit", found, INT_RANGE)
        image = Image.fromarray((values.astype(np.uint16) >> 8).astype(np.uint8))
    elif mode == FLOAT_MODE:
        values = np.asarray(image, dtype=np.float32)
        if values.size and not np.isfinite(values).all():
            raise ImageDecodeError(
                RANGE,
                "Pillow mode 'F' (32-bit float) image holding NaN or infinite values, outside [0, 1], "
                "the range mapped to 0-255",
            )
        span = (float(values.min()), float(values.max())) if values.size else FLOAT_RANGE
        if span[0] < FLOAT_RANGE[0] or span[1] > FLOAT_RANGE[1]:
            raise _range_error(mode, "32-bit float", span, FLOAT_RANGE)
        image = Image.fromarray(np.rint(values * 255).astype(np.uint8))
    elif mode == "LAB" and target == "L":
        image = image.convert("RGB")  # Pillow converts LAB to RGB only (littleCMS, sRGB)
    elif mode not in PILLOW_CONVERTED_MODES:
        raise ImageDecodeError(UNREADABLE, f"Pillow mode '{mode}', which is not converted; {UNCONVERTED_FIX}")
    return image if image.mode == target else image.convert(target)


def decode_file(
    path: str, image_size: tuple[int, int] | None, channels: int | None, shape: tuple[int, int, int]
) -> np.ndarray:
    """One image as uint8 ``[H, W, C]`` of ``shape``: turned upright by its EXIF
    orientation (``ImageOps.exif_transpose``, as image viewers show it) before anything
    else, converted to ``channels`` with its full range mapped to 0-255 (:func:`to_8bit`)
    and resized to ``image_size`` (``Image.resize`` with ``Resampling.BILINEAR``: bilinear,
    antialiased when shrinking, the method of ``torchvision.transforms.Resize``) where they
    are set.

    Raises:
      ImageDecodeError: the file cannot be decoded or disappeared, its pixels cannot be
        converted (:func:`to_8bit`), or (without ``image_size``/``channels``) its mode,
        channel count or upright size is not ``shape``'s.
    """
    try:
        with Image.open(path) as opened:
            opened.load()
            turned = orientation(opened)
            ImageOps.exif_transpose(opened, in_place=True)
            image: Image.Image = opened
            if channels is not None:
                image = to_8bit(image, CHANNEL_MODES[channels])
            elif image.mode not in MODE_CHANNELS:
                raise ImageDecodeError(MODE, image.mode)
            elif MODE_CHANNELS[image.mode] != shape[2]:
                raise ImageDecodeError(CHANNELS, f"{MODE_CHANNELS[image.mode]} channel(s) ({image.mode})")
            if image_size is not None:
                image = image.resize((image_size[1], image_size[0]), Image.Resampling.BILINEAR)
            elif (image.height, image.width) != shape[:2]:
                upright = f" (upright, by its EXIF orientation {turned})" if turned != 1 else ""
                raise ImageDecodeError(SIZE, f"{image.height}x{image.width}{upright}")
            array = np.asarray(image, dtype=np.uint8)
    except FileNotFoundError as err:
        raise ImageDecodeError(MISSING, str(err)) from None
    except PILLOW_ERRORS as err:
        raise ImageDecodeError(UNREADABLE, f"{type(err).__name__}: {' '.join(str(err).split())}"[:240]) from None
    return array.reshape(shape)


def decode_block(
    paths: Sequence[str],
    image_size: tuple[int, int] | None,
    channels: int | None,
    shape: tuple[int, int, int],
    skip_unreadable: bool,
) -> tuple[np.ndarray, np.ndarray, list[tuple[int, str, str]]]:
    """Decode ``paths`` in order with :func:`decode_file`, stopping at the first error that
    refuses the whole folder (any error, or any but :data:`UNREADABLE` with
    ``skip_unreadable``).

    Returns:
      ``(images uint8 [n, H, W, C], ok bool [n], errors [(index in paths, kind, detail)])``;
      ``images[i]`` is meaningful where ``ok[i]``.
    """
    images = np.zeros((len(paths), *shape), np.uint8)
    ok = np.zeros(len(paths), bool)
    errors: list[tuple[int, str, str]] = []
    for i, path in enumerate(paths):
        try:
            images[i] = decode_file(path, image_size, channels, shape)
            ok[i] = True
        except ImageDecodeError as err:
            errors.append((i, err.kind, err.detail))
            if not (skip_unreadable and err.kind == UNREADABLE):
                break
    return images, ok, errors


#: Pillow's mode of a uint8 array by its channel count (what ``Image.fromarray`` infers).
ARRAY_MODES = {1: "L", 2: "LA", 3: "RGB", 4: "RGBA"}


def convert_images(images: np.ndarray, size: tuple[int, int] | None, channels: int | None) -> np.ndarray:
    """uint8 images ``[N, h, w, c]`` (c 1 to 4) brought to ``size`` ``(H, W)`` and
    ``channels`` (1 or 3) as an image file is decoded (:func:`decode_file`: Pillow's
    ``Image.convert``, then ``Image.resize`` with ``Resampling.BILINEAR``); unchanged
    where neither is set or the images have them already.

    Returns:
      uint8 ``[N, H, W, channels]``.

    Raises:
      ValueError: images that are not uint8 ``[N, h, w, c]`` with c in 1..4, or c not 1
        or 3 without ``channels``.
    """
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] not in ARRAY_MODES:
        raise ValueError(f"images are {images.dtype} {images.shape}, not uint8 [N, H, W, C] with C in 1..4")
    c = images.shape[-1]
    if channels is None and c not in MODE_CHANNELS.values():
        raise ValueError(f"images have {c} channels, neither 1 (grey) nor 3 (RGB); set the channels to convert to")
    height, width = size if size is not None else images.shape[1:3]
    channels = channels or c
    if (height, width, channels) == images.shape[1:]:
        return images
    out = np.empty((len(images), height, width, channels), np.uint8)
    for i, array in enumerate(images):
        image = Image.fromarray(array[..., 0] if c == 1 else array).convert(CHANNEL_MODES[channels])
        if (image.height, image.width) != (height, width):
            image = image.resize((width, height), Image.Resampling.BILINEAR)
        out[i] = np.asarray(image, np.uint8).reshape(height, width, channels)
    return out
