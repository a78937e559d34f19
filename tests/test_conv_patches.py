"""``conv_as_patches``: nn.Conv as patches times a kernel matrix, equal to nn.Conv (forward
and gradients) for the strides, paddings and channel counts the registry's models use, alone
and under ``jax.vmap`` over members."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks.conv_patches import conv_as_patches

TOL = {"rtol": 1e-5, "atol": 1e-5}


def _both(module: nn.Module, variables, x, method="slices"):
    plain = module.apply(variables, x)
    with conv_as_patches(method):
        patched = module.apply(variables, x)
    return plain, patched


@pytest.mark.slow
@pytest.mark.parametrize(
    "method, channels, stride, padding, kernel_size, use_bias",
    [  # each method, channel count, stride, padding form and kernel shape at least once
        ("slices", 1, 1, "SAME", (3, 3), True),
        ("slices", 3, 2, "SAME", (3, 3), False),
        ("slices", 1, 2, "VALID", (5, 3), True),
        ("slices", 3, 1, ((0, 2), (1, 0)), (3, 3), True),
        ("lax", 1, 2, 1, (1, 1), False),
        ("lax", 3, 1, ((1, 1), (1, 1)), (5, 3), True),
    ],
)
def test_forward_and_gradients_equal_nn_conv(method, channels, stride, padding, kernel_size, use_bias):
    conv = nn.Conv(5, kernel_size, strides=stride, padding=padding, use_bias=use_bias)
    x = jax.random.normal(jax.random.key(0), (2, 9, 8, channels))
    variables = conv.init(jax.random.key(1), x)
    plain, patched = _both(conv, variables, x, method)
    assert patched.shape == plain.shape
    np.testing.assert_allclose(patched, plain, **TOL)

    def loss(v, x, patches):
        if patches:
            with conv_as_patches(method):
                y = conv.apply(v, x)
        else:
            y = conv.apply(v, x)
        return jnp.sum(jnp.sin(y))

    g_plain = jax.grad(loss, argnums=(0, 1))(variables, x, False)
    g_patched = jax.grad(loss, argnums=(0, 1))(variables, x, True)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(b, a, **TOL), g_plain, g_patched)


@pytest.mark.slow
@pytest.mark.parametrize(
    "conv",
    [
        nn.Conv(4, (3, 3), strides=(2, 1), padding="SAME", kernel_dilation=(2, 1)),
        nn.Conv(4, (3, 3), strides=(2, 1), padding=((1, 2), (0, 1)), kernel_dilation=(1, 2), input_dilation=(2, 1)),
    ],
    ids=["kernel-dilation-same", "both-dilations-explicit"],
)
def test_dilations_equal_nn_conv(conv):
    x = jax.random.normal(jax.random.key(0), (2, 11, 7, 3))
    variables = conv.init(jax.random.key(1), x)
    plain, patched = _both(conv, variables, x)
    assert patched.shape == plain.shape
    np.testing.assert_allclose(patched, plain, **TOL)


def test_init_under_the_interceptor_creates_nn_convs_parameters():
    conv = nn.Conv(6, (3, 3))
    x = jnp.ones((1, 8, 8, 3))
    plain = conv.init(jax.random.key(3), x)
    with conv_as_patches():
        patched = conv.init(jax.random.key(3), x)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(b, a), plain, patched)


@pytest.mark.slow
def test_unsupported_convolutions_run_unchanged():
    x = jax.random.normal(jax.random.key(0), (2, 8, 8, 4))
    for conv in (nn.Conv(4, (3, 3), feature_group_count=2), nn.Conv(4, (3, 3), padding="CIRCULAR"), nn.Conv(4, (3,))):
        xi = x if len(conv.kernel_size) == 2 else x[:, 0]
        variables = conv.init(jax.random.key(1), xi)
        plain, patched = _both(conv, variables, xi)
        np.testing.assert_array_equal(patched, plain)


class _Net(nn.Module):
    """Convolutions as the registry's ResNets use them (bias-free padded 3x3, stride 2, 1x1 shortcut)."""

    @nn.compact
    def __call__(self, x):
        y = nn.relu(nn.Conv(8, (3, 3), padding=((1, 1), (1, 1)), use_bias=False)(x))
        y = nn.relu(nn.Conv(8, (3, 3), strides=2, padding=((1, 1), (1, 1)))(y))
        s = nn.Conv(8, (1, 1), strides=2, padding="VALID", use_bias=False)(x)
        return nn.Dense(3)(jnp.mean(y + s, axis=(1, 2)))


@pytest.mark.slow
def test_under_vmap_over_members_equals_nn_conv_and_is_one_batched_matmul():
    net = _Net()
    x = jax.random.normal(jax.random.key(0), (4, 3, 10, 10, 3))  # [E, B, H, W, C]
    variables = jax.vmap(net.init)(jax.random.split(jax.random.key(1), 4), x)

    def loss(v, x):
        return jnp.sum(jax.vmap(net.apply)(v, x) ** 2)

    def patched_loss(v, x):
        with conv_as_patches():
            return loss(v, x)

    np.testing.assert_allclose(patched_loss(variables, x), loss(variables, x), rtol=1e-5)
    g = jax.grad(loss)(variables, x)
    gp = jax.grad(patched_loss)(variables, x)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(b, a, **TOL), g, gp)
    # every member unchanged against the member applied alone
    for m in range(4):
        alone = net.apply(jax.tree.map(lambda v, m=m: v[m], variables), x[m])
        with conv_as_patches():
            patched = jax.vmap(net.apply)(variables, x)[m]
        np.testing.assert_allclose(patched, alone, **TOL)
    hlo = jax.jit(patched_loss).lower(variables, x).as_text()
    assert "convolution" not in hlo  # no (grouped) convolution left: batched dot_generals
    assert "dot_general" in hlo
