"""BatchEnsemble: ``M`` members that share one weight, each with its own rank-1 "fast weights".

Wen, Tran & Ba, "BatchEnsemble: an Alternative Approach to Efficient Ensemble and Lifelong
Learning", ICLR 2020, Section 3. Member ``i`` of a layer whose shared ("slow") weight is
``W`` (``[in, out]``) has the weight

    W_i = W ∘ (r_i s_i^T),       i.e.  W_i[a, b] = W[a, b] · r_i[a] · s_i[b],

with ``r_i`` of the input size, ``s_i`` of the output size and its own bias ``b_i``. The
layer never builds ``W_i``: as the paper's eq. (5) it computes, for all members at once,

    Y_i = ((X_i ∘ r_i) W) ∘ s_i + b_i,                    X [M, B, in] -> Y [M, B, out]

(``∘`` broadcasts ``r_i``, ``s_i`` and ``b_i`` over the member's ``B`` rows): one matmul
of the ``[M * B, in]`` rows with the shared ``W``. A convolution is the same with ``r_i``
over the input channels and ``s_i`` over the output channels, one convolution of the
``[M * B, H, W, C]`` batch: scaling a convolution's input channel ``c`` by ``r_i[c]`` and
its output channel ``f`` by ``s_i[f]`` is convolving with ``K ∘ (r_i ⊗ s_i)`` (zero padding
stays zero), so member ``i`` is exactly a plain layer with the kernel
``K_i[kh, kw, c, f] = K[kh, kw, c, f] · r_i[c] · s_i[f]`` (tests/test_batch_ensemble.py
proves it against ``M`` explicit layers and networks).

Parameters (names as the paper's symbols): ``kernel`` (``W``, shared; ``[in, out]`` or
``[kh, kw, in, out]``), ``r`` ``[M, in]``, ``s`` ``[M, out]``, ``bias`` ``[M, out]``.
edward2 calls ``r`` and ``s`` ``fast_weight_alpha`` and ``fast_weight_gamma``
(``edward2/jax/nn/dense.py``, ``DenseBatchEnsemble``; the Keras layers
``ed.layers.DenseBatchEnsemble`` and ``Conv2DBatchEnsemble`` call them ``alpha`` and
``gamma``).

Initialisation, as uncertainty-baselines trains BatchEnsemble: the shared kernel as the
plain network's (Flax's LeCun normal for the CNN, He normal for the ResNet's convolutions,
``ensemble_core.resnet_blocks.CONV_INIT``), the bias zeros, and ``r``, ``s`` from
``random_sign_init`` (:func:`random_sign_initializer`): above 0, each entry ±1 with
``P(+1) = random_sign_init`` (edward2's ``ed.initializers.RandomSign``,
``edward2/tensorflow/initializers.py``); 0 or below, normal with mean 1 and standard
deviation ``-random_sign_init`` (``make_sign_initializer`` of
``uncertainty_baselines/models/wide_resnet_batchensemble.py`` and
``make_random_sign_initializer`` of ``resnet50_batchensemble.py``). The default ``-0.5``
is the ``random_sign_init`` flag of uncertainty-baselines' CIFAR BatchEnsemble
(``baselines/cifar/batchensemble.py``); ``0`` gives edward2's layer default, all ones.

BatchNorm (:class:`BatchEnsembleResNet`): per member by default (``ensemble_batch_norm=True``),
as edward2's ``EnsembleSyncBatchNorm`` (``edward2/tensorflow/layers/normalization.py``,
``use_ensemble_bn`` of ``resnet50_batchensemble.py``): each member's statistics over its
own ``B`` examples and its own scale and bias ``[M, C]``. Chosen because each member is
then exactly the plain ResNet of :mod:`ensemble_core.models.resnet` (the test proves it,
training mode included), a member's output never depends on another member's batch (with
a different batch per member, a shared BatchNorm would mix their statistics), and it costs
only ``4 · (M - 1) · C`` more numbers per BatchNorm than a shared one (half of them running
statistics). ``ensemble_batch_norm=False`` shares one BatchNorm over all ``M · B`` examples,
as uncertainty-baselines' Wide ResNet (``wide_resnet_batchensemble.py``) does and its
ResNet-50 does by default (the baselines' ``use_ensemble_bn`` flag is False).

Inputs: every network takes float32 images ``[B, H, W, C]`` in [0, 1], the same batch for
every member (tiled inside, as uncertainty-baselines' ``baselines/cifar/batchensemble.py``
tiles its training and test batches), or ``[M, B, H, W, C]``, a batch per member (to train
each member on batches of its own); it returns float32 logits ``[M, B, num_classes]``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.nn.initializers import Initializer

from ensemble_core.models.cnn import avg_pool_2x2
from ensemble_core.resnet_blocks import CONV_INIT, global_avg_pool, shortcut_option_a

__all__ = [
    "DEFAULT_RANDOM_SIGN_INIT",
    "BatchEnsembleBasicBlock",
    "BatchEnsembleCNN",
    "BatchEnsembleConv",
    "BatchEnsembleDense",
    "BatchEnsembleResNet",
    "random_sign_initializer",
    "tile_members",
]

#: ``random_sign_init`` of uncertainty-baselines' CIFAR BatchEnsemble: fast weights ~ N(1, 0.5)
DEFAULT_RANDOM_SIGN_INIT = -0.5

BN_MOMENTUM, BN_EPSILON = 0.9, 1e-5  # as resnet_blocks.batch_norm and uncertainty-baselines


def random_sign_initializer(random_sign_init: float) -> Initializer:
    """The fast weights' initializer of uncertainty-baselines' ``make_sign_initializer``.

    ``random_sign_init > 0``: each entry +1 with probability ``random_sign_init``, else -1
    (edward2's ``RandomSign``); ``random_sign_init <= 0``: normal with mean 1 and standard
    deviation ``-random_sign_init`` (0: all ones). Returns an initializer
    ``(key, shape, dtype) -> array``.

    Raises:
      ValueError: ``random_sign_init`` above 1 (not a probability).
    """
    if random_sign_init > 1:
        raise ValueError(
            f"random_sign_init={random_sign_init} is above 1; fix: give a probability of +1 in (0, 1], "
            f"or 0 or below for N(1, -random_sign_init)"
        )

    def init(key: jax.Array, shape: Sequence[int], dtype: Any = jnp.float32) -> jax.Array:
        if random_sign_init > 0:
            return (2.0 * jax.random.bernoulli(key, random_sign_init, tuple(shape)) - 1.0).astype(dtype)
        return (1.0 - random_sign_init * jax.random.normal(key, tuple(shape))).astype(dtype)

    return cast(Initializer, init)


def tile_members(x: jnp.ndarray, ensemble_size: int, item_ndim: int) -> jnp.ndarray:
    """A batch for every member: ``[B, *item]`` -> ``[M, B, *item]`` (the same batch
    broadcast to each), or ``[M, B, *item]`` as it is (a batch per member).

    ``item_ndim`` is the number of axes of one example (3 for ``[H, W, C]`` images).

    Raises:
      ValueError: ``x`` has neither ``item_ndim + 1`` nor ``item_ndim + 2`` axes, or its
        member axis is not ``ensemble_size`` long.
    """
    if x.ndim == item_ndim + 1:
        return jnp.broadcast_to(x[None], (ensemble_size, *x.shape))
    if x.ndim == item_ndim + 2:
        if x.shape[0] != ensemble_size:
            raise ValueError(
                f"input of shape {tuple(x.shape)} has {x.shape[0]} member batches on axis 0, expected "
                f"ensemble_size={ensemble_size}; fix: pass [B, ...] (one batch for all) or [{ensemble_size}, B, ...]"
            )
        return x
    raise ValueError(
        f"input of shape {tuple(x.shape)} has {x.ndim} axes; fix: pass [B, ...] with {item_ndim} axes per "
        f"example, or [ensemble_size, B, ...]"
    )


def _check_members(layer: str, x: jnp.ndarray, ensemble_size: int) -> None:
    if x.ndim < 3 or x.shape[0] != ensemble_size:
        raise ValueError(
            f"{layer}: input of shape {tuple(x.shape)} is not [ensemble_size={ensemble_size}, B, ...]; fix: put the "
            f"member axis first (tile_members tiles one batch for all members)"
        )


def _member_shape(x: jnp.ndarray, v: jnp.ndarray) -> jnp.ndarray:
    """``v`` ``[M, n]`` reshaped to broadcast over ``x`` ``[M, B, ..., n]``: ``[M, 1, ..., n]``."""
    return v.reshape((v.shape[0],) + (1,) * (x.ndim - 2) + (v.shape[-1],))


def _merge_members(fn: Callable[[jnp.ndarray], jnp.ndarray], x: jnp.ndarray) -> jnp.ndarray:
    """``fn`` of a ``[N, ...]`` batch applied to ``x`` ``[M, B, ...]`` as one ``[M * B, ...]`` batch."""
    m, b = x.shape[:2]
    y = fn(x.reshape((m * b, *x.shape[2:])))
    return y.reshape((m, b, *y.shape[1:]))


class BatchEnsembleDense(nn.Module):
    """A BatchEnsemble dense layer: ``Y_i = ((X_i ∘ r_i) W) ∘ s_i + b_i`` (module docstring).

    Input float ``[M, B, ..., in]`` (member axis first, ``M = ensemble_size``); output
    ``[M, B, ..., features]`` float32 for float32 input. Parameters ``kernel`` ``[in, features]``
    (shared), ``r`` ``[M, in]``, ``s`` ``[M, features]``, ``bias`` ``[M, features]``
    (when ``use_bias``). Member ``i`` equals ``nn.Dense`` with the kernel
    ``kernel * r[i][:, None] * s[i][None, :]`` and the bias ``bias[i]``.

    Raises:
      ValueError: the input's axis 0 is not ``ensemble_size`` long (one line, with the fix).
    """

    features: int
    ensemble_size: int = 4
    use_bias: bool = True
    random_sign_init: float = DEFAULT_RANDOM_SIGN_INIT
    kernel_init: Initializer = nn.initializers.lecun_normal()
    bias_init: Initializer = nn.initializers.zeros

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        _check_members("BatchEnsembleDense", x, self.ensemble_size)
        fast_init = random_sign_initializer(self.random_sign_init)
        kernel = self.param("kernel", self.kernel_init, (x.shape[-1], self.features))
        r = self.param("r", fast_init, (self.ensemble_size, x.shape[-1]))
        s = self.param("s", fast_init, (self.ensemble_size, self.features))
        y = jnp.matmul(x * _member_shape(x, r), kernel) * _member_shape(x, s)
        if self.use_bias:
            y = y + _member_shape(y, self.param("bias", self.bias_init, (self.ensemble_size, self.features)))
        return y


class BatchEnsembleConv(nn.Module):
    """A BatchEnsemble convolution: ``Y_i = conv(X_i ∘ r_i, K) ∘ s_i + b_i`` (module docstring).

    Input float ``[M, B, H, W, C]`` (``M = ensemble_size``); output
    ``[M, B, H', W', features]`` float32 for float32 input, from one convolution of the
    ``[M * B, H, W, C]`` batch (``jax.lax.conv_general_dilated``, NHWC/HWIO, as ``nn.Conv``
    calls it). Parameters ``kernel`` ``[*kernel_size, C, features]`` (shared), ``r``
    ``[M, C]``, ``s`` ``[M, features]``, ``bias`` ``[M, features]`` (when ``use_bias``).
    Member ``i`` equals ``nn.Conv`` with the kernel ``kernel * r[i][:, None] * s[i]`` (over
    the last two axes) and the bias ``bias[i]``. ``padding`` is ``'SAME'``, ``'VALID'`` or
    a pair of (low, high) pads per spatial axis.

    Raises:
      ValueError: the input's axis 0 is not ``ensemble_size`` long (one line, with the fix).
    """

    features: int
    kernel_size: tuple[int, int] = (3, 3)
    ensemble_size: int = 4
    strides: tuple[int, int] = (1, 1)
    padding: str | tuple[tuple[int, int], tuple[int, int]] = "SAME"
    use_bias: bool = True
    random_sign_init: float = DEFAULT_RANDOM_SIGN_INIT
    kernel_init: Initializer = nn.initializers.lecun_normal()
    bias_init: Initializer = nn.initializers.zeros

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        _check_members("BatchEnsembleConv", x, self.ensemble_size)
        channels = x.shape[-1]
        fast_init = random_sign_initializer(self.random_sign_init)
        kernel = self.param("kernel", self.kernel_init, (*self.kernel_size, channels, self.features))
        r = self.param("r", fast_init, (self.ensemble_size, channels))
        s = self.param("s", fast_init, (self.ensemble_size, self.features))

        def conv(batch: jnp.ndarray) -> jnp.ndarray:
            return jax.lax.conv_general_dilated(
                batch, kernel, self.strides, self.padding, dimension_numbers=("NHWC", "HWIO", "NHWC")
            )

        y = _merge_members(conv, x * _member_shape(x, r)) * _member_shape(x, s)
        if self.use_bias:
            y = y + _member_shape(y, self.param("bias", self.bias_init, (self.ensemble_size, self.features)))
        return y


class BatchEnsembleCNN(nn.Module):
    """BatchEnsemble of :class:`ensemble_core.models.cnn.CNN`: Conv32 3x3 - ReLU - avgpool 2x2 -
    Conv64 3x3 - ReLU - avgpool 2x2 - Dense256 - ReLU - Dense, every layer a BatchEnsemble one.

    Input float32 ``[B, H, W, C]`` in [0, 1] (one batch for every member) or
    ``[M, B, H, W, C]`` (a batch per member); output logits float32
    ``[M, B, num_classes]``. Member ``i`` is exactly the CNN with the weights
    ``W ∘ (r_i s_i^T)`` and biases ``b_i`` of each layer. ``train`` changes nothing (no
    BatchNorm or dropout). Parameters: the CNN's, plus ``M · (in + out)`` fast weights and
    ``(M - 1) · out`` more biases per layer: on 28x28x1 images with 10 classes, 840,692 for
    ``M = 4`` against the CNN's 824,458 (one member's).

    Raises:
      ValueError: the input has neither 4 nor 5 axes, or a member axis of another length.
    """

    num_classes: int = 10
    ensemble_size: int = 4
    random_sign_init: float = DEFAULT_RANDOM_SIGN_INIT

    @nn.compact
    def __call__(self, x: jnp.ndarray, train: bool = False) -> jnp.ndarray:
        del train  # no BatchNorm or dropout: the same in training and inference mode
        m, sign = self.ensemble_size, self.random_sign_init
        x = tile_members(x, m, item_ndim=3)
        x = BatchEnsembleConv(32, (3, 3), ensemble_size=m, random_sign_init=sign)(x)
        x = _merge_members(avg_pool_2x2, nn.relu(x))
        x = BatchEnsembleConv(64, (3, 3), ensemble_size=m, random_sign_init=sign)(x)
        x = _merge_members(avg_pool_2x2, nn.relu(x))
        x = x.reshape((*x.shape[:2], -1))  # each member's [H, W, C] flattened as the CNN flattens it
        x = nn.relu(BatchEnsembleDense(256, ensemble_size=m, random_sign_init=sign)(x))
        return BatchEnsembleDense(self.num_classes, ensemble_size=m, random_sign_init=sign)(x)


def _batch_norm(train: bool, per_member: bool) -> Callable[[jnp.ndarray], jnp.ndarray]:
    """BatchNorm of ``[M, B, H, W, C]``: per member (statistics over each member's
    ``B, H, W``; scale, bias and running statistics ``[M, C]``) or shared (over
    ``M, B, H, W``; ``[C]``). Momentum and epsilon as ``resnet_blocks.batch_norm``."""
    if not per_member:
        return nn.BatchNorm(use_running_average=not train, momentum=BN_MOMENTUM, epsilon=BN_EPSILON)
    # Flax's BatchNorm takes several feature axes (its `axis` is canonicalised as a tuple)
    axes = cast(Any, (0, -1))
    return nn.BatchNorm(use_running_average=not train, axis=axes, momentum=BN_MOMENTUM, epsilon=BN_EPSILON)


class BatchEnsembleBasicBlock(nn.Module):
    """:class:`ensemble_core.resnet_blocks.BasicBlock` with BatchEnsemble convolutions.

    ``conv3x3(stride) - BN - ReLU - conv3x3 - BN``, plus He et al.'s option A shortcut
    (parameter-free, per member), then ReLU; BatchNorm per member or shared
    (``ensemble_batch_norm``, module docstring); ``batch_norm=False``: no BatchNorm, the
    convolutions get per-member biases. Input float32 ``[M, B, H, W, C]``; output
    ``[M, B, ceil(H / stride), ceil(W / stride), features]``.
    """

    features: int
    stride: int = 1
    batch_norm: bool = True
    ensemble_size: int = 4
    ensemble_batch_norm: bool = True
    random_sign_init: float = DEFAULT_RANDOM_SIGN_INIT

    @nn.compact
    def __call__(self, x: jnp.ndarray, train: bool) -> jnp.ndarray:
        def norm(y: jnp.ndarray) -> jnp.ndarray:
            if not self.batch_norm:
                return y
            return _batch_norm(train, self.ensemble_batch_norm)(y)

        y = _conv3x3(self, self.features, self.stride)(x)
        y = nn.relu(norm(y))
        y = norm(_conv3x3(self, self.features, 1)(y))
        shortcut = _merge_members(lambda z: shortcut_option_a(z, self.features, self.stride), x)
        return nn.relu(y + shortcut)


def _conv3x3(module: Any, features: int, stride: int) -> BatchEnsembleConv:
    """``resnet_blocks.conv3x3`` as a BatchEnsemble convolution: one pixel of zero padding each side,
    He normal shared kernel, a bias only without BatchNorm."""
    return BatchEnsembleConv(
        features,
        (3, 3),
        ensemble_size=module.ensemble_size,
        strides=(stride, stride),
        padding=((1, 1), (1, 1)),
        use_bias=not module.batch_norm,
        random_sign_init=module.random_sign_init,
        kernel_init=CONV_INIT,
    )


class BatchEnsembleResNet(nn.Module):
    """BatchEnsemble of :class:`ensemble_core.models.resnet.ResNet` (He et al.'s CIFAR ResNet).

    ``conv3x3(width) - BN - ReLU``, three stages of ``(depth - 2) / 6``
    :class:`BatchEnsembleBasicBlock` of ``width``, ``2 * width``, ``4 * width`` channels,
    global average pooling, ``[dropout]``, a :class:`BatchEnsembleDense`. Every
    convolution and the Dense layer are BatchEnsemble layers; BatchNorm per member
    (default) or shared (``ensemble_batch_norm=False``; module docstring says why). With
    per-member BatchNorm, member ``i`` is exactly ``ResNet(depth, width, ...)`` with the
    weights ``W ∘ (r_i s_i^T)``, biases ``b_i`` and BatchNorm ``[i]``, in training and
    inference mode.

    Input float32 ``[B, H, W, C]`` in [0, 1] or ``[M, B, H, W, C]``; output logits float32
    ``[M, B, num_classes]``. BatchNorm's running statistics are the mutable
    ``'batch_stats'`` collection, dropout draws from the ``'dropout'`` RNG.

    Raises:
      ValueError: ``depth`` is not ``6n + 2`` with ``n >= 1``; the input has neither 4 nor
        5 axes, or a member axis of another length.
    """

    num_classes: int = 10
    ensemble_size: int = 4
    depth: int = 20
    width: int = 16
    dropout_rate: float = 0.0
    batch_norm: bool = True
    ensemble_batch_norm: bool = True
    random_sign_init: float = DEFAULT_RANDOM_SIGN_INIT

    @nn.compact
    def __call__(self, x: jnp.ndarray, train: bool = False) -> jnp.ndarray:
        if (self.depth - 2) % 6 or self.depth < 8:
            raise ValueError(f"depth must be 6n + 2 with n >= 1 (8, 20, 32, ...), got {self.depth}")
        blocks = (self.depth - 2) // 6
        x = tile_members(x, self.ensemble_size, item_ndim=3)
        x = _conv3x3(self, self.width, 1)(x)
        if self.batch_norm:
            x = _batch_norm(train, self.ensemble_batch_norm)(x)
        x = nn.relu(x)
        for stage in range(3):
            for block in range(blocks):
                x = BatchEnsembleBasicBlock(
                    self.width * 2**stage,
                    2 if stage > 0 and block == 0 else 1,
                    self.batch_norm,
                    self.ensemble_size,
                    self.ensemble_batch_norm,
                    self.random_sign_init,
                )(x, train)
        x = _merge_members(global_avg_pool, x)
        if self.dropout_rate > 0:
            x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
        return BatchEnsembleDense(
            self.num_classes, ensemble_size=self.ensemble_size, random_sign_init=self.random_sign_init
        )(x)
