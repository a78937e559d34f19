"""Building blocks of the MNIST-C corruptions: Gaussian blur, affine warps about the image
centre, lines, the plasma fractal of ``fog`` (after ``google-research/mnist-c``,
``corruptions.py``, which calls scikit-image and Wand for these)."""

from __future__ import annotations

import numpy as np
from scipy import ndimage as ndi
from skimage import transform

from ensemble_core.shifts.layout import CENTRE, H, W


def gauss(x: np.ndarray, sigma: float, mode: str = "nearest", axes: tuple[int, ...] = (1, 2)) -> np.ndarray:
    """skimage ``filters.gaussian`` (truncate 4.0) per image of a ``[N, 28, 28]`` batch.

    ``axes`` are the batch axes blurred; the batch axis 0 never is.
    """
    sig = [0.0, 0.0, 0.0]
    for a in axes:
        sig[a] = sigma
    return ndi.gaussian_filter(x, sig, mode=mode, truncate=4.0)


def warp_affine(x: np.ndarray, mats: np.ndarray) -> np.ndarray:
    """skimage ``transform.warp(x_i, AffineTransform(matrix=m_i), order=1)`` per image, as
    the reference warps (bilinear, zeros outside: ``mode='constant', cval=0``).

    ``x`` float ``[N, 28, 28]``; ``mats`` float ``[N, 3, 3]`` (one per image, or ``[3, 3]``
    for all): the inverse map in skimage's ``(col, row)`` convention, so output pixel
    ``(r, c)`` samples the input at ``col = m00 c + m01 r + m02``,
    ``row = m10 c + m11 r + m12``. Returns float64 ``[N, 28, 28]``.
    """
    mats = np.broadcast_to(mats, (x.shape[0], 3, 3))
    warped = [
        transform.warp(xi, transform.AffineTransform(matrix=m), order=1, mode="constant", cval=0.0)
        for xi, m in zip(x, mats, strict=True)
    ]
    return np.stack(warped) if warped else np.zeros_like(x, dtype=np.float64)


def centred(lin: np.ndarray) -> np.ndarray:
    """The reference's trick: add the translation that keeps (13.5, 13.5) fixed.

    ``lin`` ``[N, 2, 2]`` -> ``[N, 3, 3]`` with ``a3 = 13.5 (1 - a1 - a2)``,
    ``b3 = 13.5 (1 - b1 - b2)``.
    """
    n = lin.shape[0]
    m = np.zeros((n, 3, 3))
    m[:, :2, :2] = lin
    m[:, 0, 2] = CENTRE * (1 - lin[:, 0, 0] - lin[:, 0, 1])
    m[:, 1, 2] = CENTRE * (1 - lin[:, 1, 0] - lin[:, 1, 1])
    m[:, 2, 2] = 1.0
    return m


def affine_params(rotation: np.ndarray, shear: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """skimage (<= 0.18) ``AffineTransform(scale, rotation, shear).params[:2, :2]``:
    ``[[sx cos(rot), -sy sin(rot + shear)], [sx sin(rot), sy cos(rot + shear)]]``."""
    lin = np.empty((rotation.shape[0], 2, 2))
    lin[:, 0, 0] = scale * np.cos(rotation)
    lin[:, 0, 1] = -scale * np.sin(rotation + shear)
    lin[:, 1, 0] = scale * np.sin(rotation)
    lin[:, 1, 1] = scale * np.cos(rotation + shear)
    return lin


def line_from_points(c0: float, r0: float, c1: float, r1: float) -> np.ndarray:
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


def plasma_fractal(rng: np.random.Generator, n: int, mapsize: int = 256, wibbledecay: float = 3.0) -> np.ndarray:
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
