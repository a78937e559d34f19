"""The CNN of Flax's "Ensembling on multiple devices" guide (and Flax's MNIST example)."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from ensemble_core.config import ModelConfig


def avg_pool_2x2(x: jnp.ndarray) -> jnp.ndarray:
    """2x2 average pooling, stride 2, no padding: float ``[B, H, W, C]`` -> ``[B, H//2, W//2, C]``.

    The same function as ``flax.linen.avg_pool(x, (2, 2), strides=(2, 2))``, written as a
    reshape and a mean: its gradient is a broadcast instead of the transpose of a
    ``reduce_window``, which measured faster on XLA:CPU (see docs/benchmarks.md). An odd
    last row or column is dropped, as by flax's ``'VALID'`` padding.
    """
    b, h, w, c = x.shape
    h, w = h // 2 * 2, w // 2 * 2
    return x[:, :h, :w].reshape(b, h // 2, 2, w // 2, 2, c).mean(axis=(2, 4))


class CNN(nn.Module):
    """Conv32 3x3 - ReLU - avgpool 2x2 - Conv64 3x3 - ReLU - avgpool 2x2 - Dense256 - ReLU - Dense.

    Input float32 ``[B, H, W, C]`` in [0, 1]; output logits float32 ``[B, num_classes]``.
    Parameter names and shapes are the Flax ensembling guide's (``Conv_0``, ``Conv_1``, ``Dense_0``, ``Dense_1``).
    """

    num_classes: int = 10

    @nn.compact
    def __call__(self, x: jnp.ndarray, train: bool = False) -> jnp.ndarray:
        del train  # no BatchNorm or dropout: the same in training and inference mode
        x = nn.Conv(features=32, kernel_size=(3, 3))(x)
        x = avg_pool_2x2(nn.relu(x))
        x = nn.Conv(features=64, kernel_size=(3, 3))(x)
        x = avg_pool_2x2(nn.relu(x))
        x = x.reshape((x.shape[0], -1))
        x = nn.Dense(features=256)(x)
        x = nn.relu(x)
        return nn.Dense(features=self.num_classes)(x)


def build(cfg: ModelConfig, num_classes: int) -> CNN:
    """The registry's constructor (:mod:`ensemble_core.models`); ``cfg`` has nothing for the CNN."""
    return CNN(num_classes=num_classes)
