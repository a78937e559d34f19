"""BatchEnsemble (ensemble_core.methods.batch_ensemble) against explicit members.

The reference of each check is the definition, not the layer's vectorised form: member ``i``
is a plain layer or network whose weights ``W_i = W ∘ (r_i s_i^T)`` and bias ``b_i`` are
built here from the BatchEnsemble parameters, applied with ``nn.Dense``, ``nn.Conv``,
``ensemble_core.models.cnn.CNN`` and ``ensemble_core.models.resnet.ResNet``, one member at a
time. Small shapes: each test well under 5 s on 2 busy cores.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ensemble_core.methods.batch_ensemble import (
    BatchEnsembleCNN,
    BatchEnsembleConv,
    BatchEnsembleDense,
    BatchEnsembleResNet,
    random_sign_initializer,
    tile_members,
)
from ensemble_core.models.cnn import CNN
from ensemble_core.models.resnet import ResNet
from tests.drawn_params import drawn_variables

TOL = {"rtol": 1e-5, "atol": 1e-5}  # float32 rounding: ((x ∘ r) W) ∘ s and x (W ∘ r s^T) sum in other orders


def _member_layer(p: dict, i: int) -> dict:
    """Member ``i``'s plain ``{'kernel', 'bias'}`` from a BatchEnsemble layer's parameters:
    ``kernel * r[i]`` over the input axis (-2) ``* s[i]`` over the output axis (-1)."""
    out = {"kernel": p["kernel"] * p["r"][i][:, None] * p["s"][i][None, :]}
    if "bias" in p:
        out["bias"] = p["bias"][i]
    return out


def _member_tree(tree: dict, i: int) -> dict:
    """Member ``i``'s variables of the plain network from the BatchEnsemble network's:
    submodule names without the ``BatchEnsemble`` prefix, BatchEnsemble layers as
    :func:`_member_layer`, per-member BatchNorm entries ``[M, C]`` as their row ``i``."""
    out: dict = {}
    for name, value in tree.items():
        plain = name.removeprefix("BatchEnsemble")
        if isinstance(value, dict) and "r" in value:
            out[plain] = _member_layer(value, i)
        elif isinstance(value, dict):
            out[plain] = _member_tree(value, i)
        else:  # BatchNorm scale/bias/mean/var [M, C]
            out[plain] = value[i]
    return out


def _cross_entropy(logits: jnp.ndarray, labels: jnp.ndarray) -> jnp.ndarray:
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[..., None], -1))


@pytest.mark.parametrize("shape", [(3, 4, 7), (3, 2, 5, 7)])
def test_dense_equals_explicit_members(shape):
    x = jax.random.normal(jax.random.key(0), shape)
    layer = BatchEnsembleDense(5, ensemble_size=3)
    params = drawn_variables(layer, x)["params"]
    got = layer.apply({"params": params}, x)
    assert got.shape == (*shape[:-1], 5) and got.dtype == jnp.float32
    for i in range(3):
        want = nn.Dense(5).apply({"params": _member_layer(params, i)}, x[i])
        np.testing.assert_allclose(got[i], want, **TOL)


@pytest.mark.parametrize(("strides", "padding"), [((1, 1), "SAME"), ((2, 2), ((1, 1), (1, 1))), ((1, 2), "VALID")])
def test_conv_equals_explicit_members(strides, padding):
    x = jax.random.normal(jax.random.key(0), (3, 2, 9, 9, 4))
    layer = BatchEnsembleConv(6, (3, 3), ensemble_size=3, strides=strides, padding=padding)
    params = drawn_variables(layer, x)["params"]
    got = layer.apply({"params": params}, x)
    for i in range(3):
        plain = nn.Conv(6, (3, 3), strides=strides, padding=padding)
        want = plain.apply({"params": _member_layer(params, i)}, x[i])
        assert got[i].shape == want.shape
        np.testing.assert_allclose(got[i], want, **TOL)


def test_layer_init():
    """Shapes of the parameters; fast weights from random_sign_init, biases zeros."""
    x = jnp.ones((3, 2, 7))
    params = BatchEnsembleDense(5, ensemble_size=3, random_sign_init=0.5).init(jax.random.key(0), x)["params"]
    assert jax.tree.map(jnp.shape, params) == {"kernel": (7, 5), "r": (3, 7), "s": (3, 5), "bias": (3, 5)}
    assert set(np.unique(params["r"])) <= {-1.0, 1.0} and set(np.unique(params["s"])) <= {-1.0, 1.0}
    assert not np.any(params["bias"])


def test_layer_gradients_equal_the_explicit_construction():
    """Gradients reach W, r, s and b, and equal those of the loss written with W ∘ (r_i s_i^T)."""
    x = jax.random.normal(jax.random.key(0), (3, 4, 7))
    labels = jnp.arange(12).reshape(3, 4) % 5
    layer = BatchEnsembleDense(5, ensemble_size=3)
    params = drawn_variables(layer, x)["params"]

    def vectorised(p):
        return _cross_entropy(layer.apply({"params": p}, x), labels)

    def explicit(p):
        logits = jnp.stack([x[i] @ (p["kernel"] * jnp.outer(p["r"][i], p["s"][i])) + p["bias"][i] for i in range(3)])
        return _cross_entropy(logits, labels)

    got, want = jax.jit(jax.grad(vectorised))(params), jax.jit(jax.grad(explicit))(params)
    assert set(got) == {"kernel", "r", "s", "bias"}
    for name in got:
        assert np.all(np.isfinite(got[name])) and np.abs(got[name]).max() > 0, name
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def cnn_case():
    """A BatchEnsembleCNN (M = 3) with drawn parameters, its jitted apply, 12x12x1 images."""
    x = jax.random.uniform(jax.random.key(0), (4, 12, 12, 1))
    model = BatchEnsembleCNN(num_classes=10, ensemble_size=3)
    return model, drawn_variables(model, x)["params"], jax.jit(model.apply), x


#: member i's reference network, jitted once for every member
_cnn_apply = jax.jit(CNN(num_classes=10).apply)


def test_cnn_equals_explicit_cnns(cnn_case):
    _, params, apply, x = cnn_case
    got = apply({"params": params}, x)
    assert got.shape == (3, 4, 10) and got.dtype == jnp.float32
    for i in range(3):
        member = _member_tree(params, i)
        assert set(member) == {"Conv_0", "Conv_1", "Dense_0", "Dense_1"}
        np.testing.assert_allclose(got[i], _cnn_apply({"params": member}, x), **TOL)


def test_cnn_per_member_batches(cnn_case):
    """[M, B, ...] gives member i batch i; equal batches give the single batch's output."""
    _, params, apply, x = cnn_case
    tiled = jnp.broadcast_to(x, (3, *x.shape))
    np.testing.assert_allclose(apply({"params": params}, tiled), apply({"params": params}, x), rtol=1e-6, atol=1e-6)
    batches = jax.random.uniform(jax.random.key(3), x.shape)
    per_member = jnp.stack([x, batches, x[::-1]])
    got = apply({"params": params}, per_member)
    for i in range(3):
        want = _cnn_apply({"params": _member_tree(params, i)}, per_member[i])
        np.testing.assert_allclose(got[i], want, **TOL)


@pytest.mark.slow  # over 1 CPU s with a warm compilation cache: make test-fast leaves it out (docs/development.md)
def test_cnn_gradients_reach_every_parameter(cnn_case):
    model, params, _, x = cnn_case
    labels = jnp.arange(12).reshape(3, 4) % 10
    loss_fn = jax.jit(jax.value_and_grad(lambda p: _cross_entropy(model.apply({"params": p}, x), labels)))
    loss, grads = loss_fn(params)

    # The reference: the same loss written through the definition, member i a plain CNN
    # with W_i = W ∘ (r_i s_i^T) and b_i, built from the same parameters; JAX differentiates
    # that construction, so the gradient of W, r, s and b is the chain rule through it.
    def by_members(p):
        logits = jnp.stack([_cnn_apply({"params": _member_tree(p, i)}, x) for i in range(3)])
        return _cross_entropy(logits, labels)

    want_loss, want = jax.value_and_grad(by_members)(params)
    assert float(loss) == pytest.approx(float(want_loss), rel=1e-5)
    assert 1.0 < float(loss) < 10.0  # cross-entropy of 10 classes at random parameters: about log 10
    assert set(grads) == set(want)
    for layer, g in grads.items():
        for name, value in g.items():
            np.testing.assert_allclose(value, want[layer][name], rtol=1e-4, atol=1e-6, err_msg=f"{layer} {name}")
    for layer, g in grads.items():
        assert set(g) == {"kernel", "r", "s", "bias"}, layer
        for name, value in g.items():
            assert np.all(np.isfinite(value)) and np.abs(value).max() > 0, (layer, name)


@pytest.mark.slow  # over 1 CPU s with a warm compilation cache: make test-fast leaves it out (docs/development.md)
def test_resnet_equals_explicit_resnets():
    """Per-member BatchNorm: member i is ResNet-8 with its weights, in training mode (batch
    statistics of its own batch, updated running averages) and in inference mode."""
    x = jax.random.uniform(jax.random.key(0), (3, 8, 8, 3))
    model = BatchEnsembleResNet(num_classes=5, ensemble_size=2, depth=8, width=4)
    variables = drawn_variables(model, x)
    batches = jax.random.uniform(jax.random.key(3), (2, *x.shape))
    train = jax.jit(lambda v, x: model.apply(v, x, train=True, mutable=["batch_stats"]))
    logits, updated = train(variables, batches)
    plain = ResNet(num_classes=5, depth=8, width=4)
    plain_train = jax.jit(lambda v, x: plain.apply(v, x, train=True, mutable=["batch_stats"]))
    for i in range(2):
        member = {
            "params": _member_tree(variables["params"], i),
            "batch_stats": _member_tree(variables["batch_stats"], i),
        }
        want, want_updated = plain_train(member, batches[i])
        np.testing.assert_allclose(logits[i], want, **TOL)
        jax.tree.map(
            lambda a, b: np.testing.assert_allclose(a, b, **TOL),
            _member_tree(updated["batch_stats"], i),
            want_updated["batch_stats"],
        )
    # inference: the running statistics just updated, one batch for every member
    stats = updated["batch_stats"]
    got = jax.jit(lambda v, x: model.apply(v, x, train=False))({"params": variables["params"], "batch_stats": stats}, x)
    assert got.shape == (2, 3, 5)
    plain_eval = jax.jit(lambda v, x: plain.apply(v, x, train=False))
    for i in range(2):
        member = {"params": _member_tree(variables["params"], i), "batch_stats": _member_tree(stats, i)}
        np.testing.assert_allclose(got[i], plain_eval(member, x), **TOL)


def test_resnet_shared_batch_norm():
    """ensemble_batch_norm=False: one BatchNorm ([C]) over all members' examples."""
    x = jnp.zeros((2, 8, 8, 1))
    model = BatchEnsembleResNet(num_classes=3, ensemble_size=2, depth=8, width=4, ensemble_batch_norm=False)
    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), x))
    assert shapes["params"]["BatchNorm_0"]["scale"].shape == (4,)
    assert shapes["batch_stats"]["BatchNorm_0"]["mean"].shape == (4,)
    assert shapes["params"]["BatchEnsembleDense_0"]["s"].shape == (2, 3)
    logits, _ = jax.eval_shape(lambda v: model.apply(v, x, train=True, mutable=["batch_stats"]), shapes)
    assert logits.shape == (2, 2, 3) and logits.dtype == jnp.float32


def test_random_sign_initializer():
    key, shape = jax.random.key(0), (100, 100)
    assert np.all(random_sign_initializer(1.0)(key, shape) == 1.0)
    signs = random_sign_initializer(0.5)(key, shape)
    assert set(np.unique(signs)) == {-1.0, 1.0} and abs(float(signs.mean())) < 0.05
    normal = random_sign_initializer(-0.5)(key, shape)
    assert abs(float(normal.mean()) - 1.0) < 0.02 and abs(float(normal.std()) - 0.5) < 0.02
    assert np.all(random_sign_initializer(0.0)(key, shape) == 1.0)  # edward2's layer default: ones
    with pytest.raises(ValueError, match=r"random_sign_init=1\.5 is above 1; fix"):
        random_sign_initializer(1.5)


def test_errors_name_the_fix():
    key = jax.random.key(0)
    with pytest.raises(ValueError, match=r"not \[ensemble_size=3, B, \.\.\.\]; fix"):
        jax.eval_shape(lambda: BatchEnsembleDense(4, ensemble_size=3).init(key, jnp.zeros((2, 5, 7))))
    with pytest.raises(ValueError, match="2 member batches on axis 0, expected ensemble_size=3; fix"):
        tile_members(jnp.zeros((2, 5, 8, 8, 1)), 3, item_ndim=3)
    with pytest.raises(ValueError, match="has 3 axes; fix"):
        jax.eval_shape(lambda: BatchEnsembleCNN(ensemble_size=3).init(key, jnp.zeros((5, 8, 8))))
    with pytest.raises(ValueError, match="depth must be 6n"):
        jax.eval_shape(lambda: BatchEnsembleResNet(depth=10).init(key, jnp.zeros((1, 8, 8, 1))))
