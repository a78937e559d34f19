"""The 15 common corruptions of Hendrycks & Dietterich 2019 (ensemble_core.shifts.common_corruptions).

Shapes, determinism, severity ordering and bad input on 28x28x1, 32x32x3 and 20x36x3
batches of natural-looking images (1/f-like sums of smoothed noise), and one check per
family against an independent oracle: the reference scripts' formulas
(``hendrycks/robustness``, ``ImageNet-C/create_c/make_*_c.py``) and ``imagecorruptions``'
``_motion_blur``, run per image with scipy, scikit-image and Pillow.
"""

from __future__ import annotations

import functools
import itertools
import math
from io import BytesIO

import numpy as np
import pytest
from PIL import Image
from scipy import ndimage as ndi
from scipy.ndimage import zoom as scizoom
from skimage import color as skcolor
from skimage.filters import gaussian as skgaussian

from ensemble_core.shifts import common_corruptions as cc

SHAPES = [(28, 28, 1), (32, 32, 3), (20, 36, 3)]
N = 32
# zoom blur, defocus blur, brightness, contrast, pixelate and JPEG draw nothing.
DETERMINISTIC = {"zoom_blur", "defocus_blur", "brightness", "contrast", "pixelate", "jpeg_compression"}
RANDOM = [n for n in cc.NAMES if n not in DETERMINISTIC]


def natural(n: int, h: int, w: int, c: int, seed: int = 0) -> np.ndarray:
    """Seeded natural-looking uint8 images: smoothed noise at 4 scales, coarse ones stronger."""
    rng = np.random.default_rng(seed)
    x = np.zeros((n, h, w, c))
    for sigma, weight in ((0.7, 0.5), (1.5, 1.0), (3.0, 1.5), (6.0, 2.0)):
        f = ndi.gaussian_filter(rng.standard_normal((n, h, w, c)), (0, sigma, sigma, 0), mode="wrap")
        x += weight * f / f.std()
    lo = x.min(axis=(1, 2, 3), keepdims=True)
    hi = x.max(axis=(1, 2, 3), keepdims=True)
    return np.round((x - lo) / (hi - lo) * 215 + 20).astype(np.uint8)


@functools.cache
def clean(shape: tuple[int, int, int]) -> np.ndarray:
    x = natural(N, *shape)
    x.flags.writeable = False
    return x


@functools.cache
def corrupted(name: str, shape: tuple[int, int, int], severity: int, seed: int = 0) -> np.ndarray:
    y = cc.corrupt(clean(shape), name, severity, seed=seed)
    y.flags.writeable = False
    return y


def mean_change(name: str, shape: tuple[int, int, int], severity: int) -> float:
    return float(np.abs(corrupted(name, shape, severity).astype(np.float64) - clean(shape)).mean())


# ---------------------------------------------------------------- shape, dtype, determinism


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", cc.NAMES)
def test_shape_dtype_and_determinism(name, shape):
    x = clean(shape)
    for severity in (1, 5):
        y = corrupted(name, shape, severity)
        assert y.shape == x.shape and y.dtype == np.uint8
        again = cc.corrupt(x.copy(), name, severity, seed=0)
        np.testing.assert_array_equal(again, y)
    other = corrupted(name, shape, 3, seed=1)
    if name in DETERMINISTIC:
        np.testing.assert_array_equal(other, corrupted(name, shape, 3))
    else:
        assert not np.array_equal(other, corrupted(name, shape, 3))


def test_input_untouched_and_larger_sizes():
    for shape in [(64, 48, 3), (96, 96, 3), (8, 8, 1), (9, 40, 1)]:
        x = natural(2, *shape)
        before = x.copy()
        for name in cc.NAMES:
            y = cc.corrupt(x, name, 3, seed=7)
            assert y.shape == x.shape and y.dtype == np.uint8, name
        np.testing.assert_array_equal(x, before)
    assert cc.corrupt(np.zeros((0, 28, 28, 1), np.uint8), "fog", 2).shape == (0, 28, 28, 1)


# ---------------------------------------------------------------- severity ordering

# Corruptions whose mean absolute pixel change is NOT ordered by severity in the reference
# itself; each has its own test below that checks what the reference does order:
# * glass_blur: more blur (sigma) smooths out the swap noise, so at CIFAR's table changes go
#   e.g. 9.7, 9.6, 8.7, 13.0, 11.8 for a pixel-by-pixel loop of make_cifar_c.py's code;
# * frost: c0 * x + c1 * frost with CIFAR's (0.9, 0.4) -> (0.85, 0.4) at severity 3 -> 4 only
#   takes 0.05 * x away from a change that is mostly + c1 * frost, so it shrinks;
# * elastic_transform: severity 1 is a pure random affine map with the largest jitter
#   (IMSIZE * 0.08), later severities shrink the affine and add a local elastic field, so
#   pixels move less while local distortion grows.
NOT_MONOTONE_IN_REFERENCE = {"glass_blur", "frost", "elastic_transform"}
# Steps the reference's parameters make (almost) identical in law, so that the sampled
# changes of two severities differ only by chance: motion blur at CIFAR's table, severities
# 3 (radius 6, sigma 2) and 4 (radius 8, sigma 2): ImageMagick's radius only truncates the
# half-Gaussian of sigma 2, whose taps past 12 weigh < 1e-9 (checked in the test).
REFERENCE_TIES = {("motion_blur", "make_cifar_c.py"): [(3, 4)]}


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", [n for n in cc.NAMES if n not in NOT_MONOTONE_IN_REFERENCE])
def test_severity_ordering(name, shape):
    changes = [mean_change(name, shape, s) for s in cc.SEVERITIES]
    reference = cc.parameters(name, 1, *shape[:2])["reference"]
    ties = REFERENCE_TIES.get((name, reference), [])
    for (a, ca), (b, cb) in itertools.pairwise(enumerate(changes, 1)):
        if (a, b) in ties:
            pa, pb = cc.parameters(name, a, *shape[:2]), cc.parameters(name, b, *shape[:2])
            assert pa["sigma"] == pb["sigma"]
            assert math.exp(-((2 * math.ceil(pa["radius"]) + 1) ** 2) / (2 * pa["sigma"] ** 2)) < 1e-9
            assert abs(cb - ca) <= 0.15 * ca, changes
        else:
            assert cb >= ca, (a, b, changes)
    assert changes[-1] > changes[0], changes


def glass_sequential(images: np.ndarray, p: dict, rng: np.random.Generator) -> np.ndarray:
    """make_cifar_c.py's glass_blur, pixel by pixel, with the module's (scaled) parameters."""
    sigma, d, iters = p["sigma"], p["max_delta"], p["iterations"]
    out = []
    for img in images:
        x = np.uint8(skgaussian(img / 255.0, sigma=sigma, channel_axis=-1) * 255)
        h, w = x.shape[:2]
        for _ in range(iters):
            for i in range(h - d, d, -1):
                for j in range(w - d, d, -1):
                    dx, dy = rng.integers(-d, d, size=2)
                    a, b = x[i, j].copy(), x[i + dy, j + dx].copy()
                    x[i, j], x[i + dy, j + dx] = b, a
        out.append(np.uint8(np.clip(skgaussian(x / 255.0, sigma=sigma, channel_axis=-1), 0, 1) * 255))
    return np.stack(out)


@pytest.mark.parametrize("shape", [(28, 28, 1), (32, 32, 3)], ids=lambda s: "x".join(map(str, s)))
def test_glass_blur_matches_sequential_reference(shape):
    x = natural(4, *shape, seed=3)
    rng = np.random.default_rng(0)
    ours, ref = [], []
    for s in cc.SEVERITIES:
        p = cc.parameters("glass_blur", s, *shape[:2])
        ref.append(np.abs(glass_sequential(x, p, rng).astype(float) - x).mean())
        ours.append(np.abs(cc.corrupt(x, "glass_blur", s).astype(float) - x).mean())
    # the vectorised swap rounds give the loop's change within 10 % at every severity
    np.testing.assert_allclose(ours, ref, rtol=0.10)
    # what the reference does order: a second iteration at the same sigma (2 -> 4, 3 -> 5),
    # and severity 5 over 1
    for c in (ours, ref):
        assert c[3] > c[1] and c[4] > c[2] and c[4] > c[0], c


@pytest.mark.parametrize("shape", [(28, 28, 1), (32, 32, 3)], ids=lambda s: "x".join(map(str, s)))
def test_glass_blur_swaps_are_a_permutation(shape):
    # CIFAR's severity 1 has sigma 0.05 (x 0.875 at 28): scipy's kernel is [1], so the
    # output is exactly the swapped image: each image's pixels, permuted, none duplicated
    x = clean(shape)
    y = corrupted("glass_blur", shape, 1)
    assert not np.array_equal(x, y)
    for a, b in zip(x, y, strict=True):
        pa, pb = a.reshape(-1, shape[-1]), b.reshape(-1, shape[-1])
        np.testing.assert_array_equal(pa[np.lexsort(pa.T)], pb[np.lexsort(pb.T)])


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_frost_blend_and_order(shape):
    x = clean(shape).astype(np.float64)
    ratios = []
    for s in cc.SEVERITIES:
        p = cc.parameters("frost", s, *shape[:2])
        c0, c1 = p["image_weight"], p["frost_weight"]
        ratios.append(c1 / c0)
        y = corrupted("frost", shape, s).astype(np.float64)
        # y = trunc(clip(c0 * x + c1 * frost)): recover the frost layer where nothing clipped
        ok = y < 255
        frost = (y - c0 * x) / c1
        assert frost[ok].min() >= -1e-9 and frost[ok].max() <= 255 + 1 / c1
        if shape[-1] == 3:  # the photographs' mean tint: R = 0.815 B, G = 0.933 B
            both = ok[..., 0] & ok[..., 2] & (frost[..., 2] > 50)
            np.testing.assert_allclose(frost[..., 0][both], 0.815 * frost[..., 2][both], atol=2 / c1 + 1)
    assert all(b > a for a, b in itertools.pairwise(ratios)), ratios  # frost's share grows
    assert mean_change("frost", shape, 5) > mean_change("frost", shape, 1)


def local_strain(p: dict) -> float:
    """RMS gradient of the elastic displacement field, ~ alpha * S(sigma) / sigma."""
    if p["sigma"] == 0 or p["alpha"] == 0:
        return 0.0
    return p["alpha"] * cc._gauss_weight_rms(p["sigma"]) / p["sigma"]


@pytest.mark.parametrize("hw", [(28, 28), (32, 32), (20, 36), (64, 64), (224, 224)])
def test_elastic_local_distortion_grows(hw):
    strains = [local_strain(cc.parameters("elastic_transform", s, *hw)) for s in cc.SEVERITIES]
    assert all(b > a for a, b in itertools.pairwise(strains)), strains


# ---------------------------------------------------------------- bad input


def test_errors():
    x = clean((28, 28, 1))
    with pytest.raises(ValueError, match=r"unknown corruption 'speckle_noise'.*gaussian_noise.*jpeg_compression"):
        cc.corrupt(x, "speckle_noise", 1)
    for severity in (0, 6, 2.0, True):
        with pytest.raises(ValueError, match="severity"):
            cc.corrupt(x, "fog", severity)
    with pytest.raises(ValueError, match="uint8"):
        cc.corrupt(x.astype(np.float32), "fog", 1)
    with pytest.raises(ValueError, match="rank 4"):
        cc.corrupt(x[..., 0], "fog", 1)
    with pytest.raises(ValueError, match="C in"):
        cc.corrupt(np.zeros((2, 28, 28, 2), np.uint8), "fog", 1)
    with pytest.raises(ValueError, match="at least 8x8"):
        cc.corrupt(np.zeros((2, 7, 28, 1), np.uint8), "fog", 1)
    with pytest.raises(ValueError, match="seed"):
        cc.corrupt(x, "fog", 1, seed=-1)
    with pytest.raises(ValueError, match="unknown corruption"):
        cc.parameters("nope", 1, 32, 32)
    with pytest.raises(ValueError, match="height"):
        cc.parameters("fog", 1, 4, 32)
    for args in [(x, "x", 1), (x, "fog", 0), (x[..., 0], "fog", 1), (x.astype(float), "fog", 1)]:
        with pytest.raises(ValueError) as err:
            cc.corrupt(*args)
        assert "\n" not in str(err.value)


# ---------------------------------------------------------------- parameters


def test_reference_tables_and_scaling():
    assert cc.NAMES[0] == "gaussian_noise" and cc.NAMES[-1] == "jpeg_compression" and len(cc.NAMES) == 15
    for hw, ref in [((28, 28), "make_cifar_c.py"), ((20, 36), "make_cifar_c.py"), ((32, 32), "make_cifar_c.py"),
                    ((64, 48), "make_tinyimagenet_c.py"), ((96, 96), "make_tinyimagenet_c.py"),
                    ((160, 160), "make_imagenet_c.py"), ((224, 224), "make_imagenet_c.py")]:  # fmt: skip
        assert cc.parameters("fog", 1, *hw)["reference"] == ref, hw
    # the reference tables, unscaled at the reference sizes
    sigmas = [cc.parameters("gaussian_noise", s, 32, 32)["sigma"] for s in cc.SEVERITIES]
    assert sigmas == [0.04, 0.06, 0.08, 0.09, 0.10]
    sigmas = [cc.parameters("gaussian_noise", s, 64, 64)["sigma"] for s in cc.SEVERITIES]
    assert sigmas == [0.04, 0.08, 0.12, 0.15, 0.18]
    assert [cc.parameters("jpeg_compression", s, 224, 224)["quality"] for s in cc.SEVERITIES] == [25, 18, 15, 10, 7]
    p = cc.parameters("elastic_transform", 2, 32, 32)
    assert (p["alpha"], p["sigma"], p["affine_jitter"]) == pytest.approx((32 * 0.05, 32 * 0.2, 32 * 0.07))
    assert cc.parameters("glass_blur", 5, 224, 224)["max_delta"] == 4
    assert len(cc.parameters("zoom_blur", 5, 32, 32)["zoom_factors"]) == 26
    # pixel parameters scale with r = sqrt(H W) / R
    p = cc.parameters("motion_blur", 5, 28, 28)
    assert p["scale"] == pytest.approx(28 / 32) and p["radius"] == pytest.approx(9 * 28 / 32)
    assert cc.parameters("fog", 3, 20, 36)["map_size"] == 64
    assert cc.parameters("pixelate", 5, 20, 36)["small_size"] == (13, 23)


# ---------------------------------------------------------------- oracles


def test_gaussian_shot_impulse_noise_statistics():
    grey = np.full((8, 28, 28, 1), 128, np.uint8)
    for s in cc.SEVERITIES:
        sigma = cc.parameters("gaussian_noise", s, 28, 28)["sigma"]
        d = cc.corrupt(grey, "gaussian_noise", s).astype(np.float64) - 128
        # truncation: mean -0.5, plus the variance 1/12 of a uniform rounding error
        assert d.std() == pytest.approx(math.sqrt((sigma * 255) ** 2 + 1 / 12), rel=0.04)
        assert d.mean() == pytest.approx(-0.5, abs=1.5)
        lam = cc.parameters("shot_noise", s, 28, 28)["photons"]
        d = cc.corrupt(grey, "shot_noise", s).astype(np.float64)
        assert d.std() == pytest.approx(255 * math.sqrt(128 / 255 / lam), rel=0.05)
        amount = cc.parameters("impulse_noise", s, 28, 28)["amount"]
        y = cc.corrupt(grey, "impulse_noise", s)
        assert set(np.unique(y)) <= {0, 128, 255}
        assert (y != 128).mean() == pytest.approx(amount, rel=0.2)
        assert (y == 255).mean() == pytest.approx(amount / 2, rel=0.3)


def reflect101_gauss(k: np.ndarray, ksize: int, sigma: float) -> np.ndarray:
    """cv2.GaussianBlur(k, (ksize, ksize), sigma) with its BORDER_REFLECT_101 (numpy's 'reflect')."""
    t = np.arange(ksize) - (ksize - 1) / 2
    g = np.exp(-(t**2) / (2 * sigma**2))
    g /= g.sum()
    r = ksize // 2
    padded = np.pad(k, r, mode="reflect")
    rows = sum(g[i] * padded[i : i + k.shape[0], :] for i in range(ksize))
    return sum(g[j] * rows[:, j : j + k.shape[1]] for j in range(ksize))


@pytest.mark.parametrize("severity", cc.SEVERITIES)
def test_defocus_blur_is_the_reference_disk_at_32(severity):
    radius, alias = cc._TABLES["defocus_blur"][0][severity - 1]
    grid = np.arange(-8, 9)
    xx, yy = np.meshgrid(grid, grid)
    disk = (xx**2 + yy**2 <= radius**2).astype(np.float64)
    kernel = reflect101_gauss(disk / disk.sum(), 3, alias)
    impulse = np.zeros((1, 32, 32, 3), np.uint8)
    impulse[0, 16, 16] = 255
    y = cc.corrupt(impulse, "defocus_blur", severity)[0, :, :, 0].astype(int)
    expect = np.zeros((32, 32), int)
    expect[8:25, 8:25] = np.uint8(np.clip(kernel, 0, 1) * 255)
    assert np.abs(y - expect).max() <= 1
    # a constant image stays constant at any size (the resampled kernel sums to 1)
    flat = np.full((2, 20, 36, 1), 77, np.uint8)
    assert np.abs(cc.corrupt(flat, "defocus_blur", severity).astype(int) - 77).max() <= 1


def _shift(image, dx, dy):  # imagecorruptions/corruptions.py, shift
    if dx < 0:
        shifted = np.roll(image, shift=image.shape[1] + dx, axis=1)
        shifted[:, dx:] = shifted[:, dx - 1 : dx]
    elif dx > 0:
        shifted = np.roll(image, shift=dx, axis=1)
        shifted[:, :dx] = shifted[:, dx : dx + 1]
    else:
        shifted = image
    if dy < 0:
        shifted = np.roll(shifted, shift=image.shape[0] + dy, axis=0)
        shifted[dy:, :] = shifted[dy - 1 : dy, :]
    elif dy > 0:
        shifted = np.roll(shifted, shift=dy, axis=0)
        shifted[:dy, :] = shifted[dy : dy + 1, :]
    return shifted


def _motion_blur_ic(x, radius, sigma, angle):  # imagecorruptions' _motion_blur (float64 sum)
    width = radius * 2 + 1
    k = np.exp(-(np.arange(width) ** 2) / (2 * sigma**2)) / (np.sqrt(2 * np.pi) * sigma)
    kernel = k / k.sum()
    point = (width * np.sin(np.deg2rad(angle)), width * np.cos(np.deg2rad(angle)))
    hypot = math.hypot(point[0], point[1])
    blurred = np.zeros_like(x, dtype=np.float64)
    for i in range(width):
        dy = -math.ceil(((i * point[0]) / hypot) - 0.5)
        dx = -math.ceil(((i * point[1]) / hypot) - 0.5)
        if np.abs(dy) >= x.shape[0] or np.abs(dx) >= x.shape[1]:
            break
        blurred = blurred + kernel[i] * _shift(x, dx, dy)
    return blurred


@pytest.mark.parametrize("shape", [(32, 32, 3), (20, 36, 3)], ids=lambda s: "x".join(map(str, s)))
def test_motion_blur_matches_imagecorruptions(shape):
    x = natural(3, *shape, seed=5)
    for s in (1, 5):
        p = cc.parameters("motion_blur", s, *shape[:2])
        # the module's first draw: one angle per image from default_rng([seed, name index, severity])
        angles = np.random.default_rng([0, cc.NAMES.index("motion_blur"), s]).uniform(-45, 45, size=3)
        radius = math.ceil(p["radius"])  # imagecorruptions' integer radius: 2 * radius + 1 taps
        ref = np.stack([_motion_blur_ic(im / 1.0, radius, p["sigma"], a) for im, a in zip(x, angles, strict=True)])
        ref = np.clip(np.rint(ref), 0, 255).astype(np.uint8)
        y = cc.corrupt(x, "motion_blur", s)
        diff = np.abs(y.astype(int) - ref)
        assert diff.max() <= 1 and (diff == 0).mean() > 0.99


def test_zoom_blur_matches_reference_clipped_zoom():
    x = natural(3, 32, 32, 3, seed=2)
    for s in (1, 5):
        factors = np.arange(*cc._TABLES["zoom_blur"][0][s - 1])
        ref = []
        for im in x:
            img = (im / 255.0).astype(np.float32)
            out = np.zeros_like(img)
            for z in factors:  # make_cifar_c.py clipped_zoom ('nearest': see the module docstring)
                ch = int(np.ceil(32 / z))
                top = (32 - ch) // 2
                zz = scizoom(img[top : top + ch, top : top + ch], (z, z, 1), order=1, mode="nearest")
                trim = (zz.shape[0] - 32) // 2
                out += zz[trim : trim + 32, trim : trim + 32]
            ref.append(np.uint8(np.clip((img + out) / (len(factors) + 1), 0, 1) * 255))
        diff = np.abs(cc.corrupt(x, "zoom_blur", s).astype(int) - np.stack(ref))
        assert diff.max() <= 1 and (diff == 0).mean() > 0.99


def _plasma_reference(mapsize, wibbledecay, uniform):  # make_cifar_c.py plasma_fractal
    maparray = np.empty((mapsize, mapsize), dtype=np.float64)
    maparray[0, 0] = 0
    stepsize = mapsize
    wibble = 100

    def wibbledmean(array):
        return array / 4 + wibble * uniform(-wibble, wibble, array.shape)

    def fillsquares():
        cornerref = maparray[0:mapsize:stepsize, 0:mapsize:stepsize]
        squareaccum = cornerref + np.roll(cornerref, shift=-1, axis=0)
        squareaccum += np.roll(squareaccum, shift=-1, axis=1)
        maparray[stepsize // 2 : mapsize : stepsize, stepsize // 2 : mapsize : stepsize] = wibbledmean(squareaccum)

    def filldiamonds():
        drgrid = maparray[stepsize // 2 : mapsize : stepsize, stepsize // 2 : mapsize : stepsize]
        ulgrid = maparray[0:mapsize:stepsize, 0:mapsize:stepsize]
        ltsum = (drgrid + np.roll(drgrid, 1, axis=0)) + (ulgrid + np.roll(ulgrid, -1, axis=1))
        maparray[0:mapsize:stepsize, stepsize // 2 : mapsize : stepsize] = wibbledmean(ltsum)
        ttsum = (drgrid + np.roll(drgrid, 1, axis=1)) + (ulgrid + np.roll(ulgrid, -1, axis=0))
        maparray[stepsize // 2 : mapsize : stepsize, 0:mapsize:stepsize] = wibbledmean(ttsum)

    while stepsize >= 2:
        fillsquares()
        filldiamonds()
        stepsize //= 2
        wibble /= wibbledecay
    maparray -= maparray.min()
    return maparray / maparray.max()


@pytest.mark.parametrize("shape", [(32, 32, 3), (20, 36, 1)], ids=lambda s: "x".join(map(str, s)))
def test_fog_is_the_reference_plasma_fractal(shape):
    x = natural(1, *shape, seed=4)
    for s in cc.SEVERITIES:
        p = cc.parameters("fog", s, *shape[:2])
        rng = np.random.default_rng([0, cc.NAMES.index("fog"), s])  # one image: the same draws
        plasma = _plasma_reference(p["map_size"], p["wibbledecay"], rng.uniform)
        img = x[0] / 255.0
        max_val = img.max()
        img = img + p["strength"] * plasma[: shape[0], : shape[1]][..., np.newaxis]
        ref = np.uint8(np.clip(img * max_val / (max_val + p["strength"]), 0, 1) * 255)
        np.testing.assert_array_equal(cc.corrupt(x, "fog", s)[0], ref)


@pytest.mark.parametrize("severity", cc.SEVERITIES)
def test_brightness_and_contrast_formulas(severity):
    grey = clean((28, 28, 1))
    rgb = np.repeat(grey, 3, axis=-1)
    shift = cc.parameters("brightness", severity, 28, 28)["value_shift"]
    hsv = skcolor.rgb2hsv(rgb / 255.0)  # make_*_c.py brightness, on equal channels
    hsv[..., 2] = np.clip(hsv[..., 2] + shift, 0, 1)
    ref = np.uint8(np.clip(skcolor.hsv2rgb(hsv), 0, 1) * 255)
    np.testing.assert_array_equal(cc.corrupt(grey, "brightness", severity), ref[..., :1])
    np.testing.assert_array_equal(cc.corrupt(rgb, "brightness", severity), ref)
    for shape in [(28, 28, 1), (32, 32, 3)]:
        x = clean(shape) / 255.0
        factor = cc.parameters("contrast", severity, *shape[:2])["factor"]
        means = x.mean(axis=(1, 2), keepdims=True)  # per image and channel, as the reference
        ref = np.uint8(np.clip((x - means) * factor + means, 0, 1) * 255)
        np.testing.assert_array_equal(corrupted("contrast", shape, severity), ref)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_pixelate_and_jpeg_are_pillows(shape):
    x = clean(shape)[:4]
    h, w, c = shape
    mode = "L" if c == 1 else "RGB"
    for s in cc.SEVERITIES:
        ratio = cc.parameters("pixelate", s, h, w)["ratio"]
        quality = cc.parameters("jpeg_compression", s, h, w)["quality"]
        pix, jpg = [], []
        for im in x:
            pil = Image.fromarray(im[..., 0] if c == 1 else im, mode)
            small = pil.resize((int(w * ratio), int(h * ratio)), Image.Resampling.BOX)
            pix.append(np.asarray(small.resize((w, h), Image.Resampling.BOX)))
            buf = BytesIO()
            pil.save(buf, "JPEG", quality=quality)
            jpg.append(np.asarray(Image.open(BytesIO(buf.getvalue()))))
        pix_arr, jpg_arr = np.stack(pix), np.stack(jpg)
        if c == 1:
            pix_arr, jpg_arr = pix_arr[..., None], jpg_arr[..., None]
        np.testing.assert_array_equal(cc.corrupt(x, "pixelate", s), pix_arr)
        np.testing.assert_array_equal(cc.corrupt(x, "jpeg_compression", s), jpg_arr)


@pytest.mark.parametrize("shape", [(32, 32, 3), (28, 28, 1), (20, 36, 3)], ids=lambda s: "x".join(map(str, s)))
def test_elastic_matches_scipy_oracle(shape):
    """make_cifar_c.py's elastic_transform per image, with warpAffine as its forward affine
    inverted (scipy affine_transform, reflect-101 = 'mirror') and the module's draws."""
    n = 3
    x = natural(n, *shape, seed=6)
    h, w, c = shape
    for s in cc.SEVERITIES:
        p = cc.parameters("elastic_transform", s, h, w)
        rng = np.random.default_rng([0, cc.NAMES.index("elastic_transform"), s])
        cx, cy, sq = w // 2, h // 2, min(h, w) // 3
        pts1 = np.array([[cx + sq, cy + sq], [cx + sq, cy - sq], [cx - sq, cy - sq]], float)
        pts2 = pts1 + rng.uniform(-p["affine_jitter"], p["affine_jitter"], size=(n, 3, 2))
        fields_x = rng.uniform(-1, 1, size=(n, h, w))
        fields_y = rng.uniform(-1, 1, size=(n, h, w))
        ref = []
        for i in range(n):
            forward = np.linalg.solve(np.c_[pts1, np.ones(3)], pts2[i]).T  # cv2.getAffineTransform
            a_inv = np.linalg.inv(forward[:, :2])
            b = forward[:, 2]
            swap = np.array([[0, 1], [1, 0]])
            matrix = swap @ a_inv @ swap  # (row, col) order
            offset = -(swap @ a_inv @ b)
            img = x[i] / 255.0
            img = np.stack(
                [ndi.affine_transform(img[..., k], matrix, offset, order=1, mode="mirror") for k in range(c)], -1
            )
            dx = skgaussian(fields_x[i], p["sigma"], mode="reflect", truncate=3) * p["alpha"]
            dy = skgaussian(fields_y[i], p["sigma"], mode="reflect", truncate=3) * p["alpha"]
            yy, xx, zz = np.meshgrid(np.arange(h), np.arange(w), np.arange(c), indexing="ij")
            coords = [(yy + dy[..., None]).ravel(), (xx + dx[..., None]).ravel(), zz.ravel()]
            warped = ndi.map_coordinates(img, coords, order=1, mode="reflect").reshape(img.shape)
            ref.append(np.uint8(np.clip(warped, 0, 1) * 255))
        diff = np.abs(cc.corrupt(x, "elastic_transform", s).astype(int) - np.stack(ref))
        assert diff.max() <= 1 and (diff == 0).mean() > 0.99, s


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_snow_only_brightens(shape):
    x = clean(shape).astype(int)
    for s in cc.SEVERITIES:
        y = corrupted("snow", shape, s).astype(int)
        assert (y >= x - 1).all()  # the blend with max(x, 1.5 grey + 0.5) and the flakes add
        assert y.mean() > x.mean()


def test_the_evaluator_corrupts_in_blocks_each_with_its_own_seed():
    """``evaluators.common_corruptions.corrupt_in_blocks``: block b of BLOCK images is
    ``corrupt`` of that block with the seed ``SeedSequence([seed, b])``."""
    from ensemble_core.evaluators import common_corruptions as evaluator

    rng = np.random.default_rng(4)
    images = rng.integers(0, 256, (evaluator.BLOCK + 7, 12, 12, 1), dtype=np.uint8)
    out = evaluator.corrupt_in_blocks(images, "shot_noise", 3, 5)
    for b, start in enumerate((0, evaluator.BLOCK)):
        seed = int(np.random.SeedSequence([5, b]).generate_state(1)[0])
        expected = cc.corrupt(images[start : start + evaluator.BLOCK], "shot_noise", 3, seed)
        np.testing.assert_array_equal(out[start : start + evaluator.BLOCK], expected)
