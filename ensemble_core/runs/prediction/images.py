"""What prediction accepts as images: their shape and their values, refused with one line
naming the fix rather than guessed at."""

from __future__ import annotations

import numpy as np

from ensemble_core.errors import DataError


def check_image_shape(images: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``images`` as ``[N, H, W, C]`` for a model taking ``shape`` = ``(H, W, C)`` (a grey
    ``[N, H, W]`` gains its channel axis).

    Raises:
      DataError: any other shape (a single image without its batch axis, another size or
        channel count), naming the shape found and the one the model takes.
    """
    if images.ndim == 3 and shape[-1] == 1 and tuple(images.shape[1:]) == tuple(shape[:2]):
        images = images[..., None]
    if images.ndim != 4 or tuple(images.shape[1:]) != tuple(shape):
        dims = ", ".join(map(str, shape))
        single = " (one image needs its batch axis: images[None])" if tuple(images.shape) == tuple(shape) else ""
        raise DataError(
            f"images have shape {tuple(images.shape)} but the model takes [N, {dims}]{single}; "
            f"fix: reshape them to [N, {dims}]"
        )
    return images


def check_image_values(images: np.ndarray) -> None:
    """Images must be what the model was trained on: uint8 in 0..255, or floats in [0, 1].

    Anything else is refused rather than guessed at: floats outside [0, 1] (e.g. 0..255
    stored as float, or standardised values), other integer types (16-bit scans, int64
    labels mistaken for images), booleans, and NaN or infinite values would all give
    confident, wrong predictions and uncertainty.

    Args:
      images: ``[N, H, W, C]``.

    Raises:
      DataError: no images, a dtype other than uint8 or float, values out of range, or
        non-finite values; the message gives the range found and the conversion to apply.
    """
    if images.size == 0:
        raise DataError(f"the image array is empty (shape {tuple(images.shape)})", fix="pass at least one image")
    if images.dtype == np.uint8:
        return
    if np.issubdtype(images.dtype, np.integer) or images.dtype == np.bool_:
        lo, hi = (int(images.min()), int(images.max())) if images.dtype != np.bool_ else (0, 1)
        fix = (
            "images.astype(np.uint8)"
            if lo >= 0 and hi <= 255
            else f"rescale them to 0..255 and cast to uint8 (e.g. (images / {hi} * 255).round().astype(np.uint8))"
        )
        raise DataError(
            f"images are {images.dtype} (values {lo}..{hi}); the model takes uint8 in 0..255 or floats in [0, 1]; "
            f"fix: convert explicitly, {fix}"
        )
    if not np.issubdtype(images.dtype, np.floating):
        raise DataError(f"images are {images.dtype}", fix="pass uint8 in 0..255 or floats in [0, 1]")
    if not np.all(np.isfinite(images)):
        raise DataError("images contain NaN or infinite values", fix="clean them before predicting")
    low, high = float(images.min()), float(images.max())
    if low < 0.0 or high > 1.0:
        hint = "divide by 255" if low >= 0.0 and high <= 255.0 else "rescale them to [0, 1] as the training data was"
        raise DataError(
            f"float images range over [{low:g}, {high:g}] but the model takes [0, 1] (uint8 0..255 / 255)",
            fix=hint,
        )
