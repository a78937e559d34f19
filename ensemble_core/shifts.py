"""Dataset shifts for MNIST-like images: Ovadia et al. rotations and translations, the
MNIST-C corruptions, and a notMNIST-like set of rendered letters A-J.

Pure numpy/scipy/matplotlib (no scikit-image, OpenCV, Wand/ImageMagick or PIL), host
only, deterministic. Every function takes and returns uint8 ``[N, 28, 28, 1]`` (MNIST's
layout, white strokes on black); internally images are float64 in [0, 1] (``x / 255``,
the reference code's scaling) and are returned as ``round(clip(y, 0, 1) * 255)``.

Sources:

* Ovadia et al. 2019, "Can You Trust Your Model's Uncertainty? Evaluating Predictive
  Uncertainty Under Dataset Shift" (NeurIPS 2019). Reference code:
  ``google-research/google-research``, ``uq_benchmark_2019/mnist/data_lib.py``
  (``build_dataset``: ``scipy.ndimage.rotate(images, degs, axes=[-2, -3])`` then
  ``_crop_center(images, 28)``; ``np.roll(images, k, axis=-2)``).
* Mu & Gilmer 2019, "MNIST-C: A Robustness Benchmark for Computer Vision" (ICML 2019
  UDL workshop, arXiv:1906.02337). Reference code: ``google-research/mnist-c``,
  ``corruptions.py`` (commit bba57e4). Each corruption here is that file's function at
  the ``severity`` its signature defaults to (the severity the published dataset uses; the
  values are quoted in each docstring). Where the reference calls a library we do not
  have, the docstring says what replaces it. The reference draws from numpy's global
  legacy RNG image by image; here each corruption draws the same distributions from one
  ``np.random.Generator`` for the whole batch, so outputs follow the same law but are not
  bit-identical to the published files.

Cross-checked once (not in the tests, scikit-image is not a dependency) against
scikit-image 0.26 in a scratch install: :func:`_canny` gave 0 differing pixels from
``feature.canny`` on 200 MNIST digits; :func:`_warp_affine` matched ``transform.warp`` to
1e-15 for the shear, rotate, scale and translate matrices; the Gaussian helpers matched
``filters.gaussian`` exactly (including the vertical-only glass-blur blur). Newer
scikit-image (>= 0.19-ish) defines ``AffineTransform(shear=c)`` as ``[[1, -tan c], [0, 1]]``;
MNIST-C (2019) ran the older ``[[1, -sin c], [0, cos c]]``, which is what is used here.

scipy is needed at run time (``pyproject.toml`` lists it only under the ``test`` extra;
it must move to ``[project] dependencies`` for this module to be importable in a
production install).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import numpy as np
from scipy import ndimage as ndi

H = W = 28
_CENTRE = 13.5  # MNIST-C keeps the image centre (13.5, 13.5) fixed in its affine maps.


def _check(images: np.ndarray) -> np.ndarray:
    images = np.asarray(images)
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[1:] != (H, W, 1):
        raise ValueError(f"expected uint8 [N, 28, 28, 1], got {images.dtype} {images.shape}")
    return images


def _to01(images: np.ndarray) -> np.ndarray:
    """uint8 ``[N, 28, 28, 1]`` -> float64 ``[N, 28, 28]`` in [0, 1]."""
    return _check(images)[..., 0].astype(np.float64) / 255.0


def _to_uint8(x01: np.ndarray) -> np.ndarray:
    """float ``[N, 28, 28]`` in [0, 1] (clipped) -> uint8 ``[N, 28, 28, 1]`` (rounded).

    Rounding, as the reference's ``visualize_corruptions.ipynb`` does
    (``np.round(x).astype(np.uint8)``) with the float32 [0, 255] its functions return.
    """
    return np.round(np.clip(x01, 0.0, 1.0) * 255.0).astype(np.uint8)[..., None]


# MARK: Ovadia et al. 2019: rotated and translated MNIST

ROTATION_DEGREES: tuple[int, ...] = tuple(range(0, 181, 15))
"""0, 15, ..., 180: Ovadia et al.'s grid (``DATA_OPTS_ROTATE = range(15, 181, 15)``) plus 0."""

TRANSLATION_PIXELS: tuple[int, ...] = tuple(range(0, 15))
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


# MARK: MNIST-C helpers


def _gauss(x: np.ndarray, sigma: float, mode: str = "nearest", axes: tuple[int, ...] = (1, 2)) -> np.ndarray:
    """skimage ``filters.gaussian`` (truncate 4.0) per image of a ``[N, 28, 28]`` batch.

    ``axes`` are the batch axes blurred; the batch axis 0 never is.
    """
    sig = [0.0, 0.0, 0.0]
    for a in axes:
        sig[a] = sigma
    return ndi.gaussian_filter(x, sig, mode=mode, truncate=4.0)


def _warp_affine(x: np.ndarray, mats: np.ndarray) -> np.ndarray:
    """skimage ``transform.warp(x, inverse_map=AffineTransform)`` per image, order 1.

    ``mats`` float ``[N, 3, 3]`` (one per image, or ``[3, 3]`` for all): the inverse map in
    skimage's ``(col, row)`` convention, so output pixel ``(r, c)`` samples the input at
    ``col = m00 c + m01 r + m02``, ``row = m10 c + m11 r + m12`` with bilinear interpolation
    and zeros outside (skimage's ``mode='constant', cval=0``; its bilinear kernel mixes in
    cval between the border pixel and the outside, which is scipy's ``'grid-constant'``).
    """
    n = x.shape[0]
    mats = np.broadcast_to(mats, (n, 3, 3))
    r, c = np.mgrid[0:H, 0:W].astype(np.float64)
    src_c = mats[:, 0, 0, None, None] * c + mats[:, 0, 1, None, None] * r + mats[:, 0, 2, None, None]
    src_r = mats[:, 1, 0, None, None] * c + mats[:, 1, 1, None, None] * r + mats[:, 1, 2, None, None]
    idx = np.broadcast_to(np.arange(n, dtype=np.float64)[:, None, None], src_r.shape)
    return ndi.map_coordinates(x, np.stack([idx, src_r, src_c]), order=1, mode="grid-constant", cval=0.0)


def _centred(lin: np.ndarray) -> np.ndarray:
    """The reference's trick: add the translation that keeps (13.5, 13.5) fixed.

    ``lin`` ``[N, 2, 2]`` -> ``[N, 3, 3]`` with ``a3 = 13.5 (1 - a1 - a2)``,
    ``b3 = 13.5 (1 - b1 - b2)``.
    """
    n = lin.shape[0]
    m = np.zeros((n, 3, 3))
    m[:, :2, :2] = lin
    m[:, 0, 2] = _CENTRE * (1 - lin[:, 0, 0] - lin[:, 0, 1])
    m[:, 1, 2] = _CENTRE * (1 - lin[:, 1, 0] - lin[:, 1, 1])
    m[:, 2, 2] = 1.0
    return m


def _affine_params(rotation: np.ndarray, shear: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """skimage (<= 0.18) ``AffineTransform(scale, rotation, shear).params[:2, :2]``:
    ``[[sx cos(rot), -sy sin(rot + shear)], [sx sin(rot), sy cos(rot + shear)]]``."""
    lin = np.empty((rotation.shape[0], 2, 2))
    lin[:, 0, 0] = scale * np.cos(rotation)
    lin[:, 0, 1] = -scale * np.sin(rotation + shear)
    lin[:, 1, 0] = scale * np.sin(rotation)
    lin[:, 1, 1] = scale * np.cos(rotation + shear)
    return lin


def _line_from_points(c0: float, r0: float, c1: float, r1: float) -> np.ndarray:
    """The reference's ``line_from_points``: float64 ``[28, 28]`` in [0, 1].

    Intensity ``log(1 - d / 2.3) + 1`` clipped to [0, 1] at vertical distance ``d`` from the
    line through ``(c0, r0)``, ``(c1, r1)``; columns outside ``[floor(c0), ceil(c1))``
    zeroed (with Python's slice semantics, as in the reference).
    """
    if c1 == c0:
        return np.zeros((H, W))
    cc = np.linspace(0, 27, 28)[None, :]
    rr = np.linspace(0, 27, 28)[:, None]
    m = (r1 - r0) / (c1 - c0)
    dist = np.clip(np.abs(rr - (m * (cc - c0) + r0)), 0, 2.3 - 1e-10)
    corruption = np.clip(np.log(1 - dist / 2.3) + 1, 0, 1)
    left, right = int(np.floor(c0)), int(np.ceil(c1))
    corruption[:, :left] = 0
    corruption[:, right:] = 0
    return np.clip(corruption, 0, 1)


def _plasma_fractal(rng: np.random.Generator, n: int, mapsize: int = 256, wibbledecay: float = 3.0) -> np.ndarray:
    """The reference's ``plasma_fractal`` (diamond-square), for ``n`` maps at once.

    Returns float64 ``[n, mapsize, mapsize]``, each map min-max normalised to [0, 1].
    The perturbation is ``wibble * U(-wibble, wibble)`` (wibble squared, as in the
    reference), wibble starting at 100 and divided by ``wibbledecay`` per level.
    """
    maparray = np.zeros((n, mapsize, mapsize))
    stepsize = mapsize
    wibble = 100.0

    def wibbledmean(array):
        return array / 4 + wibble * rng.uniform(-wibble, wibble, array.shape)

    while stepsize >= 2:
        s, h = stepsize, stepsize // 2
        # fillsquares
        cornerref = maparray[:, 0:mapsize:s, 0:mapsize:s]
        squareaccum = cornerref + np.roll(cornerref, shift=-1, axis=1)
        squareaccum += np.roll(squareaccum, shift=-1, axis=2)
        maparray[:, h:mapsize:s, h:mapsize:s] = wibbledmean(squareaccum)
        # filldiamonds
        drgrid = maparray[:, h:mapsize:s, h:mapsize:s]
        ulgrid = maparray[:, 0:mapsize:s, 0:mapsize:s]
        ltsum = drgrid + np.roll(drgrid, 1, axis=1) + ulgrid + np.roll(ulgrid, -1, axis=2)
        maparray[:, 0:mapsize:s, h:mapsize:s] = wibbledmean(ltsum)
        ttsum = drgrid + np.roll(drgrid, 1, axis=2) + ulgrid + np.roll(ulgrid, -1, axis=1)
        maparray[:, h:mapsize:s, 0:mapsize:s] = wibbledmean(ttsum)
        stepsize //= 2
        wibble /= wibbledecay
    maparray -= maparray.min(axis=(1, 2), keepdims=True)
    return maparray / maparray.max(axis=(1, 2), keepdims=True)


def _sobel(x: np.ndarray, axis: int) -> np.ndarray:
    """``scipy.ndimage.sobel(image, axis)`` (mode 'reflect') per image of ``[N, 28, 28]``.

    ``ndi.sobel`` on the 3-D batch would also smooth across the batch axis, so the two
    1-D passes are done by hand on the two image axes only.
    """
    other = 2 if axis == 1 else 1
    d = ndi.correlate1d(x, [-1.0, 0.0, 1.0], axis=axis, mode="reflect")
    return ndi.correlate1d(d, [1.0, 2.0, 1.0], axis=other, mode="reflect")


def _canny(x: np.ndarray, sigma: float = 1.0, low: float = 0.1, high: float = 0.2) -> np.ndarray:
    """scikit-image's ``feature.canny`` (the pure-Python version of 0.14-0.18, which MNIST-C
    ran) with its defaults for a float image (thresholds 0.1 and 0.2 of the dtype maximum
    1), per image of a float ``[N, 28, 28]`` batch. Returns bool ``[N, 28, 28]``.

    Steps, as there: Gaussian smoothing with ``mode='constant'`` normalised by the smoothed
    all-ones mask; Sobel gradients; non-maximum suppression with the four interpolated
    direction sectors (later sectors overwrite earlier ones on ties, as in the reference);
    border pixels and zero-gradient pixels excluded (the eroded mask); hysteresis by
    8-connected components of the low mask that contain a high pixel.
    """
    n = x.shape[0]
    bleed = ndi.gaussian_filter(np.ones((H, W)), sigma, mode="constant", truncate=4.0)
    smoothed = _gauss(x, sigma, mode="constant") / (bleed + np.finfo(float).eps)
    jsobel = _sobel(smoothed, axis=2)
    isobel = _sobel(smoothed, axis=1)
    abs_i, abs_j = np.abs(isobel), np.abs(jsobel)
    mag = np.hypot(isobel, jsobel)
    eroded = np.zeros((n, H, W), bool)
    eroded[:, 1:-1, 1:-1] = True
    eroded &= mag > 0

    pad = np.pad(mag, ((0, 0), (1, 1), (1, 1)))

    def nb(di: int, dj: int) -> np.ndarray:  # nb[i, j] = mag[i + di, j + dj]
        return pad[:, 1 + di : 1 + di + H, 1 + dj : 1 + dj + W]

    with np.errstate(divide="ignore", invalid="ignore"):
        w_ji = abs_j / abs_i
        w_ij = abs_i / abs_j
    local_max = np.zeros((n, H, W), bool)
    sectors = [  # (points, w, c1_plus, c2_plus, c1_minus, c2_minus) as in skimage
        (((isobel >= 0) & (jsobel >= 0) | (isobel <= 0) & (jsobel <= 0)) & (abs_i >= abs_j),
         w_ji, (1, 0), (1, 1), (-1, 0), (-1, -1)),
        (((isobel >= 0) & (jsobel >= 0) | (isobel <= 0) & (jsobel <= 0)) & (abs_i <= abs_j),
         w_ij, (0, 1), (1, 1), (0, -1), (-1, -1)),
        (((isobel <= 0) & (jsobel >= 0) | (isobel >= 0) & (jsobel <= 0)) & (abs_i <= abs_j),
         w_ij, (0, 1), (-1, 1), (0, -1), (1, -1)),
        (((isobel <= 0) & (jsobel >= 0) | (isobel >= 0) & (jsobel <= 0)) & (abs_i >= abs_j),
         w_ji, (-1, 0), (-1, 1), (1, 0), (1, -1)),
    ]  # fmt: skip
    for pts, w, c1p, c2p, c1m, c2m in sectors:
        pts = pts & eroded
        with np.errstate(invalid="ignore"):
            c_plus = nb(*c2p) * w + nb(*c1p) * (1 - w) <= mag
            c_minus = nb(*c2m) * w + nb(*c1m) * (1 - w) <= mag
        local_max = np.where(pts, c_plus & c_minus, local_max)

    high_mask = local_max & (mag >= high)
    low_mask = local_max & (mag >= low)
    strel = np.zeros((3, 3, 3), bool)
    strel[1] = True  # 8-connectivity within an image, none across the batch
    labels, count = ndi.label(low_mask, strel)
    if count == 0:
        return low_mask
    sums = np.asarray(ndi.sum(high_mask, labels, np.arange(1, count + 1)))
    good = np.zeros(count + 1, bool)
    good[1:] = sums > 0
    return good[labels]


# MARK: MNIST-C corruptions (reference: google-research/mnist-c corruptions.py)


def _shot_noise(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``shot_noise``, severity 5: ``c = 3``; ``clip(Poisson(x c) / c, 0, 1)``."""
    c = 3.0
    x = _to01(images)
    return _to_uint8(rng.poisson(x * c) / c)


def _impulse_noise(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``impulse_noise``, severity 4: ``amount = 0.17``.

    The reference calls ``skimage.util.random_noise(x, mode='s&p', amount=0.17)``
    (``salt_vs_pepper=0.5``): each pixel is flipped with probability 0.17, and a flipped
    pixel becomes 1 (salt) with probability 0.5 and 0 (pepper) otherwise. Reimplemented
    with the same Bernoulli draws.
    """
    amount, salt_vs_pepper = 0.17, 0.5
    x = _to01(images)
    flipped = rng.random(x.shape) < amount
    salted = rng.random(x.shape) < salt_vs_pepper
    x[flipped & salted] = 1.0
    x[flipped & ~salted] = 0.0
    return _to_uint8(x)


def _glass_blur(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``glass_blur``, severity 1: ``(sigma, max_delta, iterations) = (0.7, 1, 2)``.

    As the reference: blur, ``np.uint8(blurred * 255)`` (truncation), then ``iterations``
    passes over ``h, w`` from ``28 - max_delta`` down to ``max_delta + 1`` in which, with
    probability 1/2, pixel ``(h, w)`` is swapped with ``(h + dy, w + dx)``,
    ``dx, dy ~ randint(-max_delta, max_delta)`` (upper bound exclusive: {-1, 0} here), then
    blur again. The blur is ``skimage.filters.gaussian(x, sigma, multichannel=True)`` on a
    2-D ``[28, 28]`` image: skimage (<= 0.18) then takes the last axis for channels and sets
    its sigma to 0, so the reference blurs along the rows axis (vertically) only; that is
    reproduced (``mode='nearest'``, ``truncate=4``).

    The swaps are sequential in (h, w) and are kept so; they are vectorised over the batch
    (one fancy-indexed swap per position for all images, a zero offset where the coin says
    no), which draws the same distribution as the per-image loop.
    """
    sigma, d, iterations = 0.7, 1, 2
    x = _to01(images)
    x = (_gauss(x, sigma, axes=(1,)) * 255).astype(np.uint8)
    n = x.shape[0]
    positions = range(H - d, d, -1)
    npos = len(positions)
    coins = rng.random((iterations, npos, npos, n)) < 0.5
    deltas = rng.integers(-d, d, size=(iterations, npos, npos, n, 2))
    deltas[~coins] = 0
    ar = np.arange(n)
    for it in range(iterations):
        for a, h in enumerate(positions):
            for b, w in enumerate(positions):
                dx, dy = deltas[it, a, b, :, 0], deltas[it, a, b, :, 1]
                hp, wp = h + dy, w + dx
                here = x[:, h, w].copy()
                x[:, h, w] = x[ar, hp, wp]
                x[ar, hp, wp] = here
    return _to_uint8(_gauss(x / 255.0, sigma, axes=(1,)))


def _motion_blur(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``motion_blur``, severity 1: ``(radius, sigma) = (10, 3)``, angle ``U(-45, 45)`` degrees.

    The reference calls ImageMagick's ``MotionBlurImage`` through Wand, which we do not use.
    Substitute: the same computation as a line-kernel convolution, following
    ImageMagick's ``MagickCore/effect.c``: kernel width ``2 ceil(radius) + 1 = 21``
    (``GetOptimalKernelWidth1D``), one-sided weights ``k_i ∝ exp(-i^2 / (2 sigma^2))``,
    ``i = 0..20``, normalised (``GetMotionBlurKernel``), and tap ``i`` read at offset
    ``(dx, dy) = (ceil(i cos(angle) - 0.5), ceil(i sin(angle) - 0.5))`` (columns, rows);
    pixels outside the image repeat the edge (ImageMagick's default 'edge' virtual pixels).
    ImageMagick rounds to the 8-bit PNG once; we round once at the end.
    """
    radius, sigma = 10, 3.0
    x = _to01(images)
    n = x.shape[0]
    width = int(2 * np.ceil(radius) + 1)
    i = np.arange(width, dtype=np.float64)
    kernel = np.exp(-(i**2) / (2 * sigma**2))
    kernel /= kernel.sum()
    angle = np.deg2rad(rng.uniform(-45, 45, size=n))
    dx = np.ceil(i[None, :] * np.cos(angle)[:, None] - 0.5).astype(np.int64)  # [n, width]
    dy = np.ceil(i[None, :] * np.sin(angle)[:, None] - 0.5).astype(np.int64)
    rows = np.arange(H)[None, :, None]
    cols = np.arange(W)[None, None, :]
    ar = np.arange(n)[:, None, None]
    out = np.zeros_like(x)
    for t in range(width):
        r = np.clip(rows + dy[:, t, None, None], 0, H - 1)
        c = np.clip(cols + dx[:, t, None, None], 0, W - 1)
        out += kernel[t] * x[ar, r, c]
    return _to_uint8(out)


def _random_sign(rng: np.random.Generator, size) -> np.ndarray:
    return rng.choice(np.array([-1.0, 1.0]), size=size)


def _shear(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``shear``, severity 2: ``c = 0.4`` with a random sign per image.

    ``warp(x, inverse_map=AffineTransform(shear=c, translation=t))``, ``t`` keeping the
    centre (13.5, 13.5) fixed; skimage's parameterisation (<= 0.18)
    ``[[1, -sin c], [0, cos c]]``; bilinear, zeros outside.
    """
    x = _to01(images)
    c = 0.4 * _random_sign(rng, x.shape[0])
    lin = _affine_params(np.zeros_like(c), c)
    return _to_uint8(_warp_affine(x, _centred(lin)))


def _scale(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``scale``, severity 3: ``(1 / 0.7, 1 / 0.7)`` as the inverse map, i.e. the digit is
    shrunk to 0.7 of its size about the centre (13.5, 13.5); bilinear, zeros outside.
    Deterministic (``rng`` unused)."""
    x = _to01(images)
    lin = _affine_params(np.zeros(x.shape[0]), np.zeros(x.shape[0]), scale=1 / 0.7)
    return _to_uint8(_warp_affine(x, _centred(lin)))


def _mnistc_rotate(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``rotate``, severity 2: ``0.4`` rad (about 22.9 degrees) with a random sign per image,
    about the centre (13.5, 13.5); ``warp`` with ``AffineTransform(rotation=c)`` as the
    inverse map; bilinear, zeros outside."""
    x = _to01(images)
    c = 0.4 * _random_sign(rng, x.shape[0])
    lin = _affine_params(c, np.zeros_like(c))
    return _to_uint8(_warp_affine(x, _centred(lin)))


def _brightness(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``brightness``, severity 5: ``c = 0.5`` added to V in HSV.

    The reference goes gray -> RGB -> HSV, ``V = clip(V + c, 0, 1)``, HSV -> RGB -> gray
    (skimage ``rgb2gray`` weights 0.2125, 0.7154, 0.0721, which sum to 1). A gray pixel
    has S = 0 and V = its value, so the round trip is exactly ``clip(x + 0.5, 0, 1)``,
    which is what is computed. Deterministic (``rng`` unused).
    """
    return _to_uint8(_to01(images) + 0.5)


def _translate(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``translate``, severity 3: ``c = 3`` pixels, independent random signs for x and y.

    ``warp`` with ``AffineTransform(translation=(dx, dy))`` as the inverse map: output
    ``(r, c)`` = input ``(r + dy, c + dx)``, zeros where that is outside. An exact integer
    shift (not the cyclic roll of :func:`translate`).
    """
    x = _to01(images)
    n = x.shape[0]
    signs = _random_sign(rng, (n, 2))
    m = np.tile(np.eye(3), (n, 1, 1))
    m[:, 0, 2] = 3 * signs[:, 0]
    m[:, 1, 2] = 3 * signs[:, 1]
    return _to_uint8(_warp_affine(x, m))


def _stripe(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``stripe``: columns 0-6 and 21-27 inverted (``255 - x``). Deterministic."""
    x = _check(images).copy()
    x[:, :, :7] = 255 - x[:, :, :7]
    x[:, :, 21:] = 255 - x[:, :, 21:]
    return x


_FOG_CHUNK = 64  # maps per plasma_fractal call (256x256 float64 each): bounds memory


def _fog(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``fog``, severity 5: ``c = (3.0, 1.4)``.

    ``x + 3 * plasma_fractal(mapsize=256, wibbledecay=1.4)[:28, :28]`` (a fresh fractal per
    image, normalised over its whole 256x256 map as in the reference), then
    ``clip(x * max(x) / (max(x) + 3), 0, 1)`` with ``max(x)`` the image's maximum before the
    fog (an all-black image stays black). Fractals are drawn in chunks of 64 images, so
    the output for a seed also depends on that fixed chunk size.
    """
    c0, decay = 3.0, 1.4
    x = _to01(images)
    max_val = x.max(axis=(1, 2), keepdims=True)
    fogmap = np.empty_like(x)
    for s in range(0, x.shape[0], _FOG_CHUNK):
        k = min(_FOG_CHUNK, x.shape[0] - s)
        fogmap[s : s + k] = _plasma_fractal(rng, k, wibbledecay=decay)[:, :H, :W]
    with np.errstate(invalid="ignore", divide="ignore"):
        y = (x + c0 * fogmap) * max_val / (max_val + c0)
    return _to_uint8(y)


def _spatter(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``spatter``, severity 4: ``c = (0.65, 0.3, 1, 0.65, 1.5, 1)``.

    ``liquid ~ N(0.65, 0.3)`` per pixel, Gaussian-blurred (sigma 1, skimage's default
    ``mode='nearest'``), values below 0.65 zeroed; mask ``m = [liquid > 0.65]`` blurred
    with sigma 1.5 and values below 0.8 zeroed; ``x (1 - m) + (63 / 255) m`` (grey mud).
    ``c[5]`` is unused by the reference's grayscale version.
    """
    loc, scale, s1, thr, s2 = 0.65, 0.3, 1.0, 0.65, 1.5
    x = _to01(images)
    liquid = _gauss(rng.normal(loc, scale, size=x.shape), s1)
    liquid[liquid < thr] = 0
    m = _gauss((liquid > thr).astype(np.float64), s2)
    m[m < 0.8] = 0
    return _to_uint8(x * (1 - m) + 63 / 255.0 * m)


def _dotted_line(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``dotted_line``: ``line_from_points(0, r0, 27, r1)``, ``r0, r1 ~ randint(0, 27)``
    (0..26), with the 2-pixel column blocks 0-1, 4-5, ..., 24-25 blanked (and column 27,
    outside ``[floor(0), ceil(27))``); added to the image and clipped."""
    x = _to01(images)
    n = x.shape[0]
    r0, r1 = rng.integers(0, 27, size=(2, n)).astype(np.float64)
    cc = np.linspace(0, 27, 28)[None, None, :]
    rr = np.linspace(0, 27, 28)[None, :, None]
    m = ((r1 - r0) / 27.0)[:, None, None]
    dist = np.clip(np.abs(rr - (m * cc + r0[:, None, None])), 0, 2.3 - 1e-10)
    line = np.clip(np.log(1 - dist / 2.3) + 1, 0, 1)
    line[:, :, 27:] = 0
    idx = np.arange(0, 30, 2)
    off = True
    for i in range(1, len(idx)):
        if off:
            line[:, :, idx[i - 1] : idx[i]] = 0
        off = not off
    return _to_uint8(x + line)


def _zigzag_line(rng: np.random.Generator) -> np.ndarray:
    """One zigzag of the reference's ``zigzag`` (float64 ``[28, 28]``, may exceed 1)."""
    a = b = 2.0
    c0, c1 = 2, 25
    r0 = int(rng.integers(0, 27))
    r1 = r0 + int(rng.integers(-5, 5))
    theta = np.arctan((r1 - r0) / (c1 - c0))
    d = (c1 - c0) / np.cos(theta)
    endpoints = [(0.0, 0.0)]
    for i in range(int((d - a) // (2 * a)) + 1):
        c_i = (2 * i + 1) * a
        r_i = (-1) ** i * b
        endpoints.append((c_i, r_i))
    max_c = (2 * a) * (d // (2 * a))
    if d != max_c:
        endpoints.append((d, r_i / (2 * (d - max_c))))
    pts = np.array(endpoints).T
    rot = np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])
    cs, rs = rot @ pts
    cs += c0
    rs += r0
    total = np.zeros((H, W))
    for i in range(1, pts.shape[1]):
        total += _line_from_points(cs[i - 1], rs[i - 1], cs[i], rs[i])
    return total


def _zigzag(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``zigzag``: a zigzag polyline (segment length and amplitude ``a = b = 2``) from
    column 2 to 25, starting at row ``r0 ~ randint(0, 27)`` and ending near
    ``r0 + randint(-5, 5)``, each segment drawn with ``line_from_points`` and added to the
    image with clipping. (The reference clips after every segment; the segments are
    non-negative, so one clip of the sum is the same.) The geometry is computed per image
    (a few 28x28 arrays each); the reference's points and formulas are kept as they are,
    including the odd last endpoint ``(d, r_i / (2 (d - max_c)))``.
    """
    x = _to01(images)
    lines = np.stack([_zigzag_line(rng) for _ in range(x.shape[0])]) if x.shape[0] else np.zeros_like(x)
    return _to_uint8(x + lines)


def _canny_edges(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``canny_edges``: ``skimage.feature.canny(x)`` (sigma 1, thresholds 0.1 / 0.2) as a
    0/255 image; scikit-image is not installed, so :func:`_canny` reimplements that
    version's algorithm with scipy. Deterministic (``rng`` unused)."""
    return _to_uint8(_canny(_to01(images)).astype(np.float64))


CORRUPTIONS: dict[str, Callable[[np.ndarray, np.random.Generator], np.ndarray]] = {
    "shot_noise": _shot_noise,
    "impulse_noise": _impulse_noise,
    "glass_blur": _glass_blur,
    "motion_blur": _motion_blur,
    "shear": _shear,
    "scale": _scale,
    "rotate": _mnistc_rotate,
    "brightness": _brightness,
    "translate": _translate,
    "stripe": _stripe,
    "fog": _fog,
    "spatter": _spatter,
    "dotted_line": _dotted_line,
    "zigzag": _zigzag,
    "canny_edges": _canny_edges,
}
"""The 15 MNIST-C corruptions, in the reference's ``CORRUPTIONS`` order (without
``identity``): ``name -> f(images uint8 [N, 28, 28, 1], rng) -> uint8 [N, 28, 28, 1]``."""


def corrupt(images: np.ndarray, name: str, seed: int = 0) -> np.ndarray:
    """Applies the MNIST-C corruption ``name`` with ``np.random.default_rng([seed, k])``,
    ``k`` the index of ``name`` in :data:`CORRUPTIONS`: deterministic for a seed, and the
    corruptions draw independent streams.

    Args:
      images: uint8 ``[N, 28, 28, 1]``.
      name: a key of :data:`CORRUPTIONS`.
      seed: non-negative int.

    Returns:
      uint8 ``[N, 28, 28, 1]``.
    """
    if name not in CORRUPTIONS:
        raise KeyError(f"unknown corruption {name!r}; known: {', '.join(CORRUPTIONS)}")
    k = list(CORRUPTIONS).index(name)
    return CORRUPTIONS[name](_check(images), np.random.default_rng([seed, k]))


# MARK: notMNIST-like letters

LETTERS = "ABCDEFGHIJ"
_SUPERSAMPLE = 4
_BOX = 20  # MNIST: digits size-normalised into a 20x20 box, centred by mass in 28x28
# Jitter (ours, not from a paper): small enough that the letters stay legible.
_JITTER_DEG = 12.0
_JITTER_SCALE = (0.85, 1.1)
_JITTER_SHEAR = 0.2
_JITTER_SHIFT = 1.5


def letter_fonts() -> tuple[Path, ...]:
    """The DejaVu TTFs that ship with matplotlib (``<get_data_path()>/fonts/ttf``), sorted
    by name, without the ``*Display`` subsets (they carry only a few glyphs). Typically 12:
    Sans, Sans Mono, Serif, each regular, bold, oblique/italic, bold oblique/italic."""
    import matplotlib

    d = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
    fonts = tuple(sorted(p for p in d.glob("DejaVu*.ttf") if "Display" not in p.name))
    if not fonts:
        raise FileNotFoundError(f"no DejaVu TTF under {d}")
    return fonts


@functools.lru_cache(maxsize=1)
def _letter_templates() -> np.ndarray:
    """float64 ``[F, 10, 28, 28]`` coverage in [0, 1]: each letter of each font, its
    bounding box scaled (aspect kept) so the longer side is 20 px and centred; rendered
    anti-aliased by matplotlib's Agg at 4x and block-averaged to 28x28."""
    from matplotlib.backends.backend_agg import RendererAgg
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextPath
    from matplotlib.transforms import Affine2D

    ss = _SUPERSAMPLE
    size = H * ss
    out = []
    for font in letter_fonts():
        prop = FontProperties(fname=str(font))
        per_font = []
        for ch in LETTERS:
            path = TextPath((0, 0), ch, size=1.0, prop=prop)
            ext = path.get_extents()
            s = _BOX * ss / max(ext.width, ext.height)
            tr = (
                Affine2D()
                .translate(-(ext.x0 + ext.x1) / 2, -(ext.y0 + ext.y1) / 2)
                .scale(s)
                .translate(size / 2, size / 2)
            )
            renderer = RendererAgg(size, size, 72)
            gc = renderer.new_gc()
            gc.set_linewidth(0)
            gc.set_antialiased(True)
            renderer.draw_path(gc, path, tr, (1.0, 1.0, 1.0, 1.0))
            gc.restore()
            alpha = np.asarray(renderer.buffer_rgba())[..., 3].astype(np.float64) / 255.0
            per_font.append(alpha.reshape(H, ss, W, ss).mean(axis=(1, 3)))
        out.append(per_font)
    return np.asarray(out)


def letters(num_per_letter: int, seed: int = 0) -> np.ndarray:
    """A notMNIST-like out-of-distribution set: letters A-J rendered at 28x28.

    (notMNIST, Bulatov 2011, is letters A-J in many fonts; Ovadia et al. use it as MNIST's
    OOD set. It is not shipped here, so this is a stand-in built from fonts we have.)
    Each image: a DejaVu font drawn uniformly from :func:`letter_fonts`, the letter's
    glyph rendered white on black with matplotlib's Agg and fitted into a 20x20 box as
    MNIST digits are (LeCun et al.: size-normalised to 20x20 keeping the aspect ratio, then
    centred by centre of mass in the 28x28 field), then a seeded random affine jitter
    about the centre of mass applied with ``scipy.ndimage`` (bilinear): rotation
    ``U(-12, 12)`` degrees, isotropic scale ``U(0.85, 1.1)``, horizontal shear
    ``U(-0.2, 0.2)``, shift ``U(-1.5, 1.5)`` px per axis. Deterministic for a seed (and a
    given matplotlib's fonts and Agg).

    Args:
      num_per_letter: images per letter.
      seed: seed of ``np.random.default_rng``.

    Returns:
      uint8 ``[10 * num_per_letter, 28, 28, 1]``, letter-major: rows
      ``k * num_per_letter : (k + 1) * num_per_letter`` are ``LETTERS[k]`` (label ``k``).
    """
    num_per_letter = int(num_per_letter)
    if num_per_letter < 0:
        raise ValueError("num_per_letter must be >= 0")
    templates = _letter_templates()  # [F, 10, 28, 28]
    nf = templates.shape[0]
    flat = templates.reshape(nf * len(LETTERS), H, W)
    rr, cc = np.mgrid[0:H, 0:W].astype(np.float64)
    mass = flat.sum(axis=(1, 2))
    com = np.stack([(flat * rr).sum(axis=(1, 2)) / mass, (flat * cc).sum(axis=(1, 2)) / mass], axis=1)

    m = len(LETTERS) * num_per_letter
    rng = np.random.default_rng(seed)
    letter = np.repeat(np.arange(len(LETTERS)), num_per_letter)
    font = rng.integers(0, nf, size=m)
    theta = np.deg2rad(rng.uniform(-_JITTER_DEG, _JITTER_DEG, size=m))
    scale = rng.uniform(*_JITTER_SCALE, size=m)
    shear = rng.uniform(-_JITTER_SHEAR, _JITTER_SHEAR, size=m)
    shift = rng.uniform(-_JITTER_SHIFT, _JITTER_SHIFT, size=(m, 2))

    # Forward map in (row, col): o = A (i - com) + centre + shift, A = R(theta) Shear scale.
    cos, sin = np.cos(theta), np.sin(theta)
    rot = np.stack([np.stack([cos, -sin], -1), np.stack([sin, cos], -1)], -2)
    sh = np.tile(np.eye(2), (m, 1, 1))
    sh[:, 1, 0] = shear  # col += shear * row
    a = rot @ sh * scale[:, None, None]
    a_inv = np.linalg.inv(a)
    tid = font * len(LETTERS) + letter
    out = np.empty((m, H, W), np.uint8)
    chunk = 2048
    for s in range(0, m, chunk):
        e = min(m, s + chunk)
        o = np.stack([rr, cc])[None] - (_CENTRE + shift[s:e])[:, :, None, None]  # [k, 2, 28, 28]
        src = np.einsum("kij,kjhw->kihw", a_inv[s:e], o) + com[tid[s:e]][:, :, None, None]
        idx = np.broadcast_to(tid[s:e, None, None].astype(np.float64), (e - s, H, W))
        vals = ndi.map_coordinates(flat, np.stack([idx, src[:, 0], src[:, 1]]), order=1, mode="constant", cval=0.0)
        out[s:e] = np.round(np.clip(vals, 0, 1) * 255)
    return out[..., None]
