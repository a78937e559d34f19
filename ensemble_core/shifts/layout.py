"""The image layouts the shifts take and return: the MNIST-C corruptions and the letters
uint8 ``[N, 28, 28, 1]`` (MNIST's, white strokes on black; float64 ``[N, 28, 28]`` in
[0, 1] inside, ``x / 255``, the reference code's scaling); the Ovadia et al. rotations and
translations any uint8 ``[N, H, W, C]`` with C in {1, 3} (grey or RGB)."""

from __future__ import annotations

import numpy as np

H = W = 28
CENTRE = 13.5  # MNIST-C keeps the image centre (13.5, 13.5) fixed in its affine maps.


def check_images(images: np.ndarray) -> np.ndarray:
    """``images`` as an array, checked to be uint8 ``[N, 28, 28, 1]`` (the MNIST-C shifts' input).

    Raises:
        ValueError: another dtype or shape, naming the one given.
    """
    images = np.asarray(images)
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[1:] != (H, W, 1):
        raise ValueError(f"expected uint8 [N, 28, 28, 1], got {images.dtype} {images.shape}")
    return images


#: The channel counts the shape-generic shifts take: grey and RGB.
CHANNELS = (1, 3)


def check_hwc(images: np.ndarray) -> np.ndarray:
    """uint8 ``[N, H, W, C]`` with C in {1, 3}, returned as an array.

    Raises:
      ValueError: another dtype, rank or channel count.
    """
    images = np.asarray(images)
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] not in CHANNELS:
        raise ValueError(f"expected uint8 [N, H, W, C] with C in {CHANNELS}, got {images.dtype} {images.shape}")
    return images


def to01(images: np.ndarray) -> np.ndarray:
    """uint8 ``[N, 28, 28, 1]`` -> float64 ``[N, 28, 28]`` in [0, 1]."""
    return check_images(images)[..., 0].astype(np.float64) / 255.0


def to_uint8(x01: np.ndarray) -> np.ndarray:
    """float ``[N, 28, 28]`` in [0, 1] (clipped) -> uint8 ``[N, 28, 28, 1]`` (rounded).

    Rounding, as the reference's ``visualize_corruptions.ipynb`` does
    (``np.round(x).astype(np.uint8)``) with the float32 [0, 255] its functions return.
    """
    return np.round(np.clip(x01, 0.0, 1.0) * 255.0).astype(np.uint8)[..., None]
