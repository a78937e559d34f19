"""2-D convolutions as one matrix product over image patches, for members mapped with ``jax.vmap``.

Under ``jax.vmap`` over the members, ``flax.linen.Conv`` becomes a *grouped* convolution
(the members' kernels side by side, ``feature_group_count = E``), which XLA:CPU runs several
times slower than E separate convolutions. Written instead as patches times a kernel
matrix, a convolution is ``patches [B*Ho*Wo, kh*kw*C] @ kernel [kh*kw*C, O]``, and under
``vmap`` one *batched* matrix product over the member axis (``dot_general`` with batch
dimension E), the kernel XLA:CPU runs best.

:func:`conv_as_patches` is a :func:`flax.linen.intercept_methods` context (the mechanism
:mod:`ensemble_core.train.forward` uses for BatchNorm): inside it, every ``nn.Conv.__call__``
with 2 spatial dimensions, ``feature_group_count == 1``, no mask and padding ``'SAME'``,
``'VALID'``, an int or explicit pairs (any strides, input and kernel dilation; with or
without bias) is computed as patches (strided slices of the padded input, no convolution
op) and one ``einsum``; any other convolution runs unchanged. Its parameters are
``nn.Conv``'s own (same names, shapes, initialisers), so a module is the same network
with or without it; outputs agree with ``nn.Conv`` within float32 rounding.

The user's module is used unchanged::

    with conv_as_patches():
        logits = jax.vmap(lambda v, x: model.apply(v, x, train=False))(variables, images)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import cast

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["conv_as_patches", "conv_patches_call", "supported"]

_SPATIAL = 2


#: How the patches are gathered: 'slices' (strided slices of the padded input, stacked;
#: the gradient is pads and adds) or 'lax' (``lax.conv_general_dilated_patches``, a
#: depthwise convolution with a one-hot kernel; the gradient is its transpose).
METHODS = ("slices", "lax")


@contextlib.contextmanager
def conv_as_patches(method: str = "slices") -> Iterator[None]:
    """Within the context, every supported ``nn.Conv`` (:func:`supported`) is computed by
    :func:`conv_patches_call`; it must be active while the model is *traced* (``apply``,
    ``jax.jit(...).lower``, the first call of a jitted function)."""
    if method not in METHODS:
        raise ValueError(f"unknown patches method {method!r}; use one of {METHODS}")

    def interceptor(next_fun, args, kwargs, context):
        module = context.module
        if context.method_name == "__call__" and isinstance(module, nn.Conv) and supported(module, *args, **kwargs):
            return conv_patches_call(module, *args, method=method, **kwargs)
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(interceptor):
        yield


def _pair(value, default: int) -> tuple[int, ...] | None:
    if value is None:
        return (default,) * _SPATIAL
    if isinstance(value, int):
        return (value,) * _SPATIAL
    value = tuple(value)
    return value if len(value) == _SPATIAL and all(isinstance(v, int) for v in value) else None


def _padding(padding) -> str | tuple[tuple[int, int], ...] | None:
    """``'SAME'``, ``'VALID'`` or 2 ``(lo, hi)`` pairs; None for what is not handled (CIRCULAR, CAUSAL, ...)."""
    if isinstance(padding, str):
        return padding.upper() if padding.upper() in ("SAME", "VALID") else None
    if isinstance(padding, int):
        return ((padding, padding),) * _SPATIAL
    if isinstance(padding, Sequence) and len(padding) == _SPATIAL:
        pairs = []
        for p in padding:
            if isinstance(p, int):
                pairs.append((p, p))
            elif isinstance(p, Sequence) and len(p) == 2 and all(isinstance(v, int) for v in p):
                pairs.append((int(p[0]), int(p[1])))
            else:
                return None
        return tuple(pairs)
    return None


def supported(module: nn.Conv, inputs, mask=None) -> bool:
    """Whether :func:`conv_patches_call` computes ``module(inputs)``: a 2-D ``nn.Conv`` on a
    ``[B, H, W, C]`` input, ``feature_group_count`` 1, no ``mask``, padding 'SAME', 'VALID',
    an int or explicit pairs, int strides and dilations."""
    kernel_size = module.kernel_size
    return (
        type(module) is nn.Conv
        and mask is None
        and module.mask is None
        and module.conv_general_dilated is None  # a user's own convolution function runs as given
        and module.conv_general_dilated_cls is None
        and getattr(inputs, "ndim", 0) == _SPATIAL + 2
        and not isinstance(kernel_size, int)
        and len(tuple(kernel_size)) == _SPATIAL
        and module.feature_group_count == 1
        and _pair(module.strides, 1) is not None
        and _pair(module.input_dilation, 1) is not None
        and _pair(module.kernel_dilation, 1) is not None
        and _padding(module.padding) is not None
    )


def _patches(x, kernel_size, strides, pads, input_dilation, kernel_dilation):
    """``[B, Ho, Wo, kh * kw * C]`` (kernel row, kernel column, channel; the order of an
    HWIO kernel reshaped to ``[kh * kw * C, O]``) from strided slices of the padded input."""
    config = [(0, 0, 0)] + [(lo, hi, d - 1) for (lo, hi), d in zip(pads, input_dilation, strict=True)] + [(0, 0, 0)]
    x = lax.pad(x, jnp.zeros((), x.dtype), config)
    b, h, w, c = x.shape
    (kh, kw), (sh, sw), (dh, dw) = kernel_size, strides, kernel_dilation
    out_h = (h - (kh - 1) * dh - 1) // sh + 1
    out_w = (w - (kw - 1) * dw - 1) // sw + 1
    slices = [
        lax.slice(
            x,
            (0, i * dh, j * dw, 0),
            (b, i * dh + (out_h - 1) * sh + 1, j * dw + (out_w - 1) * sw + 1, c),
            (1, sh, sw, 1),
        )
        for i in range(kh)
        for j in range(kw)
    ]
    if len(slices) == 1:
        return slices[0]
    return jnp.stack(slices, axis=3).reshape(b, out_h, out_w, kh * kw * c)


def conv_patches_call(module: nn.Conv, inputs, mask=None, *, method: str = "slices"):
    """``module(inputs)`` (``module`` a bound ``nn.Conv``, :func:`supported`) as patches times
    the ``[kh * kw * C, O]`` kernel matrix: the same parameters (created by ``module.param``
    exactly as ``nn.Conv`` creates them) and the same result within float32 rounding."""
    del mask  # supported() only lets mask=None through
    # supported() let only what these resolve through: none of them is None here.
    kernel_size = tuple(cast(Sequence[int], module.kernel_size))
    strides = cast(tuple[int, ...], _pair(module.strides, 1))
    input_dilation = cast(tuple[int, ...], _pair(module.input_dilation, 1))
    kernel_dilation = cast(tuple[int, ...], _pair(module.kernel_dilation, 1))
    in_features = inputs.shape[-1]
    kernel = module.param(
        "kernel", module.kernel_init, (*kernel_size, in_features, module.features), module.param_dtype
    )
    bias = module.param("bias", module.bias_init, (module.features,), module.param_dtype) if module.use_bias else None
    inputs, kernel, bias = module.promote_dtype(inputs, kernel, bias, dtype=module.dtype)
    resolved = _padding(module.padding)
    if isinstance(resolved, str):  # as lax.conv_general_dilated resolves it
        dilated_in = [(n - 1) * d + 1 for n, d in zip(inputs.shape[1:3], input_dilation, strict=True)]
        window = [(k - 1) * d + 1 for k, d in zip(kernel_size, kernel_dilation, strict=True)]
        padding: Sequence[tuple[int, int]] = lax.padtype_to_pads(dilated_in, window, strides, resolved)
    else:
        padding = cast(tuple[tuple[int, int], ...], resolved)
    if method == "lax":  # features ordered (channel, kernel row, kernel column)
        patches = lax.conv_general_dilated_patches(
            inputs,
            kernel_size,
            strides,
            padding,
            lhs_dilation=input_dilation,
            rhs_dilation=kernel_dilation,
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
            precision=cast(lax.Precision | None, module.precision),
        )
        matrix = jnp.transpose(cast(jax.Array, kernel), (2, 0, 1, 3)).reshape(-1, module.features)
    else:
        patches = _patches(inputs, kernel_size, strides, padding, input_dilation, kernel_dilation)
        matrix = cast(jax.Array, kernel).reshape(-1, module.features)
    y = jnp.einsum("bhwk,ko->bhwo", patches, matrix, precision=module.precision)
    if bias is not None:
        y = y + bias
    return y
