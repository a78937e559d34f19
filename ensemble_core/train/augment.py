"""Data augmentation inside the jitted train step: random pad-and-crop and horizontal flip.

The recipe of He et al. 2016, "Deep Residual Learning for Image Recognition", Sec. 4.2 (CIFAR):
pad 4 pixels on each side with zeros, take a random H x W crop, flip left-right with
probability 1/2. Pure JAX: works under ``jax.jit``, ``jax.vmap`` over members and inside the
step's ``jax.shard_map``.

Topology invariance: the random choices are drawn for a member's *whole* batch of
``global_batch`` rows from its key, and each data shard slices out its own rows, so an example
gets the same augmentation whatever the number of data shards.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Bool, Int, UInt8


def _check(crop_padding: int) -> None:
    if crop_padding < 0:
        raise ValueError(f"crop_padding must be >= 0, got {crop_padding}; fix: pass 0 (no crop) or a positive padding")


def augmentation_params(
    key: Array, global_batch: int, crop_padding: int, flip: bool
) -> tuple[Int[Array, "N 2"], Bool[Array, " N"]]:
    """The random choices for one member's whole batch of ``global_batch`` rows, drawn from ``key``.

    Args:
      key: a typed PRNG key (``jax.random.key``) for one member and one step.
      global_batch: rows in the member's whole batch (all data shards together).
      crop_padding: zero padding per side; offsets are uniform in ``[0, 2 * crop_padding]``.
      flip: whether to draw flip bits (each True with probability 1/2).

    Returns:
      ``(offsets, flips)``: int32 ``[global_batch, 2]`` crop offsets (y, x) into the padded
      image (all 0 when ``crop_padding == 0``) and bool ``[global_batch]`` flip bits (all False
      when ``flip`` is False). The crop and flip draws use separate subkeys, so turning one
      on or off does not change the other.

    Raises:
      ValueError: ``crop_padding < 0``.
    """
    _check(crop_padding)
    crop_key, flip_key = jax.random.split(key)
    offsets = jax.random.randint(crop_key, (global_batch, 2), 0, 2 * crop_padding + 1, dtype=jnp.int32)
    flips = jax.random.bernoulli(flip_key, 0.5, (global_batch,)) if flip else jnp.zeros((global_batch,), bool)
    return offsets, flips


def augment(
    key: Array,
    images: UInt8[Array, "b H W C"],
    *,
    global_batch: int,
    first_row: int | Int[Array, ""],
    crop_padding: int,
    flip: bool,
) -> UInt8[Array, "b H W C"]:
    """Randomly crop (after zero padding) and flip one member's shard of a batch (He et al. 2016, Sec. 4.2).

    Args:
      key: a typed PRNG key for one member and one step (vmap it over members: key ``[E]``,
        images ``[E, b, H, W, C]``).
      images: uint8 ``[b, H, W, C]``, rows ``first_row .. first_row + b - 1`` of the member's
        batch of ``global_batch`` rows.
      global_batch: rows in the member's whole batch; the draws are made for all of them.
      first_row: this shard's first row (may be traced, e.g. ``lax.axis_index('data') * b``);
        like ``lax.dynamic_slice`` it is clamped to ``[0, global_batch - b]``.
      crop_padding: pixels of zeros padded on each side before a random H x W crop (4 in the
        CIFAR recipe); 0: no crop.
      flip: flip each example left-right (axis W) with probability 1/2.

    Returns:
      uint8 ``[b, H, W, C]``: each example padded, cropped at its offsets and, if its flip bit
      is set, flipped along W. With ``crop_padding == 0`` and ``flip`` False, ``images`` itself.

    Raises:
      ValueError: ``crop_padding < 0``, ``images`` not rank 4, or ``global_batch < b``.
    """
    _check(crop_padding)
    if images.ndim != 4:
        raise ValueError(
            f"images must be rank 4 [b, H, W, C], got shape {images.shape}; fix: pass one member's batch of images"
        )
    b, h, w, c = images.shape
    if global_batch < b:
        raise ValueError(
            f"global_batch ({global_batch}) is smaller than the shard's rows ({b}); "
            "fix: pass the member's whole batch size (rows per shard times data shards)"
        )
    if crop_padding == 0 and not flip:
        return images
    offsets, flips = augmentation_params(key, global_batch, crop_padding, flip)
    offsets = lax.dynamic_slice_in_dim(offsets, first_row, b, axis=0)
    flips = lax.dynamic_slice_in_dim(flips, first_row, b, axis=0)
    out = images
    if crop_padding > 0:
        p = crop_padding
        padded = jnp.pad(images, ((0, 0), (p, p), (p, p), (0, 0)))

        def crop(image: Array, offset: Array) -> Array:
            return lax.dynamic_slice(image, (offset[0], offset[1], jnp.int32(0)), (h, w, c))

        out = jax.vmap(crop)(padded, offsets)
    if flip:
        out = jnp.where(flips[:, None, None, None], jnp.flip(out, axis=2), out)
    return out


def augmentation_bytes(batch: int, height: int, width: int, channels: int, crop_padding: int, flip: bool) -> int:
    """Extra device memory (bytes) one member's augmentation needs per step, for the memory estimate.

    ``batch`` rows of uint8 ``[height, width, channels]`` images: the zero-padded copy
    ``batch * (height + 2p) * (width + 2p) * channels`` when ``crop_padding = p > 0``, plus
    the augmented copy ``batch * height * width * channels`` when crop or flip is on; 0 when
    both are off (the images are used as they are). The draws (9 bytes a row) are left out.

    Raises:
      ValueError: ``crop_padding < 0``.
    """
    _check(crop_padding)
    if crop_padding == 0 and not flip:
        return 0
    p = crop_padding
    padded = batch * (height + 2 * p) * (width + 2 * p) * channels if p > 0 else 0
    return padded + batch * height * width * channels
