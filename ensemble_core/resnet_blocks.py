"""Building blocks shared by :mod:`~ensemble_core.models.resnet`, :mod:`~ensemble_core.models.wide_resnet`
and the methods' ResNet variants (:mod:`ensemble_core.methods`).

Not a registered model (``registry.MODEL_NAMES`` does not name it). Conventions are those of Flax's ImageNet
example (``flax/examples/imagenet/models.py``): modules are called as ``__call__(x, train)``,
BatchNorm is ``nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5)``
without ``axis_name`` (the pipeline handles cross-device statistics), its statistics live in
the mutable ``'batch_stats'`` collection, and dropout is ``nn.Dropout(rate, deterministic=not
train)`` drawing from the ``'dropout'`` RNG collection.

3x3 convolutions pad one pixel on each side (as the papers' Torch/Caffe code does), not
``'SAME'``: with stride 2, ``'SAME'`` pads only at the end, so the kernel centres would sit on
the odd pixels while the shortcut (``x[:, ::2, ::2]`` or a strided 1x1 convolution) keeps the
even ones; with one pixel each side both keep pixels 0, 2, 4, ... and an odd size ``H`` gives
``ceil(H / 2)`` for both. Convolution kernels use He et al.'s initialisation (``he_normal``),
the one both papers train with.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import flax.linen as nn
import jax.numpy as jnp

#: Kernel initialisation of every convolution: He et al. 2015 (fan-in, gain 2).
CONV_INIT = nn.initializers.he_normal()


def conv3x3(features: int, stride: int = 1, *, use_bias: bool = False, name: str | None = None) -> nn.Conv:
    """A 3x3 convolution with one pixel of zero padding on each side (output ``ceil(H / stride)``)."""
    return nn.Conv(
        features,
        (3, 3),
        strides=(stride, stride),
        padding=((1, 1), (1, 1)),
        use_bias=use_bias,
        kernel_init=CONV_INIT,
        name=name,
    )


def batch_norm(train: bool, *, name: str | None = None) -> nn.BatchNorm:
    """The BatchNorm of Flax's ImageNet example: running averages when not training, momentum 0.9, eps 1e-5."""
    return nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5, name=name)


def global_avg_pool(x: jnp.ndarray) -> jnp.ndarray:
    """``[B, H, W, C]`` -> ``[B, C]``: the mean over the spatial axes."""
    return jnp.mean(x, axis=(1, 2))


def shortcut_option_a(x: jnp.ndarray, features: int, stride: int) -> jnp.ndarray:
    """He et al. 2016's option A shortcut: identity; when the shape changes, subsample and zero-pad.

    ``x`` float ``[B, H, W, C]`` -> ``[B, ceil(H / stride), ceil(W / stride), features]``: every
    ``stride``-th pixel (pixels 0, stride, 2 * stride, ...), and ``features - C`` channels of
    zeros appended after the ``C`` input channels. No parameters.
    """
    if stride != 1:
        x = x[:, ::stride, ::stride, :]
    extra = features - x.shape[-1]
    if extra < 0:
        raise ValueError(f"option A shortcut cannot reduce channels ({x.shape[-1]} -> {features})")
    if extra:
        x = jnp.pad(x, ((0, 0), (0, 0), (0, 0), (0, extra)))
    return x


class BasicBlock(nn.Module):
    """The post-activation basic block of He et al. 2016 (Fig. 2 left, Sec. 4.2 for CIFAR).

    ``conv3x3(stride) - BN - ReLU - conv3x3 - BN``, plus the option A shortcut, then ReLU.
    ``batch_norm=False`` leaves both BatchNorms out and gives the convolutions a bias instead
    (the per-channel offset BatchNorm's ``bias`` would have provided).

    Input float32 ``[B, H, W, C]``; output float32 ``[B, ceil(H / stride), ceil(W / stride), features]``.
    """

    features: int
    stride: int = 1
    batch_norm: bool = True

    @nn.compact
    def __call__(self, x: jnp.ndarray, train: bool) -> jnp.ndarray:
        norm = _norm_or_identity(self.batch_norm, train)
        y = conv3x3(self.features, self.stride, use_bias=not self.batch_norm)(x)
        y = nn.relu(norm()(y))
        y = conv3x3(self.features, use_bias=not self.batch_norm)(y)
        y = norm()(y)
        return nn.relu(y + shortcut_option_a(x, self.features, self.stride))


class WideBasicBlock(nn.Module):
    """The pre-activation block of Zagoruyko & Komodakis 2016 (``B(3,3)``, Fig. 1 c/d).

    ``BN - ReLU - conv3x3(stride) - BN - ReLU - [dropout] - conv3x3``, plus the shortcut: the
    identity when the shape is unchanged, otherwise a bias-free 1x1 convolution with ``stride``
    applied to the pre-activated input (``BN - ReLU(x)``), as in the authors' Torch code.

    Input float32 ``[B, H, W, C]``; output float32 ``[B, ceil(H / stride), ceil(W / stride), features]``.
    """

    features: int
    stride: int = 1
    dropout_rate: float = 0.0

    @nn.compact
    def __call__(self, x: jnp.ndarray, train: bool) -> jnp.ndarray:
        project = self.stride != 1 or x.shape[-1] != self.features
        o = nn.relu(batch_norm(train)(x))
        y = conv3x3(self.features, self.stride)(o)
        y = nn.relu(batch_norm(train)(y))
        if self.dropout_rate > 0:
            y = nn.Dropout(self.dropout_rate, deterministic=not train)(y)
        y = conv3x3(self.features)(y)
        if project:
            shortcut = nn.Conv(
                self.features,
                (1, 1),
                strides=(self.stride, self.stride),
                padding="VALID",
                use_bias=False,
                kernel_init=CONV_INIT,
                name="shortcut",
            )(o)
        else:
            shortcut = x
        return y + shortcut


def _norm_or_identity(enabled: bool, train: bool) -> Callable[[], Callable[[jnp.ndarray], jnp.ndarray]]:
    """A factory of BatchNorms (or of identities when ``enabled`` is False), made inside a compact method."""
    if enabled:
        return functools.partial(batch_norm, train)
    return lambda: _identity


def _identity(x: jnp.ndarray) -> jnp.ndarray:
    return x
