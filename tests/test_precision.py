"""``train.precision`` (issue 42): ``float32`` is the program of a run without the key,
``high`` puts ``Precision.HIGH`` on every matmul and convolution, ``bfloat16`` computes in
bfloat16 on float32 master weights.

The references: the run without the key (bit for bit), a mixed-precision step written here
from Flax and optax alone (the member's own jitted step, bfloat16 casts inside its loss),
the float32 run (close, not equal), and the lowered programs (the dtypes and precision of
every convolution and dot_general in them).
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ensemble_core.train  # noqa: F401  (first: ensemble_core.models imported first is an import cycle)
from ensemble_core import ensemble_setup as setup
from ensemble_core import rngs
from ensemble_core.config import PipelineConfig, load_config
from ensemble_core.data import to_float
from ensemble_core.errors import ConfigError
from ensemble_core.predict import make_predict, member_probs
from ensemble_core.runs.storage.resume import check_resumable, config_changes, resumable_settings
from ensemble_core.train import make_train_step, train_compiler_options, unstacked
from tests.ensembles import train_small

N_TRAIN = 128
BATCH = 32
BN_LINEN = ("tests.user_models.bn_dropout_net:build", {"width": 4})
BN_NNX = ("tests.user_models.nnx_nets:BNDropoutNet", {"width": 4})


def _setup(model: str, precision: str | None, options: dict | None = None, strategy: str = "unroll"):
    """2 members on 2 devices (vmap: 1 device), batch 32; ``precision`` None leaves the key unset."""
    train = {"batch_size": BATCH, "learning_rate": 0.05}
    if precision is not None:
        train["precision"] = precision
    cfg = PipelineConfig.model_validate(
        {
            "model": {"name": model, "hidden_sizes": [32], "options": options or {}},
            "ensemble": {"size": 2},
            "train": train,
            "mesh": {"member_strategy": strategy},
        }
    )
    return setup.build(cfg, 10, num_devices=2 if strategy == "unroll" else 1)


@functools.cache
def _trained(model: str, precision: str | None, options: tuple = (), strategy: str = "unroll"):
    """(setup, state after one epoch of the first 128 training digits (4 steps), the epoch's
    record), trained once per test process and shared by the tests below."""
    images, labels = _DATA["train"]
    built = _setup(model, precision, dict(options), strategy)
    records: list[dict] = []
    state, _ = train_small(built, images, labels, on_epoch_end=lambda e, s, r: records.append(r))
    return built, state, records[0]


#: The session's training digits (the same arrays for every test, so ``_trained`` may cache).
_DATA: dict = {}


@pytest.fixture(autouse=True)
def _digits(mnist_train):
    _DATA.setdefault("train", (mnist_train[0][:N_TRAIN], mnist_train[1][:N_TRAIN]))


def _leaves(state) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves((state.params, state.model_state, state.opt_state))]


def _max_diff(a, b) -> float:
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(a, b, strict=True))


# MARK: the lowered programs

#: A convolution or dot_general of StableHLO text, with its two operand types.
_OP = re.compile(r"stablehlo\.(convolution|dot_general).*: \(tensor<[^>]*x(\w+)>, tensor<[^>]*x(\w+)>\)")


def _matmuls(text: str) -> list[tuple[str, str, str, bool]]:
    """``(op, lhs dtype, rhs dtype, HIGH?)`` of every convolution and dot_general in ``text``."""
    out = []
    for line in text.splitlines():
        m = _OP.search(line)
        if m:
            out.append((m.group(1), m.group(2), m.group(3), "HIGH" in line))
    return out


def _abstract_args(built, batch: int = 8):
    e = built.plan.padded_members
    return (
        jax.ShapeDtypeStruct((2 * batch, 28, 28, 1), jnp.uint8),
        jax.ShapeDtypeStruct((2 * batch,), jnp.int32),
        jax.ShapeDtypeStruct((e, 2), jnp.uint32),
        jax.ShapeDtypeStruct((e, batch), jnp.int32),
    )


@pytest.mark.parametrize("model, options", [("cnn", {}), BN_LINEN, BN_NNX])
@pytest.mark.parametrize("precision", ["float32", "high", "bfloat16"])
@pytest.mark.slow  # over 1 CPU s with a warm compilation cache: make test-fast leaves it out (docs/development.md)
def test_the_lowered_step_and_predict_compute_at_the_precision(model, options, precision):
    """Every convolution and dot_general of the train step (forward and backward) and of the
    predict program takes bfloat16 operands under bfloat16 and float32 ones otherwise, and
    carries HIGH under high only; the step's new state (params, optimizer state,
    batch_stats) and its metrics are float32 under each, and so are the probabilities;
    float32's programs are those of a config without the key."""
    built = _setup(model, precision, options, strategy="vmap")
    state = built.abstract_state((28, 28, 1))
    args = _abstract_args(built)
    lowered = built.train_step().lower(state, *args)
    ops = _matmuls(lowered.as_text())
    predict = built.predict_fn()
    images = jax.ShapeDtypeStruct((8, 28, 28, 1), jnp.uint8)
    predict_ops = _matmuls(predict.lower(state.variables, images).as_text())
    assert {op for op, *_ in ops} == {"convolution", "dot_general"} and len(ops) >= 7
    assert {op for op, *_ in predict_ops} == {"convolution", "dot_general"}
    want = "bf16" if precision == "bfloat16" else "f32"
    for got in (ops, predict_ops):
        assert {(lhs, rhs) for _, lhs, rhs, _ in got} == {(want, want)}, got
        assert {high for *_, high in got} == {precision == "high"}, got

    new_state, metrics = lowered.out_info
    floats = [
        x.dtype
        for x in jax.tree.leaves((new_state.params, new_state.opt_state, new_state.model_state, metrics))
        if jnp.issubdtype(x.dtype, jnp.floating)
    ]
    assert floats and set(floats) == {jnp.dtype(jnp.float32)}
    assert bool(new_state.model_state) == (model != "cnn")  # batch_stats of the BatchNorm members
    assert jax.eval_shape(predict, state.variables, images).dtype == jnp.float32
    if precision == "float32":  # the program of a config without the key, character for character
        unset = _setup(model, None, options, strategy="vmap")
        assert unset.train_step().lower(state, *args).as_text() == lowered.as_text()
        assert (
            unset.predict_fn().lower(state.variables, images).as_text()
            == predict.lower(state.variables, images).as_text()
        )


# MARK: float32 and high


def _bn_linen(precision: str | None):
    return _trained(BN_LINEN[0], precision, tuple(BN_LINEN[1].items()))


@pytest.mark.slow  # 5-6 s on 2 busy cores: two trainings (the second loads the first's program)
def test_float32_is_the_default_and_bit_identical_to_the_key_unset():
    """The default changes nothing: a BatchNorm and Dropout network's params, batch_stats,
    optimizer state and its epoch's loss, bit for bit. (Against the code before the key,
    the same held for the registry CNN, this network and the NNX one, predictions
    included, when the key was added.)"""
    _, unset, unset_record = _bn_linen(None)
    built, f32, f32_record = _bn_linen("float32")
    assert built.config.train.precision == "float32" == PipelineConfig().train.precision
    for x, y in zip(_leaves(unset), _leaves(f32), strict=True):
        np.testing.assert_array_equal(x, y)
    assert unset_record["train_loss"] == f32_record["train_loss"]


@pytest.mark.slow  # 3-8 s on 2 busy cores: two trainings, one shared with the test above
def test_high_is_float32_on_cpu():
    """XLA:CPU computes float32 whatever the precision config of a matmul: ``high`` trains
    bit for bit as ``float32`` there (its HIGH ops: the lowered-program test above)."""
    _, f32, f32_record = _bn_linen("float32")
    _, high, high_record = _bn_linen("high")
    assert jax.default_backend() == "cpu"
    for x, y in zip(_leaves(high), _leaves(f32), strict=True):
        np.testing.assert_array_equal(x, y)
    assert high_record["train_loss"] == f32_record["train_loss"]


# MARK: bfloat16


def _mixed_precision_member(model, tx, params, images, labels, order):
    """One member trained by its own jitted step, written here from Flax and optax: float32
    master params cast to bfloat16 inside the loss with the images, logits cast to float32
    for the softmax cross-entropy, the float32 gradient applied to the float32 params."""

    def loss_fn(p, x, y):
        low = jax.tree.map(lambda w: w.astype(jnp.bfloat16), p)
        logits = model.apply({"params": low}, to_float(x).astype(jnp.bfloat16))
        return optax.losses.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), y).mean()

    @functools.partial(jax.jit, compiler_options=train_compiler_options("cpu"))
    def step(params, opt_state, x, y):
        grads = jax.grad(loss_fn)(params, x, y)
        assert all(g.dtype == jnp.float32 for g in jax.tree.leaves(grads))
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    opt_state = tx.init(params)
    for idx in order:
        params, opt_state = step(params, opt_state, images[idx], labels[idx])
    return params


@pytest.mark.slow  # 5-8 s on 2 busy cores: two ensembles and the reference step compiled
def test_a_bfloat16_member_is_the_hand_written_mixed_precision_step():
    """Each member of the bfloat16 ensemble equals the mixed-precision step written here
    (to float32 rounding of the update), and is 1e-4 or more away from the float32 run: with
    the casts removed it would be the float32 run."""
    built, bf16, record = _trained("mlp", "bfloat16", (), "vmap")
    _, f32, f32_record = _trained("mlp", "float32", (), "vmap")
    images, labels = _DATA["train"]
    keys = rngs.member_keys(0, 2)
    order = rngs.epoch_order(keys["data"], 0, N_TRAIN, BATCH)  # [S, E, B]
    for m in range(2):
        params0 = built.model.init(keys["init"][m], np.zeros((1, 28, 28, 1), np.float32))["params"]
        want = _mixed_precision_member(built.model, built.optimizer, params0, images, labels, order[:, m])
        got = unstacked(bf16.params, m)
        for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            assert x.dtype == jnp.float32
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-6, rtol=0)
        assert _max_diff(jax.tree.leaves(got), jax.tree.leaves(unstacked(f32.params, m))) > 1e-4
    np.testing.assert_allclose(record["train_loss"], f32_record["train_loss"], atol=0.02)


@pytest.mark.slow  # 4-8 s each on 2 busy cores: two ensembles and two predict programs compiled
# make soak: the Linen network (make test: the NNX one; both APIs' precision in the lowered-step test above)
@pytest.mark.parametrize(
    "model, options",
    [pytest.param(*BN_LINEN, marks=pytest.mark.soak), BN_NNX],
    ids=["linen-batchnorm", "nnx-batchnorm"],
)
def test_batchnorm_members_train_in_bfloat16_with_float32_statistics(model, options):
    """A Linen and an NNX network with BatchNorm and Dropout train under bfloat16: params,
    optimizer state and the running averages stay float32, the running averages moved, the
    loss and accuracy of the epoch are close to float32's and the params are not equal to
    them; the predicted probabilities (inference mode, bfloat16 compute) are float32 and
    close to the float32 members'."""
    built, bf16, record = _trained(model, "bfloat16", tuple(options.items()))
    f32_built, f32, f32_record = _trained(model, "float32", tuple(options.items()))
    init = f32_built.init_state(f32_built.member_keys()["init"], (28, 28, 1))
    assert set(bf16.model_state) == {"batch_stats"}
    for x in jax.tree.leaves((bf16.params, bf16.model_state, bf16.opt_state)):
        assert x.dtype in (jnp.float32, jnp.int32), x.dtype
    assert _max_diff(jax.tree.leaves(bf16.model_state), jax.tree.leaves(init.model_state)) > 1e-3
    assert 0 < _max_diff(_leaves(bf16), _leaves(f32)) < 0.05
    np.testing.assert_allclose(record["train_loss"], f32_record["train_loss"], atol=0.03)
    np.testing.assert_allclose(record["train_accuracy"], f32_record["train_accuracy"], atol=0.1)

    images = _DATA["train"][0][:64]
    probs = member_probs(built.predict_fn(), bf16.variables, images, built.mesh, 64)
    want = member_probs(f32_built.predict_fn(), bf16.variables, images, built.mesh, 64)
    assert probs.dtype == np.float32 and probs.shape == (2, 64, 10)
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
    np.testing.assert_allclose(probs, want, atol=0.03)
    assert not np.array_equal(probs, want)


# MARK: refusals and resume


def test_precision_values_aliases_and_refusals_are_one_line():
    assert load_config(None, ["train.precision=tf32"]).train.precision == "high"
    assert load_config(None, ["train.precision=bfloat16"]).train.precision == "bfloat16"
    for value in ("fp16", "bf16", "FLOAT32", "1"):
        with pytest.raises(ConfigError) as err:
            load_config(None, [f"train.precision={value}"])
        message = str(err.value)
        assert "\n" not in message and "train.precision" in message and "fix:" in message
        assert "float32, high, bfloat16" in message and "tf32" in message
    with pytest.raises(ConfigError) as err:
        load_config(None, ["ensemble.search={precision: [float32, bfloat16, float32, bfloat16]}"])
    message = str(err.value)
    assert "\n" not in message and "cannot vary precision" in message and "set train.precision" in message
    built = _setup("mlp", None)
    for make in (
        lambda: make_train_step(built.model, built.optimizer, built.mesh, precision="fp16"),
        lambda: make_predict(built.model, built.mesh, precision="tf32"),  # the config's alias, not the code's
    ):
        with pytest.raises(ConfigError, match="float32, high, bfloat16"):
            make()


def test_a_run_may_resume_under_another_precision_and_the_session_records_it(tmp_path):
    """The master weights and optimizer state are float32 under every precision, so the
    checkpoint means the same: a resume may change it (as it may change the mesh), and the
    new session's settings and changes hold it."""
    saved = load_config(None, ["train.precision=float32"])
    resumed = load_config(None, ["train.precision=bfloat16"])
    meta = {"config": saved.model_dump(mode="json"), "epoch": 1, "members_trained": 8}
    check_resumable(meta, resumed, tmp_path, 8)  # no IncompatibleRunError
    assert config_changes(meta["config"], resumed) == {"train.precision": ("float32", "bfloat16")}
    assert resumable_settings(resumed)["train.precision"] == "bfloat16"
    # a checkpoint written before the key existed reads as float32
    del meta["config"]["train"]["precision"]
    assert config_changes(meta["config"], saved) == {}
