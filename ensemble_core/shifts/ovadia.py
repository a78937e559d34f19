"""Rotated and translated MNIST, as Ovadia et al. 2019 build them, for any uint8
``[N, H, W, C]`` with C in {1, 3}: each channel is transformed alike and on its own
(for 28x28x1 the computation is exactly the reference's).

Ovadia et al. 2019, "Can You Trust Your Model's Uncertainty? Evaluating Predictive
Uncertainty Under Dataset Shift" (NeurIPS 2019). Reference code:
``google-research/google-research``, ``uq_benchmark_2019/mnist/data_lib.py``
(``build_dataset``: ``scipy.ndimage.rotate(images, degs, axes=[-2, -3])`` then
``_crop_center(images, 28)``; ``np.roll(images, k, axis=-2)``).
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage as ndi

from ensemble_core.shifts.layout import check_hwc

ROTATION_DEGREES: tuple[int, ...] = tuple(range(0, 181, 15))
"""0, 15, ..., 180: Ovadia et al.'s grid (``DATA_OPTS_ROTATE = range(15, 181, 15)``) plus 0."""

TRANSLATION_PIXELS: tuple[int, ...] = tuple(range(15))
"""0..14 pixels. (The reference's own grid is ``DATA_OPTS_ROLL = range(2, 28, 2)``;
rolls by k and 28 - k are mirror images, so 0..14 covers the distinct magnitudes of
MNIST's width; on wider images, e.g. CIFAR-10's 32, they are 0..14 of 0..16.)"""


def rotate(images: np.ndarray, degrees: float) -> np.ndarray:
    """Ovadia et al.'s rotated MNIST.

    Exactly the reference computation (``uq_benchmark_2019/mnist/data_lib.py``,
    ``build_dataset``): the images as float32 in [0, 1] are rotated with
    ``scipy.ndimage.rotate(images, degrees, axes=[-2, -3])`` with its defaults
    (``reshape=True``, ``order=3`` spline, ``mode='constant'``, ``cval=0``), so the output
    grows to hold the whole rotated square (e.g. 35x35 at 15 degrees), and then the central
    28x28 is cropped (``_crop_center``: rows and columns from ``size // 2 - 14``). With
    ``reshape=True`` plus the crop, the digit is rotated about the centre of the enlarged
    canvas, which coincides with the 28x28 image's centre up to the half pixel of the
    integer crop; ``reshape=False`` would rotate about the exact centre but is not what the
    paper's code ran. For any other ``[H, W]`` the central ``H x W`` is cropped the same way
    (rows from ``size // 2 - H // 2``, columns from ``size // 2 - W // 2``; a non-square
    image's canvas, shorter than H or narrower than W near 90 degrees, is first padded with
    zeros around its centre), and each of the
    C channels is rotated on its own (``scipy.ndimage.rotate`` rotates every plane of the
    (width, height) axes separately). ``axes=[-2, -3]`` (width, height) fixes the direction: a positive
    angle turns the digit counterclockwise as displayed (row 0 at the top). Degrees that are 0 return the input
    unchanged (the reference skips the call when ``rotate_degs`` is 0). The order-3 spline
    over- and undershoots; values are clipped to [0, 1] before rounding to uint8.

    Args:
      images: uint8 ``[N, H, W, C]``, C in {1, 3} (MNIST: ``[N, 28, 28, 1]``).
      degrees: rotation angle in degrees (:data:`ROTATION_DEGREES` is the paper's grid).

    Returns:
      uint8 ``[N, H, W, C]``.

    Raises:
      ValueError: images of another dtype, rank or channel count.
    """
    images = check_hwc(images)
    if degrees == 0:
        return images.copy()
    h, w = images.shape[1:3]
    x = images.astype(np.float32) / 255.0
    x = ndi.rotate(x, degrees, axes=(-2, -3))
    # A non-square image's rotated canvas can be shorter than H or narrower than W (at 90
    # degrees H and W swap): pad it with zeros (cval) around the centre before the crop.
    grow_h, grow_w = max(0, h - x.shape[1]), max(0, w - x.shape[2])
    if grow_h or grow_w:
        pad = ((0, 0), (grow_h // 2, grow_h - grow_h // 2), (grow_w // 2, grow_w - grow_w // 2), (0, 0))
        x = np.pad(x, pad)
    i0 = x.shape[1] // 2 - h // 2
    j0 = x.shape[2] // 2 - w // 2
    x = x[:, i0 : i0 + h, j0 : j0 + w]
    return np.round(np.clip(x, 0.0, 1.0) * 255.0).astype(np.uint8)


def translate(images: np.ndarray, pixels: int) -> np.ndarray:
    """Ovadia et al.'s translated MNIST: ``np.roll(images, pixels, axis=-2)``.

    A horizontal cyclic shift along the width axis (the reference's ``axis=-2`` of
    ``[N, H, W, C]``): content leaving the right edge re-enters at the left, so a roll by
    the width W (28 for MNIST, or any multiple) is the identity. Every channel moves alike.

    Args:
      images: uint8 ``[N, H, W, C]``, C in {1, 3} (MNIST: ``[N, 28, 28, 1]``).
      pixels: shift to the right in pixels (:data:`TRANSLATION_PIXELS`).

    Returns:
      uint8 ``[N, H, W, C]``.

    Raises:
      ValueError: images of another dtype, rank or channel count.
    """
    return np.roll(check_hwc(images), int(pixels), axis=-2)
