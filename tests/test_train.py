"""Training: struct-of-arrays equals per-member training; topology invariance; mesh plans."""

import jax
import numpy as np
import pytest

from ensemble_core import mesh as mesh_lib
from ensemble_core import rngs
from ensemble_core.errors import MeshError
from ensemble_core.train import fit, unstacked
from tests.ensembles import BATCH, small_setup, train_small
from tests.oracles import train_member_alone

N_TRAIN = 256


def _assert_trees_close(a, b, atol=1e-5):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=atol, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("model_name, strategy", [("cnn", "unroll"), ("cnn", "vmap"), ("mlp", "vmap")])
def test_stacked_ensemble_equals_members_trained_alone(mnist_train, model_name, strategy):
    images, labels = mnist_train[0][:N_TRAIN], mnist_train[1][:N_TRAIN]
    e = 4
    built = small_setup(model_name, e, strategy, ensemble=2)
    model, tx = built.model, built.optimizer
    state, timing = train_small(built, images, labels)
    assert int(state.step) == timing["steps"] == N_TRAIN // BATCH

    keys = rngs.member_keys(0, e)
    order = rngs.epoch_order(keys["data"], 0, N_TRAIN, BATCH)  # [S, E, B]
    for m in range(e):
        params0 = model.init(keys["init"][m], np.zeros((1, 28, 28, 1), np.float32))["params"]
        alone = train_member_alone(model, tx, params0, images, labels, order[:, m])
        _assert_trees_close(unstacked(state.params, m), alone)


@pytest.mark.slow
@pytest.mark.parametrize(
    "ensemble_axis, data_axis",
    [
        # make test: ensemble 2 x data 2 (members split over one axis, batches over the
        # other); make soak: the reference's own layout again, each axis alone, four ways
        pytest.param(1, 1, marks=pytest.mark.soak),
        pytest.param(2, 1, marks=pytest.mark.soak),
        pytest.param(4, 1, marks=pytest.mark.soak),
        (2, 2),
        pytest.param(1, 4, marks=pytest.mark.soak),
    ],
)
def test_same_members_on_any_mesh(mnist_train, ensemble_axis, data_axis):
    images, labels = mnist_train[0][:N_TRAIN], mnist_train[1][:N_TRAIN]
    ref, _ = train_small(small_setup("cnn", 4, "unroll", devices=1), images, labels)
    built = small_setup("cnn", 4, "unroll", devices=ensemble_axis * data_axis, ensemble=ensemble_axis, data=data_axis)
    got, _ = train_small(built, images, labels)
    assert got.params["Dense_0"]["kernel"].sharding.mesh.shape == {"ensemble": ensemble_axis, "data": data_axis}
    # Splitting a batch over 'data' sums its gradient in another order: float32 rounding
    # differences, grown over the training steps to a few 1e-5.
    _assert_trees_close(got.params, ref.params, atol=1e-5 if data_axis == 1 else 5e-5)


@pytest.mark.slow
def test_member_is_independent_of_ensemble_size(mnist_train):
    images, labels = mnist_train[0][:N_TRAIN], mnist_train[1][:N_TRAIN]
    small, _ = train_small(small_setup("mlp", 2), images, labels)
    big, _ = train_small(small_setup("mlp", 6), images, labels)
    _assert_trees_close(unstacked(small.params, 1), unstacked(big.params, 1))


@pytest.mark.slow
def test_training_reduces_loss(mnist_train):
    images, labels = mnist_train[0][:1024], mnist_train[1][:1024]
    built = small_setup("mlp", 2, hidden=(64,), lr=0.05)
    keys = built.member_keys()
    state = built.init_state(keys["init"], (28, 28, 1))
    records = []
    fit(
        state,
        built.train_step(),
        jax.device_put(images),
        jax.device_put(labels),
        keys["data"],
        built.mesh,
        stochastic_keys=keys["stochastic"],
        epochs=3,
        batch_size=BATCH,
        on_epoch_end=lambda e, s, r: records.append(r),
    )
    assert len(records) == 3
    first, last = np.asarray(records[0]["train_loss"]), np.asarray(records[-1]["train_loss"])
    assert np.all(last < 0.5 * first)
    assert np.all(np.asarray(records[-1]["train_accuracy"]) > 0.8)


def test_mesh_plans():
    assert mesh_lib.plan_mesh(8, 8) == mesh_lib.MeshPlan(8, 1, 8, 8)
    assert mesh_lib.plan_mesh(6, 8) == mesh_lib.MeshPlan(6, 1, 6, 6)
    assert mesh_lib.plan_mesh(7, 4) == mesh_lib.MeshPlan(1, 1, 7, 7)
    assert mesh_lib.plan_mesh(12, 8, data=2) == mesh_lib.MeshPlan(4, 2, 12, 12)
    assert mesh_lib.plan_mesh(5, 8, ensemble=4, pad=True) == mesh_lib.MeshPlan(4, 1, 5, 8)
    with pytest.raises(MeshError, match="does not split evenly"):
        mesh_lib.plan_mesh(5, 8, ensemble=4)
    with pytest.raises(MeshError, match="does not divide the 8 devices"):
        mesh_lib.plan_mesh(4, 8, data=3)
    with pytest.raises(MeshError, match="needs 16 devices"):
        mesh_lib.plan_mesh(16, 8, ensemble=16)
    with pytest.raises(MeshError, match="batch_size=33"):
        mesh_lib.plan_mesh(4, 8, data=2, batch_size=33)


@pytest.mark.slow
def test_padded_members_are_real_members(mnist_train):
    images, labels = mnist_train[0][:N_TRAIN], mnist_train[1][:N_TRAIN]
    padded, _ = train_small(small_setup("mlp", 3, ensemble=2, pad=True, hidden=(16,)), images, labels)
    plain, _ = train_small(small_setup("mlp", 3, hidden=(16,)), images, labels)
    assert padded.params["Dense_0"]["kernel"].shape[0] == 4
    _assert_trees_close(jax.tree.map(lambda x: x[:3], padded.params), plain.params)


def test_epoch_order_is_a_permutation_per_member():
    keys = rngs.member_keys(3, 4)
    order = rngs.epoch_order(keys["data"], 0, 100, 10)
    assert order.shape == (10, 4, 10)
    for m in range(4):
        assert sorted(order[:, m].ravel().tolist()) == list(range(100))
    assert not np.array_equal(order[:, 0], order[:, 1])
    assert not np.array_equal(order, rngs.epoch_order(keys["data"], 1, 100, 10))
    # Member keys do not depend on the ensemble size.
    more = rngs.member_keys(3, 9)
    np.testing.assert_array_equal(jax.random.key_data(keys["init"]), jax.random.key_data(more["init"])[:4])


def test_epoch_order_traces_one_program_for_every_epoch():
    """Each epoch's order comes from the same program: none is traced after the first epoch
    (a program per epoch took 0.3-0.5 s at each epoch's start on 2 CPU cores), and the
    orders are those of the Flax guide's ``permutation(fold_in(key, epoch), N)``."""
    keys = rngs.member_keys(5, 3)["data"]
    rngs.epoch_order(keys, 0, 120, 16)
    traced: list[str] = []

    def listen(event: str, _seconds: float, **_kw) -> None:
        if event == "/jax/core/compile/jaxpr_trace_duration":
            traced.append(event)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        orders = [rngs.epoch_order(keys, epoch, 120, 16) for epoch in range(1, 6)]
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert traced == []
    for epoch, order in enumerate(orders, start=1):
        for m in range(3):
            want = jax.random.permutation(jax.random.fold_in(keys[m], epoch), 120)[:112]
            np.testing.assert_array_equal(order[:, m].ravel(), np.asarray(want))


@pytest.mark.slow
@pytest.mark.parametrize("donate", [None, True])
def test_cpu_step_compiler_options_and_donation(mnist_train, donate):
    """On CPU the step is compiled without YNNPACK fusions and, by default, without
    donation (the state stays usable); donate=True deletes the donated state."""
    images, labels = mnist_train[0][:N_TRAIN], mnist_train[1][:N_TRAIN]
    built = small_setup("cnn", 2, "unroll", devices=2)
    model, mesh = built.model, built.mesh
    state = built.init_state(built.member_keys()["init"], images.shape[1:])
    imgs = jax.device_put(images, mesh_lib.replicated(mesh))
    labs = jax.device_put(labels, mesh_lib.replicated(mesh))
    idx = jax.device_put(
        np.arange(2 * BATCH, dtype=np.int32).reshape(2, BATCH),
        jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("ensemble", "data")),
    )
    step = built.train_step(donate=donate)
    member_keys = jax.device_put(
        np.asarray(jax.random.key_data(built.member_keys()["stochastic"])),
        jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("ensemble")),
    )
    hlo = step.lower(state, imgs, labs, member_keys, idx).compile().as_text()
    assert "__ynn_fusion" not in hlo
    # the evaluation of the same model keeps XLA:CPU's default (YNNPACK) fusions
    apply = jax.jit(lambda p, x: model.apply({"params": p}, x, train=False))
    assert "__ynn_fusion" in apply.lower(unstacked(state.params, 0), images[:8] / 255.0).compile().as_text()
    kernel = state.params["Conv_0"]["kernel"]
    before = np.asarray(kernel)
    new_state, _ = step(state, imgs, labs, member_keys, idx)
    assert kernel.is_deleted() == bool(donate)
    assert not np.array_equal(np.asarray(new_state.params["Conv_0"]["kernel"]), before)  # it did train


def test_the_abstract_state_is_the_initialised_states_shapes_and_shardings_from_one_trace(monkeypatch):
    """What a checkpoint is restored onto (every evaluation, selection and drift check loads
    one): the same tree, shapes, dtypes and shardings as the state ``init_state`` computes,
    with the network traced once (it was traced twice, and JAX printed the traced program
    into a discarded error message at a ``block_until_ready`` on its tracers)."""
    from ensemble_core.train import state as state_module

    built = small_setup("cnn", 3, devices=4, pad=True)
    traces, waits = [], []
    real, real_wait = state_module.init_variables, jax.block_until_ready
    monkeypatch.setattr(state_module, "init_variables", lambda *a, **k: traces.append(1) or real(*a, **k))
    monkeypatch.setattr(jax, "block_until_ready", lambda x: waits.append(1) or real_wait(x))
    abstract = built.abstract_state((28, 28, 1))
    assert (len(traces), len(waits)) == (1, 0)
    state = built.init_state(built.member_keys()["init"], (28, 28, 1))
    assert jax.tree.structure(abstract) == jax.tree.structure(state)
    for a, x in zip(jax.tree.leaves(abstract), jax.tree.leaves(state), strict=True):
        assert isinstance(a, jax.ShapeDtypeStruct) and not isinstance(a, jax.Array)
        assert (a.shape, a.dtype, a.sharding) == (x.shape, x.dtype, x.sharding)
