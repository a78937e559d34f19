"""The Canny edge detector of MNIST-C's ``canny_edges`` corruption (Canny 1986; the
reference calls ``skimage.feature.canny(x, sigma=1, low_threshold=0.1,
high_threshold=0.2)``), written with scipy.ndimage."""

from __future__ import annotations

import numpy as np
from scipy import ndimage as ndi

from ensemble_core.shifts._image import H, W
from ensemble_core.shifts.transforms import _gauss


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
