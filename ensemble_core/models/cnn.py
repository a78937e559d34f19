"""The CNN of Flax's "Ensembling on multiple devices" guide (and Flax's MNIST example)."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
from pydantic import BaseModel, ConfigDict, Field

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


class Options(BaseModel):
    """``model.options`` of ``model.name: cnn``."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    dropout_rate: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Dropout rate after the Dense256 layer's ReLU (0, the guide's: no dropout layer); what "
        "ensemble.method=mc_dropout needs.",
    )


class CNN(nn.Module):
    """Conv32 3x3 - ReLU - avgpool 2x2 - Conv64 3x3 - ReLU - avgpool 2x2 - Dense256 - ReLU - [Dropout] - Dense.

    Input float32 ``[B, H, W, C]`` in [0, 1]; output logits float32 ``[B, num_classes]``.
    Parameter names and shapes are the Flax ensembling guide's (``Conv_0``, ``Conv_1``, ``Dense_0``, ``Dense_1``).
    With ``dropout_rate > 0`` an ``nn.Dropout(deterministic=not train)`` on the ``'dropout'``
    stream follows the Dense256 ReLU (the place of Flax's ``examples/sst2`` classifier's);
    at 0 (the default) there is none, and the network is the guide's.
    """

    num_classes: int = 10
    dropout_rate: float = 0.0

    @nn.compact
    def __call__(self, x: jnp.ndarray, train: bool = False) -> jnp.ndarray:
        x = nn.Conv(features=32, kernel_size=(3, 3))(x)
        x = avg_pool_2x2(nn.relu(x))
        x = nn.Conv(features=64, kernel_size=(3, 3))(x)
        x = avg_pool_2x2(nn.relu(x))
        x = x.reshape((x.shape[0], -1))
        x = nn.Dense(features=256)(x)
        x = nn.relu(x)
        if self.dropout_rate > 0:
            x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
        return nn.Dense(features=self.num_classes)(x)


def build(cfg: ModelConfig, num_classes: int) -> CNN:
    """The registry's constructor (:mod:`ensemble_core.models`): ``model.options`` :class:`Options`."""
    opts = Options.model_validate(cfg.options or {})
    return CNN(num_classes=num_classes, dropout_rate=opts.dropout_rate)
