"""A ReLU multilayer perceptron: the seed's ``[in, hidden..., out]`` network."""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax.numpy as jnp

from ensemble_core.config import ModelConfig


class MLP(nn.Module):
    """Flatten - (Dense - ReLU) per hidden size - Dense.

    Input float32 ``[B, ...]`` (flattened); output logits float32 ``[B, num_classes]``.
    """

    hidden_sizes: Sequence[int] = (512, 512)
    num_classes: int = 10

    @nn.compact
    def __call__(self, x: jnp.ndarray, train: bool = False) -> jnp.ndarray:
        del train  # no BatchNorm or dropout: the same in training and inference mode
        x = x.reshape((x.shape[0], -1))
        for width in self.hidden_sizes:
            x = nn.relu(nn.Dense(features=width)(x))
        return nn.Dense(features=self.num_classes)(x)


def build(cfg: ModelConfig, num_classes: int) -> MLP:
    """The registry's constructor (:mod:`ensemble_core.models`): ``cfg.hidden_sizes`` widths."""
    return MLP(hidden_sizes=tuple(cfg.hidden_sizes), num_classes=num_classes)
