"""The 15 MNIST-C corruptions.

Mu & Gilmer 2019, "MNIST-C: A Robustness Benchmark for Computer Vision" (ICML 2019 UDL
workshop, arXiv:1906.02337). Reference code: ``google-research/mnist-c``,
``corruptions.py`` (commit bba57e4). Each corruption here is that file's function at the
``severity`` its signature defaults to (the severity the published dataset uses; the
values are quoted in each docstring). Where the reference calls a library we do not
have, the docstring says what replaces it. The reference draws from numpy's global
legacy RNG image by image; here each corruption draws the same distributions from one
``np.random.Generator`` for the whole batch, so outputs follow the same law but are not
bit-identical to the published files.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from skimage import feature

from ensemble_core.shifts.layout import H, W, check_images, to01, to_uint8
from ensemble_core.shifts.transforms import (
    affine_params,
    centred,
    gauss,
    line_from_points,
    plasma_fractal,
    warp_affine,
)


def _shot_noise(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``shot_noise``, severity 5: ``c = 3``; ``clip(Poisson(x c) / c, 0, 1)``."""
    c = 3.0
    x = to01(images)
    return to_uint8(rng.poisson(x * c) / c)


def _impulse_noise(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``impulse_noise``, severity 4: ``amount = 0.17``.

    The reference calls ``skimage.util.random_noise(x, mode='s&p', amount=0.17)``
    (``salt_vs_pepper=0.5``): each pixel is flipped with probability 0.17, and a flipped
    pixel becomes 1 (salt) with probability 0.5 and 0 (pepper) otherwise. Reimplemented
    with the same Bernoulli draws.
    """
    amount, salt_vs_pepper = 0.17, 0.5
    x = to01(images)
    flipped = rng.random(x.shape) < amount
    salted = rng.random(x.shape) < salt_vs_pepper
    x[flipped & salted] = 1.0
    x[flipped & ~salted] = 0.0
    return to_uint8(x)


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
    x = to01(images)
    x = (gauss(x, sigma, axes=(1,)) * 255).astype(np.uint8)
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
    return to_uint8(gauss(x / 255.0, sigma, axes=(1,)))


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
    x = to01(images)
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
    return to_uint8(out)


def _random_sign(rng: np.random.Generator, size) -> np.ndarray:
    return rng.choice(np.array([-1.0, 1.0]), size=size)


def _shear(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``shear``, severity 2: ``c = 0.4`` with a random sign per image.

    ``warp(x, inverse_map=AffineTransform(shear=c, translation=t))``, ``t`` keeping the
    centre (13.5, 13.5) fixed; skimage's parameterisation (<= 0.18)
    ``[[1, -sin c], [0, cos c]]``; bilinear, zeros outside.
    """
    x = to01(images)
    c = 0.4 * _random_sign(rng, x.shape[0])
    lin = affine_params(np.zeros_like(c), c)
    return to_uint8(warp_affine(x, centred(lin)))


def _scale(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``scale``, severity 3: ``(1 / 0.7, 1 / 0.7)`` as the inverse map, i.e. the digit is
    shrunk to 0.7 of its size about the centre (13.5, 13.5); bilinear, zeros outside.
    Deterministic (``rng`` unused)."""
    x = to01(images)
    lin = affine_params(np.zeros(x.shape[0]), np.zeros(x.shape[0]), scale=1 / 0.7)
    return to_uint8(warp_affine(x, centred(lin)))


def _mnistc_rotate(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``rotate``, severity 2: ``0.4`` rad (about 22.9 degrees) with a random sign per image,
    about the centre (13.5, 13.5); ``warp`` with ``AffineTransform(rotation=c)`` as the
    inverse map; bilinear, zeros outside."""
    x = to01(images)
    c = 0.4 * _random_sign(rng, x.shape[0])
    lin = affine_params(c, np.zeros_like(c))
    return to_uint8(warp_affine(x, centred(lin)))


def _brightness(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``brightness``, severity 5: ``c = 0.5`` added to V in HSV.

    The reference goes gray -> RGB -> HSV, ``V = clip(V + c, 0, 1)``, HSV -> RGB -> gray
    (skimage ``rgb2gray`` weights 0.2125, 0.7154, 0.0721, which sum to 1). A gray pixel
    has S = 0 and V = its value, so the round trip is exactly ``clip(x + 0.5, 0, 1)``,
    which is what is computed. Deterministic (``rng`` unused).
    """
    return to_uint8(to01(images) + 0.5)


def _translate(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``translate``, severity 3: ``c = 3`` pixels, independent random signs for x and y.

    ``warp`` with ``AffineTransform(translation=(dx, dy))`` as the inverse map: output
    ``(r, c)`` = input ``(r + dy, c + dx)``, zeros where that is outside. An exact integer
    shift (not the cyclic roll of :func:`translate`).
    """
    x = to01(images)
    n = x.shape[0]
    signs = _random_sign(rng, (n, 2))
    m = np.tile(np.eye(3), (n, 1, 1))
    m[:, 0, 2] = 3 * signs[:, 0]
    m[:, 1, 2] = 3 * signs[:, 1]
    return to_uint8(warp_affine(x, m))


def _stripe(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``stripe``: columns 0-6 and 21-27 inverted (``255 - x``). Deterministic."""
    x = check_images(images).copy()
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
    x = to01(images)
    max_val = x.max(axis=(1, 2), keepdims=True)
    fogmap = np.empty_like(x)
    for s in range(0, x.shape[0], _FOG_CHUNK):
        k = min(_FOG_CHUNK, x.shape[0] - s)
        fogmap[s : s + k] = plasma_fractal(rng, k, wibbledecay=decay)[:, :H, :W]
    with np.errstate(invalid="ignore", divide="ignore"):
        y = (x + c0 * fogmap) * max_val / (max_val + c0)
    return to_uint8(y)


def _spatter(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``spatter``, severity 4: ``c = (0.65, 0.3, 1, 0.65, 1.5, 1)``.

    ``liquid ~ N(0.65, 0.3)`` per pixel, Gaussian-blurred (sigma 1, skimage's default
    ``mode='nearest'``), values below 0.65 zeroed; mask ``m = [liquid > 0.65]`` blurred
    with sigma 1.5 and values below 0.8 zeroed; ``x (1 - m) + (63 / 255) m`` (grey mud).
    ``c[5]`` is unused by the reference's grayscale version.
    """
    loc, scale, s1, thr, s2 = 0.65, 0.3, 1.0, 0.65, 1.5
    x = to01(images)
    liquid = gauss(rng.normal(loc, scale, size=x.shape), s1)
    liquid[liquid < thr] = 0
    m = gauss((liquid > thr).astype(np.float64), s2)
    m[m < 0.8] = 0
    return to_uint8(x * (1 - m) + 63 / 255.0 * m)


def _dotted_line(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``dotted_line``: ``line_from_points(0, r0, 27, r1)``, ``r0, r1 ~ randint(0, 27)``
    (0..26), with the 2-pixel column blocks 0-1, 4-5, ..., 24-25 blanked (and column 27,
    outside ``[floor(0), ceil(27))``); added to the image and clipped."""
    x = to01(images)
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
    return to_uint8(x + line)


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
        total += line_from_points(cs[i - 1], rs[i - 1], cs[i], rs[i])
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
    x = to01(images)
    lines = np.stack([_zigzag_line(rng) for _ in range(x.shape[0])]) if x.shape[0] else np.zeros_like(x)
    return to_uint8(x + lines)


def _canny_edges(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``canny_edges``: ``skimage.feature.canny(x)`` (sigma 1, thresholds 0.1 / 0.2 of a
    float image) per image, as a 0/255 image, as the reference does. Deterministic
    (``rng`` unused)."""
    edges = [feature.canny(x, sigma=1.0, low_threshold=0.1, high_threshold=0.2) for x in to01(images)]
    return to_uint8(np.stack(edges).astype(np.float64) if edges else np.zeros((0, H, W)))


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
    return CORRUPTIONS[name](check_images(images), np.random.default_rng([seed, k]))
