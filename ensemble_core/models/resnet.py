"""The CIFAR ResNet of He et al. 2016, "Deep Residual Learning for Image Recognition", Sec. 4.2.

``conv3x3(width) - BN - ReLU``, then three stages of ``n = (depth - 2) / 6`` basic blocks
(:class:`~ensemble_core.resnet_blocks.BasicBlock`: ``conv3x3 - BN - ReLU - conv3x3 - BN``,
shortcut, ReLU) of ``width``, ``2 * width`` and ``4 * width`` channels, the first block of
stages 2 and 3 with stride 2, then global average pooling, ``[dropout]`` and a Dense layer.
The shortcuts are the paper's option A for CIFAR: the identity, or, when the shape changes,
every second pixel with zero channels appended (no parameters). ``depth = 6n + 2``: 20, 32,
44, 56, 110, ...

Input float32 ``[B, H, W, C]`` in [0, 1] (any ``H``, ``W``; ``C`` 1 or 3); output float32
logits ``[B, num_classes]``. Called as ``model.apply(variables, x, train=bool)``; BatchNorm's
running statistics are the mutable ``'batch_stats'`` collection (absent when
``batch_norm=False``), dropout draws from the ``'dropout'`` RNG.

Parameters (10 classes, 3 input channels; the count does not depend on ``H``, ``W``), against
the paper's Table 6:

========= ========= =======
depth     measured  paper
========= ========= =======
20        269,722   0.27M
32        464,154   0.46M
44        658,586   0.66M
56        853,018   0.85M
110       1,727,962 1.7M
========= ========= =======

(BatchNorm's scale and bias included, its running statistics not; the default, ResNet-20 of
width 16 on 32x32x3 CIFAR-10, has 269,722;
``batch_norm=False``: 269,034.)

Options (``model.options``, :class:`Options`): ``depth`` (20), ``width`` (16), ``dropout_rate``
(0.0), ``batch_norm`` (True).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ensemble_core.config import ModelConfig
from ensemble_core.resnet_blocks import BasicBlock, batch_norm, conv3x3, global_avg_pool


class Options(BaseModel):
    """``model.options`` of ``model.name: resnet``."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    depth: int = Field(
        20,
        ge=8,
        le=1202,
        description="Layers with weights, 6n + 2 for n basic blocks per stage: 20, 32, 44, 56, 110, ... "
        "(at least 8, at most 1202, the paper's deepest).",
    )
    width: int = Field(
        16,
        ge=1,
        le=1024,
        description="Channels of the stem and the first stage (the paper's 16); the second and third stages "
        "have twice and four times as many.",
    )
    dropout_rate: float = Field(
        0.0, ge=0.0, lt=1.0, description="Dropout rate before the final Dense layer (0 disables it, the paper's)."
    )
    batch_norm: bool = Field(
        True,
        description="BatchNorm after every convolution (the paper's). False leaves it out (the convolutions "
        "get a bias instead): to measure what BatchNorm costs.",
    )

    @field_validator("depth")
    @classmethod
    def _six_n_plus_two(cls, depth: int) -> int:
        if (depth - 2) % 6:
            raise ValueError(f"depth must be 6n + 2 (20, 32, 44, 56, 110, ...), got {depth}")
        return depth


class ResNet(nn.Module):
    """He et al. 2016's CIFAR ResNet (module docstring): float32 ``[B, H, W, C]`` -> logits ``[B, num_classes]``."""

    num_classes: int = 10
    depth: int = 20
    width: int = 16
    dropout_rate: float = 0.0
    batch_norm: bool = True

    @nn.compact
    def __call__(self, x: jnp.ndarray, train: bool) -> jnp.ndarray:
        if (self.depth - 2) % 6 or self.depth < 8:
            raise ValueError(f"depth must be 6n + 2 with n >= 1, got {self.depth}")
        blocks = (self.depth - 2) // 6
        x = conv3x3(self.width, use_bias=not self.batch_norm)(x)
        if self.batch_norm:
            x = batch_norm(train)(x)
        x = nn.relu(x)
        for stage in range(3):
            features = self.width * 2**stage
            for block in range(blocks):
                stride = 2 if stage > 0 and block == 0 else 1
                x = BasicBlock(features, stride, self.batch_norm)(x, train)
        x = global_avg_pool(x)
        if self.dropout_rate > 0:
            x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
        return nn.Dense(self.num_classes)(x)


def build(cfg: ModelConfig, num_classes: int) -> ResNet:
    """The registry's constructor (:mod:`ensemble_core.models`): the ResNet of ``cfg.options`` (:class:`Options`).

    Raises:
      pydantic.ValidationError: ``cfg.options`` has an unknown key or a bad value.
    """
    options: dict[str, Any] = dict(cfg.options)
    opts = Options.model_validate(options)
    return ResNet(
        num_classes=num_classes,
        depth=opts.depth,
        width=opts.width,
        dropout_rate=opts.dropout_rate,
        batch_norm=opts.batch_norm,
    )
