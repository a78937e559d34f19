"""ensemble_core.shifts: Ovadia et al. rotations/translations, MNIST-C corruptions, letters."""

import numpy as np
import pytest
import scipy.ndimage

from ensemble_core import shifts

MNIST_C_NAMES = [  # google-research/mnist-c corruptions.py CORRUPTIONS, without 'identity'
    "shot_noise", "impulse_noise", "glass_blur", "motion_blur", "shear", "scale", "rotate",
    "brightness", "translate", "stripe", "fog", "spatter", "dotted_line", "zigzag", "canny_edges",
]  # fmt: skip
RANDOM = {"shot_noise", "impulse_noise", "glass_blur", "motion_blur", "shear", "rotate", "translate", "fog",
          "spatter", "dotted_line", "zigzag"}  # fmt: skip


@pytest.fixture(scope="module")
def mnist():
    """(200 real MNIST test digits uint8 [200, 28, 28, 1], all 5,000 images' mean intensity)."""
    from ensemble_core.data import read_mnist5k_csv

    images, _ = read_mnist5k_csv()
    return images[::25].copy(), float(images.mean())


# MARK: Ovadia et al.


def test_rotate_matches_direct_scipy_call(mnist):
    images, _ = mnist
    img = images[7, :, :, 0]
    # Independent reference: uq_benchmark_2019/mnist/data_lib.py on one [28, 28] image.
    big = scipy.ndimage.rotate(img.astype(np.float32) / 255.0, 30, axes=(1, 0), reshape=True)
    i0, j0 = big.shape[0] // 2 - 14, big.shape[1] // 2 - 14
    expected = np.round(np.clip(big[i0 : i0 + 28, j0 : j0 + 28], 0, 1) * 255).astype(np.uint8)
    got = shifts.rotate(images[7:8], 30)
    assert got.shape == (1, 28, 28, 1) and got.dtype == np.uint8
    np.testing.assert_array_equal(got[0, :, :, 0], expected)


def test_rotate_grid_shape_and_identity(mnist):
    images, _ = mnist
    assert tuple(range(0, 181, 15)) == shifts.ROTATION_DEGREES
    np.testing.assert_array_equal(shifts.rotate(images, 0), images)
    for deg in (15, 90, 180):
        out = shifts.rotate(images[:5], deg)
        assert out.shape == (5, 28, 28, 1) and out.dtype == np.uint8
        assert not np.array_equal(out, images[:5])
    # 180 degrees is (up to interpolation) a flip of both axes.
    flipped = images[:5, ::-1, ::-1]
    assert np.abs(shifts.rotate(images[:5], 180).astype(int) - flipped).max() <= 2


def test_rotate_direction_counterclockwise():
    x = np.zeros((1, 28, 28, 1), np.uint8)
    x[0, 4:14, 13:15] = 255  # bar above the centre
    rows, cols = np.nonzero(shifts.rotate(x, 90)[0, :, :, 0] > 128)
    assert cols.max() <= 14 and rows.min() >= 12 and rows.max() <= 15  # now left of centre


def test_translate(mnist):
    images, _ = mnist
    assert tuple(range(15)) == shifts.TRANSLATION_PIXELS
    np.testing.assert_array_equal(shifts.translate(images, 0), images)
    np.testing.assert_array_equal(shifts.translate(images, 28), images)
    for k in (1, 5, 14):
        np.testing.assert_array_equal(shifts.translate(images, k), np.roll(images, k, axis=2))
    assert not np.array_equal(shifts.translate(images, 5), images)


def test_bad_input_rejected():
    with pytest.raises(ValueError):
        shifts.rotate(np.zeros((2, 28, 28), np.uint8), 15)
    with pytest.raises(ValueError):
        shifts.corrupt(np.zeros((2, 28, 28, 1), np.float32), "fog")
    with pytest.raises(KeyError):
        shifts.corrupt(np.zeros((2, 28, 28, 1), np.uint8), "snow")


# MARK: MNIST-C


def test_corruption_names_follow_reference():
    assert list(shifts.CORRUPTIONS) == MNIST_C_NAMES == list(LAWS)


# What each corruption does to the 200 digits, against a reference written here (scipy's
# map_coordinates for the affine warps, skimage's canny, the reference's fog with its
# plasma fractal, closed forms) or a property its definition implies that a wrong
# corruption (an inversion, noise, a blur of another kind) breaks. ``x``: the clean
# digits, ``a``: the corrupted ones, both float64 [N, 28, 28] in 0..255.


def _correlation(a, x):
    """Pearson correlation of each corrupted image with its clean image, [N]."""
    a = a.reshape(len(a), -1) - a.reshape(len(a), -1).mean(1, keepdims=True)
    x = x.reshape(len(x), -1) - x.reshape(len(x), -1).mean(1, keepdims=True)
    return (a * x).sum(1) / np.sqrt((a * a).sum(1) * (x * x).sum(1) + 1e-12)


def _variation(a, axis):
    """Total variation of each image along ``axis`` (1: down the rows, 2: across the columns)."""
    return np.abs(np.diff(a, axis=axis)).sum(axis=(1, 2))


def _warped(x01, lin):
    """skimage ``warp`` with ``AffineTransform(matrix)`` as the inverse map about the centre
    (13.5, 13.5), written with scipy: output (r, c) samples the input at
    ``col = l00 c + l01 r + t0``, ``row = l10 c + l11 r + t1``, bilinear, zeros outside."""
    t0, t1 = 13.5 * (1 - lin[0, 0] - lin[0, 1]), 13.5 * (1 - lin[1, 0] - lin[1, 1])
    r, c = np.mgrid[0:28, 0:28].astype(np.float64)
    coords = [lin[1, 0] * c + lin[1, 1] * r + t1, lin[0, 0] * c + lin[0, 1] * r + t0]
    out = scipy.ndimage.map_coordinates(x01, coords, order=1, mode="grid-constant", cval=0.0)
    return np.round(np.clip(out, 0, 1) * 255)


def _affine_law(candidates):
    """Each image is the scipy warp of its clean image by one of ``candidates`` (the
    reference's maps for the signs it draws), to one grey level; with two signs, both occur."""

    def law(x, a):
        chosen = []
        for xi, ai in zip(x / 255.0, a, strict=True):
            errors = [np.abs(_warped(xi, lin) - ai).max() for lin in candidates]
            chosen.append(int(np.argmin(errors)))
            assert min(errors) <= 1, errors
        assert len(set(chosen)) == len(candidates)

    return law


def _rotation(c):
    return np.array([[np.cos(c), -np.sin(c)], [np.sin(c), np.cos(c)]])


def _shear(c):  # skimage (<= 0.18) AffineTransform(shear=c): [[1, -sin c], [0, cos c]]
    return np.array([[1.0, -np.sin(c)], [0.0, np.cos(c)]])


def _plasma_reference(mapsize, wibbledecay, uniform):
    """google-research/mnist-c corruptions.py ``plasma_fractal`` (one map, as written there)."""
    maparray = np.empty((mapsize, mapsize), dtype=np.float64)
    maparray[0, 0] = 0
    stepsize = mapsize
    wibble = 100

    def wibbledmean(array):
        return array / 4 + wibble * uniform(-wibble, wibble, array.shape)

    while stepsize >= 2:
        h = stepsize // 2
        cornerref = maparray[0:mapsize:stepsize, 0:mapsize:stepsize]
        squareaccum = cornerref + np.roll(cornerref, shift=-1, axis=0)
        squareaccum += np.roll(squareaccum, shift=-1, axis=1)
        maparray[h:mapsize:stepsize, h:mapsize:stepsize] = wibbledmean(squareaccum)
        drgrid = maparray[h:mapsize:stepsize, h:mapsize:stepsize]
        ulgrid = maparray[0:mapsize:stepsize, 0:mapsize:stepsize]
        ltsum = drgrid + np.roll(drgrid, 1, axis=0) + ulgrid + np.roll(ulgrid, -1, axis=1)
        maparray[0:mapsize:stepsize, h:mapsize:stepsize] = wibbledmean(ltsum)
        ttsum = drgrid + np.roll(drgrid, 1, axis=1) + ulgrid + np.roll(ulgrid, -1, axis=0)
        maparray[h:mapsize:stepsize, 0:mapsize:stepsize] = wibbledmean(ttsum)
        stepsize //= 2
        wibble /= wibbledecay
    maparray -= maparray.min()
    return maparray / maparray.max()


def _fog_reference(image_u8, uniform):
    """mnist-c ``fog`` at severity 5, ``c = (3.0, 1.4)``, on one [28, 28] image, rounded."""
    x = image_u8.astype(np.float64) / 255.0
    max_val = x.max()
    x = x + 3.0 * _plasma_reference(256, 1.4, uniform)[:28, :28]
    return np.round(np.clip(x * max_val / (max_val + 3.0), 0, 1) * 255)


def _fog_law(x, a):
    # Fog adds 3 * plasma (a map in [0, 1]) and rescales by max / (max + 3): undoing the
    # rescaling leaves x plus a fog in [0, 3] (to the rounding), a smooth field.
    m = x.max(axis=(1, 2), keepdims=True) / 255.0
    assert m.min() > 0
    fog = a / 255.0 * (m + 3) / m - x / 255.0
    tol = 0.5 / 255.0 * (m + 3) / m + 1e-9
    assert (fog >= -tol).all() and (fog <= 3 + tol).all(), (fog.min(), fog.max())
    assert np.abs(np.diff(fog, axis=2)).mean() < 0.05  # smooth (noise or strokes are not)
    assert np.median(_correlation(a, x)) > 0.7  # the digit shows through (an inversion: < 0)
    assert np.median(a.mean(axis=(1, 2)) - x.mean(axis=(1, 2))) > 30  # the background greys up
    # Each of the first images alone, against the reference fog drawn with the same stream
    # (one image: the reference's draws in its order from default_rng([seed, k])).
    k = MNIST_C_NAMES.index("fog")
    for i in range(3):
        image = x[i].astype(np.uint8)
        want = _fog_reference(image, np.random.default_rng([0, k]).uniform)
        got = shifts.corrupt(image[None, :, :, None], "fog", seed=0)[0, :, :, 0]
        np.testing.assert_array_equal(got, want)


def _shot_noise_law(x, a):
    assert set(np.unique(a)) <= {0, 85, 170, 255}  # Poisson(3 x) / 3: thirds of 255
    assert (a[x == 0] == 0).all()  # Poisson(0) is 0: the black background stays black
    assert np.median(_correlation(a, x)) > 0.8


def _impulse_noise_law(x, a):
    assert ((a == x) | (a == 0) | (a == 255)).all()  # salt or pepper, or untouched
    assert np.median(_correlation(a, x)) > 0.5


def _glass_blur_law(x, a):
    assert _correlation(a, x).min() > 0.6
    assert abs(a.mean() - x.mean()) < 2  # blur and local swaps keep the ink
    assert (a.max(axis=(1, 2)) <= x.max(axis=(1, 2))).all()
    # The reference's blur is along the rows axis only (see the docstring): vertical
    # variation falls, horizontal variation (the swaps) rises.
    assert np.median(_variation(a, 1) / _variation(x, 1)) < 0.95
    assert np.median(_variation(a, 2) / _variation(x, 2)) > 1.05


def _motion_blur_law(x, a):
    assert _correlation(a, x).min() > 0.5
    assert abs(a.mean() - x.mean()) < 2  # a normalised kernel keeps the ink
    assert (a.max(axis=(1, 2)) <= x.max(axis=(1, 2))).all()
    assert np.median(_variation(a, 1) / _variation(x, 1)) < 0.9  # smoothed both ways
    assert np.median(_variation(a, 2) / _variation(x, 2)) < 0.9


def _brightness_law(x, a):
    assert np.abs(a - np.clip(x + 127.5, 0, 255)).max() <= 1


def _translate_law(x, a):
    for xi, ai in zip(x, a, strict=True):
        p = np.pad(xi, 3)
        shifted = [p[3 + dy : 31 + dy, 3 + dx : 31 + dx] for dy in (-3, 3) for dx in (-3, 3)]
        assert any(np.array_equal(ai, s) for s in shifted)


def _stripe_law(x, a):
    want = x.copy()
    want[:, :, :7] = 255 - x[:, :, :7]
    want[:, :, 21:] = 255 - x[:, :, 21:]
    np.testing.assert_array_equal(a, want)


def _spatter_law(x, a):
    # x (1 - m) + 63 m with m = 0 or m in [0.8, 1]: untouched, or within a fifth of the
    # way from grey mud (63) to the clean value.
    muddy = np.abs(a - 63) <= 0.2 * np.abs(x - 63) + 1
    assert ((a == x) | muddy).all()
    assert ((a != x) & muddy).mean() > 0.02


def _dotted_line_law(x, a):
    assert (a >= x).all()  # a line added, clipped
    on = np.zeros(28, bool)
    on[[2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26]] = True  # the dashes' columns
    assert not (a != x)[:, :, ~on].any()
    assert (a != x).any(axis=(1, 2)).mean() > 0.95


def _zigzag_law(x, a):
    assert (a >= x).all()
    changed = a != x
    assert not changed[:, :, :1].any() and not changed[:, :, 27:].any()  # columns ~2 to 25
    assert (changed.mean(axis=(1, 2)) < 0.25).all()  # a thin line, not the whole image


def _canny_law(x, a):
    from skimage import feature

    for xi, ai in zip(x / 255.0, a, strict=True):
        want = feature.canny(xi, sigma=1.0, low_threshold=0.1, high_threshold=0.2) * 255.0
        np.testing.assert_array_equal(ai, want)


LAWS = {
    "shot_noise": _shot_noise_law,
    "impulse_noise": _impulse_noise_law,
    "glass_blur": _glass_blur_law,
    "motion_blur": _motion_blur_law,
    "shear": _affine_law([_shear(0.4), _shear(-0.4)]),
    "scale": _affine_law([np.eye(2) / 0.7]),
    "rotate": _affine_law([_rotation(0.4), _rotation(-0.4)]),
    "brightness": _brightness_law,
    "translate": _translate_law,
    "stripe": _stripe_law,
    "fog": _fog_law,
    "spatter": _spatter_law,
    "dotted_line": _dotted_line_law,
    "zigzag": _zigzag_law,
    "canny_edges": _canny_law,
}


@pytest.mark.parametrize("name", MNIST_C_NAMES)
def test_corruption_contract(mnist, name):
    images, _ = mnist
    before = images.copy()
    a = shifts.corrupt(images, name, seed=0)
    np.testing.assert_array_equal(images, before)  # input untouched
    assert a.shape == images.shape and a.dtype == np.uint8  # uint8: 0..255 by construction
    assert a.min() >= 0 and a.max() <= 255 and a.max() > 0
    np.testing.assert_array_equal(a, shifts.corrupt(images, name, seed=0))
    np.testing.assert_array_equal(
        a, shifts.CORRUPTIONS[name](images, np.random.default_rng([0, MNIST_C_NAMES.index(name)]))
    )
    changed = np.any(a != images, axis=(1, 2, 3))
    assert changed.mean() >= 0.95, f"{name} left {np.sum(~changed)} of {len(images)} images unchanged"
    b = shifts.corrupt(images, name, seed=1)
    if name in RANDOM:
        assert not np.array_equal(a, b)
    else:
        np.testing.assert_array_equal(a, b)
    assert shifts.corrupt(images[:0], name).shape == (0, 28, 28, 1)
    LAWS[name](images[..., 0].astype(np.float64), a[..., 0].astype(np.float64))


def test_mnistc_translate_is_exact_shift_by_3(mnist):
    images, _ = mnist
    out = shifts.corrupt(images, "translate")
    for x, y in zip(images[..., 0], out[..., 0], strict=True):
        candidates = []
        for dy in (-3, 3):
            for dx in (-3, 3):  # output(r, c) = input(r + dy, c + dx), zeros outside
                p = np.pad(x, 3)
                candidates.append(p[3 + dy : 31 + dy, 3 + dx : 31 + dx])
        assert any(np.array_equal(y, c) for c in candidates)


def test_mnistc_closed_forms(mnist):
    images, _ = mnist
    x = images.astype(int)
    bright = shifts.corrupt(images, "brightness").astype(int)
    assert np.abs(bright - np.clip(x + 127.5, 0, 255)).max() <= 1
    stripe = shifts.corrupt(images, "stripe").astype(int)
    np.testing.assert_array_equal(stripe[:, :, 7:21], x[:, :, 7:21])
    np.testing.assert_array_equal(stripe[:, :, :7], 255 - x[:, :, :7])
    np.testing.assert_array_equal(stripe[:, :, 21:], 255 - x[:, :, 21:])
    edges = shifts.corrupt(images, "canny_edges")
    assert set(np.unique(edges)) <= {0, 255}
    assert edges[:, [0, -1]].max() == 0 and edges[:, :, [0, -1]].max() == 0  # border excluded
    scaled = shifts.corrupt(images, "scale")
    assert scaled.astype(float).sum() < 0.6 * x.sum()  # shrunk to 0.7 (area ~0.49)
    impulse = shifts.corrupt(images, "impulse_noise")
    flipped = np.mean(impulse != images)
    assert 0.05 < flipped < 0.17  # amount 0.17, about half of flips land on equal values


def test_canny_single_edge():
    x = np.zeros((1, 28, 28, 1), np.uint8)
    x[0, :, 14:] = 255  # vertical step edge between columns 13 and 14
    edges = shifts.corrupt(x, "canny_edges")[0, :, :, 0] > 0
    cols = np.nonzero(edges.any(axis=0))[0]
    assert set(cols) <= {13, 14} and edges[1:-1].any(axis=1).all()


# MARK: letters


def test_letters(mnist):
    _, mnist_mean = mnist
    a = shifts.letters(40, seed=3)
    assert a.shape == (400, 28, 28, 1) and a.dtype == np.uint8
    np.testing.assert_array_equal(a, shifts.letters(40, seed=3))
    assert not np.array_equal(a, shifts.letters(40, seed=4))
    assert shifts.letters(0).shape == (0, 28, 28, 1)
    assert len(shifts.letter_fonts()) >= 4

    per_letter = a[..., 0].astype(float).reshape(10, 40, 28, 28)
    means = per_letter.mean(axis=1)
    assert np.abs(means[0] - means[8]).mean() > 10  # 'A' vs 'I'
    # Ten distinguishable classes: nearest class mean (from the first half) on the second half.
    centroids = per_letter[:, :20].mean(axis=1).reshape(10, -1)
    test = per_letter[:, 20:].reshape(10, 20, -1)
    d = ((test[:, :, None, :] - centroids[None, None]) ** 2).sum(-1)
    accuracy = np.mean(d.argmin(-1) == np.arange(10)[:, None])
    assert accuracy > 0.6, accuracy

    assert mnist_mean / 3 < a.mean() < mnist_mean * 3
    # Background black, strokes white, centred like MNIST digits.
    assert np.median(a) == 0 and a.max() == 255
    assert a[:, :2].mean() < 5 and a[:, :, :2].mean() < 5
