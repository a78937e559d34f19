"""WRN-d-k, the Wide Residual Network of Zagoruyko & Komodakis 2016, "Wide Residual Networks" (BMVC).

``conv3x3(16)``, then three groups of ``N = (d - 4) / 6`` pre-activation blocks
(:class:`~ensemble_core.resnet_blocks.WideBasicBlock`: ``BN - ReLU - conv3x3 - BN - ReLU -
[dropout] - conv3x3``) of ``16k``, ``32k`` and ``64k`` channels, the first block of groups 2 and
3 with stride 2, a bias-free 1x1 convolution as the shortcut where the shape changes, then
``BN - ReLU``, global average pooling and a Dense layer (the paper's Table 1 and Sec. 2; the
authors' Torch code for the details). ``d``: 10, 16, 22, 28, 40, ...; ``k``: the widening factor.

Input float32 ``[B, H, W, C]`` in [0, 1] (any ``H``, ``W``; ``C`` 1 or 3); output float32
logits ``[B, num_classes]``. Called as ``model.apply(variables, x, train=bool)``; BatchNorm's
running statistics are the mutable ``'batch_stats'`` collection, dropout draws from the
``'dropout'`` RNG.

Parameters (10 classes, 3 input channels; the count does not depend on ``H``, ``W``), against
the "# params" of the paper's CIFAR tables (Sec. 3):

========= ========== ======
network   measured   paper
========= ========== ======
WRN-16-4  2,748,890  2.7M
WRN-16-8  10,961,370 11.0M
WRN-22-8  17,158,106 17.2M
WRN-28-10 36,479,194 36.5M
WRN-40-4  8,949,210  8.9M
========= ========== ======

(BatchNorm's scale and bias included, its running statistics not; the default, WRN-28-10 on
32x32x3 CIFAR-10, has 36,479,194.)

Options (``model.options``, :class:`Options`): ``depth`` (28), ``widen_factor`` (10),
``dropout_rate`` (0.0; the paper uses 0.3 for its dropout variants).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ensemble_core.config import ModelConfig
from ensemble_core.resnet_blocks import WideBasicBlock, batch_norm, conv3x3, global_avg_pool


class Options(BaseModel):
    """``model.options`` of ``model.name: wide_resnet``."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    depth: int = Field(
        28,
        ge=10,
        le=1000,
        description="d of WRN-d-k: layers with weights, 6N + 4 for N blocks per group: 10, 16, 22, 28, 40, ...",
    )
    widen_factor: int = Field(
        10, ge=1, le=64, description="k of WRN-d-k: the groups have 16k, 32k and 64k channels (1: a pre-act ResNet)."
    )
    dropout_rate: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Dropout rate between the two convolutions of every block (0 disables it; the paper uses 0.3).",
    )

    @field_validator("depth")
    @classmethod
    def _six_n_plus_four(cls, depth: int) -> int:
        if (depth - 4) % 6:
            raise ValueError(f"depth must be 6N + 4 (10, 16, 22, 28, 40, ...), got {depth}")
        return depth


class WideResNet(nn.Module):
    """WRN-d-k (module docstring): float32 ``[B, H, W, C]`` -> logits ``[B, num_classes]``."""

    num_classes: int = 10
    depth: int = 28
    widen_factor: int = 10
    dropout_rate: float = 0.0

    @nn.compact
    def __call__(self, x: jnp.ndarray, train: bool) -> jnp.ndarray:
        if (self.depth - 4) % 6 or self.depth < 10:
            raise ValueError(f"depth must be 6N + 4 with N >= 1, got {self.depth}")
        blocks = (self.depth - 4) // 6
        x = conv3x3(16)(x)
        for group in range(3):
            features = 16 * self.widen_factor * 2**group
            for block in range(blocks):
                stride = 2 if group > 0 and block == 0 else 1
                x = WideBasicBlock(features, stride, self.dropout_rate)(x, train)
        x = nn.relu(batch_norm(train)(x))
        return nn.Dense(self.num_classes)(global_avg_pool(x))


def build(cfg: ModelConfig, num_classes: int) -> WideResNet:
    """The registry's constructor (:mod:`ensemble_core.models`): the WRN of ``cfg.options`` (:class:`Options`).

    Raises:
      pydantic.ValidationError: ``cfg.options`` has an unknown key or a bad value.
    """
    options: dict[str, Any] = dict(cfg.options)
    opts = Options.model_validate(options)
    return WideResNet(
        num_classes=num_classes, depth=opts.depth, widen_factor=opts.widen_factor, dropout_rate=opts.dropout_rate
    )
