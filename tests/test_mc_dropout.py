"""MC dropout (``ensemble.method=mc_dropout``, :mod:`ensemble_core.mc_dropout`) against
independent references: each row of the evaluation is one stochastic pass, equal to a
forward pass written here with ``jax.lax`` primitives and the pass's dropout mask drawn
per example; the passes do not depend on the batch size or the mesh; what it cannot wrap
is refused in one line."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ensemble_core.config import load_config
from ensemble_core.ensemble_setup import build
from ensemble_core.errors import ConfigError
from ensemble_core.mc_dropout import check_network, example_dropout, pass_keys
from ensemble_core.models import build_model
from ensemble_core.runs.ensemble.load import all_members

SHAPE = (8, 8, 1)
MC = ["ensemble.method=mc_dropout", "model.name=cnn", "model.options={dropout_rate: 0.5}", "ensemble.size=2"]


def test_example_dropout_draws_each_examples_mask_from_its_own_key():
    key, index = jax.random.key(3), jnp.array([5, 0, 9])
    x = jnp.arange(3 * 4 * 2, dtype=jnp.float32).reshape(3, 4, 2) + 1.0
    got = np.asarray(example_dropout(x, key, index, 0.25))
    for row, i in enumerate([5, 0, 9]):  # the definition, one example at a time
        keep = np.asarray(jax.random.bernoulli(jax.random.fold_in(key, i), 0.75, (4, 2)))
        np.testing.assert_allclose(got[row], np.where(keep, np.asarray(x[row]) / 0.75, 0.0), rtol=1e-6)
    shared = np.asarray(example_dropout(x, key, index, 0.25, broadcast_dims=(2,)))
    assert (((shared == 0)[..., 0]) == ((shared == 0)[..., 1])).all()  # one mask over the broadcast axis
    np.testing.assert_array_equal(np.asarray(example_dropout(x, key, index, 0.0)), np.asarray(x))
    assert not np.asarray(example_dropout(x, key, index, 1.0)).any()


def _setup(*sets: str, devices: int | None = None):
    cfg = load_config(None, [*MC, *sets])
    setup = build(cfg, 10, num_devices=devices)
    state = setup.init_state(setup.member_keys()["init"], SHAPE)
    return cfg, setup, state


def _layer_keys(model, variables, key) -> list:
    """The key each ``nn.Dropout`` of ``model`` gets from ``make_rng`` in a pass keyed
    ``key`` (read by an interceptor that stands in for the dropout and draws the key as
    the pass does, once per layer)."""
    seen: list = []

    def probe(next_fun, args, kwargs, context):
        if context.method_name == "__call__" and isinstance(context.module, nn.Dropout):
            seen.append(context.module.make_rng("dropout"))
            return args[0]
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(probe):
        model.apply(variables, jnp.zeros((1, *SHAPE)), train=False, rngs={"dropout": key})
    return seen


def _reference_pass(params, x: np.ndarray, layer_key, rate: float) -> np.ndarray:
    """The CNN (Conv32 - ReLU - pool - Conv64 - ReLU - pool - Dense256 - ReLU - dropout -
    Dense) written with lax primitives, example by example, example i's mask
    ``bernoulli(fold_in(layer_key, i))``: softmax probabilities ``[N, C]``."""

    def conv(h, p):
        out = jax.lax.conv_general_dilated(h, p["kernel"], (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return out + p["bias"]

    def pool(h):
        return jax.lax.reduce_window(h, 0.0, jax.lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID") / 4.0

    rows = []
    for i in range(len(x)):
        h = pool(jax.nn.relu(conv(jnp.asarray(x[i : i + 1]), params["Conv_0"])))
        h = pool(jax.nn.relu(conv(h, params["Conv_1"]))).reshape(1, -1)
        h = jax.nn.relu(h @ params["Dense_0"]["kernel"] + params["Dense_0"]["bias"])
        keep = jax.random.bernoulli(jax.random.fold_in(layer_key, i), 1.0 - rate, h.shape[1:])
        h = jnp.where(keep, h / (1.0 - rate), 0.0)
        rows.append(jax.nn.softmax(h @ params["Dense_1"]["kernel"] + params["Dense_1"]["bias"])[0])
    return np.asarray(jnp.stack(rows))


@pytest.mark.slow  # over 1 CPU s with a warm compilation cache: make test-fast leaves it out (docs/development.md)
def test_each_row_is_one_stochastic_pass_of_its_member_with_the_passes_keys():
    cfg, setup, state = _setup("ensemble.mc_samples=3", "eval.batch_size=4")
    members = all_members(cfg, state, setup)
    assert list(members.expand) == [0, 0, 0, 1, 1, 1] and list(members.outputs) == [0, 1, 2, 0, 1, 2]
    images = np.random.default_rng(0).integers(0, 256, (7, *SHAPE), dtype=np.uint8)
    probs, _ = members.predict(cfg, images)
    assert probs.shape == (6, 7, 10)
    x = images.astype(np.float32) / 255.0
    variables = jax.tree.map(np.asarray, state.final_variables)
    for row, (u, t) in enumerate(zip(members.expand, members.outputs, strict=True)):
        params = jax.tree.map(lambda a, u=u: a[u], variables["params"])
        key = jax.random.wrap_key_data(pass_keys(cfg.seed, 2, int(t))[u])
        (layer_key,) = _layer_keys(setup.model, {"params": params}, key)
        np.testing.assert_allclose(probs[row], _reference_pass(params, x, layer_key, 0.5), atol=2e-6)
    assert not np.allclose(probs[0], probs[1])  # the passes differ
    # the MC predictive (the evaluation's ensemble) is the mean of the rows
    np.testing.assert_allclose(probs.mean(0), probs.reshape(2, 3, 7, 10).mean((0, 1)), atol=1e-7)


def test_the_passes_do_not_depend_on_the_batch_size_or_the_mesh():
    images = np.random.default_rng(1).integers(0, 256, (9, *SHAPE), dtype=np.uint8)
    got = []
    for devices, batch in ((8, 16), (1, 3)):
        cfg, setup, state = _setup("ensemble.mc_samples=2", f"eval.batch_size={batch}", devices=devices)
        got.append(all_members(cfg, state, setup).predict(cfg, images)[0])
    np.testing.assert_allclose(got[0], got[1], atol=1e-6)


def test_a_network_without_dropout_and_selection_are_refused_in_one_line():
    cfg = load_config(None, ["model.name=cnn"])
    model = build_model(cfg.model, 10)
    with pytest.raises(ConfigError, match=r"needs dropout, and model.name=cnn has no dropout layer.*fix: set model"):
        check_network(model, "cnn", SHAPE)
    with pytest.raises(ConfigError, match=r"ensemble.select_size chooses among networks.*fix: drop"):
        load_config(None, [*MC, "ensemble.select_size=1", "data.validation_fraction=0.1"])


NNX_NET = "tests.user_models.nnx_nets:BNDropoutNet"


def test_an_nnx_member_s_passes_are_its_layers_with_per_example_masks():
    """An NNX network (BatchNorm in inference mode, nnx.Dropout on): each row equals the
    network's own layers applied in eval mode with example i's mask drawn from its dropout
    stream's key folded with i, written here layer by layer."""
    from flax import nnx

    cfg, setup, state = _setup(f"model.name={NNX_NET}", "model.options={}", "ensemble.mc_samples=2")
    members = all_members(cfg, state, setup)
    images = np.random.default_rng(2).integers(0, 256, (5, *SHAPE), dtype=np.uint8)
    probs, _ = members.predict(cfg, images)
    x = jnp.asarray(images, jnp.float32) / 255.0
    for row, (u, t) in enumerate(zip(members.expand, members.outputs, strict=True)):
        variables = jax.tree.map(lambda a, u=u: jnp.asarray(np.asarray(a)[u]), state.final_variables)
        key = jax.random.wrap_key_data(pass_keys(cfg.seed, 2, int(t))[u])
        net = setup.model.merge(variables, key)
        net.eval()
        h = nnx.relu(net.norm2(net.conv2(nnx.relu(net.norm1(net.conv1(x)))))).mean(axis=(1, 2))
        layer_key = net.dropout.rngs()  # the layer's stream, as nnx.Dropout draws it
        keep = jnp.stack([jax.random.bernoulli(jax.random.fold_in(layer_key, i), 0.75, h.shape[1:]) for i in range(5)])
        want = jax.nn.softmax(net.head(jnp.where(keep, h / 0.75, 0.0)))
        np.testing.assert_allclose(probs[row], np.asarray(want), atol=2e-6)
    assert not np.allclose(probs[0], probs[1])


def test_a_users_linen_network_with_a_mode_argument_and_its_own_batchnorm_axis_is_accepted():
    """``__call__(x, training)`` with ``BatchNorm(axis_name='batch')`` (Flax's ImageNet
    example's conventions): its dropout is found by tracing it as the step does; the
    check called it without its mode argument and failed (TypeError)."""
    cfg = load_config(None, ["model.name=tests.user_models.paced_nets:PacedLinenNet"])
    check_network(build_model(cfg.model, 10), cfg.model.name, (28, 28, 1))  # no error
