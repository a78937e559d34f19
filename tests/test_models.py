"""The project's CNN is the HOWTO's CNN: same parameters, outputs and gradients."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ensemble_core.models.cnn import CNN, avg_pool_2x2


class HowtoCNN(nn.Module):
    """The CNN as the Flax HOWTO writes it (flax's reduce_window average pooling)."""

    @nn.compact
    def __call__(self, x):
        x = nn.avg_pool(nn.relu(nn.Conv(32, (3, 3))(x)), (2, 2), strides=(2, 2))
        x = nn.avg_pool(nn.relu(nn.Conv(64, (3, 3))(x)), (2, 2), strides=(2, 2))
        x = nn.relu(nn.Dense(256)(x.reshape((x.shape[0], -1))))
        return nn.Dense(10)(x)


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(2, 28, 28, 3), (1, 7, 9, 2), (3, 4, 4, 1)])
def test_avg_pool_2x2_equals_flax_avg_pool(shape):
    x = jax.random.normal(jax.random.key(0), shape)
    want = nn.avg_pool(x, (2, 2), strides=(2, 2))
    np.testing.assert_allclose(avg_pool_2x2(x), want, rtol=1e-6, atol=1e-7)
    g = jax.random.normal(jax.random.key(1), want.shape)
    got_grad = jax.grad(lambda x: jnp.sum(avg_pool_2x2(x) * g))(x)
    want_grad = jax.grad(lambda x: jnp.sum(nn.avg_pool(x, (2, 2), strides=(2, 2)) * g))(x)
    np.testing.assert_allclose(got_grad, want_grad, rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_cnn_equals_the_howto_cnn():
    x = jax.random.uniform(jax.random.key(0), (16, 28, 28, 1))
    labels = jnp.arange(16) % 10
    params = HowtoCNN().init(jax.random.key(1), x)["params"]
    ours = CNN().init(jax.random.key(1), x)["params"]
    assert jax.tree.map(np.shape, ours) == jax.tree.map(np.shape, params)

    def loss(model, p):
        logits = model.apply({"params": p}, x)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1)), logits

    (l_ours, out_ours), g_ours = jax.value_and_grad(lambda p: loss(CNN(), p), has_aux=True)(params)
    (l_ref, out_ref), g_ref = jax.value_and_grad(lambda p: loss(HowtoCNN(), p), has_aux=True)(params)
    np.testing.assert_allclose(out_ours, out_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(l_ours, l_ref, rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), g_ours, g_ref)
