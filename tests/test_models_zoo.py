"""The model zoo: ResNet (He et al. 2016), WRN (Zagoruyko & Komodakis 2016), LeNet-5 (Uncertainty Baselines).

Parameter counts against the published numbers (shapes only, ``jax.eval_shape``), output
shapes, the ``'batch_stats'`` collection, BatchNorm in training and evaluation, dropout, and
the ``Options`` each module validates. Networks that really run are small (CPU).
"""

import math
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from pydantic import ValidationError

from ensemble_core.config import MODEL_NAMES, ModelConfig
from ensemble_core.models import build_model, lenet5, resnet, wide_resnet
from ensemble_core.resnet_blocks import batch_norm, shortcut_option_a


def cfg(name: str, **options):
    """The model config ``name`` with ``model.options`` = ``options``."""
    return ModelConfig(name=name, options=options)


def variables_shape(model, shape=(1, 32, 32, 3)):
    return jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros(shape), train=False))


def param_count(model, shape=(1, 32, 32, 3)) -> int:
    return sum(int(np.prod(a.shape)) for a in jax.tree.leaves(variables_shape(model, shape)["params"]))


# The networks that run, run on this batch shape: odd sizes (stride 2 rounds up), few pixels, one compile.
ODD = (4, 9, 7, 3)


def init(model, x: jnp.ndarray) -> dict:
    """``model.init`` with an 'rbg' key: its random bits compile about 3x faster on a CPU than threefry's."""
    return model.init(jax.random.key(0, impl="rbg"), x, train=False)


def images(key: int, shape=ODD) -> jnp.ndarray:
    return jax.random.uniform(jax.random.key(key), shape)


# Small networks that run fast on a CPU: one block per stage, a few channels.
SMALL = {
    "resnet": {"depth": 8, "width": 4},
    "wide_resnet": {"depth": 10, "widen_factor": 1},
    "lenet5": {},
}


# ---------------------------------------------------------------- parameter counts


@pytest.mark.parametrize(("depth", "paper"), [(20, 0.27e6), (32, 0.46e6), (44, 0.66e6), (56, 0.85e6), (110, 1.7e6)])
def test_resnet_parameter_count_is_the_papers(depth, paper):
    """He et al. 2016, Table 6 (CIFAR-10): ResNet-20/32/44/56/110."""
    n = param_count(resnet.build(cfg("resnet", depth=depth), 10))
    assert abs(n - paper) / paper < 0.02, n


def test_resnet_default_parameter_count_is_the_docstrings():
    assert param_count(resnet.build(cfg("resnet"), 10)) == 269_722
    assert param_count(resnet.build(cfg("resnet", batch_norm=False), 10)) == 269_034


@pytest.mark.parametrize(
    ("depth", "k", "paper"), [(16, 4, 2.7e6), (28, 10, 36.5e6), (40, 4, 8.9e6), (16, 8, 11.0e6), (22, 8, 17.2e6)]
)
def test_wide_resnet_parameter_count_is_the_papers(depth, k, paper):
    """Zagoruyko & Komodakis 2016, the "# params" of the CIFAR tables (Sec. 3)."""
    n = param_count(wide_resnet.build(cfg("wide_resnet", depth=depth, widen_factor=k), 10))
    assert abs(n - paper) / paper < 0.02, n


def test_wide_resnet_default_is_wrn_28_10():
    assert param_count(wide_resnet.build(cfg("wide_resnet"), 10)) == 36_479_194


def lenet5_hand_count(h: int, w: int, c: int, classes: int) -> int:
    """Kernels + biases of UB's LeNet-5, 'SAME' convolutions and pooling (ceil division)."""
    h4, w4 = math.ceil(math.ceil(h / 2) / 2), math.ceil(math.ceil(w / 2) / 2)
    convs = (5 * 5 * c * 6 + 6) + (5 * 5 * 6 * 16 + 16) + (5 * 5 * 16 * 120 + 120)
    dense = (h4 * w4 * 120 * 84 + 84) + (84 * classes + classes)
    return convs + dense


@pytest.mark.parametrize(("shape", "docstring"), [((1, 28, 28, 1), 545_546), ((1, 32, 32, 3), 697_046)])
def test_lenet5_parameter_count_is_the_hand_count(shape, docstring):
    n = param_count(lenet5.build(cfg("lenet5"), 10), shape)
    assert n == lenet5_hand_count(*shape[1:], 10) == docstring


def test_lenet5_layers_are_ubs():
    """Conv 6/16/120 5x5, Dense 84, Dense classes; 28x28 -> 7x7x120 flattened (two 'SAME' 2x2 pools)."""
    params = variables_shape(lenet5.build(cfg("lenet5"), 10), (1, 28, 28, 1))["params"]
    shapes = {name: layer["kernel"].shape for name, layer in params.items()}
    assert shapes == {
        "Conv_0": (5, 5, 1, 6),
        "Conv_1": (5, 5, 6, 16),
        "Conv_2": (5, 5, 16, 120),
        "Dense_0": (7 * 7 * 120, 84),
        "Dense_1": (84, 10),
    }


# ---------------------------------------------------------------- shapes and collections


@pytest.mark.parametrize("name", sorted(SMALL))
@pytest.mark.parametrize("shape", [(2, 28, 28, 1), (3, 32, 32, 3), (2, 9, 7, 1)])
def test_output_is_float32_logits(name, shape):
    """Shapes and dtypes by tracing only (``jax.eval_shape``): the networks run in the tests below."""
    model = build_model_with(name, num_classes=7)
    x = jax.ShapeDtypeStruct(shape, jnp.float32)
    variables = jax.eval_shape(lambda x: model.init(jax.random.key(1), x, train=False), x)
    for train in (False, True):
        out, _ = jax.eval_shape(
            lambda v, x, train=train: model.apply(
                v, x, train=train, mutable=["batch_stats"], rngs={"dropout": jax.random.key(2)}
            ),
            variables,
            x,
        )
        assert out.shape == (shape[0], 7)
        assert out.dtype == jnp.float32


def build_model_with(name: str, num_classes: int = 10, **overrides):
    return {"resnet": resnet, "wide_resnet": wide_resnet, "lenet5": lenet5}[name].build(
        cfg(name, **{**SMALL[name], **overrides}), num_classes
    )


def test_the_registry_builds_them():
    for name in SMALL:
        assert name in MODEL_NAMES
        model = build_model(ModelConfig(name=name), 10)  # no options: the defaults
        assert type(model).__module__ == f"ensemble_core.models.{name}"


@pytest.mark.parametrize(
    ("name", "overrides", "collections"),
    [
        ("resnet", {}, {"params", "batch_stats"}),
        ("resnet", {"batch_norm": False}, {"params"}),
        ("wide_resnet", {}, {"params", "batch_stats"}),
        ("lenet5", {}, {"params"}),
    ],
)
def test_collections(name, overrides, collections):
    variables = variables_shape(build_model_with(name, **overrides))
    assert set(variables) == collections


def test_resnet_without_batch_norm_has_conv_biases_instead():
    params = variables_shape(build_model_with("resnet", batch_norm=False))["params"]
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    names = {"/".join(str(k.key) for k in path) for path, _ in flat}
    assert not any("BatchNorm" in n for n in names)
    assert "Conv_0/bias" in names and "BasicBlock_0/Conv_0/bias" in names


def test_option_a_shortcut_subsamples_and_zero_pads():
    x = images(0, (2, 7, 8, 3))
    y = shortcut_option_a(x, 5, 2)
    assert y.shape == (2, 4, 4, 5)
    np.testing.assert_array_equal(y[..., :3], x[:, ::2, ::2])
    np.testing.assert_array_equal(y[..., 3:], 0)
    np.testing.assert_array_equal(shortcut_option_a(x, 3, 1), x)


# ---------------------------------------------------------------- BatchNorm


def test_batch_norm_is_flax_imagenets():
    """Evaluation: (x - mean) / sqrt(var + 1e-5) * scale + bias with the running statistics;
    training: the batch's statistics, and running = 0.9 * running + 0.1 * batch."""
    x = images(0, (6, 3, 3, 4)) * 3 + 1
    mean, var = jnp.arange(4.0), jnp.arange(1.0, 5.0)
    scale, bias = jnp.linspace(0.5, 2.0, 4), jnp.linspace(-1.0, 1.0, 4)
    variables = {"params": {"scale": scale, "bias": bias}, "batch_stats": {"mean": mean, "var": var}}
    out = batch_norm(False).apply(variables, x)
    np.testing.assert_allclose(out, (x - mean) / jnp.sqrt(var + 1e-5) * scale + bias, rtol=1e-5, atol=1e-5)
    out, updated = batch_norm(True).apply(variables, x, mutable=["batch_stats"])
    bmean, bvar = x.mean(axis=(0, 1, 2)), x.var(axis=(0, 1, 2))
    np.testing.assert_allclose(out, (x - bmean) / jnp.sqrt(bvar + 1e-5) * scale + bias, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(updated["batch_stats"]["mean"], 0.9 * mean + 0.1 * bmean, rtol=1e-5)
    np.testing.assert_allclose(updated["batch_stats"]["var"], 0.9 * var + 0.1 * bvar, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet", "wide_resnet"])
def test_train_updates_batch_stats_and_eval_uses_them(name):
    model = build_model_with(name)
    x, other = images(0, ODD), images(1, ODD)
    variables = init(model, x)
    _, updated = model.apply(variables, x, train=True, mutable=["batch_stats"])
    changed = jax.tree.map(lambda a, b: bool(jnp.any(a != b)), variables["batch_stats"], updated["batch_stats"])
    assert all(jax.tree.leaves(changed))
    # Evaluation: running averages, so an example's logits do not depend on the rest of its batch ...
    trained = {**variables, **updated}
    alone = model.apply(trained, x, train=False)
    assert bool(jnp.all(jnp.isfinite(alone)))
    together = model.apply(trained, jnp.concatenate([x[:2], other[2:]]), train=False)
    np.testing.assert_allclose(together[:2], alone[:2], rtol=1e-5, atol=1e-5)
    # ... and they are the running averages: other statistics give other logits.
    assert not np.allclose(model.apply(variables, x, train=False), alone, atol=1e-5)
    # Training: the batch's statistics, so the rest of the batch matters.
    first, _ = model.apply(trained, x, train=True, mutable=["batch_stats"])
    second, _ = model.apply(trained, jnp.concatenate([x[:2], other[2:]]), train=True, mutable=["batch_stats"])
    assert not np.allclose(first[:2], second[:2], atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "overrides"), [("resnet", {"batch_norm": False}), ("lenet5", {})])
def test_without_batch_norm_training_is_per_example_too(name, overrides):
    model = build_model_with(name, **overrides)
    x, other = images(0, ODD), images(1, ODD)
    variables = init(model, x)
    first = model.apply(variables, x, train=True)
    second = model.apply(variables, jnp.concatenate([x[:2], other[2:]]), train=True)
    np.testing.assert_allclose(first[:2], second[:2], rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- dropout


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet", "wide_resnet"])
def test_dropout(name):
    model = build_model_with(name, dropout_rate=0.5)
    x = images(0, ODD)
    variables = init(model, x)

    def train(key: int) -> jnp.ndarray:
        out, _ = model.apply(variables, x, train=True, mutable=["batch_stats"], rngs={"dropout": jax.random.key(key)})
        return out

    np.testing.assert_array_equal(train(1), train(1))
    assert not np.allclose(train(1), train(2), atol=1e-5)
    # Evaluation: no dropout, no RNG needed; the same function as the network without dropout.
    evaluated = model.apply(variables, x, train=False)
    np.testing.assert_array_equal(evaluated, model.apply(variables, x, train=False))
    without = build_model_with(name, dropout_rate=0.0)
    np.testing.assert_allclose(without.apply(variables, x, train=False), evaluated, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- options


@pytest.mark.parametrize(
    ("module", "options"),
    [
        (resnet, {"depht": 20}),
        (resnet, {"depth": 21}),
        (resnet, {"depth": 2}),
        (resnet, {"depth": 14, "widen_factor": 2}),
        (resnet, {"width": 0}),
        (resnet, {"dropout_rate": 1.0}),
        (resnet, {"dropout_rate": -0.1}),
        (resnet, {"dropout_rate": float("nan")}),
        (wide_resnet, {"depth": 27}),
        (wide_resnet, {"depth": 4}),
        (wide_resnet, {"width": 16}),
        (wide_resnet, {"widen_factor": 0}),
        (lenet5, {"dropout_rate": 0.1}),
    ],
)
def test_options_refuse(module, options):
    with pytest.raises(ValidationError):
        module.Options.model_validate(options)
    with pytest.raises(ValidationError):
        module.build(SimpleNamespace(name=module.__name__.rsplit(".", 1)[1], options=options), 10)


def test_options_accept_and_are_frozen():
    opts = resnet.Options.model_validate({"depth": 56, "width": 32, "dropout_rate": 0.1, "batch_norm": False})
    assert (opts.depth, opts.width, opts.dropout_rate, opts.batch_norm) == (56, 32, 0.1, False)
    assert wide_resnet.Options.model_validate({"depth": 16, "widen_factor": 4}).depth == 16
    with pytest.raises(ValidationError):
        opts.depth = 20
    for module in (resnet, wide_resnet):
        assert all(f.description for f in module.Options.model_fields.values())
    model = resnet.build(cfg("resnet", depth=56, width=32, dropout_rate=0.1, batch_norm=False), 100)
    assert (model.depth, model.width, model.dropout_rate, model.batch_norm) == (56, 32, 0.1, False)
    assert model.num_classes == 100
    assert resnet.build(ModelConfig(name="resnet"), 10).depth == 20
