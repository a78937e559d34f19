"""Packed-Ensembles (ensemble_core.methods.packed) against explicit members.

The references split the packed weights by hand: a packed layer is ``M · gamma`` small plain
layers (``nn.Conv``, ``nn.Dense`` or a matmul) on the channel blocks of its input, built here
from slices of the grouped kernel; with ``gamma = 1`` the packed CNN and ResNet are ``M`` plain
networks of ``alpha / M`` of the base width (``ensemble_core.models.cnn.CNN`` when
``alpha = M``, a CNN of other widths written here, ``ensemble_core.models.resnet.ResNet``),
each applied on its own. The parameter count is checked against the paper's per-layer
formula. Small shapes: each test well under 5 s on 2 busy cores.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ensemble_core.methods.packed import PackedCNN, PackedConv, PackedDense, PackedResNet, packed_width
from ensemble_core.models.cnn import CNN, avg_pool_2x2
from ensemble_core.models.resnet import ResNet
from tests.drawn_params import drawn_variables

TOL = {"rtol": 1e-5, "atol": 1e-5}


def _block(a: jnp.ndarray, i: int, n: int, axis: int = -1) -> jnp.ndarray:
    """Block ``i`` of ``n`` equal contiguous blocks of ``a`` along ``axis``."""
    size = a.shape[axis] // n
    return jax.lax.slice_in_dim(a, i * size, (i + 1) * size, axis=axis % a.ndim)


@pytest.mark.parametrize(
    ("members", "gamma", "strides", "padding"),
    [(2, 2, (1, 1), "SAME"), (3, 1, (2, 2), ((1, 1), (1, 1))), (1, 4, (1, 2), "VALID")],
)
def test_conv_equals_group_convolutions(members, gamma, strides, padding):
    """Output block g is a plain convolution of input block g with kernel block g."""
    groups = members * gamma
    x = jax.random.normal(jax.random.key(0), (2, 9, 9, 2 * groups))
    layer = PackedConv(3 * groups, (3, 3), ensemble_size=members, gamma=gamma, strides=strides, padding=padding)
    p = drawn_variables(layer, x)["params"]["conv"]
    assert p["kernel"].shape == (3, 3, 2, 3 * groups)
    got = layer.apply({"params": {"conv": p}}, x)
    plain = nn.Conv(3, (3, 3), strides=strides, padding=padding)
    want = jnp.concatenate(
        [
            plain.apply(
                {"params": {"kernel": _block(p["kernel"], g, groups), "bias": _block(p["bias"], g, groups)}},
                _block(x, g, groups),
            )
            for g in range(groups)
        ],
        axis=-1,
    )
    np.testing.assert_allclose(got, want, **TOL)


def test_first_conv_shares_the_input_or_takes_a_batch_per_member():
    """first=True: member i's channels are a plain convolution of the whole input with kernel
    block i; with per_member_input, of member i's images (channels [i·C, (i+1)·C))."""
    x = jax.random.normal(jax.random.key(0), (2, 7, 7, 3))
    layer = PackedConv(8, (3, 3), ensemble_size=4, gamma=2, first=True)
    p = drawn_variables(layer, x)["params"]["conv"]
    assert p["kernel"].shape == (3, 3, 3, 8)  # no groups on the input, whatever gamma
    plain = nn.Conv(2, (3, 3))

    def member(i, images):
        return plain.apply({"params": {"kernel": _block(p["kernel"], i, 4), "bias": _block(p["bias"], i, 4)}}, images)

    got = layer.apply({"params": {"conv": p}}, x)
    np.testing.assert_allclose(got, jnp.concatenate([member(i, x) for i in range(4)], -1), **TOL)
    stacked = jax.random.normal(jax.random.key(1), (2, 7, 7, 4 * 3))
    got = layer.apply({"params": {"conv": p}}, stacked, per_member_input=True)
    want = jnp.concatenate([member(i, _block(stacked, i, 4)) for i in range(4)], -1)
    np.testing.assert_allclose(got, want, **TOL)


@pytest.mark.parametrize(("members", "gamma", "first"), [(3, 1, False), (2, 3, False), (2, 2, True)])
def test_dense_equals_group_matmuls(members, gamma, first):
    groups = 1 if first else members * gamma
    x = jax.random.normal(jax.random.key(0), (4, 5, 2 * members * gamma))
    layer = PackedDense(3 * members * gamma, ensemble_size=members, gamma=gamma, first=first)
    p = drawn_variables(layer, x)["params"]
    assert p["kernel"].shape == (groups, x.shape[-1] // groups, 3 * members * gamma // groups)
    got = layer.apply({"params": p}, x)
    want = jnp.concatenate(
        [_block(x, g, groups) @ p["kernel"][g] + _block(p["bias"], g, groups) for g in range(groups)], axis=-1
    )
    np.testing.assert_allclose(got, want, **TOL)


class WidthCNN(nn.Module):
    """ensemble_core.models.cnn.CNN with other widths: the reference member of a packed CNN."""

    widths: tuple[int, int, int]
    num_classes: int = 10

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        x = avg_pool_2x2(nn.relu(nn.Conv(self.widths[0], (3, 3))(x)))
        x = avg_pool_2x2(nn.relu(nn.Conv(self.widths[1], (3, 3))(x)))
        x = nn.relu(nn.Dense(self.widths[2])(x.reshape((x.shape[0], -1))))
        return nn.Dense(self.num_classes)(x)


def _member_cnn(params: dict, i: int, members: int) -> dict:
    """Member i's plain CNN parameters: its output-channel blocks of the convolutions (the
    second one's kernel is already the member's, one group each), its group of each Dense."""
    conv = {
        k: {
            "kernel": _block(params[k]["conv"]["kernel"], i, members),
            "bias": _block(params[k]["conv"]["bias"], i, members),
        }
        for k in ("PackedConv_0", "PackedConv_1")
    }
    dense = {
        k: {"kernel": params[k]["kernel"][i], "bias": _block(params[k]["bias"], i, members)}
        for k in ("PackedDense_0", "PackedDense_1")
    }
    return {
        "Conv_0": conv["PackedConv_0"],
        "Conv_1": conv["PackedConv_1"],
        "Dense_0": dense["PackedDense_0"],
        "Dense_1": dense["PackedDense_1"],
    }


@pytest.mark.parametrize(("members", "alpha"), [(2, 2.0), (4, 2.0)])
def test_cnn_with_gamma_1_equals_member_cnns(members, alpha):
    """gamma=1: member i is the CNN of widths (32, 64, 256) · alpha / M, on a shared batch and
    on its own batch; alpha = M gives the registry's CNN itself."""
    x = jax.random.uniform(jax.random.key(0), (3, 12, 12, 1))
    model = PackedCNN(num_classes=10, ensemble_size=members, alpha=alpha, gamma=1)
    params = drawn_variables(model, x)["params"]
    widths = tuple(int(c * alpha) // members for c in (32, 64, 256))
    reference = CNN(num_classes=10) if widths == (32, 64, 256) else WidthCNN(widths)
    member_apply = jax.jit(reference.apply)
    apply = jax.jit(model.apply)
    got = apply({"params": params}, x)
    assert got.shape == (members, 3, 10) and got.dtype == jnp.float32
    batches = jax.random.uniform(jax.random.key(1), (members, *x.shape))
    got_own = apply({"params": params}, batches)
    for i in range(members):
        member = {"params": _member_cnn(params, i, members)}
        np.testing.assert_allclose(got[i], member_apply(member, x), **TOL)
        np.testing.assert_allclose(got_own[i], member_apply(member, batches[i]), **TOL)


def test_cnn_members_are_independent_with_gamma_2():
    """gamma=2: changing every weight of member 1's blocks changes member 1's logits only."""
    x = jax.random.uniform(jax.random.key(0), (2, 12, 12, 1))
    model = PackedCNN(num_classes=4, ensemble_size=3, alpha=3.0, gamma=2)
    params = drawn_variables(model, x)["params"]
    assert params["PackedDense_0"]["kernel"].shape[0] == 6 and params["PackedDense_1"]["kernel"].shape[0] == 3

    def perturb(a: jnp.ndarray, axis: int, n: int) -> jnp.ndarray:  # block 1 of n along axis, scaled
        index = [slice(None)] * a.ndim
        size = a.shape[axis] // n
        index[axis] = slice(size, 2 * size)
        return a.at[tuple(index)].multiply(1.7)

    changed = jax.tree.map(lambda a: a, params)
    for k in ("PackedConv_0", "PackedConv_1"):
        changed[k]["conv"] = {name: perturb(v, -1, 3) for name, v in params[k]["conv"].items()}
    changed["PackedDense_0"] = {
        "kernel": perturb(params["PackedDense_0"]["kernel"], 0, 3),
        "bias": perturb(params["PackedDense_0"]["bias"], 0, 3),
    }
    changed["PackedDense_1"] = {
        "kernel": perturb(params["PackedDense_1"]["kernel"], 0, 3),
        "bias": perturb(params["PackedDense_1"]["bias"], 0, 3),
    }
    apply = jax.jit(model.apply)
    before, after = apply({"params": params}, x), apply({"params": changed}, x)
    np.testing.assert_array_equal(before[0], after[0])
    np.testing.assert_array_equal(before[2], after[2])
    assert np.abs(before[1] - after[1]).max() > 1e-3


def _member_tree(tree: dict, i: int, members: int) -> dict:
    """Member i's ResNet variables from the packed ResNet's: ``PackedX`` -> ``X``, each
    convolution's output-channel block i (its input is the member's already: M groups),
    BatchNorm entries' block i, the Dense layer's group i."""
    out: dict = {}
    for name, value in tree.items():
        plain = name.removeprefix("Packed")
        if name.startswith("PackedConv"):
            out[plain] = {k: _block(v, i, members) for k, v in value["conv"].items()}
        elif name.startswith("PackedDense"):
            out[plain] = {"kernel": value["kernel"][i], "bias": _block(value["bias"], i, members)}
        elif isinstance(value, dict):
            out[plain] = _member_tree(value, i, members)
        else:  # BatchNorm scale/bias/mean/var over all packed channels
            out[plain] = _block(value, i, members)
    return out


def test_resnet_with_gamma_1_equals_member_resnets():
    """gamma=1: member i is ResNet-8 of width alpha · width / M, BatchNorm included, in
    training mode (updated running statistics too) and in inference mode."""
    x = jax.random.uniform(jax.random.key(0), (3, 8, 8, 3))
    model = PackedResNet(num_classes=5, ensemble_size=2, alpha=2.0, gamma=1, depth=8, width=4)
    variables = drawn_variables(model, x)
    plain = ResNet(num_classes=5, depth=8, width=4)
    train = jax.jit(lambda v, x: model.apply(v, x, train=True, mutable=["batch_stats"]))
    plain_train = jax.jit(lambda v, x: plain.apply(v, x, train=True, mutable=["batch_stats"]))
    logits, updated = train(variables, x)
    assert logits.shape == (2, 3, 5)
    for i in range(2):
        member = {k: _member_tree(v, i, 2) for k, v in variables.items()}
        want, want_updated = plain_train(member, x)
        np.testing.assert_allclose(logits[i], want, **TOL)
        jax.tree.map(
            lambda a, b: np.testing.assert_allclose(a, b, **TOL),
            _member_tree(updated["batch_stats"], i, 2),
            want_updated["batch_stats"],
        )
    stats = updated["batch_stats"]
    got = jax.jit(lambda v, x: model.apply(v, x, train=False))({"params": variables["params"], "batch_stats": stats}, x)
    plain_eval = jax.jit(lambda v, x: plain.apply(v, x, train=False))
    for i in range(2):
        member = {"params": _member_tree(variables["params"], i, 2), "batch_stats": _member_tree(stats, i, 2)}
        np.testing.assert_allclose(got[i], plain_eval(member, x), **TOL)


def _count(tree) -> int:
    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(tree))


@pytest.mark.parametrize("gamma", [1, 2])
def test_cnn_parameter_count_matches_the_papers_formula(gamma):
    """A packed k x k layer has k² · (alpha C_in)(alpha C_out) / (M · gamma) weights + alpha C_out biases; the
    first (shared input) k² C_in (alpha C_out) + alpha C_out, the last (alpha C_in)(M · classes) / M + M ·
    classes. Total about alpha² / (M · gamma) times the CNN's (1 for alpha = 2, M = 4, gamma = 1)."""
    members, alpha, classes = 4, 2, 10
    x = jnp.zeros((1, 28, 28, 1))
    shapes = jax.eval_shape(lambda: PackedCNN(classes, members, alpha, gamma).init(jax.random.key(0), x))
    a = alpha
    conv0 = 9 * 1 * (a * 32) + a * 32
    conv1 = 9 * (a * 32) * (a * 64) // (members * gamma) + a * 64
    dense0 = (7 * 7 * a * 64) * (a * 256) // (members * gamma) + a * 256
    dense1 = (a * 256) * (members * classes) // members + members * classes
    assert _count(shapes["params"]) == conv0 + conv1 + dense0 + dense1 == {1: 827_688, 2: 417_064}[gamma]
    base = _count(jax.eval_shape(lambda: CNN(classes).init(jax.random.key(0), x))["params"])
    assert base == 824_458
    assert _count(shapes["params"]) / base == pytest.approx(alpha**2 / (members * gamma), rel=0.02)


def test_packed_width_rounds_as_torch_uncertainty():
    assert packed_width(32, 2, 4) == 64
    assert packed_width(10, 1.25, 1) == 12  # int(12.5): truncated
    assert packed_width(10, 1.5, 4) == 16  # 15 -> next multiple of 4
    assert packed_width(33, 2, 4, gamma=2) == 72  # 66 -> next multiple of 8
    with pytest.raises(ValueError, match="fix: features, ensemble_size and gamma must be at least 1"):
        packed_width(32, 2, 0)


def test_errors_name_the_fix():
    key = jax.random.key(0)

    def init(module, x, **kwargs):
        return jax.eval_shape(lambda: module.init(key, x, **kwargs))

    with pytest.raises(ValueError, match="12 input channels do not split into ensemble_size \\* gamma = 8 groups; fix"):
        init(PackedConv(16, ensemble_size=4, gamma=2), jnp.zeros((1, 5, 5, 12)))
    with pytest.raises(ValueError, match="features=30 do not split into 8 groups; fix: use a multiple of 8"):
        init(PackedConv(30, ensemble_size=4, gamma=2), jnp.zeros((1, 5, 5, 16)))
    with pytest.raises(ValueError, match="features=30 do not split into 4 groups"):
        init(PackedDense(30, ensemble_size=4, first=True), jnp.zeros((2, 7)))
    with pytest.raises(ValueError, match="per_member_input needs first=True; fix"):
        init(PackedConv(16, ensemble_size=4), jnp.zeros((1, 5, 5, 16)), per_member_input=True)
    with pytest.raises(ValueError, match=r"neither \[B, H, W, C\] nor \[ensemble_size=4, B, H, W, C\]; fix"):
        init(PackedCNN(ensemble_size=4), jnp.zeros((3, 2, 8, 8, 1)))
    with pytest.raises(ValueError, match="depth must be 6n"):
        init(PackedResNet(depth=12), jnp.zeros((1, 8, 8, 1)))


@pytest.mark.parametrize("strides, padding", [((1, 1), "SAME"), ((2, 2), ((1, 1), (1, 1)))])
def test_grouped_conv_equals_xla_grouped_convolution_with_gradients(strides, padding):
    """``grouped_conv`` (on XLA:CPU: the G convolutions of the blocks, concatenated) equals
    ``lax.conv_general_dilated`` with ``feature_group_count`` (the definition), forward and
    gradients with respect to input and kernel."""
    from jax import lax

    from ensemble_core.methods.packed import grouped_conv

    x = jax.random.normal(jax.random.key(0), (3, 9, 9, 12))
    k = jax.random.normal(jax.random.key(1), (3, 3, 4, 6)) * 0.3
    numbers = lax.conv_dimension_numbers(x.shape, k.shape, ("NHWC", "HWIO", "NHWC"))

    def loss(conv, x, k):
        y = conv(x, k, strides, padding, dimension_numbers=numbers, feature_group_count=3)
        return (y * jnp.cos(y)).sum(), y

    (_, want), want_grads = jax.value_and_grad(lambda x, k: loss(lax.conv_general_dilated, x, k), (0, 1), has_aux=True)(
        x, k
    )
    (_, got), got_grads = jax.value_and_grad(lambda x, k: loss(grouped_conv, x, k), (0, 1), has_aux=True)(x, k)
    np.testing.assert_allclose(got, want, **TOL)
    for g, w in zip(got_grads, want_grads, strict=True):
        np.testing.assert_allclose(g, w, **TOL)
