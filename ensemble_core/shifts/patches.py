"""Images with their patches shuffled: the same pixels, no meaning.

Each image is cut into a ``grid x grid`` array of equal tiles (``H // grid`` by
``W // grid`` pixels) and the tiles are put back in a random order, its own per image
(never the identity order): a jigsaw puzzle left unsolved. Every pixel value of the
image is kept, each tile intact, so the set has the data's pixel statistics (per image
histogram, local texture, contrast, the dataset's colours) but not its objects' shapes: an
out-of-distribution set for any image data that the pixel statistics alone do not give
away, unlike uniform noise. The construction is Yu, Shin, Ko & Lee 2024 ("Exploring using
jigsaw puzzles for out-of-distribution detection", Computer Vision and Image Understanding
241, 103968; their jigsaw puzzles of in-distribution images, which keep "similar background
information as the in-distribution data but with their semantic information destroyed",
serve there as outliers to train on, here as an OOD test set), after the jigsaw puzzles of
Noroozi & Favaro 2016 ("Unsupervised learning of visual representations by solving jigsaw
puzzles", ECCV).

When ``grid`` does not divide the height or width, the last ``H % grid`` rows and
``W % grid`` columns stay where they are (so every tile has the same shape and the pixel
multiset of every image is kept exactly).
"""

from __future__ import annotations

import numpy as np

#: Tiles per side by default: 4 x 4 tiles (7 x 7 pixels on 28 x 28 images, 8 x 8 on 32 x 32).
PATCH_GRID = 4


def patch_orders(n: int, tiles: int, seed: int) -> np.ndarray:
    """``n`` permutations of ``range(tiles)`` (int64 ``[n, tiles]``) drawn with
    ``np.random.default_rng(seed)``, each redrawn until it is not the identity (``tiles >= 2``)."""
    if tiles < 2:
        raise ValueError(f"shuffling patches needs at least 2 tiles; got {tiles}")
    rng = np.random.default_rng(seed)
    orders = np.argsort(rng.random((n, tiles)), axis=1)
    identity = np.arange(tiles)
    same = np.flatnonzero((orders == identity).all(axis=1))
    while same.size:
        orders[same] = np.argsort(rng.random((same.size, tiles)), axis=1)
        same = same[(orders[same] == identity).all(axis=1)]
    return orders


def shuffle_patches(images: np.ndarray, grid: int = PATCH_GRID, seed: int = 0) -> np.ndarray:
    """``images`` (``[N, H, W, C]``, any dtype) with each image's ``grid x grid`` tiles in a
    random non-identity order (:func:`patch_orders`, seeded by ``seed``; image i's order does
    not depend on the images, only on ``i``, ``N``, ``grid`` and ``seed``). Same shape and dtype.

    Raises:
      ValueError: ``images`` is not 4-D, or a tile would be smaller than one pixel
        (``grid`` > H or W), or ``grid < 2``.
    """
    x = np.asarray(images)
    if x.ndim != 4:
        raise ValueError(f"shuffle_patches takes images [N, H, W, C]; got shape {x.shape}")
    n, height, width, channels = x.shape
    if grid < 2 or grid > min(height, width):
        fits = min(height, width)
        raise ValueError(f"a patch grid of {grid} x {grid} does not fit {height} x {width} images (2..{fits})")
    th, tw = height // grid, width // grid
    out = x.copy()
    if n == 0:
        return out
    tiles = (
        x[:, : grid * th, : grid * tw]
        .reshape(n, grid, th, grid, tw, channels)
        .transpose(0, 1, 3, 2, 4, 5)
        .reshape(n, grid * grid, th, tw, channels)
    )
    orders = patch_orders(n, grid * grid, seed)
    shuffled = np.take_along_axis(tiles, orders[:, :, None, None, None], axis=1)
    back = shuffled.reshape(n, grid, grid, th, tw, channels).transpose(0, 1, 3, 2, 4, 5)
    out[:, : grid * th, : grid * tw] = back.reshape(n, grid * th, grid * tw, channels)
    return out
