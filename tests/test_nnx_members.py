"""NNX members (``flax.nnx.Module`` networks named by class path, in a user's own file):
a member equals the same network trained alone with ``nnx.Optimizer``; dropout masks
come from the member's key and the step only (different across members, the same
however often the module ran before, as after a resume); the members do not depend on
how their batches are split over the mesh; the mode conventions; the refusals."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from ensemble_core import rngs
from ensemble_core.config import load_config
from ensemble_core.data import to_float
from ensemble_core.errors import ConfigError
from ensemble_core.models import build_model, check_model
from ensemble_core.train import unstacked
from ensemble_core.train.forward import (
    apply_inference,
    apply_train,
    convention,
    init_variables,
    mode,
    split_variables,
    train_unsharded,
)
from ensemble_core.train.nnx_member import NnxNetwork
from tests.ensembles import BATCH, small_setup, train_small
from tests.user_models import nnx_nets

NETS = "tests.user_models.nnx_nets"
N_TRAIN = 128


def _net(name: str, options: str = "{}", num_classes: int = 10):
    cfg = load_config(None, [f"model.name={NETS}:{name}", f"model.options={options}"])
    return cfg, build_model(cfg.model, num_classes)


def _close(a, b, atol):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=atol, rtol=1e-4)


def test_an_nnx_class_is_built_with_its_options_and_its_variables_are_linen_named_collections():
    _, net = _net("BNDropoutNet", "{width: 4}", num_classes=7)
    assert isinstance(net, NnxNetwork) and net.module_type is nnx_nets.BNDropoutNet
    variables = init_variables(net, jax.random.key(3), (28, 28, 1))
    assert set(variables) == {"params", "batch_stats"}
    assert variables["params"]["head"]["kernel"].shape == (8, 7)  # 2 * width -> num_classes
    assert set(variables["batch_stats"]["norm1"]) == {"mean", "var"}
    # the same arrays as the user's class constructed directly from the member's key
    direct = nnx_nets.BNDropoutNet(num_classes=7, width=4, rngs=nnx.Rngs(jax.random.key(3)))
    np.testing.assert_array_equal(variables["params"]["conv1"]["kernel"], direct.conv1.kernel[...])
    assert "model.train() / model.eval()" in convention(net)


def test_inference_is_the_module_in_eval_mode_and_training_drops_units():
    """Inference equals the user's module in ``eval()`` mode (the reference: Flax itself);
    training mode uses the batch's statistics and dropout (it differs)."""
    _, net = _net("BNDropoutNet", "{width: 4, axis_name: null}")
    variables = init_variables(net, jax.random.key(0), (28, 28, 1))
    x = jax.random.uniform(jax.random.key(1), (8, 28, 28, 1))
    module = nnx_nets.BNDropoutNet(width=4, axis_name=None, rngs=nnx.Rngs(jax.random.key(0)))
    module.eval()
    np.testing.assert_allclose(apply_inference(net, variables, x), module(x), rtol=1e-6, atol=1e-6)
    logits, updated = train_unsharded(net, variables, x)
    assert not np.allclose(np.asarray(logits), np.asarray(module(x)))
    assert not np.allclose(updated["batch_stats"]["norm1"]["mean"], variables["batch_stats"]["norm1"]["mean"])


def test_a_mode_argument_of_an_nnx_module_is_passed_too():
    _, net = _net("TrainArgNet")
    assert mode(net, True) == {"train": True} and mode(net, False) == {"train": False}
    variables = init_variables(net, jax.random.key(0), (28, 28, 1))
    x = jax.random.uniform(jax.random.key(1), (8, 28, 28, 1))
    inference = apply_inference(net, variables, x)
    training, _ = train_unsharded(net, variables, x)
    assert not np.allclose(np.asarray(training), np.asarray(inference))  # its dropout ran


def test_dropout_masks_come_from_the_member_key_and_step_only():
    """The RNG state is not carried: the same key gives the same masks on a module that
    has already run (as after a resume), another member's key other masks."""
    _, net = _net("BNDropoutNet", "{width: 4}")
    params, state = split_variables(init_variables(net, jax.random.key(0), (28, 28, 1)))
    x = jax.random.uniform(jax.random.key(1), (8, 28, 28, 1))

    def train(key):
        return jax.vmap(
            lambda p, s: apply_train(net, p, s, x, key, 1)[0], in_axes=(None, None), axis_size=1, axis_name="data"
        )(params, state)[0]

    member_a, member_b = jax.random.key(10), jax.random.key(11)
    first = jax.jit(train)(member_a)
    np.testing.assert_array_equal(jax.jit(lambda k: train(k))(member_a), first)  # again, compiled afresh
    assert not np.allclose(np.asarray(jax.jit(train)(member_b)), np.asarray(first))


@pytest.mark.slow
# make soak: vmap too (make test: unroll here, and vmap in the topology test below)
@pytest.mark.parametrize("strategy", ["unroll", pytest.param("vmap", marks=pytest.mark.soak)])
def test_an_nnx_member_equals_the_network_trained_alone_with_nnx_optimizer(mnist_train, strategy):
    """Each member of the ensemble equals the user's network constructed from the
    member's init key and trained alone the NNX way: ``nnx.Optimizer``,
    ``nnx.value_and_grad``, ``model.train()``, its dropout stream seeded each step with
    the member's key for that step (``fold_in(fold_in(key, step), 0)``, stream 0)."""
    images, labels = mnist_train[0][:N_TRAIN], mnist_train[1][:N_TRAIN]
    e = 2
    built = small_setup(f"{NETS}:BNDropoutNet", e, strategy, options={"width": 4, "axis_name": None}, lr=0.05)
    state, _ = train_small(built, images, labels)
    keys = rngs.member_keys(0, e)
    order = rngs.epoch_order(keys["data"], 0, N_TRAIN, BATCH)  # [S, E, B]

    @nnx.jit
    def step(model, optimizer, x, y):
        def loss_fn(model):
            return optax.losses.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

        grads = nnx.grad(loss_fn)(model)
        optimizer.update(model, grads)

    for m in range(e):
        model = nnx_nets.BNDropoutNet(width=4, axis_name=None, rngs=nnx.Rngs(keys["init"][m]))
        optimizer = nnx.Optimizer(model, built.optimizer, wrt=nnx.Param)
        model.train()
        for s, idx in enumerate(order[:, m]):
            dropout_key = jax.random.fold_in(jax.random.fold_in(keys["stochastic"][m], s), 0)
            model.dropout.rngs.key.set_value(jax.random.fold_in(dropout_key, 0))
            model.dropout.rngs.count.set_value(jnp.zeros((), jnp.uint32))
            step(model, optimizer, to_float(images[idx]), labels[idx])
        got = unstacked(state.variables, m)
        _close(got["params"]["conv1"]["kernel"], model.conv1.kernel[...], atol=5e-5)
        _close(got["params"]["head"], {"bias": model.head.bias[...], "kernel": model.head.kernel[...]}, atol=5e-5)
        _close(got["batch_stats"]["norm2"], {"mean": model.norm2.mean[...], "var": model.norm2.var[...]}, atol=5e-5)


@pytest.mark.slow
def test_nnx_members_do_not_depend_on_how_their_batches_are_split(mnist_train):
    """BatchNorm (its own axis_name 'batch' replaced by the data axis) and dropout of the
    member's whole batch: 4 members on one device equal 4 members over ensemble 4 x data 2."""
    images, labels = mnist_train[0][:N_TRAIN], mnist_train[1][:N_TRAIN]
    options = {"width": 4, "axis_name": "batch"}
    one_device = small_setup(f"{NETS}:BNDropoutNet", 4, "unroll", options=options, lr=0.05, devices=1)
    ref, _ = train_small(one_device, images, labels)
    split = small_setup(f"{NETS}:BNDropoutNet", 4, "vmap", options=options, lr=0.05, devices=8, ensemble=4, data=2)
    got, _ = train_small(split, images, labels)
    assert got.params["head"]["kernel"].sharding.mesh.shape == {"ensemble": 4, "data": 2}
    _close(got.variables, ref.variables, atol=5e-4)
    a, b = (np.asarray(unstacked(got.params, m)["head"]["kernel"]) for m in (0, 1))
    assert np.abs(a - b).max() > 1e-3  # members differ


def test_the_memory_estimate_of_an_nnx_network_is_that_of_the_same_linen_network():
    """The registry's Linen CNN and the same CNN in NNX (``nnx_nets.CNN``): the same
    parameters, and the same layer outputs (NNX's ``nnx.capture`` against Linen's
    ``capture_intermediates``: each layer's output and the network's)."""
    from ensemble_core import ensemble_setup as setup
    from ensemble_core import memory

    estimates = []
    for name in ("cnn", f"{NETS}:CNN"):
        cfg = load_config(None, [f"model.name={name}", "ensemble.size=8", "train.batch_size=32"])
        estimates.append(memory.estimate(cfg, setup.plan(cfg), 10, (28, 28, 1), 1000, "vmap"))
    linen, nnx_cnn = estimates
    assert nnx_cnn == linen
    # conv 28x28x32, conv 14x14x64, dense 256, dense 10, the network's 10: per image
    assert linen.activation_bytes == linen.members_per_device * 32 * (28 * 28 * 32 + 14 * 14 * 64 + 256 + 10 + 10) * 4


def test_refusals_name_the_cause():
    with pytest.raises(ConfigError, match="without taking rngs, so every member would start from the same weights"):
        _net("FixedSeedNet")
    cfg, net = _net("NoClassesNet", num_classes=7)  # 10 logits written in: checked against the dataset's classes
    with pytest.raises(ConfigError, match="takes no num_classes and returns logits of width 10, but the dataset has 7"):
        check_model(net, cfg.model, (28, 28, 1), 7)
    cfg, net = _net("NoClassesNet")
    assert check_model(net, cfg.model, (28, 28, 1), 10) == 7850
    with pytest.raises(ConfigError, match=r"needs a newer flax than the installed .*LayerFromAFutureFlax"):
        build_model(load_config(None, ["model.name=tests.user_models.needs_newer_flax:Net"]).model, 10)
    cfg, net = _net("CNN", "{num_classes: 3}")  # logits of the wrong shape
    with pytest.raises(ConfigError, match=r"returns an array of shape \(2, 3\).*not float logits \[2, 10\]"):
        check_model(net, cfg.model, (28, 28, 1), 10)


def test_an_nnx_network_on_a_flax_too_old_is_refused(monkeypatch):
    import flax

    monkeypatch.setattr(flax, "__version__", "0.8.5")
    with pytest.raises(ConfigError, match=r"NNX members need Flax >= 0\.12; this environment has Flax 0\.8\.5"):
        _net("CNN")
