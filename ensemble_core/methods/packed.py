"""Packed-Ensembles: ``M`` narrow members packed side by side into one network of grouped layers.

Laurent, Lafage, Tartaglione, Daniel, Martinez, Bursuc & Franchi, "Packed-Ensembles for
Efficient Uncertainty Estimation", ICLR 2023, Section 3 (Figure 2: a base network, Deep
Ensembles, and Packed-Ensembles-(alpha, M, gamma)); reference code: torch-uncertainty
(``github.com/ENSTA-U2IS-AI/torch-uncertainty``), ``torch_uncertainty/layers/packed.py``
(``PackedConv2d``, ``PackedLinear``) and ``torch_uncertainty/models/resnet/packed.py``.

Hyper-parameters: ``M`` members (``ensemble_size``), the width factor ``alpha`` and
``gamma`` groups per member. A packed layer is a grouped convolution (or dense
layer) with ``G = M · gamma`` groups: its ``C_in`` input and ``C_out`` output channels are split
into ``G`` contiguous blocks, and block ``g`` of the output sees only block ``g`` of the
input,

    Y[..., g] = conv(X[..., g], K_g) + b_g,      g = 0, ..., G - 1,

computed as one convolution with ``feature_group_count = G`` (``nn.Conv``; XLA's grouped
convolution), except on XLA:CPU, whose grouped convolution is slow (training step about
12x slower than the same G convolutions, measured): there :func:`grouped_conv` computes the
G convolutions on the blocks and concatenates them, in the same program (same parameters).
Member ``i`` owns the blocks ``i·gamma, ..., i·gamma + gamma - 1``, i.e. the channels
``[i · C / M, (i + 1) · C / M)`` of every layer: no weight connects two members, so the
network is ``M`` independent subnetworks, each with ``gamma`` groups inside. Widths: a layer of
the base network with ``C`` channels has ``int(alpha · C)`` here, rounded up to a multiple of
``M · gamma`` (:func:`packed_width`), so each member has ``alpha · C / M`` channels: with
``gamma = 1`` the members are the base network at ``alpha / M`` of its width (tests/test_packed.py
proves it against ``M`` explicit narrow networks).

The first layer takes the plain input, shared by every member: no groups on its input
(torch-uncertainty's ``first=True``); its ``C_out`` outputs are the members' blocks. The last
layer has ``M · num_classes`` outputs in ``M`` groups (torch-uncertainty's ``last=True``,
which its packed ResNet builds without ``gamma``), reshaped to ``[M, B, num_classes]``.

Parameters: a packed ``k x k`` convolution has ``k² · (alpha C_in) · (alpha C_out) / (M · gamma)`` weights
(plus ``alpha C_out`` biases) against the base layer's ``k² · C_in · C_out``: the network has
about ``alpha² / (M · gamma)`` times the base network's parameters (1 for ``alpha = 2, M = 4, gamma = 1``, the
paper's usual setting; the first layer has ``alpha`` times the base's, ungrouped, and the last
``alpha`` times). tests/test_packed.py checks this count for the CNN.

Channel rounding, as torch-uncertainty: ``int(C * alpha)`` (truncated), then, when that does
not split into the groups, rounded up. Where ``gamma > 1`` torch-uncertainty adds
``M - (C % (M · gamma))``, which need not reach a multiple of ``M · gamma`` (its layer then fails);
:func:`packed_width` rounds up to the next multiple of ``M · gamma``, the same for ``gamma = 1``.
Not followed: torch-uncertainty's ``PackedConv2d`` also lowers ``gamma`` silently until every
group has at least ``minimum_channels_per_group = 64`` input channels, which would turn
``gamma`` into 1 in every layer of the small networks here; a layer here keeps the ``gamma`` it is
given and raises ``ValueError`` where the channels do not split.

Input of the networks: float32 images ``[B, H, W, C]`` in [0, 1], shared by every member,
or ``[M, B, H, W, C]``, a batch per member: stacked on the channel axis
(``[B, H, W, M · C]``), the first convolution then takes ``M`` groups, one per member, with
the same kernel as for the shared input (``[kh, kw, C, C_out]`` either way). Output logits
float32 ``[M, B, num_classes]``.

BatchNorm (:class:`PackedResNet`): ``nn.BatchNorm`` over the packed channels, as
torch-uncertainty's ``BatchNorm2d(planes * alpha)``: its statistics, scale and bias are per
channel, so per member (over the member's own batch).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax
from jax.nn.initializers import Initializer

from ensemble_core.models.cnn import avg_pool_2x2
from ensemble_core.resnet_blocks import CONV_INIT, batch_norm, global_avg_pool

__all__ = [
    "PackedBasicBlock",
    "PackedCNN",
    "PackedConv",
    "PackedDense",
    "PackedResNet",
    "grouped_conv",
    "packed_width",
]


def grouped_conv(
    lhs: jax.Array, rhs: jax.Array, window_strides, padding, *, feature_group_count: int = 1, **kwargs
) -> jax.Array:
    """``lax.conv_general_dilated`` (same arguments, the ``nn.Conv`` hook
    ``conv_general_dilated``), with a grouped convolution on XLA:CPU computed as its
    ``G = feature_group_count`` convolutions: input block ``g`` (channels ``[g C_in/G, (g+1)
    C_in/G)``) with kernel block ``g`` (output channels ``[g C_out/G, (g+1) C_out/G)``),
    concatenated on the output's feature axis. That is the definition of a grouped
    convolution (``lax.conv_general_dilated``'s docs), so the result is the same up to
    float32 summation order. On XLA:CPU a grouped convolution's forward pass took 3x and its
    training step (forward and gradients) about 12x the time of the G convolutions (batch
    128, 28 x 28, 64 -> 128 channels, 4 groups, 2026-11-27); other backends keep the one
    grouped convolution (cuDNN's grouped kernels).

    ``dimension_numbers`` must be a ``lax.ConvDimensionNumbers`` (``nn.Conv`` passes one).
    Returns the convolution ``[B, H', W', C_out]`` (in ``nn.Conv``'s layout), of the input's dtype.
    """
    if feature_group_count == 1 or jax.default_backend() != "cpu":
        return lax.conv_general_dilated(
            lhs, rhs, window_strides, padding, feature_group_count=feature_group_count, **kwargs
        )
    numbers = kwargs["dimension_numbers"]
    lhs_feature, rhs_out, out_feature = numbers.lhs_spec[1], numbers.rhs_spec[0], numbers.out_spec[1]
    blocks = [
        lax.conv_general_dilated(x, k, window_strides, padding, **kwargs)
        for x, k in zip(
            jnp.split(lhs, feature_group_count, axis=lhs_feature),
            jnp.split(rhs, feature_group_count, axis=rhs_out),
            strict=True,
        )
    ]
    return jnp.concatenate(blocks, axis=out_feature)


def packed_width(features: int, alpha: float, ensemble_size: int, gamma: int = 1) -> int:
    """The channels of a packed layer whose base layer has ``features``: ``int(features *
    alpha)``, rounded up to a multiple of ``ensemble_size * gamma`` (module docstring).

    Raises:
      ValueError: ``features``, ``ensemble_size`` or ``gamma`` below 1, or ``alpha`` not
        positive.
    """
    if features < 1 or ensemble_size < 1 or gamma < 1 or not alpha > 0:
        raise ValueError(
            f"packed_width(features={features}, alpha={alpha}, ensemble_size={ensemble_size}, gamma={gamma}): "
            f"fix: features, ensemble_size and gamma must be at least 1 and alpha positive"
        )
    groups = ensemble_size * gamma
    width = max(int(features * alpha), 1)
    return -(-width // groups) * groups


def _groups(layer: str, channels: int, features: int, ensemble_size: int, gamma: int, shared_input: bool) -> int:
    """The layer's ``feature_group_count``, after checking that its channels split into it.

    ``shared_input``: the first layer's plain input (one group); its outputs still split
    into the ``ensemble_size`` members' blocks."""
    if ensemble_size < 1 or gamma < 1:
        raise ValueError(f"{layer}: ensemble_size={ensemble_size}, gamma={gamma}; fix: both must be at least 1")
    groups = ensemble_size * gamma
    if not shared_input and channels % groups:
        raise ValueError(
            f"{layer}: {channels} input channels do not split into ensemble_size * gamma = {groups} groups; "
            f"fix: give the layer before it a multiple of {groups} channels (packed_width rounds up to one)"
        )
    split = ensemble_size if shared_input else groups
    if features % split:
        raise ValueError(
            f"{layer}: features={features} do not split into {split} groups; fix: use a multiple of {split} "
            f"(packed_width(base, alpha, {ensemble_size}, {gamma}) rounds up to one)"
        )
    return 1 if shared_input else groups


class PackedConv(nn.Module):
    """A packed convolution: one grouped ``nn.Conv`` with ``M · gamma`` groups (module docstring).

    ``features`` is the layer's total output channels (``packed_width(base, alpha, M, gamma)``;
    ``M * num_classes`` for a last layer), as ``nn.Conv``'s. ``first=True``: the input is
    shared by all members (one group, torch-uncertainty's ``first``); called with
    ``per_member_input=True`` a first layer takes ``M`` images stacked on the channel axis
    (``[B, H, W, M · C]``) in ``M`` groups, with the same kernel.

    Input float ``[B, H, W, C_in]``; output ``[B, H', W', features]`` float32 for float32 input,
    member ``i`` in the channels ``[i · features / M, (i + 1) · features / M)``. Parameters
    (in the child ``conv``): ``kernel`` ``[*kernel_size, C_in / G, features]`` with ``G`` the
    groups (1 for ``first``), ``bias`` ``[features]``.

    Raises:
      ValueError: ``C_in`` or ``features`` does not split into the groups (``M · gamma``; a
        first layer's ``features`` into ``M``), or ``per_member_input`` on a layer that is
        not ``first``; one line with the fix.
    """

    features: int
    kernel_size: tuple[int, int] = (3, 3)
    ensemble_size: int = 4
    gamma: int = 1
    first: bool = False
    strides: tuple[int, int] = (1, 1)
    padding: str | tuple[tuple[int, int], tuple[int, int]] = "SAME"
    use_bias: bool = True
    kernel_init: Initializer = nn.initializers.lecun_normal()
    bias_init: Initializer = nn.initializers.zeros

    @nn.compact
    def __call__(self, x: jnp.ndarray, per_member_input: bool = False) -> jnp.ndarray:
        if per_member_input and not self.first:
            raise ValueError("PackedConv: per_member_input needs first=True; fix: give it to the first layer only")
        if per_member_input:
            groups = _groups("PackedConv", x.shape[-1], self.features, self.ensemble_size, 1, shared_input=False)
        else:
            groups = _groups(
                "PackedConv", x.shape[-1], self.features, self.ensemble_size, self.gamma, shared_input=self.first
            )
        return nn.Conv(
            self.features,
            self.kernel_size,
            strides=self.strides,
            padding=self.padding,
            feature_group_count=groups,
            conv_general_dilated=grouped_conv,
            use_bias=self.use_bias,
            kernel_init=self.kernel_init,
            bias_init=self.bias_init,
            name="conv",
        )(x)


class PackedDense(nn.Module):
    """A packed dense layer: ``G = M · gamma`` independent dense layers on contiguous blocks of
    the features (a block-diagonal weight), one batched matmul (``einsum``).

    ``features`` is the total output width (``packed_width(base, alpha, M, gamma)``;
    ``M * num_classes`` for a last layer, with ``gamma=1``). ``first=True``: one group over
    the shared input. Input float ``[..., F_in]``; output ``[..., features]``, float32 for
    float32 input, block ``g`` of the output from block ``g`` of the input. Parameters ``kernel``
    ``[G, F_in / G, features / G]`` (LeCun normal per group: fan-in ``F_in / G``) and
    ``bias`` ``[features]``.

    Raises:
      ValueError: ``F_in`` or ``features`` does not split into the groups; one line with
        the fix.
    """

    features: int
    ensemble_size: int = 4
    gamma: int = 1
    first: bool = False
    use_bias: bool = True
    kernel_init: Initializer = nn.initializers.lecun_normal(batch_axis=(0,))
    bias_init: Initializer = nn.initializers.zeros

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        channels = x.shape[-1]
        groups = _groups("PackedDense", channels, self.features, self.ensemble_size, self.gamma, self.first)
        kernel = self.param("kernel", self.kernel_init, (groups, channels // groups, self.features // groups))
        lead = x.shape[:-1]
        y = jnp.einsum("...gi,gio->...go", x.reshape((*lead, groups, channels // groups)), kernel)
        y = y.reshape((*lead, self.features))
        if self.use_bias:
            y = y + self.param("bias", self.bias_init, (self.features,))
        return y


def _packed_input(x: jnp.ndarray, ensemble_size: int) -> tuple[jnp.ndarray, bool]:
    """``[B, H, W, C]`` as it is (shared), or ``[M, B, H, W, C]`` as ``[B, H, W, M · C]``
    (member ``i``'s images in channels ``[i · C, (i + 1) · C)``); and whether per member."""
    if x.ndim == 4:
        return x, False
    if x.ndim == 5 and x.shape[0] == ensemble_size:
        m, b, h, w, c = x.shape
        return jnp.moveaxis(x, 0, 3).reshape((b, h, w, m * c)), True
    raise ValueError(
        f"input of shape {tuple(x.shape)} is neither [B, H, W, C] nor [ensemble_size={ensemble_size}, B, H, W, C]; "
        f"fix: pass one batch for all members or one per member"
    )


def _member_logits(logits: jnp.ndarray, ensemble_size: int) -> jnp.ndarray:
    """The last layer's ``[B, M · num_classes]`` as ``[M, B, num_classes]``."""
    b, n = logits.shape
    return jnp.swapaxes(logits.reshape((b, ensemble_size, n // ensemble_size)), 0, 1)


class PackedCNN(nn.Module):
    """Packed-Ensembles of :class:`ensemble_core.models.cnn.CNN`: Conv32 3x3 - ReLU - avgpool 2x2 -
    Conv64 3x3 - ReLU - avgpool 2x2 - Dense256 - ReLU - Dense, each packed.

    Widths ``packed_width(32 | 64 | 256, alpha, M, gamma)``; the first convolution takes the
    shared input, the middle two layers have ``M · gamma`` groups, the last Dense
    ``M · num_classes`` outputs in ``M`` groups. Before the first Dense each group's
    ``[H, W, C / G]`` is flattened on its own (member ``i``'s features stay contiguous).
    With ``gamma = 1`` member ``i`` is exactly the CNN with the widths 32·alpha/M, 64·alpha/M, 256·alpha/M on
    its channel blocks' weights.

    Input float32 ``[B, H, W, C]`` in [0, 1] (shared) or ``[M, B, H, W, C]`` (a batch per
    member); output logits float32 ``[M, B, num_classes]``. ``train`` changes nothing.

    Raises:
      ValueError: the input has another shape; a width does not split into the groups.
    """

    num_classes: int = 10
    ensemble_size: int = 4
    alpha: float = 2.0
    gamma: int = 1

    @nn.compact
    def __call__(self, x: jnp.ndarray, train: bool = False) -> jnp.ndarray:
        del train  # no BatchNorm or dropout
        m, gamma = self.ensemble_size, self.gamma
        x, per_member = _packed_input(x, m)
        c0, c1, d0 = (packed_width(c, self.alpha, m, gamma) for c in (32, 64, 256))
        x = PackedConv(c0, (3, 3), ensemble_size=m, gamma=gamma, first=True)(x, per_member_input=per_member)
        x = avg_pool_2x2(nn.relu(x))
        x = PackedConv(c1, (3, 3), ensemble_size=m, gamma=gamma)(x)
        x = avg_pool_2x2(nn.relu(x))
        b, h, w, c = x.shape
        groups = m * gamma
        x = jnp.moveaxis(x.reshape((b, h, w, groups, c // groups)), 3, 1).reshape((b, -1))
        x = nn.relu(PackedDense(d0, ensemble_size=m, gamma=gamma)(x))
        return _member_logits(PackedDense(m * self.num_classes, ensemble_size=m, gamma=1)(x), m)


def _member_shortcut(x: jnp.ndarray, features: int, stride: int, ensemble_size: int) -> jnp.ndarray:
    """He et al.'s option A shortcut for each member: every ``stride``-th pixel, and each
    member's ``C / M`` channels padded with zeros to its ``features / M`` (in its own block)."""
    if stride != 1:
        x = x[:, ::stride, ::stride, :]
    b, h, w, c = x.shape
    extra = (features - c) // ensemble_size
    if extra < 0:
        raise ValueError(f"option A shortcut cannot reduce channels ({c} -> {features})")
    if not extra:
        return x
    x = x.reshape((b, h, w, ensemble_size, c // ensemble_size))
    return jnp.pad(x, ((0, 0), (0, 0), (0, 0), (0, 0), (0, extra))).reshape((b, h, w, features))


def _packed_conv3x3(
    features: int, ensemble_size: int, gamma: int, stride: int, use_bias: bool, **kw: Any
) -> PackedConv:
    """``resnet_blocks.conv3x3`` packed: one pixel of zero padding each side, He normal kernel."""
    return PackedConv(
        features,
        (3, 3),
        ensemble_size=ensemble_size,
        gamma=gamma,
        strides=(stride, stride),
        padding=((1, 1), (1, 1)),
        use_bias=use_bias,
        kernel_init=CONV_INIT,
        **kw,
    )


class PackedBasicBlock(nn.Module):
    """:class:`ensemble_core.resnet_blocks.BasicBlock` packed: ``conv3x3(stride) - BN - ReLU -
    conv3x3 - BN``, option A shortcut per member, ReLU.

    As torch-uncertainty's ``_BasicBlock``: the block's first convolution has ``M`` groups
    (no subgroups), the second ``M · gamma``. ``features`` is the packed width (all members).
    Input float32 ``[B, H, W, C]``; output ``[B, ceil(H / stride), ceil(W / stride), features]``.
    """

    features: int
    stride: int = 1
    batch_norm: bool = True
    ensemble_size: int = 4
    gamma: int = 1

    @nn.compact
    def __call__(self, x: jnp.ndarray, train: bool) -> jnp.ndarray:
        def norm(y: jnp.ndarray) -> jnp.ndarray:
            return batch_norm(train)(y) if self.batch_norm else y

        m, bias = self.ensemble_size, not self.batch_norm
        y = nn.relu(norm(_packed_conv3x3(self.features, m, 1, self.stride, bias)(x)))
        y = norm(_packed_conv3x3(self.features, m, self.gamma, 1, bias)(y))
        return nn.relu(y + _member_shortcut(x, self.features, self.stride, m))


class PackedResNet(nn.Module):
    """Packed-Ensembles of :class:`ensemble_core.models.resnet.ResNet` (He et al.'s CIFAR ResNet).

    Stem ``conv3x3`` on the shared input (``first``) - BN - ReLU, three stages of
    ``(depth - 2) / 6`` :class:`PackedBasicBlock` of ``packed_width(width · 2^s, alpha, M,
    gamma)`` channels, global average pooling, ``[dropout]``, a :class:`PackedDense` of
    ``M · num_classes`` outputs in ``M`` groups (torch-uncertainty's
    ``models/resnet/packed.py``, with this project's option A shortcuts). With ``gamma = 1``
    member ``i`` is exactly ``ResNet(depth, width=packed_width(width, ...) / M)`` on its
    channel blocks, BatchNorm included.

    Input float32 ``[B, H, W, C]`` in [0, 1] (shared) or ``[M, B, H, W, C]``; output logits
    float32 ``[M, B, num_classes]``. BatchNorm's running statistics are the mutable
    ``'batch_stats'`` collection, dropout draws from the ``'dropout'`` RNG.

    Raises:
      ValueError: ``depth`` is not ``6n + 2`` with ``n >= 1``; the input has another shape.
    """

    num_classes: int = 10
    ensemble_size: int = 4
    alpha: float = 2.0
    gamma: int = 1
    depth: int = 20
    width: int = 16
    dropout_rate: float = 0.0
    batch_norm: bool = True

    @nn.compact
    def __call__(self, x: jnp.ndarray, train: bool = False) -> jnp.ndarray:
        if (self.depth - 2) % 6 or self.depth < 8:
            raise ValueError(f"depth must be 6n + 2 with n >= 1 (8, 20, 32, ...), got {self.depth}")
        blocks = (self.depth - 2) // 6
        m, gamma = self.ensemble_size, self.gamma
        widths = [packed_width(self.width * 2**stage, self.alpha, m, gamma) for stage in range(3)]
        x, per_member = _packed_input(x, m)
        stem = _packed_conv3x3(widths[0], m, gamma, 1, not self.batch_norm, first=True)
        x = stem(x, per_member_input=per_member)
        if self.batch_norm:
            x = batch_norm(train)(x)
        x = nn.relu(x)
        for stage in range(3):
            for block in range(blocks):
                stride = 2 if stage > 0 and block == 0 else 1
                x = PackedBasicBlock(widths[stage], stride, self.batch_norm, m, gamma)(x, train)
        x = global_avg_pool(x)
        if self.dropout_rate > 0:
            x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
        return _member_logits(PackedDense(m * self.num_classes, ensemble_size=m, gamma=1)(x), m)
