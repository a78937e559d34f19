"""Augmentation: equal to a per-example NumPy reference, topology invariant, vmappable, unbiased."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from ensemble_core.train.augment import augment, augmentation_bytes, augmentation_params


def _images(b, h, w, c, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (b, h, w, c), dtype=np.uint8)


def _reference(images, offsets, flips, crop_padding):
    """Straightforward per-example NumPy: pad with zeros, slice at the offsets, flip along W."""
    _, h, w, _ = images.shape
    p = crop_padding
    out = []
    for x, (dy, dx), f in zip(images, np.asarray(offsets), np.asarray(flips), strict=True):
        y = np.pad(x, ((p, p), (p, p), (0, 0)))[dy : dy + h, dx : dx + w]
        out.append(np.flip(y, axis=1) if f else y)
    return np.stack(out)


def _augment(key, images, first_row=0, global_batch=None, crop_padding=4, flip=True):
    g = images.shape[0] if global_batch is None else global_batch
    return augment(key, images, global_batch=g, first_row=first_row, crop_padding=crop_padding, flip=flip)


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(16, 28, 28, 1), (16, 32, 32, 3)])
@pytest.mark.parametrize("crop_padding, flip", [(4, True), (4, False), (0, True), (2, True)])
def test_equals_numpy_reference(shape, crop_padding, flip):
    images = _images(*shape)
    key = jax.random.key(3)
    fn = jax.jit(functools.partial(_augment, crop_padding=crop_padding, flip=flip))
    out = fn(key, images)
    assert out.dtype == jnp.uint8 and out.shape == images.shape
    offsets, flips = augmentation_params(key, shape[0], crop_padding, flip)
    assert offsets.dtype == jnp.int32 and offsets.shape == (shape[0], 2)
    assert flips.dtype == jnp.bool_ and flips.shape == (shape[0],)
    np.testing.assert_array_equal(np.asarray(out), _reference(images, offsets, flips, crop_padding))


def test_both_off_returns_the_input():
    images = jnp.asarray(_images(4, 8, 8, 3))
    assert _augment(jax.random.key(0), images, crop_padding=0, flip=False) is images
    assert augmentation_bytes(4, 8, 8, 3, 0, False) == 0


@pytest.mark.parametrize("shards", [2, 4])
def test_shards_equal_the_whole_batch(shards):
    images = _images(32, 32, 32, 3)
    key = jax.random.key(7)
    whole = _augment(key, images)
    b = 32 // shards
    fn = jax.jit(functools.partial(_augment, global_batch=32))
    parts = [fn(key, images[i * b : (i + 1) * b], jnp.int32(i * b)) for i in range(shards)]
    np.testing.assert_array_equal(np.asarray(jnp.concatenate(parts)), np.asarray(whole))


def _devices(n):
    """The first n devices; on CPU tests/conftest.py makes 8. A GPU machine's one device
    (JAX_PLATFORMS=cuda, scripts/gpu_check.sh) cannot hold a multi-device mesh: skipped there."""
    if jax.default_backend() != "cpu" and len(jax.devices()) < n:
        pytest.skip(f"needs {n} devices; {jax.default_backend()} has {len(jax.devices())}")
    assert len(jax.devices()) >= n, "tests/conftest.py sets 8 host devices"
    return jax.devices()[:n]


@pytest.mark.parametrize("data", [2, 4])
def test_shard_map_equals_the_whole_batch(data):
    mesh = Mesh(np.array(_devices(data)).reshape(1, data), ("ensemble", "data"))
    images = _images(32, 28, 28, 1)
    key = jax.random.key(11)

    def local(key, images):
        b = images.shape[0]
        return _augment(key, images, lax.axis_index("data") * b, global_batch=32)

    sharded = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P("data")), out_specs=P("data")))
    np.testing.assert_array_equal(np.asarray(sharded(key, images)), np.asarray(_augment(key, images)))


@pytest.mark.slow
def test_members_vmapped_inside_shard_map():
    """As in the train step: members vmapped on each device of an ('ensemble', 'data') = (2, 2) mesh."""
    mesh = Mesh(np.array(_devices(4)).reshape(2, 2), ("ensemble", "data"))
    keys = jax.random.split(jax.random.key(4), 4)
    images = np.stack([_images(16, 28, 28, 1, seed=m) for m in range(4)])  # [E, B, H, W, C]

    def local(keys, images):
        b = images.shape[1]
        one = functools.partial(_augment, first_row=lax.axis_index("data") * b, global_batch=16)
        return jax.vmap(one)(keys, images)

    spec = P("ensemble", "data")
    sharded = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P("ensemble"), spec), out_specs=spec))
    out = np.asarray(sharded(keys, images))
    for m in range(4):
        np.testing.assert_array_equal(out[m], np.asarray(_augment(keys[m], images[m])))


def test_vmap_over_members():
    images = _images(16, 32, 32, 3)
    keys = jax.random.split(jax.random.key(5), 3)
    stacked = np.broadcast_to(images, (3, *images.shape))
    out = np.asarray(jax.jit(jax.vmap(_augment))(keys, stacked))
    for m in range(3):
        np.testing.assert_array_equal(out[m], np.asarray(_augment(keys[m], images)))
    assert not np.array_equal(out[0], out[1]) and not np.array_equal(out[1], out[2])
    assert not np.array_equal(out[0], out[2])


def test_crop_moves_content_at_most_padding_and_fills_zeros():
    p, h, w = 4, 12, 12
    images = np.ones((64, h, w, 1), np.uint8)  # nonzero everywhere, so padding shows as zeros
    images[:, h // 2, w // 2, 0] = 255  # one bright pixel in the middle
    out = np.asarray(_augment(jax.random.key(1), images, crop_padding=p, flip=False))
    offsets = np.asarray(augmentation_params(jax.random.key(1), 64, p, False)[0])
    assert offsets.min() >= 0 and offsets.max() <= 2 * p
    assert len({tuple(o) for o in offsets}) > 1
    for x, (dy, dx) in zip(out, offsets, strict=True):
        ys, xs = np.nonzero(x[..., 0] == 255)
        assert abs(ys[0] - h // 2) <= p and abs(xs[0] - w // 2) <= p
        assert (ys[0] - h // 2, xs[0] - w // 2) == (p - dy, p - dx)
        # rows/columns shifted in from outside are zeros; the rest is the original content
        inside = np.zeros((h, w), bool)
        inside[max(0, p - dy) : h + min(0, p - dy), max(0, p - dx) : w + min(0, p - dx)] = True
        assert np.all(x[..., 0][~inside] == 0) and np.all(x[..., 0][inside] > 0)


def test_flip_only_flips_along_width():
    images = _images(64, 10, 14, 3)
    key = jax.random.key(2)
    cropped = np.asarray(_augment(key, images, crop_padding=3, flip=False))
    both = np.asarray(_augment(key, images, crop_padding=3, flip=True))
    flips = np.asarray(augmentation_params(key, 64, 3, True)[1])
    assert 0 < flips.sum() < 64
    for c, o, f in zip(cropped, both, flips, strict=True):
        np.testing.assert_array_equal(o, np.flip(c, axis=1) if f else c)
    flipped_only = np.asarray(_augment(key, images, crop_padding=0, flip=True))
    for x, o, f in zip(images, flipped_only, flips, strict=True):
        np.testing.assert_array_equal(o, np.flip(x, axis=1) if f else x)


def test_flip_fraction_is_near_one_half():
    n = 4096
    images = np.zeros((n, 4, 4, 1), np.uint8)
    images[:, :, 0, 0] = 1  # left column marked: a flipped image has it on the right
    out = np.asarray(_augment(jax.random.key(9), images, crop_padding=0, flip=True))
    flipped = out[:, 0, -1, 0] == 1
    assert np.all(flipped == np.asarray(augmentation_params(jax.random.key(9), n, 0, True)[1]))
    assert abs(flipped.sum() - n / 2) <= 5 * np.sqrt(n / 4)


def test_augmentation_bytes():
    assert augmentation_bytes(128, 32, 32, 3, 4, True) == 128 * 40 * 40 * 3 + 128 * 32 * 32 * 3
    assert augmentation_bytes(128, 32, 32, 3, 4, False) == 128 * 40 * 40 * 3 + 128 * 32 * 32 * 3
    assert augmentation_bytes(64, 28, 28, 1, 0, True) == 64 * 28 * 28
    assert augmentation_bytes(64, 28, 28, 1, 0, False) == 0


def test_errors():
    key = jax.random.key(0)
    images = jnp.zeros((8, 4, 4, 1), jnp.uint8)
    with pytest.raises(ValueError, match="crop_padding must be >= 0"):
        _augment(key, images, crop_padding=-1)
    with pytest.raises(ValueError, match="crop_padding must be >= 0"):
        augmentation_bytes(8, 4, 4, 1, -1, True)
    with pytest.raises(ValueError, match="must be rank 4"):
        _augment(key, jnp.zeros((8, 4, 4), jnp.uint8))
    with pytest.raises(ValueError, match=r"global_batch \(4\) is smaller"):
        _augment(key, images, global_batch=4)
