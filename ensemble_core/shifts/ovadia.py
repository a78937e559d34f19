"""Rotated and translated MNIST, as Ovadia et al. 2019 build them.

Ovadia et al. 2019, "Can You Trust Your Model's Uncertainty? Evaluating Predictive
Uncertainty Under Dataset Shift" (NeurIPS 2019). Reference code:
``google-research/google-research``, ``uq_benchmark_2019/mnist/data_lib.py``
(``build_dataset``: ``scipy.ndimage.rotate(images, degs, axes=[-2, -3])`` then
``_crop_center(images, 28)``; ``np.roll(images, k, axis=-2)``).
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage as ndi

from ensemble_core.shifts._image import H, W, _check, _to_uint8

ROTATION_DEGREES: tuple[int, ...] = tuple(range(0, 181, 15))
"""0, 15, ..., 180: Ovadia et al.'s grid (``DATA_OPTS_ROTATE = range(15, 181, 15)``) plus 0."""

TRANSLATION_PIXELS: tuple[int, ...] = tuple(range(15))
"""0..14 pixels. (The reference's own grid is ``DATA_OPTS_ROLL = range(2, 28, 2)``;
rolls by k and 28 - k are mirror images, so 0..14 covers the distinct magnitudes.)"""


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
    paper's code ran. ``axes=[-2, -3]`` (width, height) fixes the direction: a positive
    angle turns the digit counterclockwise as displayed (row 0 at the top). Degrees that are 0 return the input
    unchanged (the reference skips the call when ``rotate_degs`` is 0). The order-3 spline
    over- and undershoots; values are clipped to [0, 1] before rounding to uint8.

    Args:
      images: uint8 ``[N, 28, 28, 1]``.
      degrees: rotation angle in degrees (:data:`ROTATION_DEGREES` is the paper's grid).

    Returns:
      uint8 ``[N, 28, 28, 1]``.
    """
    images = _check(images)
    if degrees == 0:
        return images.copy()
    x = images.astype(np.float32) / 255.0
    x = ndi.rotate(x, degrees, axes=(-2, -3))
    i0 = x.shape[1] // 2 - H // 2
    j0 = x.shape[2] // 2 - W // 2
    x = x[:, i0 : i0 + H, j0 : j0 + W, 0]
    return _to_uint8(x)


def translate(images: np.ndarray, pixels: int) -> np.ndarray:
    """Ovadia et al.'s translated MNIST: ``np.roll(images, pixels, axis=-2)``.

    A horizontal cyclic shift along the width axis (the reference's ``axis=-2`` of
    ``[N, H, W, C]``): content leaving the right edge re-enters at the left, so a roll by
    28 (or any multiple) is the identity.

    Args:
      images: uint8 ``[N, 28, 28, 1]``.
      pixels: shift to the right in pixels (:data:`TRANSLATION_PIXELS`).

    Returns:
      uint8 ``[N, 28, 28, 1]``.
    """
    return np.roll(_check(images), int(pixels), axis=-2)
