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
    assert list(shifts.CORRUPTIONS) == MNIST_C_NAMES


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
