"""A ResNet as Flax's ImageNet example writes it (``examples/imagenet/models.py``:
``ResNetBlock``, ``ResNet`` with ``conv``/``norm`` partials, BatchNorm with
``axis_name='batch'``, the pmap axis of that example), plus dropout before the head, in
both Flax APIs, as a user would bring them (named by class path with options):

- ``LinenResNet``: ``flax.linen``, ``__call__(self, x, train: bool = True)`` (the
  example's convention); ``SmallLinenResNet`` is it with ``stage_sizes=(1, 1)`` and 8 filters;
- ``NnxResNet``: the same network in ``flax.nnx`` (``__init__(..., rngs)``, switched by
  ``model.train()`` / ``model.eval()``).

Both take 28x28 (or larger) images with ``channels`` channels.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import flax.linen as nn
import jax.numpy as jnp
from flax import nnx

ModuleDef = Any


class ResNetBlock(nn.Module):
    """ResNet block (Flax's example, unchanged)."""

    filters: int
    conv: ModuleDef
    norm: ModuleDef
    act: Callable
    strides: tuple[int, int] = (1, 1)

    @nn.compact
    def __call__(self, x):
        residual = x
        y = self.conv(self.filters, (3, 3), self.strides)(x)
        y = self.norm()(y)
        y = self.act(y)
        y = self.conv(self.filters, (3, 3))(y)
        y = self.norm(scale_init=nn.initializers.zeros_init())(y)
        if residual.shape != y.shape:
            residual = self.conv(self.filters, (1, 1), self.strides, name="conv_proj")(residual)
            residual = self.norm(name="norm_proj")(residual)
        return self.act(residual + y)


class LinenResNet(nn.Module):
    """ResNetV1.5 (Flax's example) with dropout before the head."""

    stage_sizes: Sequence[int]
    num_classes: int
    block_cls: ModuleDef = ResNetBlock
    num_filters: int = 64
    dropout_rate: float = 0.0
    dtype: Any = jnp.float32
    act: Callable = nn.relu
    conv: ModuleDef = nn.Conv

    @nn.compact
    def __call__(self, x, train: bool = True):
        conv = partial(self.conv, use_bias=False, dtype=self.dtype)
        norm = partial(
            nn.BatchNorm,
            use_running_average=not train,
            momentum=0.9,
            epsilon=1e-5,
            dtype=self.dtype,
            axis_name="batch",
        )
        x = conv(self.num_filters, (7, 7), (2, 2), padding=[(3, 3), (3, 3)], name="conv_init")(x)
        x = norm(name="bn_init")(x)
        x = nn.relu(x)
        x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
        for i, block_size in enumerate(self.stage_sizes):
            for j in range(block_size):
                strides = (2, 2) if i > 0 and j == 0 else (1, 1)
                x = self.block_cls(self.num_filters * 2**i, strides=strides, conv=conv, norm=norm, act=self.act)(x)
        x = jnp.mean(x, axis=(1, 2))
        x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
        x = nn.Dense(self.num_classes, dtype=self.dtype)(x)
        return jnp.asarray(x, self.dtype)


SmallLinenResNet = partial(LinenResNet, stage_sizes=(1, 1), num_filters=8, dropout_rate=0.1)


class NnxResNetBlock(nnx.Module):
    """The block above in NNX."""

    def __init__(self, in_filters: int, filters: int, strides: tuple[int, int], *, rngs: nnx.Rngs):
        norm = partial(nnx.BatchNorm, momentum=0.9, epsilon=1e-5, axis_name="batch", rngs=rngs)
        self.conv1 = nnx.Conv(in_filters, filters, (3, 3), strides, use_bias=False, rngs=rngs)
        self.norm1 = norm(filters)
        self.conv2 = nnx.Conv(filters, filters, (3, 3), use_bias=False, rngs=rngs)
        self.norm2 = norm(filters, scale_init=nnx.initializers.zeros_init())
        project = in_filters != filters or strides != (1, 1)
        self.projection = (
            nnx.Sequential(nnx.Conv(in_filters, filters, (1, 1), strides, use_bias=False, rngs=rngs), norm(filters))
            if project
            else None
        )

    def __call__(self, x):
        y = nnx.relu(self.norm1(self.conv1(x)))
        y = self.norm2(self.conv2(y))
        residual = x if self.projection is None else self.projection(x)
        return nnx.relu(residual + y)


class NnxResNet(nnx.Module):
    """``LinenResNet`` with ``stage_sizes=(1, 1)``, 8 filters and dropout 0.1 by default, in NNX."""

    def __init__(
        self,
        num_classes: int,
        stage_sizes: Sequence[int] = (1, 1),
        num_filters: int = 8,
        dropout_rate: float = 0.1,
        channels: int = 1,
        *,
        rngs: nnx.Rngs,
    ):
        self.conv_init = nnx.Conv(
            channels, num_filters, (7, 7), (2, 2), padding=[(3, 3), (3, 3)], use_bias=False, rngs=rngs
        )
        self.bn_init = nnx.BatchNorm(num_filters, momentum=0.9, epsilon=1e-5, axis_name="batch", rngs=rngs)
        blocks, filters = [], num_filters
        for i, block_size in enumerate(stage_sizes):
            for j in range(block_size):
                strides = (2, 2) if i > 0 and j == 0 else (1, 1)
                blocks.append(NnxResNetBlock(filters, num_filters * 2**i, strides, rngs=rngs))
                filters = num_filters * 2**i
        self.blocks = nnx.List(blocks)
        self.dropout = nnx.Dropout(dropout_rate, rngs=rngs)
        self.head = nnx.Linear(filters, num_classes, rngs=rngs)

    def __call__(self, x):
        x = nnx.relu(self.bn_init(self.conv_init(x)))
        x = nnx.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
        for block in self.blocks:
            x = block(x)
        x = self.dropout(jnp.mean(x, axis=(1, 2)))
        return self.head(x)
