"""The 15 common corruptions of Hendrycks & Dietterich at severities 1-5, for any uint8
``[N, H, W, C]`` (C in {1, 3}, H, W >= 8): grey Fashion-MNIST, CIFAR, Tiny ImageNet, ...

Hendrycks & Dietterich 2019, "Benchmarking Neural Network Robustness to Common Corruptions
and Perturbations" (ICLR 2019). Reference code: ``hendrycks/robustness``,
``ImageNet-C/create_c/make_cifar_c.py`` (CIFAR-10-C, 32x32), ``make_tinyimagenet_c.py``
(Tiny ImageNet-C, 64x64) and ``make_imagenet_c.py`` (ImageNet-C, 224x224); and
``bethgelab/imagecorruptions``, ``imagecorruptions/corruptions.py`` (ImageNet-C's code
generalised to any image size and to grey images; its numpy ``_motion_blur`` replaces
ImageMagick's). Names, in the paper's order: :data:`NAMES`.

Which parameter table, and how it is scaled
-------------------------------------------
The image's size is its geometric-mean side ``s = sqrt(H * W)``. The table is that of the
reference whose images are nearest in size, and ``r = s / R`` (R: that reference's side)
is the scale:

=====================  ==============================  =====  ==========================
``s``                  reference (its table)           R      e.g.
=====================  ==============================  =====  ==========================
``s < 48``             ``make_cifar_c.py``             32     28x28 (r .875), 20x36, 32x32
``48 <= s < 160``      ``make_tinyimagenet_c.py``      64     64x48 (r .866), 64, 96 (1.5)
``s >= 160``           ``make_imagenet_c.py``          224    160 (r .714), 224, 256
=====================  ==============================  =====  ==========================

Intensity parameters (noise levels, brightness, contrast, fog strength and roughness,
frost and snow blend weights, JPEG quality) are the table's. Parameters that are
fractions of the image side are scale-free and kept (zoom blur's zoom factors,
pixelate's downsampling ratio, applied per axis). Parameters in pixels are multiplied by
``r``, as if the image were the reference image resampled to ``H x W``:

* defocus blur: the reference kernel (the aliased disk of the reference radius, blurred by
  the reference's 3x3 or 5x5 Gaussian of sigma ``alias_blur``) is resampled by ``r``
  (bilinear splatting of its taps to ``r`` times their offsets when ``r < 1``, bilinear
  interpolation at ``offset / r`` when ``r > 1``; ``r = 1`` is the reference kernel
  exactly). Rebuilding the aliased disk at radius ``r * radius`` would jump with the
  integer grid (at 28 px CIFAR's severity-4 radius 1 becomes 0.875, a single pixel, and
  severity 4 would blur less than 3);
* glass blur: the Gaussian sigma times ``r``; the swap distance ``max_delta`` becomes
  ``max(1, floor(max_delta * r + 0.5))``; the iteration count is kept;
* motion blur and snow's streaks: ImageMagick's radius and sigma times ``r``;
* snow: the flake zoom times ``r`` (flakes are ``zoom`` pixels of the noise layer);
* elastic transform: the affine jitter and the smoothing sigma times ``r``; ``alpha``
  such that the smoothed random displacement field's RMS (in pixels) is ``r`` times the
  reference's: ``alpha * r * S(sigma) / S(r * sigma)``, with ``S`` the root of the sum
  of the squared weights of the 2-D Gaussian kernel (``truncate=3``; 1 for sigma 0). Just
  multiplying ``alpha`` by ``r`` (as the reference's ``IMSIZE * ...`` suggests) would keep
  the displacement in pixels nearly constant, because smoothing white noise with a wider
  Gaussian lowers its amplitude (ImageNet's table uses ``244 * ...``, a typo its comment
  admits; the numbers are used as they are);
* fog: the diamond-square plasma map is the smallest power of two >= ``max(H, W)``
  (the references use 32, 64 and 256 cropped to 224), cropped to ``H x W``;
* frost: the texture's length unit is the reference's frost-photo resize factor (0.2,
  0.3, 1) times ``r``.

:func:`parameters` returns the values used for a size.

Computation, and where it departs from the reference
----------------------------------------------------
Images are ``x / 255`` in float64 (float32 where the reference uses float32: zoom blur)
and each corruption is the reference function's computation on the whole batch at once.
Grey images (C=1) go through each step on their single channel: brightness adds to the
grey level (the HSV value of a grey pixel), contrast and fog act on the grey level, snow's
greyscale term is the image itself, JPEG and pixelate use Pillow mode ``'L'``, frost uses
the luma of its colour texture (as ``imagecorruptions``).

* Randomness: one ``np.random.Generator`` (``np.random.default_rng([seed, index of the
  name in NAMES, severity])``) draws every random quantity of the batch, never the global
  ``np.random``. The draws follow the reference's distributions but not its sequence, so
  outputs are not bit-identical to the published datasets, and an image's corruption
  depends on the batch it is in (the batch is corrupted as one unit).
* Impulse noise: scikit-image's current ``random_noise(mode='s&p')`` law (each value of
  each channel independently replaced with probability ``amount``, half by 0, half by
  1). The 2019 scikit-image drew ``ceil(amount * size / 2)`` coordinates with
  ``randint(0, dim - 1)``, which never touched the last row, column or channel.
* Defocus blur: OpenCV's ``GaussianBlur`` and ``filter2D`` are written out (separable
  Gaussian, kernel size 3 or 5, and correlation, both with OpenCV's default border,
  reflect-101 = scipy's ``'mirror'``). For radii above 8 the disk grid is
  ``-ceil(radius)..ceil(radius)`` (the reference's ``np.arange(-radius, radius + 1)``
  is only a grid of integers for integer radii).
* Glass blur: the reference swaps each pixel (h, w), h and w running down from
  ``H - max_delta`` to ``max_delta + 1``, with the pixel at (h + dy, w + dx),
  ``dy, dx`` uniform integers in ``[-max_delta, max_delta)``, one swap after the other.
  Here the same swaps are done in ``(2 * max_delta) ** 2`` vectorised rounds: the
  positions are split into classes by ``(h mod 2d, w mod 2d)`` (d = ``max_delta``);
  within a class no two swaps touch the same pixel, so a class is applied at once, and
  the classes go in the reference's descending order of their first position. The swaps
  are the same local transpositions, composed in another order; on the tests' 28x28x1 and
  32x32x3 images the mean change is within 10 % of a pixel-by-pixel loop (about 4 % more).
* Motion blur: ImageMagick's ``MotionBlurImage`` -> the one-sided line kernel of
  ``imagecorruptions``' ``_motion_blur``: ``2 * ceil(radius) + 1`` taps, weight
  ``exp(-i**2 / (2 sigma**2))`` (normalised) at offset ``i`` along the angle (uniform in
  [-45, 45) degrees per image), edge pixels repeated beyond the border, the taps that
  would leave the image dropped (the reference's ``break``). The result is rounded to
  integers, as ImageMagick's 8-bit output is.
* Zoom blur: ``clipped_zoom`` per axis (``imagecorruptions``) with the reference's centred
  trim of the zoomed image (``imagecorruptions`` keeps its top-left corner instead). The
  linear zoom is ``scipy.ndimage.zoom(order=1)``'s, written as two separable passes; where
  float rounding puts its last sample a hair past the input's edge (e.g. 36 px at zoom
  1.2), the edge value is used, while scipy's ``mode='constant'`` returns 0 (a black line
  at the image's edge).
* Snow: the snow layer's ImageMagick motion blur is the same line kernel (angle uniform
  in [-135, -45)); the layer is quantised to 8 bits before and after the blur, as the
  reference's PNG round trip does. A zoom below 1 (a small image) draws a larger noise
  layer and shrinks it; otherwise the layer is drawn at the cropped size and zoomed
  (the reference draws ``H x W`` and crops the centre: the same law).
* Frost: the reference blends a random crop of one of five photographs of frost
  (``frost1.png`` ... ``frost5.jpg``, resized by 0.2 for CIFAR, 0.3 for Tiny ImageNet).
  Those files are not used here: the frost layer is a deterministic procedural texture
  from the same generator, in [0, 1] before the colour: per image a brightness uniform in
  [0.5, 0.85) and a contrast uniform in [0.06, 0.17) (the range of the photographs' blue
  channel means and grey standard deviations, measured) times a unit-variance sum of
  smoothed white noise at four scales (sigmas 2, 6, 18, 54 photo pixels) and crystal-like
  needles (2 % of the pixels as seeds, smeared along three directions 60 degrees apart,
  25 photo pixels long); tinted by the photographs' mean colour ratio (0.815, 0.933, 1) (R, G, B).
  It is blended with the reference coefficients: ``c0 * x + c1 * frost`` (in 0..255).
* Elastic transform: OpenCV's ``getAffineTransform``/``warpAffine`` (bilinear, border
  reflect-101) are written out (exact bilinear weights; OpenCV rounds them to 1/32 px),
  then the displacement as the reference (``gaussian(..., mode='reflect', truncate=3)``,
  bilinear ``map_coordinates(mode='reflect')``). The affine's three control points are
  centred at ``(W // 2, H // 2)`` as (x, y) (the reference's
  ``float32(shape_size) // 2`` is (H // 2, W // 2); the same for square images).
* Pixelate: Pillow BOX down to ``(int(W * c), int(H * c))`` and BOX back up, as the
  three references (``imagecorruptions`` uses NEAREST to go up). JPEG: Pillow at the
  reference quality.

Severity ordering: the mean absolute pixel change grows with severity for 12 of the 15
at the reference's parameters, but not for three, by the reference's own design: glass
blur (more Gaussian blur smooths away swap noise; CIFAR's table gives e.g. 9.7, 9.6, 8.7,
13.0, 11.8 grey levels for the reference's loop), frost (CIFAR's severity 4 only lowers the
image weight from 0.9 to 0.85 at the same frost weight, which shrinks a change dominated
by the added frost) and the elastic transform (severity 1 is the largest random affine map;
later severities shrink it and add local distortion). At CIFAR's table motion blur's
severities 3 and 4 are the same law (radius 6 or 8 only truncates a half-Gaussian of sigma
2, whose taps past 12 weigh < 1e-9).

Output: the reference returns ``np.clip(y, 0, 1) * 255`` floats that its scripts store
with ``np.uint8(...)``, i.e. truncation; so does this module
(``np.clip(y * 255, 0, 255).astype(np.uint8)``), except where the reference's last step
already yields 8-bit integers: motion blur (ImageMagick, rounded to nearest), pixelate
and JPEG (Pillow).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from io import BytesIO
from typing import Any

import numpy as np
from PIL import Image
from scipy import ndimage as ndi
from skimage import color as skcolor

NAMES: tuple[str, ...] = (
    "gaussian_noise",
    "shot_noise",
    "impulse_noise",
    "defocus_blur",
    "glass_blur",
    "motion_blur",
    "zoom_blur",
    "snow",
    "frost",
    "fog",
    "brightness",
    "contrast",
    "elastic_transform",
    "pixelate",
    "jpeg_compression",
)
"""The 15 corruptions, in the paper's (and the reference scripts') order."""

SEVERITIES: tuple[int, ...] = (1, 2, 3, 4, 5)

MIN_SIDE = 8
"""Smallest height and width accepted."""

# (reference file, its side R, upper bound of the geometric-mean side that uses it)
_REFERENCES: tuple[tuple[str, int, float], ...] = (
    ("make_cifar_c.py", 32, 48.0),
    ("make_tinyimagenet_c.py", 64, 160.0),
    ("make_imagenet_c.py", 224, math.inf),
)

# Each entry: the severity-1..5 parameters of make_cifar_c.py, make_tinyimagenet_c.py and
# make_imagenet_c.py (in that order), copied from the reference functions' ``c = [...]``.
_Table = tuple[list[Any], list[Any], list[Any]]
_TABLES: dict[str, _Table] = {
    "gaussian_noise": (
        [0.04, 0.06, 0.08, 0.09, 0.10],
        [0.04, 0.08, 0.12, 0.15, 0.18],
        [0.08, 0.12, 0.18, 0.26, 0.38],
    ),
    "shot_noise": ([500, 250, 100, 75, 50], [250, 100, 50, 30, 15], [60, 25, 12, 5, 3]),
    "impulse_noise": (
        [0.01, 0.02, 0.03, 0.05, 0.07],
        [0.01, 0.02, 0.05, 0.08, 0.14],
        [0.03, 0.06, 0.09, 0.17, 0.27],
    ),
    # (radius, alias_blur)
    "defocus_blur": (
        [(0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1)],
        [(0.5, 0.6), (1, 0.1), (1.5, 0.1), (2.5, 0.01), (3, 0.1)],
        [(3, 0.1), (4, 0.5), (6, 0.5), (8, 0.5), (10, 0.5)],
    ),
    # (sigma, max_delta, iterations)
    "glass_blur": (
        [(0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2), (0.4, 1, 2)],
        [(0.1, 1, 1), (0.5, 1, 1), (0.6, 1, 2), (0.7, 2, 1), (0.9, 2, 2)],
        [(0.7, 1, 2), (0.9, 2, 1), (1, 2, 3), (1.1, 3, 2), (1.5, 4, 2)],
    ),
    # (radius, sigma)
    "motion_blur": (
        [(6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5)],
        [(10, 1), (10, 1.5), (10, 2), (10, 2.5), (12, 3)],
        [(10, 3), (15, 5), (15, 8), (15, 12), (20, 15)],
    ),
    # (start, stop, step) of np.arange
    "zoom_blur": (
        [(1, 1.06, 0.01), (1, 1.11, 0.01), (1, 1.16, 0.01), (1, 1.21, 0.01), (1, 1.26, 0.01)],
        [(1, 1.06, 0.01), (1, 1.11, 0.01), (1, 1.16, 0.01), (1, 1.21, 0.01), (1, 1.26, 0.01)],
        [(1, 1.11, 0.01), (1, 1.16, 0.01), (1, 1.21, 0.02), (1, 1.26, 0.02), (1, 1.31, 0.03)],
    ),
    # (loc, scale, zoom, threshold, blur radius, blur sigma, image weight)
    "snow": (
        [
            (0.1, 0.2, 1, 0.6, 8, 3, 0.95),
            (0.1, 0.2, 1, 0.5, 10, 4, 0.9),
            (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9),
            (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85),
            (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8),
        ],
        [
            (0.1, 0.2, 1, 0.6, 8, 3, 0.8),
            (0.1, 0.2, 1, 0.5, 10, 4, 0.8),
            (0.15, 0.3, 1.75, 0.55, 10, 4, 0.7),
            (0.25, 0.3, 2.25, 0.6, 12, 6, 0.65),
            (0.3, 0.3, 1.25, 0.65, 14, 12, 0.6),
        ],
        [
            (0.1, 0.3, 3, 0.5, 10, 4, 0.8),
            (0.2, 0.3, 2, 0.5, 12, 4, 0.7),
            (0.55, 0.3, 4, 0.9, 12, 8, 0.7),
            (0.55, 0.3, 4.5, 0.85, 12, 8, 0.65),
            (0.55, 0.3, 2.5, 0.85, 12, 12, 0.55),
        ],
    ),
    # (image weight, frost weight); the photo resize factor is in _FROST_PHOTO_SCALE
    "frost": (
        [(1, 0.2), (1, 0.3), (0.9, 0.4), (0.85, 0.4), (0.75, 0.45)],
        [(1, 0.3), (0.9, 0.4), (0.8, 0.45), (0.75, 0.5), (0.7, 0.55)],
        [(1, 0.4), (0.8, 0.6), (0.7, 0.7), (0.65, 0.7), (0.6, 0.75)],
    ),
    # (strength, wibbledecay)
    "fog": (
        [(0.2, 3), (0.5, 3), (0.75, 2.5), (1, 2), (1.5, 1.75)],
        [(0.4, 3), (0.7, 3), (1, 2.5), (1.5, 2), (2, 1.75)],
        [(1.5, 2), (2, 2), (2.5, 1.7), (2.5, 1.5), (3, 1.4)],
    ),
    "brightness": (
        [0.05, 0.1, 0.15, 0.2, 0.3],
        [0.1, 0.2, 0.3, 0.4, 0.5],
        [0.1, 0.2, 0.3, 0.4, 0.5],
    ),
    "contrast": (
        [0.75, 0.5, 0.4, 0.3, 0.15],
        [0.4, 0.3, 0.2, 0.1, 0.05],
        [0.4, 0.3, 0.2, 0.1, 0.05],
    ),
    # (alpha, sigma, affine jitter) in pixels: IMSIZE * (...) with IMSIZE 32, 64 and 244
    "elastic_transform": (
        [
            (32 * a, 32 * b, 32 * c)
            for a, b, c in [(0, 0, 0.08), (0.05, 0.2, 0.07), (0.08, 0.06, 0.06), (0.1, 0.04, 0.05), (0.1, 0.03, 0.03)]
        ],
        [
            (64 * a, 64 * b, 64 * c)
            for a, b, c in [(0, 0, 0.08), (0.05, 0.3, 0.06), (0.1, 0.08, 0.06), (0.1, 0.03, 0.03), (0.16, 0.03, 0.02)]
        ],
        [
            (244 * a, 244 * b, 244 * c)
            for a, b, c in [(2, 0.7, 0.1), (2, 0.08, 0.2), (0.05, 0.01, 0.02), (0.07, 0.01, 0.02), (0.12, 0.01, 0.02)]
        ],
    ),
    "pixelate": (
        [0.95, 0.9, 0.85, 0.75, 0.65],
        [0.9, 0.8, 0.7, 0.6, 0.5],
        [0.6, 0.5, 0.4, 0.3, 0.25],
    ),
    "jpeg_compression": ([80, 65, 58, 50, 40], [65, 58, 50, 40, 25], [25, 18, 15, 10, 7]),
}

_FROST_PHOTO_SCALE = (0.2, 0.3, 1.0)  # cv2.resize(frost, fx=..., fy=...) of each reference
_FROST_TINT = np.array([0.815, 0.933, 1.0])  # mean colour of frost1..5 (R, G, B) / blue
_LUMA = np.array([0.299, 0.587, 0.114])  # cv2 COLOR_RGB2GRAY, and the luma of grey frost


# ---------------------------------------------------------------- checks and parameters


def _check_name_severity(name: str, severity: int) -> None:
    if name not in NAMES:
        raise ValueError(f"unknown corruption {name!r}; expected one of {', '.join(NAMES)}")
    if isinstance(severity, bool) or not isinstance(severity, (int, np.integer)) or severity not in SEVERITIES:
        raise ValueError(f"severity must be an integer in 1..5, got {severity!r}")


def _check_side(height: int, width: int) -> None:
    for label, v in (("height", height), ("width", width)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < MIN_SIDE:
            raise ValueError(f"{label} must be an integer >= {MIN_SIDE}, got {v!r}")


def _reference(height: int, width: int) -> tuple[int, str, int, float]:
    """(table index, reference file, reference side R, scale r = sqrt(H * W) / R)."""
    s = math.sqrt(height * width)
    for i, (file, side, upper) in enumerate(_REFERENCES):
        if s < upper:
            return i, file, side, s / side
    raise AssertionError("unreachable")  # pragma: no cover


def _round_half_up(v: float) -> int:
    return math.floor(v + 0.5)


def _gauss_weight_rms(sigma: float, truncate: float = 3.0) -> float:
    """Root of the sum of the squared weights of scipy's 2-D Gaussian kernel (1 if sigma 0)."""
    if sigma <= 0:
        return 1.0
    radius = int(truncate * sigma + 0.5)
    k = np.exp(-0.5 * (np.arange(-radius, radius + 1) / sigma) ** 2)
    k /= k.sum()
    return float(np.sum(k**2))  # sqrt of (sum k_i^2)^2, the 2-D kernel being separable


def parameters(name: str, severity: int, height: int, width: int) -> dict[str, Any]:
    """The parameters :func:`corrupt` uses for ``name`` at ``severity`` on ``height x width`` images.

    Args:
      name: one of :data:`NAMES`.
      severity: 1..5.
      height, width: the image size, each >= 8.

    Returns:
      A dict with ``reference`` (the reference script whose table is used),
      ``reference_side`` (its image side R), ``scale`` (``r = sqrt(height * width) / R``)
      and the corruption's own parameters after scaling (see the module docstring), e.g.
      ``{"sigma": 0.08}`` for Gaussian noise or ``{"radius": ..., "sigma": ...}`` for
      motion blur. Values are Python floats, ints and tuples.

    Raises:
      ValueError: an unknown name, a severity outside 1..5, or a side below 8.
    """
    _check_name_severity(name, severity)
    _check_side(height, width)
    t, file, side, r = _reference(height, width)
    c = _TABLES[name][t][int(severity) - 1]
    out: dict[str, Any] = {"reference": file, "reference_side": side, "scale": r}
    if name == "gaussian_noise":
        out["sigma"] = float(c)
    elif name == "shot_noise":
        out["photons"] = float(c)
    elif name == "impulse_noise":
        out["amount"] = float(c)
    elif name == "defocus_blur":
        out.update(reference_radius=float(c[0]), reference_alias_blur=float(c[1]))
        out.update(radius=float(c[0]) * r, alias_blur=float(c[1]) * r)
    elif name == "glass_blur":
        out.update(
            sigma=float(c[0]) * r,
            max_delta=max(1, _round_half_up(c[1] * r)),
            iterations=int(c[2]),
        )
    elif name == "motion_blur":
        out.update(radius=float(c[0]) * r, sigma=float(c[1]) * r, angle_range=(-45.0, 45.0))
    elif name == "zoom_blur":
        out["zoom_factors"] = tuple(float(z) for z in np.arange(*c))
    elif name == "snow":
        out.update(
            noise_loc=float(c[0]),
            noise_scale=float(c[1]),
            zoom=float(c[2]) * r,
            threshold=float(c[3]),
            blur_radius=float(c[4]) * r,
            blur_sigma=float(c[5]) * r,
            angle_range=(-135.0, -45.0),
            image_weight=float(c[6]),
        )
    elif name == "frost":
        out.update(
            image_weight=float(c[0]),
            frost_weight=float(c[1]),
            photo_scale=_FROST_PHOTO_SCALE[t],
            texture_unit=_FROST_PHOTO_SCALE[t] * r,
        )
    elif name == "fog":
        out.update(
            strength=float(c[0]),
            wibbledecay=float(c[1]),
            map_size=1 << (max(height, width) - 1).bit_length(),
        )
    elif name == "brightness":
        out["value_shift"] = float(c)
    elif name == "contrast":
        out["factor"] = float(c)
    elif name == "elastic_transform":
        alpha, sigma, jitter = (float(v) for v in c)
        scaled_sigma = sigma * r
        out.update(
            reference_alpha=alpha,
            reference_sigma=sigma,
            reference_affine_jitter=jitter,
            alpha=alpha * r * _gauss_weight_rms(sigma) / _gauss_weight_rms(scaled_sigma),
            sigma=scaled_sigma,
            affine_jitter=jitter * r,
        )
    elif name == "pixelate":
        out.update(ratio=float(c), small_size=(max(1, int(height * c)), max(1, int(width * c))))
    elif name == "jpeg_compression":
        out["quality"] = int(c)
    return out


# ---------------------------------------------------------------- helpers


def _to_uint8(x01: np.ndarray) -> np.ndarray:
    """float in [0, 1] (clipped here) -> uint8, truncating as the reference's ``np.uint8``."""
    return np.clip(x01 * 255.0, 0.0, 255.0).astype(np.uint8)


def _fold(i: np.ndarray, n: int, mode: str) -> np.ndarray:
    """Integer indices (any values) folded into 0..n-1: 'mirror' = reflect-101 (OpenCV's
    BORDER_REFLECT_101), 'reflect' = half-sample symmetric, 'nearest' = edge."""
    if mode == "nearest":
        return np.clip(i, 0, n - 1)
    if mode == "mirror":
        period = 2 * n - 2
        i = np.mod(i, period)
        return np.where(i >= n, period - i, i)
    period = 2 * n  # reflect
    i = np.mod(i, period)
    return np.where(i >= n, period - 1 - i, i)


def _bilinear(x: np.ndarray, ys: np.ndarray, xs: np.ndarray, mode: str) -> np.ndarray:
    """Sample float ``x`` [N, H, W, C] at float coordinates ``ys``, ``xs`` [N, H, W]."""
    n, h, w, _ = x.shape
    y0 = np.floor(ys)
    x0 = np.floor(xs)
    wy = (ys - y0)[..., None]
    wx = (xs - x0)[..., None]
    y0i = y0.astype(np.int64)
    x0i = x0.astype(np.int64)
    ya, yb = _fold(y0i, h, mode), _fold(y0i + 1, h, mode)
    xa, xb = _fold(x0i, w, mode), _fold(x0i + 1, w, mode)
    b = np.arange(n)[:, None, None]
    top = x[b, ya, xa] * (1 - wx) + x[b, ya, xb] * wx
    bottom = x[b, yb, xa] * (1 - wx) + x[b, yb, xb] * wx
    return top * (1 - wy) + bottom * wy


def _shift_sum(x: np.ndarray, weights: np.ndarray, dy: np.ndarray, dx: np.ndarray) -> np.ndarray:
    """``sum_k weights[n, k] * x[n, y - dy[n, k], x - dx[n, k]]``, edge pixels repeated.

    x: float [N, H, W, C]; weights, dy, dx: [N, K] (integer offsets).
    """
    n, h, w, _ = x.shape
    b = np.arange(n)[:, None, None]
    out = np.zeros(x.shape, dtype=np.float64)
    rows_all = np.clip(np.arange(h)[None, None, :] - dy[:, :, None], 0, h - 1)
    cols_all = np.clip(np.arange(w)[None, None, :] - dx[:, :, None], 0, w - 1)
    for k in range(weights.shape[1]):
        wk = weights[:, k]
        if not np.any(wk):
            continue
        out += wk[:, None, None, None] * x[b, rows_all[:, k, :, None], cols_all[:, k, None, :]]
    return out


def _motion_blur_float(x: np.ndarray, radius: float, sigma: float, angles_deg: np.ndarray) -> np.ndarray:
    """ImageMagick's MotionBlurImage as ``imagecorruptions``' ``_motion_blur``, per-image angle.

    x: float [N, H, W, C]; returns float [N, H, W, C].
    """
    _, h, w, _ = x.shape
    width = 2 * math.ceil(radius) + 1
    i = np.arange(width, dtype=np.float64)
    kernel = np.exp(-(i**2) / (2.0 * sigma**2))
    kernel /= kernel.sum()
    a = np.deg2rad(angles_deg)[:, None]
    dy = -np.ceil(i[None, :] * np.sin(a) - 0.5).astype(np.int64)
    dx = -np.ceil(i[None, :] * np.cos(a) - 0.5).astype(np.int64)
    inside = (np.abs(dy) < h) & (np.abs(dx) < w)
    inside = np.cumprod(inside, axis=1).astype(bool)  # the reference's `break`
    return _shift_sum(x, kernel[None, :] * inside, dy, dx)


def _zoom_axis(x: np.ndarray, axis: int, z: float, out: int) -> np.ndarray:
    """Axis ``axis`` of ``x`` zoomed by ``z`` as ``scipy.ndimage.zoom(order=1)`` does (its
    output length ``round(n * z)``, sample ``k`` at input coordinate
    ``k * (n - 1) / (length - 1)``), keeping only the centre ``out`` samples
    (``clipped_zoom``'s trim)."""
    n = x.shape[axis]
    length = round(n * z)
    trim = (length - out) // 2
    k = np.arange(trim, trim + out, dtype=np.float64)
    coord = k * ((n - 1) / (length - 1)) if length > 1 else np.zeros(out)
    i0 = np.floor(coord).astype(np.int64)
    t = coord - i0
    i1 = np.minimum(i0 + 1, n - 1)  # at the last coordinate t == 0
    shape = [1] * x.ndim
    shape[axis] = out
    t = t.reshape(shape)
    return np.take(x, i0, axis=axis) * (1 - t) + np.take(x, i1, axis=axis) * t


def _zoom_centre(x: np.ndarray, z: float, out_h: int, out_w: int) -> np.ndarray:
    """``clipped_zoom``: the centre ``ceil(out / z)`` of ``x`` [N, h, w, C] zoomed by ``z``
    (linear, as ``scipy.ndimage.zoom(order=1)``), then the centre ``out_h x out_w`` of
    that. Separable, in float64; returned in ``x``'s dtype (scipy's zoom also computes in
    float64 and casts back)."""
    _, h, w, _ = x.shape
    ch, cw = math.ceil(out_h / z), math.ceil(out_w / z)
    if ch > h or cw > w:
        raise ValueError("zoom crop larger than its input")  # pragma: no cover (internal)
    top, left = (h - ch) // 2, (w - cw) // 2
    crop = x[:, top : top + ch, left : left + cw].astype(np.float64)
    zoomed = _zoom_axis(_zoom_axis(crop, 1, z, out_h), 2, z, out_w)
    return zoomed.astype(x.dtype)


# ---------------------------------------------------------------- the corruptions
# Each takes uint8 [N, H, W, C], its parameters() dict and the generator; returns uint8.

_Impl = Callable[[np.ndarray, dict[str, Any], np.random.Generator], np.ndarray]


def _gaussian_noise(images: np.ndarray, p: dict[str, Any], rng: np.random.Generator) -> np.ndarray:
    x = images / 255.0
    return _to_uint8(x + rng.normal(scale=p["sigma"], size=x.shape))


def _shot_noise(images: np.ndarray, p: dict[str, Any], rng: np.random.Generator) -> np.ndarray:
    x = images / 255.0
    c = p["photons"]
    return _to_uint8(rng.poisson(x * c) / c)


def _impulse_noise(images: np.ndarray, p: dict[str, Any], rng: np.random.Generator) -> np.ndarray:
    x = images / 255.0
    flipped = rng.random(x.shape) < p["amount"]
    salted = rng.random(x.shape) < 0.5
    x[flipped & salted] = 1.0
    x[flipped & ~salted] = 0.0
    return _to_uint8(x)


def _disk(radius: float, alias_blur: float) -> np.ndarray:
    """The reference ``disk``: an aliased disk blurred by OpenCV's 3x3 (5x5 past radius 8)
    Gaussian of sigma ``alias_blur`` with OpenCV's reflect-101 border."""
    if radius <= 8:
        grid = np.arange(-8, 8 + 1)
        ksize = 3
    else:
        grid = np.arange(-math.ceil(radius), math.ceil(radius) + 1)
        ksize = 5
    yy, xx = np.meshgrid(grid, grid, indexing="ij")
    aliased = (xx**2 + yy**2 <= radius**2).astype(np.float64)
    aliased /= aliased.sum()
    t = np.arange(ksize) - (ksize - 1) / 2
    g = np.exp(-(t**2) / (2.0 * alias_blur**2))
    g /= g.sum()
    out = ndi.correlate1d(aliased, g, axis=0, mode="mirror")
    return ndi.correlate1d(out, g, axis=1, mode="mirror")


def _rescale_kernel(k: np.ndarray, r: float) -> np.ndarray:
    """A centred odd square kernel resampled to ``r`` times its size, normalised to sum 1:
    its taps splatted bilinearly to ``r`` times their offsets (r < 1), or it interpolated
    bilinearly at ``offset / r`` (r > 1); r == 1 returns it unchanged."""
    if r == 1.0:
        return k
    half = k.shape[0] // 2
    if r < 1.0:
        new_half = math.ceil(half * r) + 1
        out = np.zeros((2 * new_half + 1, 2 * new_half + 1))
        off = np.arange(-half, half + 1) * r + new_half
        i0 = np.floor(off).astype(np.int64)
        f = off - i0
        for dy, wy in ((0, 1 - f), (1, f)):
            for dx, wx in ((0, 1 - f), (1, f)):
                np.add.at(out, (i0[:, None] + dy, i0[None, :] + dx), k * wy[:, None] * wx[None, :])
    else:
        new_half = math.ceil((half + 1) * r)
        pos = np.arange(-new_half, new_half + 1) / r + half
        yy, xx = np.meshgrid(pos, pos, indexing="ij")
        out = ndi.map_coordinates(k, [yy, xx], order=1, mode="constant", cval=0.0)
    return out / out.sum()


def _trim_zeros(k: np.ndarray) -> np.ndarray:
    """Drop all-zero outer rings of a centred kernel (the correlation is unchanged)."""
    while k.shape[0] > 1 and not np.any(k[0]) and not np.any(k[-1]) and not np.any(k[:, 0]) and not np.any(k[:, -1]):
        k = k[1:-1, 1:-1]
    return k


def _defocus_blur(images: np.ndarray, p: dict[str, Any], rng: np.random.Generator) -> np.ndarray:
    kernel = _disk(p["reference_radius"], p["reference_alias_blur"])
    kernel = _trim_zeros(_rescale_kernel(kernel, p["scale"]))
    x = images / 255.0
    out = ndi.correlate(x, kernel[None, :, :, None], mode="mirror")
    return _to_uint8(out)


def _glass_blur(images: np.ndarray, p: dict[str, Any], rng: np.random.Generator) -> np.ndarray:
    sigma, d, iterations = p["sigma"], p["max_delta"], p["iterations"]
    n, h, w, _ = images.shape
    spatial = (0, sigma, sigma, 0)
    # skimage.filters.gaussian: mode 'nearest', truncate 4; then np.uint8 (truncation)
    x = (ndi.gaussian_filter(images / 255.0, spatial, mode="nearest", truncate=4.0) * 255).astype(np.uint8)
    hs = np.arange(h - d, d, -1)  # the reference's range(H - d, d, -1)
    ws = np.arange(w - d, d, -1)
    b = np.arange(n)[:, None, None]
    period = 2 * d
    for _ in range(iterations):
        if hs.size == 0 or ws.size == 0:
            break
        shifts = rng.integers(-d, d, size=(n, hs.size, ws.size, 2))  # randint(-d, d): [-d, d)
        for ca in range(min(period, hs.size)):
            for cb in range(min(period, ws.size)):
                hh = hs[ca::period][None, :, None]
                ww = ws[cb::period][None, None, :]
                sub = shifts[:, ca::period, cb::period]
                h2 = hh + sub[..., 1]  # the reference: dx, dy = randint(...); h + dy, w + dx
                w2 = ww + sub[..., 0]
                a_vals = x[b, hh, ww]
                b_vals = x[b, h2, w2]
                x[b, hh, ww] = b_vals
                x[b, h2, w2] = a_vals
    out = ndi.gaussian_filter(x / 255.0, spatial, mode="nearest", truncate=4.0)
    return _to_uint8(out)


def _motion_blur(images: np.ndarray, p: dict[str, Any], rng: np.random.Generator) -> np.ndarray:
    low, high = p["angle_range"]
    angles = np.asarray(rng.uniform(float(low), float(high), size=images.shape[0]), dtype=np.float64)
    out = _motion_blur_float(images.astype(np.float64), p["radius"], p["sigma"], angles)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def _zoom_blur(images: np.ndarray, p: dict[str, Any], rng: np.random.Generator) -> np.ndarray:
    x = (images / 255.0).astype(np.float32)
    _, h, w, _ = x.shape
    out = np.zeros_like(x)
    for z in p["zoom_factors"]:
        out += _zoom_centre(x, z, h, w)
    return _to_uint8((x + out) / (len(p["zoom_factors"]) + 1))


def _snow(images: np.ndarray, p: dict[str, Any], rng: np.random.Generator) -> np.ndarray:
    n, h, w, c = images.shape
    x = images / 255.0
    z = p["zoom"]
    layer = rng.normal(loc=p["noise_loc"], scale=p["noise_scale"], size=(n, math.ceil(h / z), math.ceil(w / z), 1))
    layer = _zoom_centre(layer, z, h, w)
    layer[layer < p["threshold"]] = 0
    layer = np.floor(np.clip(layer, 0, 1) * 255)  # the reference's uint8 PNG of the layer
    low, high = p["angle_range"]
    angles = np.asarray(rng.uniform(float(low), float(high), size=n), dtype=np.float64)
    layer = _motion_blur_float(layer, p["blur_radius"], p["blur_sigma"], angles)
    layer = np.clip(np.rint(layer), 0, 255) / 255.0  # ImageMagick's 8-bit result
    grey = x if c == 1 else (x @ _LUMA)[..., None]
    k = p["image_weight"]
    x = k * x + (1 - k) * np.maximum(x, grey * 1.5 + 0.5)
    return _to_uint8(x + layer + np.rot90(layer, k=2, axes=(1, 2)))


def _frost_texture(rng: np.random.Generator, n: int, h: int, w: int, unit: float) -> np.ndarray:
    """Procedural frost in [0, 1], float [N, H, W]; ``unit``: one photo pixel in image pixels."""
    z = np.zeros((n, h, w))
    for sigma, weight in ((2.0, 0.35), (6.0, 0.3), (18.0, 0.25), (54.0, 0.2)):
        f = ndi.gaussian_filter(rng.standard_normal((n, h, w)), (0, sigma * unit, sigma * unit), mode="wrap")
        f -= f.mean(axis=(1, 2), keepdims=True)
        f /= f.std(axis=(1, 2), keepdims=True) + 1e-12
        z += weight * f
    # crystal-like needles: sparse seeds smeared symmetrically along three directions 60
    # degrees apart (ice's hexagonal habit), 2 * 12 photo pixels long
    length = max(1, round(12.0 * unit))
    offsets = np.arange(-length, length + 1, dtype=np.float64)
    base = rng.uniform(0.0, 180.0, size=n)
    streaks = np.zeros((n, h, w, 1))
    for extra in (0.0, 60.0, 120.0):
        seeds = (rng.random((n, h, w, 1)) < 0.02) * rng.exponential(1.0, size=(n, h, w, 1))
        a = np.deg2rad(base + extra)[:, None]
        dy = np.rint(offsets[None, :] * np.sin(a)).astype(np.int64)
        dx = np.rint(offsets[None, :] * np.cos(a)).astype(np.int64)
        weights = np.full(dy.shape, 1.0 / offsets.size)
        streaks += _shift_sum(seeds, weights, dy, dx)
    s = streaks[..., 0]
    s -= s.mean(axis=(1, 2), keepdims=True)
    s /= s.std(axis=(1, 2), keepdims=True) + 1e-12
    z += 0.5 * s
    z /= z.std(axis=(1, 2), keepdims=True) + 1e-12
    level = rng.uniform(0.5, 0.85, size=(n, 1, 1))
    contrast = rng.uniform(0.06, 0.17, size=(n, 1, 1))
    return np.clip(level + contrast * z, 0.0, 1.0)


def _frost(images: np.ndarray, p: dict[str, Any], rng: np.random.Generator) -> np.ndarray:
    n, h, w, c = images.shape
    t = _frost_texture(rng, n, h, w, p["texture_unit"])
    rgb = 255.0 * t[..., None] * _FROST_TINT
    frost = rgb if c == 3 else (rgb @ _LUMA)[..., None]
    out = p["image_weight"] * images.astype(np.float64) + p["frost_weight"] * frost
    return np.clip(out, 0, 255).astype(np.uint8)


def _plasma_fractal(rng: np.random.Generator, n: int, mapsize: int, wibbledecay: float) -> np.ndarray:
    """The reference ``plasma_fractal`` (diamond-square) for ``n`` maps at once, float [N, M, M] in [0, 1]."""
    m = mapsize
    a = np.zeros((n, m, m))
    step = m
    wibble = 100.0

    def wibbled_mean(v: np.ndarray) -> np.ndarray:
        return v / 4 + wibble * rng.uniform(-wibble, wibble, v.shape)

    while step >= 2:
        half = step // 2
        corner = a[:, 0:m:step, 0:m:step]
        square = corner + np.roll(corner, -1, axis=1)
        square = square + np.roll(square, -1, axis=2)
        a[:, half:m:step, half:m:step] = wibbled_mean(square)
        dr = a[:, half:m:step, half:m:step]
        ul = a[:, 0:m:step, 0:m:step]
        lt = (dr + np.roll(dr, 1, axis=1)) + (ul + np.roll(ul, -1, axis=2))  # the reference's sums
        a[:, 0:m:step, half:m:step] = wibbled_mean(lt)
        tt = (dr + np.roll(dr, 1, axis=2)) + (ul + np.roll(ul, -1, axis=1))
        a[:, half:m:step, 0:m:step] = wibbled_mean(tt)
        step //= 2
        wibble /= wibbledecay
    a -= a.min(axis=(1, 2), keepdims=True)
    return a / a.max(axis=(1, 2), keepdims=True)


def _fog(images: np.ndarray, p: dict[str, Any], rng: np.random.Generator) -> np.ndarray:
    n, h, w, _ = images.shape
    x = images / 255.0
    max_val = x.max(axis=(1, 2, 3), keepdims=True)
    strength = p["strength"]
    x = x + strength * _plasma_fractal(rng, n, p["map_size"], p["wibbledecay"])[:, :h, :w, None]
    return _to_uint8(x * max_val / (max_val + strength))


def _brightness(images: np.ndarray, p: dict[str, Any], rng: np.random.Generator) -> np.ndarray:
    x = images / 255.0
    if x.shape[-1] == 1:
        return _to_uint8(np.clip(x + p["value_shift"], 0, 1))
    hsv = skcolor.rgb2hsv(x)
    hsv[..., 2] = np.clip(hsv[..., 2] + p["value_shift"], 0, 1)
    return _to_uint8(skcolor.hsv2rgb(hsv))


def _contrast(images: np.ndarray, p: dict[str, Any], rng: np.random.Generator) -> np.ndarray:
    x = images / 255.0
    means = x.mean(axis=(1, 2), keepdims=True)
    return _to_uint8((x - means) * p["factor"] + means)


def _elastic_transform(images: np.ndarray, p: dict[str, Any], rng: np.random.Generator) -> np.ndarray:
    n, h, w, _ = images.shape
    x = images / 255.0
    # random affine: three control points (x, y) jittered, then warpAffine's inverse map
    cx, cy = w // 2, h // 2
    s = min(h, w) // 3
    pts1 = np.array([[cx + s, cy + s], [cx + s, cy - s], [cx - s, cy - s]], dtype=np.float64)
    jitter = p["affine_jitter"]
    pts2 = pts1[None] + rng.uniform(-jitter, jitter, size=(n, 3, 2))
    a2 = np.concatenate([pts2, np.ones((n, 3, 1))], axis=2)  # dst points, homogeneous
    inv = np.linalg.solve(a2, np.broadcast_to(pts1, (n, 3, 2)))  # [x, y, 1] @ inv -> src (x, y)
    yy, xx = np.meshgrid(np.arange(h, dtype=np.float64), np.arange(w, dtype=np.float64), indexing="ij")
    src_x = xx[None] * inv[:, 0, 0, None, None] + yy[None] * inv[:, 1, 0, None, None] + inv[:, 2, 0, None, None]
    src_y = xx[None] * inv[:, 0, 1, None, None] + yy[None] * inv[:, 1, 1, None, None] + inv[:, 2, 1, None, None]
    x = _bilinear(x, src_y, src_x, "mirror")
    # elastic displacement
    sigma, alpha = p["sigma"], p["alpha"]
    smooth = (0, sigma, sigma)
    dx = ndi.gaussian_filter(rng.uniform(-1, 1, size=(n, h, w)), smooth, mode="reflect", truncate=3.0) * alpha
    dy = ndi.gaussian_filter(rng.uniform(-1, 1, size=(n, h, w)), smooth, mode="reflect", truncate=3.0) * alpha
    x = _bilinear(x, yy[None] + dy, xx[None] + dx, "reflect")
    return _to_uint8(x)


def _pil_images(images: np.ndarray) -> list[Image.Image]:
    if images.shape[-1] == 1:
        return [Image.fromarray(im[..., 0], mode="L") for im in images]
    return [Image.fromarray(im, mode="RGB") for im in images]


def _from_pil(pils: list[Image.Image], channels: int) -> np.ndarray:
    arrays = [np.asarray(im, dtype=np.uint8) for im in pils]
    out = np.stack(arrays)
    return out[..., None] if channels == 1 else out


def _pixelate(images: np.ndarray, p: dict[str, Any], rng: np.random.Generator) -> np.ndarray:
    h, w = images.shape[1:3]
    small_h, small_w = p["small_size"]
    box = Image.Resampling.BOX
    pils = [im.resize((small_w, small_h), box).resize((w, h), box) for im in _pil_images(images)]
    return _from_pil(pils, images.shape[-1])


def _jpeg_compression(images: np.ndarray, p: dict[str, Any], rng: np.random.Generator) -> np.ndarray:
    out = []
    for im in _pil_images(images):
        buf = BytesIO()
        im.save(buf, "JPEG", quality=p["quality"])
        buf.seek(0)
        with Image.open(buf) as decoded:
            decoded.load()
            out.append(decoded.copy())
    return _from_pil(out, images.shape[-1])


_IMPLS: dict[str, _Impl] = {
    "gaussian_noise": _gaussian_noise,
    "shot_noise": _shot_noise,
    "impulse_noise": _impulse_noise,
    "defocus_blur": _defocus_blur,
    "glass_blur": _glass_blur,
    "motion_blur": _motion_blur,
    "zoom_blur": _zoom_blur,
    "snow": _snow,
    "frost": _frost,
    "fog": _fog,
    "brightness": _brightness,
    "contrast": _contrast,
    "elastic_transform": _elastic_transform,
    "pixelate": _pixelate,
    "jpeg_compression": _jpeg_compression,
}


def corrupt(images: np.ndarray, name: str, severity: int, seed: int = 0) -> np.ndarray:
    """``images`` with the common corruption ``name`` at ``severity``.

    Args:
      images: uint8 ``[N, H, W, C]``, C in {1, 3} (grey or RGB), H and W >= 8.
      name: one of :data:`NAMES`.
      severity: 1..5 (:data:`SEVERITIES`).
      seed: a non-negative integer; the random draws come from
        ``np.random.default_rng([seed, NAMES.index(name), severity])``.

    Returns:
      uint8 ``[N, H, W, C]``, a new array; the same for the same (images, name,
      severity, seed), bit for bit. The parameters are :func:`parameters`' for ``H x W``.

    Raises:
      ValueError: an unknown name, a severity outside 1..5, images that are not uint8,
        not of rank 4, with C not in {1, 3} or a side below 8, or a negative or
        non-integer seed.
    """
    _check_name_severity(name, severity)
    images = np.asarray(images)
    if images.dtype != np.uint8:
        raise ValueError(f"images must be uint8 [N, H, W, C], got dtype {images.dtype}")
    if images.ndim != 4:
        raise ValueError(f"images must be uint8 [N, H, W, C] (rank 4), got shape {images.shape}")
    if images.shape[-1] not in (1, 3):
        raise ValueError(f"images must have C in (1, 3) channels, got shape {images.shape}")
    if images.shape[1] < MIN_SIDE or images.shape[2] < MIN_SIDE:
        raise ValueError(f"images must be at least {MIN_SIDE}x{MIN_SIDE}, got shape {images.shape}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    if images.shape[0] == 0:
        return images.copy()
    p = parameters(name, int(severity), int(images.shape[1]), int(images.shape[2]))
    rng = np.random.default_rng([int(seed), NAMES.index(name), int(severity)])
    out = _IMPLS[name](np.ascontiguousarray(images), p, rng)
    assert out.shape == images.shape and out.dtype == np.uint8
    return out
