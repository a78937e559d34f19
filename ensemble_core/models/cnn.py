"""The CNN of the Flax "ensembling on multiple devices" HOWTO (and Flax's MNIST example)."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp


class CNN(nn.Module):
    """Conv32 3x3 - ReLU - avgpool 2x2 - Conv64 3x3 - ReLU - avgpool 2x2 - Dense256 - ReLU - Dense.

    Input float32 ``[B, H, W, C]`` in [0, 1]; output logits float32 ``[B, num_classes]``.
    """

    num_classes: int = 10

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        x = nn.Conv(features=32, kernel_size=(3, 3))(x)
        x = nn.relu(x)
        x = nn.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
        x = nn.Conv(features=64, kernel_size=(3, 3))(x)
        x = nn.relu(x)
        x = nn.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
        x = x.reshape((x.shape[0], -1))
        x = nn.Dense(features=256)(x)
        x = nn.relu(x)
        return nn.Dense(features=self.num_classes)(x)
