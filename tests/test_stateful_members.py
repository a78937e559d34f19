"""Members with mutable collections (BatchNorm's batch_stats), dropout and on-device
augmentation: against Flax's own single-model pattern, across topologies, in inference."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from ensemble_core import rngs
from ensemble_core.train import unstacked
from ensemble_core.train.augment import augment
from ensemble_core.train.forward import init_variables
from tests.ensembles import BATCH, small_setup, train_small
from tests.oracles import train_stateful_member_alone

USER_MODEL = "tests.user_models.bn_dropout_net:build"
N_TRAIN = 128
AUGMENT = {"crop_padding": 2, "flip": True}


def _setup(e=4, strategy="unroll", augment_cfg=None, **kw):
    return small_setup(USER_MODEL, e, strategy, options={"width": 4}, augment=augment_cfg, lr=0.05, **kw)


def _close(a, b, atol=1e-5):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=atol, rtol=1e-4)


def _train(mnist_train, built, epochs=1):
    images, labels = mnist_train[0][:N_TRAIN], mnist_train[1][:N_TRAIN]
    state, _ = train_small(built, images, labels, epochs=epochs)
    return state


@pytest.mark.slow
# make soak: vmap too (make test: unroll here; the vmapped step in the any-mesh test below)
@pytest.mark.parametrize("strategy", ["unroll", pytest.param("vmap", marks=pytest.mark.soak)])
def test_a_batchnorm_dropout_member_equals_flax_trainstate_alone(mnist_train, strategy):
    """Each member equals the same network trained alone with Flax's TrainState +
    batch_stats pattern, its dropout and augmentation keys fold_in(fold_in(key, step), 0|1).

    Why not shorter (up to a minute under load, most of it XLA compiling): the stacked
    step and each member's own jitted step are compiled once each, for every strategy."""
    images, labels = mnist_train[0][:N_TRAIN], mnist_train[1][:N_TRAIN]
    e = 4
    built = _setup(e, strategy, AUGMENT, ensemble=2)
    state, _ = train_small(built, images, labels)
    keys = rngs.member_keys(0, e)
    order = rngs.epoch_order(keys["data"], 0, N_TRAIN, BATCH)  # [S, E, B]
    assert set(state.model_state) == {"batch_stats"}
    for m in range(e):
        variables = dict(built.model.init(keys["init"][m], np.zeros((1, 28, 28, 1), np.float32), train=False))
        step_keys = [
            tuple(jax.random.fold_in(jax.random.fold_in(keys["stochastic"][m], s), i) for i in (0, 1))
            for s in range(len(order))
        ]
        params, batch_stats = train_stateful_member_alone(
            built.model,
            built.optimizer,
            variables,
            images,
            labels,
            order[:, m],
            step_keys,
            augment=lambda k, x: augment(k, x, global_batch=len(x), first_row=0, crop_padding=2, flip=True),
        )
        # float32 rounding (the batch mean written as a sum over the global batch, the
        # statistics' pmean), amplified through the normalisation over the steps: a few 1e-5
        _close(unstacked(state.params, m), params, atol=5e-5)
        _close(unstacked(state.model_state["batch_stats"], m), batch_stats, atol=5e-5)


@pytest.fixture(scope="module")
def one_device(mnist_train):
    """The reference of the topology tests: 4 members on one device."""
    return _train(mnist_train, _setup(4, "unroll", AUGMENT, devices=1))


@pytest.mark.slow
@pytest.mark.parametrize(
    "devices, ensemble, data",
    [
        # make soak: two more meshes (make test: ensemble 4 x data 2, BatchNorm statistics
        # over a member's data shards, and tests/test_train.py's meshes for stateless members)
        pytest.param(2, 2, 1, marks=pytest.mark.soak),
        (8, 4, 2),
        pytest.param(4, 1, 4, marks=pytest.mark.soak),
    ],
)
def test_same_members_with_batchnorm_dropout_and_augmentation_on_any_mesh(
    mnist_train, one_device, devices, ensemble, data
):
    """BatchNorm statistics, dropout masks and augmentations are those of each member's
    whole batch, however the batch is split over 'data'."""
    ref = one_device
    got = _train(mnist_train, _setup(4, "vmap", AUGMENT, devices=devices, ensemble=ensemble, data=data))
    assert got.params["Dense_0"]["kernel"].sharding.mesh.shape == {"ensemble": ensemble, "data": data}
    # Measured on (8, 4, 2): at most 1.4e-4 apart (float32 rounding of the split sums, through
    # BatchNorm); drawing dropout masks per shard instead puts members 1e-2 apart, augmenting
    # per shard 1.5e-2, and per-shard statistics are refused by shard_map's replication check.
    _close(got.variables, ref.variables, atol=5e-4)


@pytest.mark.slow
def test_a_user_axis_name_is_replaced_by_the_data_axis(mnist_train):
    """A network copied from Flax's ImageNet example names its BatchNorm axis 'batch' (its
    pmap axis); in the ensemble the statistics are averaged over the member's batch anyway."""
    ref = _train(mnist_train, small_setup(USER_MODEL, 2, options={"width": 4}, lr=0.05, devices=1))
    got = _train(
        mnist_train,
        small_setup(USER_MODEL, 2, options={"width": 4, "axis_name": "batch"}, lr=0.05, devices=4, ensemble=2, data=2),
    )
    _close(got.variables, ref.variables, atol=5e-5)


@pytest.mark.slow
def test_members_draw_different_dropout_masks_and_augmentations(mnist_train):
    """Members with the same initialisation and data order still differ: their dropout and
    augmentation keys are their own."""
    images, labels = mnist_train[0][:N_TRAIN], mnist_train[1][:N_TRAIN]
    built = _setup(2, "unroll", AUGMENT, devices=1)
    keys = built.member_keys()
    same = {k: jax.numpy.stack([v[0], v[0]]) for k, v in keys.items() if k != "stochastic"}
    state = built.init_state(same["init"], (28, 28, 1))
    from ensemble_core.mesh import replicated
    from ensemble_core.train import fit

    state, _ = fit(
        state,
        built.train_step(),
        jax.device_put(images, replicated(built.mesh)),
        jax.device_put(labels, replicated(built.mesh)),
        same["data"],
        built.mesh,
        stochastic_keys=keys["stochastic"],
        epochs=1,
        batch_size=BATCH,
    )
    a, b = (np.asarray(unstacked(state.params, m)["Dense_0"]["kernel"]) for m in (0, 1))
    assert np.abs(a - b).max() > 1e-3
    state2, _ = fit(
        built.init_state(same["init"], (28, 28, 1)),
        built.train_step(),
        jax.device_put(images, replicated(built.mesh)),
        jax.device_put(labels, replicated(built.mesh)),
        same["data"],
        built.mesh,
        stochastic_keys=jax.numpy.stack([keys["stochastic"][0]] * 2),
        epochs=1,
        batch_size=BATCH,
    )
    np.testing.assert_array_equal(*(np.asarray(unstacked(state2.params, m)["Dense_0"]["kernel"]) for m in (0, 1)))


@pytest.mark.slow
def test_inference_uses_the_running_averages(mnist_train):
    """Evaluation applies each member with train=False: normalised by its batch_stats, so
    an example's prediction does not depend on the rest of its batch."""
    built = _setup(2, "unroll", devices=1)
    state = _train(mnist_train, built)
    images = mnist_train[0][:64]
    predict = built.predict_fn()
    from ensemble_core.predict import member_probs

    whole = member_probs(predict, state.variables, images, built.mesh, 64)
    alone = member_probs(predict, state.variables, images[:8], built.mesh, 8)
    np.testing.assert_allclose(whole[:, :8], alone, rtol=1e-5, atol=1e-6)
    variables = jax.tree.map(lambda x: np.asarray(x[0]), state.variables)
    logits = built.model.apply(variables, images[:8].astype(np.float32) / 255.0, train=False)
    np.testing.assert_allclose(whole[0, :8], jax.nn.softmax(logits), rtol=1e-5, atol=1e-6)
    stats = variables["batch_stats"]
    init = init_variables(built.model, jax.random.key(0), (28, 28, 1))["batch_stats"]
    moved = [
        np.abs(np.asarray(a) - np.asarray(b)).max()
        for a, b in zip(jax.tree.leaves(stats), jax.tree.leaves(init), strict=True)
    ]
    assert min(moved) > 1e-3  # the running averages were updated by training


@pytest.mark.soak  # make test: the any-mesh test above (BatchNorm statistics over a data axis of 2)
def test_a_resnet_member_does_not_depend_on_how_its_batch_is_split(mnist_train):
    """A CIFAR ResNet with BatchNorm at initialisation amplifies float32 rounding: with
    XLA:CPU's own convolutions (which round differently for a batch of 32 and two of 16)
    one step's update differed by 3e-2 of itself between data=1 and data=2. The step of a
    BatchNorm network is compiled with YNNPACK's convolutions (train_compiler_options),
    which agree across the split: measured 2e-5."""
    images, labels = mnist_train[0][:BATCH], mnist_train[1][:BATCH]
    options = {"depth": 8, "width": 4}
    runs = {}
    for data in (1, 2):
        built = small_setup("resnet", 1, "unroll", options=options, lr=0.05, devices=data, ensemble=1, data=data)
        initial = built.init_state(built.member_keys()["init"], (28, 28, 1))
        runs[data] = (train_small(built, images, labels, state=initial)[0], initial)
    (one, start), (two, _) = runs[1], runs[2]
    for a, b, i in zip(
        jax.tree.leaves(two.params), jax.tree.leaves(one.params), jax.tree.leaves(start.params), strict=True
    ):
        a, b, i = np.asarray(a), np.asarray(b), np.asarray(i)
        assert np.abs(a - b).max() <= 1e-3 * np.abs(b - i).max(), np.abs(a - b).max() / np.abs(b - i).max()
