"""NNX networks as Flax writes them today: the dropout keys taken at call time,
``__call__(self, x, rngs)`` (Flax's MNIST example, ``tests/user_models/flax_mnist.py``,
unchanged), and classes without ``num_classes``. The references are Flax itself (the
user's module constructed and called directly, the way Flax's example calls it) and the
key rule written out by hand; the refusals name the failing call and argument."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ensemble_core import mc_dropout, runs
from ensemble_core.config import load_config
from ensemble_core.errors import ConfigError, PreemptedError
from ensemble_core.models import build_model, check_model
from ensemble_core.rngs import member_keys
from ensemble_core.train import unstacked
from ensemble_core.train.forward import apply_inference, apply_train, convention, init_variables, split_variables
from ensemble_core.train.step import step_keys
from tests.ensembles import assert_checkpoints_equal, small_setup, stop_after, tiny_config, train_small
from tests.prefect_api import cli_env
from tests.user_models import call_rngs_nets, flax_mnist

ROOT = Path(__file__).resolve().parents[1]
NETS = "tests.user_models.call_rngs_nets"
FLAX_CNN = "tests.user_models.flax_mnist:CNN"


def _net(name: str, num_classes: int = 10):
    cfg = load_config(None, [f"model.name={name}"])
    return cfg, build_model(cfg.model, num_classes)


def _train(net, variables, x, key):
    """One member's training-mode logits and collections as the train step computes them
    (axis 'data' bound, one shard)."""
    params, state = split_variables(variables)

    def one(p, s, images, k):
        return apply_train(net, p, s, images, k, 1)

    train = jax.vmap(one, in_axes=(None, None, None, None), axis_size=1, axis_name="data")
    return jax.jit(train)(params, state, x, key)


def _first(tree):
    return jax.tree.map(lambda leaf: leaf[0], tree)


# MARK: Flax's MNIST CNN as Flax calls it


def test_flax_s_mnist_cnn_is_called_as_its_own_train_and_eval_steps_call_it():
    """Training mode: the module (``model.train()``) called with ``nnx.Rngs`` of the
    member's step key folded with 0 (it holds no stream of its own); inference mode:
    ``model.eval()`` and ``rngs=None``, as the example's ``eval_step``. The reference is
    the class constructed from the member's init key and called directly (under
    ``nnx.jit``, as the example's steps)."""
    cfg, net = _net(FLAX_CNN)
    assert check_model(net, cfg.model, (28, 28, 1), 10) > 0
    assert "rngs=nnx.Rngs(the member's step key) / rngs=None" in convention(net)
    init, step_key = jax.random.key(3), jax.random.key(7)
    module, fresh = flax_mnist.CNN(rngs=nnx.Rngs(init)), flax_mnist.CNN(rngs=nnx.Rngs(init))
    variables = init_variables(net, init, (28, 28, 1))
    x = jax.random.uniform(jax.random.key(1), (4, 28, 28, 1))
    logits, updated = _first(_train(net, variables, x, step_key))
    call = nnx.jit(lambda model, images, rngs: model(images, rngs))
    module.train()
    want = call(module, x, nnx.Rngs(jax.random.fold_in(step_key, 0)))
    np.testing.assert_allclose(np.asarray(logits), np.asarray(want), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(updated["batch_stats"]["batch_norm1"]["mean"], module.batch_norm1.mean[...], atol=1e-6)
    assert not np.allclose(np.asarray(call(module, x, nnx.Rngs(1))), np.asarray(want))  # its dropout is on
    fresh.eval()  # its running averages untouched
    inference = jax.jit(lambda v: apply_inference(net, v, x))(variables)
    np.testing.assert_allclose(inference, call(fresh, x, None), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["DefaultNoneNet", "KeywordOnlyNet"])
def test_every_form_of_a_call_rngs_argument_gets_the_member_s_keys(name):
    """``rngs: nnx.Rngs | None = None`` and keyword-only ``*, rngs``: the mask of each
    example is ``bernoulli(fold_in(fold_in(step_key, 0), 0))`` (stream ``fold_in(key,
    streams)``, first draw), written out here; inference is the module in eval mode with
    ``rngs=None``."""
    cfg, net = _net(f"{NETS}:{name}")
    check_model(net, cfg.model, (28, 28, 1), 10)
    variables = init_variables(net, jax.random.key(0), (28, 28, 1))
    x = jax.random.uniform(jax.random.key(1), (4, 28, 28, 1))
    key = jax.random.key(5)
    logits, _ = _first(_train(net, variables, x, key))
    module = getattr(call_rngs_nets, name)(rngs=nnx.Rngs(jax.random.key(0)))
    h = module.features(x)
    mask = jax.random.bernoulli(jax.random.fold_in(jax.random.fold_in(key, 0), 0), 0.5, h.shape)
    want = module.out(jnp.where(mask, h / 0.5, 0.0))
    np.testing.assert_allclose(np.asarray(logits), np.asarray(want), rtol=1e-5, atol=1e-5)
    module.eval()
    np.testing.assert_allclose(apply_inference(net, variables, x), module.out(h), rtol=1e-5, atol=1e-5)


def test_a_call_time_stream_is_drawn_after_the_module_held_ones():
    """A module with its own stream (``nnx.Dropout(rate, rngs=rngs)``, stream 0:
    ``fold_in(key, 0)``) and a call-time one (``fold_in(key, 1)``): the reference seeds
    both by hand and calls the class directly."""
    _, net = _net(f"{NETS}:BothNet")
    assert net.streams == 1
    variables = init_variables(net, jax.random.key(0), (28, 28, 1))
    x = jax.random.uniform(jax.random.key(1), (4, 28, 28, 1))
    key = jax.random.key(9)
    logits, _ = _first(_train(net, variables, x, key))
    module = call_rngs_nets.BothNet(rngs=nnx.Rngs(jax.random.key(0)))
    module.train()
    module.held.rngs.key.set_value(jax.random.fold_in(key, 0))
    module.held.rngs.count.set_value(jnp.zeros((), jnp.uint32))
    want = module(x, nnx.Rngs(jax.random.fold_in(key, 1)))
    np.testing.assert_allclose(np.asarray(logits), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_call_time_masks_differ_between_members_and_steps_and_repeat_for_the_same_ones():
    """The keys the train step hands a member (:func:`step_keys` of its stochastic key and
    the global step): members 0 and 1 at step 0, member 0 at steps 0 and 1 give other
    logits; the same member and step, compiled afresh, the same."""
    _, net = _net(f"{NETS}:DefaultNoneNet")
    variables = init_variables(net, jax.random.key(0), (28, 28, 1))
    x = jax.random.uniform(jax.random.key(1), (8, 28, 28, 1))
    stochastic = member_keys(0, 2)["stochastic"]

    def logits(member, step):
        key = step_keys(stochastic[member], jnp.asarray(step))[0]
        return np.asarray(_first(_train(net, variables, x, key))[0])

    first = logits(0, 0)
    np.testing.assert_array_equal(logits(0, 0), first)
    assert not np.allclose(logits(1, 0), first)
    assert not np.allclose(logits(0, 1), first)


def test_mc_dropout_passes_hand_a_call_time_rngs_from_the_pass_key():
    """An MC dropout pass in inference mode with dropout on: the call's ``rngs`` come from
    the pass's key as in training (``rngs=None`` would leave a layer built without
    ``rngs`` no key): the reference applies :func:`example_dropout` with the key
    ``fold_in(fold_in(pass_key, 0), 0)`` by hand. Flax's CNN passes the model check."""
    _, net = _net(f"{NETS}:DefaultNoneNet")
    mc_dropout.check_network(net, "DefaultNoneNet", (28, 28, 1))
    variables = init_variables(net, jax.random.key(0), (28, 28, 1))
    x = jax.random.uniform(jax.random.key(1), (4, 28, 28, 1))
    index, key = jnp.arange(10, 14), jax.random.key(4)
    got = mc_dropout.apply_stochastic(net, variables, x, key, index)
    module = call_rngs_nets.DefaultNoneNet(rngs=nnx.Rngs(jax.random.key(0)))
    layer_key = jax.random.fold_in(jax.random.fold_in(key, 0), 0)
    want = module.out(mc_dropout.example_dropout(module.features(x), layer_key, index, 0.5))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    _, cnn = _net(FLAX_CNN)
    mc_dropout.check_network(cnn, FLAX_CNN, (28, 28, 1))


def test_the_memory_estimate_traces_the_call_time_rngs():
    """Every layer output of Flax's CNN in one training-mode pass (``nnx.capture``), its
    call's ``rngs`` passed: conv1, batch_norm1, dropout1 (28x28x32), conv2, batch_norm2
    (14x14x64), linear1, dropout2 (256), linear2 and the network (10), counted by hand."""
    from ensemble_core import ensemble_setup as setup
    from ensemble_core import memory

    cfg = load_config(None, [f"model.name={FLAX_CNN}", "ensemble.size=8", "train.batch_size=32"])
    estimate = memory.estimate(cfg, setup.plan(cfg), 10, (28, 28, 1), 1000, "vmap")
    per_image = 3 * 28 * 28 * 32 + 2 * 14 * 14 * 64 + 2 * 256 + 10 + 10
    assert estimate.activation_bytes == estimate.members_per_device * 32 * per_image * 4


# MARK: training: topology and resume


@pytest.mark.slow  # over 1 CPU s with a warm compilation cache: make test-fast leaves it out (docs/development.md)
def test_call_time_dropout_does_not_depend_on_how_the_batch_is_split(mnist_train):
    """BatchNorm (its 'batch' axis replaced by the data axis) and call-time dropout of the
    member's whole batch: 2 members on one device equal 2 members over ensemble 2 x data 4;
    the members differ."""
    images, labels = mnist_train[0][:64], mnist_train[1][:64]
    name = f"{NETS}:SmallBNNet"
    ref, _ = train_small(small_setup(name, 2, "unroll", lr=0.1, devices=1), images, labels)
    got, _ = train_small(small_setup(name, 2, "vmap", lr=0.1, devices=8, ensemble=2, data=4), images, labels)
    assert got.params["head"]["kernel"].sharding.mesh.shape == {"ensemble": 2, "data": 4}
    for a, b in zip(jax.tree.leaves(got.variables), jax.tree.leaves(ref.variables), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=5e-4, rtol=1e-4)  # docs/architecture.md
    a, b = (np.asarray(unstacked(got.params, m)["head"]["kernel"]) for m in (0, 1))
    assert np.abs(a - b).max() > 1e-3


@pytest.mark.slow  # over 1 CPU s with a warm compilation cache: make test-fast leaves it out (docs/development.md)
def test_a_stopped_run_with_call_time_rngs_resumes_bitwise(tfds_dir, tmp_path):
    """Stopped at step 5 of 16 (a stop request, as SIGTERM makes) and resumed: the
    checkpoints equal the uninterrupted run's bitwise."""
    cfg = tiny_config(tfds_dir, f"model.name={NETS}:SmallBNNet", "data.max_train_examples=256", "train.epochs=2")
    dataset = runs.prepare(cfg.data)
    runs.train(cfg, dataset, tmp_path / "full")
    with pytest.raises(PreemptedError):
        runs.train(cfg, dataset, tmp_path / "stopped", should_stop=stop_after(5))
    resumed = runs.train(cfg, dataset, tmp_path / "stopped")
    assert resumed.resumed_from is not None
    assert_checkpoints_equal(cfg, dataset, tmp_path / "full", tmp_path / "stopped")


# MARK: no num_classes


def test_a_class_without_num_classes_is_accepted_when_its_logits_fit_and_refused_naming_both_numbers():
    cfg, net = _net(FLAX_CNN, num_classes=10)
    assert check_model(net, cfg.model, (28, 28, 1), 10) == 824_650  # the example's parameters
    cfg, net = _net(FLAX_CNN, num_classes=7)
    with pytest.raises(ConfigError) as err:
        check_model(net, cfg.model, (28, 28, 1), 7)
    message = str(err.value)
    assert "\n" not in message
    assert "takes no num_classes and returns logits of width 10, but the dataset has 7 classes" in message
    assert "fix: make its last layer's outputs 7, or give it an argument num_classes" in message
    cfg, net = _net(f"{NETS}:WideNet")
    with pytest.raises(ConfigError, match="returns logits of width 12, but the dataset has 10 classes; fix:"):
        check_model(net, cfg.model, (28, 28, 1), 10)


def test_flax_s_cnn_through_a_wrapper_function_passes_the_check():
    """Its call-time ``rngs`` found on the class the function returns (before: refused as
    ``cannot run on images ... missing 1 required positional argument: 'rngs'``)."""
    cfg, net = _net(f"{NETS}:wrapped_flax_cnn")
    assert net.module_type is flax_mnist.CNN
    assert check_model(net, cfg.model, (28, 28, 1), 10) == 824_650


# MARK: refusals name the call and the argument


@pytest.mark.parametrize(
    "name, fragments",
    [
        (
            "ExtraKeyNet",
            ["ExtraKeyNet.__call__ requires an argument 'key' that the pipeline does not pass", "fix: give 'key'"],
        ),
        (
            "PositionalOnlyNet",
            ["PositionalOnlyNet.__call__ takes 'rngs' as a positional-only argument", "fix: remove the '/'"],
        ),
        (
            "LinenRngsNet",
            ["LinenRngsNet.__call__ requires an argument 'rngs'", "self.make_rng('dropout')"],
        ),
        (
            "MisusedDropoutNet",
            [
                "the network's call Dropout.__call__() at call_rngs_nets.py:",
                "takes 2 positional arguments but 3 were given",
                "fix: call Dropout.__call__ with the arguments its signature takes",
            ],
        ),
        (
            "NoneRngsNet",
            [
                "NoneRngsNet.__call__(x, rngs=None) raised AttributeError in inference mode at call_rngs_nets.py:",
                "the pipeline passes rngs=None",
            ],
        ),
    ],
)
def test_a_call_the_pipeline_cannot_make_is_refused_naming_the_call_not_the_images(name, fragments):
    cfg, net = _net(f"{NETS}:{name}")
    with pytest.raises(ConfigError) as err:
        check_model(net, cfg.model, (28, 28, 1), 10)
    message = str(err.value)
    assert "\n" not in message and "images" not in message.split("fix:")[1], message
    assert "cannot run on images" not in message
    for fragment in fragments:
        assert fragment in message, message


def test_images_of_the_wrong_shape_are_still_named_as_the_cause():
    """The Flax CNN's ``Conv(1, 32)`` on RGB images: the images' shape and the call."""
    cfg, net = _net(FLAX_CNN)
    with pytest.raises(ConfigError) as err:
        check_model(net, cfg.model, (28, 28, 3), 10)
    message = str(err.value)
    assert "cannot run on images of shape (28, 28, 3)" in message and "CNN.__call__(x, rngs=None)" in message
    assert "flax_mnist.py:" in message


# MARK: through the command lines


@pytest.mark.slow  # two command lines in subprocesses (about a minute on 2 busy cores)
def test_flax_s_mnist_file_trains_by_class_path_through_the_cli_and_is_served_by_predict(
    tmp_path, tfds_dir, prefect_api
):
    """Flax's MNIST ``CNN`` file, unchanged, in a user's package outside the repository:
    ``python -m flows.train_ensemble --set model.name=my_nets.mnist:CNN`` (2 members, 2
    epochs on 256 digits) from the directory that holds it, then ``python -m flows.predict``
    on a few test digits: the members' probabilities equal the run's predictions."""
    home = tmp_path / "home"
    (home / "my_nets").mkdir(parents=True)
    (home / "my_nets" / "__init__.py").write_text("")
    (home / "my_nets" / "mnist.py").write_text((ROOT / "tests" / "user_models" / "flax_mnist.py").read_text())
    env = cli_env(prefect_api, PYTHONPATH=str(ROOT))
    out = tmp_path / "runs"
    sets = [
        f"data.data_dir={tfds_dir}",
        "data.max_train_examples=256",
        "data.max_test_examples=64",
        "data.validation_fraction=0",
        "data.calibration_fraction=0",
        "model.name=my_nets.mnist:CNN",
        "ensemble.size=2",
        "train.epochs=2",
        "train.batch_size=32",
        "eval.evaluators=[test]",
    ]
    args = ["--config", str(ROOT / "configs" / "tiny.yaml"), *(a for s in sets for a in ("--set", s))]
    train = subprocess.run(
        [sys.executable, "-m", "flows.train_ensemble", *args, "--output-dir", str(out), "--run-name", "flax"],
        cwd=home,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert train.returncode == 0, train.stderr[-3000:]
    run_dir = out / "flax"
    report = json.loads((run_dir / "report.json").read_text())
    assert report["config"]["model"]["name"] == "my_nets.mnist:CNN"
    with np.load(run_dir / "predictions.npz") as f:
        member_probs, all_labels = f["member_probs"], f["labels"]
    assert member_probs.shape == (2, 64, 10)
    accuracy = float(np.mean(member_probs.mean(0).argmax(-1) == all_labels))
    assert accuracy == pytest.approx(report["ensemble"]["accuracy"]) and accuracy > 0.5  # chance: 0.1
    want, labels = member_probs[:, :5], all_labels[:5]
    from ensemble_core import data

    embedded = data.prepare(data.EMBEDDED, tfds_dir).tfds_data_dir
    images, test_labels = data.load_split(data.EMBEDDED, "test", embedded, limit=5)
    np.testing.assert_array_equal(test_labels, labels)
    np.save(tmp_path / "digits.npy", images)
    predict = subprocess.run(
        [
            sys.executable,
            "-m",
            "flows.predict",
            "--images",
            str(tmp_path / "digits.npy"),
            "--run-dir",
            str(run_dir),
            "--output",
            str(tmp_path / "p.npz"),
        ],
        cwd=home,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert predict.returncode == 0, predict.stderr[-3000:]
    with np.load(tmp_path / "p.npz") as f:
        np.testing.assert_allclose(f["member_probs"], want, atol=1e-5)
