"""Decoding image files to uint8 arrays with Pillow, block by block.

Kept apart from :mod:`ensemble_core.data` (which imports TFDS) so that the worker processes
:func:`ensemble_core.data.image_folder.decode_images` starts import only NumPy and Pillow;
what a worker returns is plain data (arrays, strings), so it crosses processes as is.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PIL import Image

#: Pillow's modes taken as they are: grey and RGB. Any other (palette, alpha, CMYK,
#: 16-bit, bilevel) needs ``data.channels``, which converts.
MODE_CHANNELS = {"L": 1, "RGB": 3}
#: Pillow's mode for each ``data.channels``.
CHANNEL_MODES = {1: "L", 3: "RGB"}

#: The kinds of :class:`ImageDecodeError`.
UNREADABLE, MISSING, MODE, CHANNELS, SIZE = "unreadable", "missing", "mode", "channels", "size"
#: Exceptions that mean Pillow cannot decode a file (truncated, damaged, not an image).
PILLOW_ERRORS = (OSError, SyntaxError, ValueError, Image.DecompressionBombError)


class ImageDecodeError(Exception):
    """One file that did not decode to the expected geometry: ``kind`` (:data:`UNREADABLE`,
    :data:`MISSING`, :data:`MODE` (a mode that needs ``data.channels``), :data:`CHANNELS`
    or :data:`SIZE` (other than the first image's)) and ``detail`` (Pillow's error as
    ``Type: message``, the mode, or ``HxW``)."""

    def __init__(self, kind: str, detail: str):
        super().__init__(kind, detail)
        self.kind, self.detail = kind, detail


def decode_file(
    path: str, image_size: tuple[int, int] | None, channels: int | None, shape: tuple[int, int, int]
) -> np.ndarray:
    """One image as uint8 ``[H, W, C]`` of ``shape``: converted to ``channels`` (Pillow's
    ``Image.convert``: ``L`` is ITU-R 601-2 luma) and resized to ``image_size``
    (``Image.resize`` with ``Resampling.BILINEAR``: bilinear, antialiased when
    shrinking, the method of ``torchvision.transforms.Resize``) where they are set.

    Raises:
      ImageDecodeError: the file cannot be decoded or disappeared, or (without
        ``image_size``/``channels``) its mode, channel count or size is not ``shape``'s.
    """
    try:
        with Image.open(path) as opened:
            opened.load()
            image: Image.Image = opened
            if channels is not None:
                image = image.convert(CHANNEL_MODES[channels])
            elif image.mode not in MODE_CHANNELS:
                raise ImageDecodeError(MODE, image.mode)
            elif MODE_CHANNELS[image.mode] != shape[2]:
                raise ImageDecodeError(CHANNELS, f"{MODE_CHANNELS[image.mode]} channel(s) ({image.mode})")
            if image_size is not None:
                image = image.resize((image_size[1], image_size[0]), Image.Resampling.BILINEAR)
            elif (image.height, image.width) != shape[:2]:
                raise ImageDecodeError(SIZE, f"{image.height}x{image.width}")
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
