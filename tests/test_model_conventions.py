"""A user's Linen network as Flax code writes it: named by class with its options (no glue
file), in any of the mode conventions (``train``, keyword-only ``train``, ``training``,
``deterministic``, none), with BatchNorm's own ``axis_name`` (Flax's ImageNet example's
``'batch'``) traced by the preflight as the step runs it; and refusals that name the real
cause (a missing dependency, a class that cannot be sized)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ensemble_core import runs
from ensemble_core.config import load_config
from ensemble_core.errors import ConfigError
from ensemble_core.models import build_model, check_model
from ensemble_core.train.forward import apply_inference, init_variables, mode, mode_argument, train_unsharded
from tests.ensembles import tiny_config

CONVENTIONS = "tests.user_models.conventions"


def _model(name: str, options: str = "{}"):
    cfg = load_config(None, [f"model.name={CONVENTIONS}:{name}", f"model.options={options}"])
    return cfg, build_model(cfg.model, 10)


@pytest.mark.parametrize(
    "name, argument, training",
    [
        ("TrainingArgNet", "training", {"training": True}),
        ("KeywordTrainNet", "train", {"train": True}),
        ("DeterministicNet", "deterministic", {"deterministic": False}),
        ("FlaxMnistCNN", None, {}),
    ],
)
def test_each_mode_convention_is_found_and_sets_the_mode(name, argument, training):
    _, model = _model(name)
    assert mode_argument(model) == argument
    assert mode(model, True) == training
    inference = {k: not v for k, v in training.items()}
    assert mode(model, False) == inference


@pytest.mark.parametrize("name", ["TrainingArgNet", "KeywordTrainNet", "DeterministicNet"])
def test_dropout_is_on_in_training_and_off_in_inference_whatever_the_argument(name):
    """The same module applied directly by Flax (the reference) and through the project's
    mode: inference is deterministic and equal; training drops units (differs)."""
    _, model = _model(name)
    x = jax.random.uniform(jax.random.key(1), (8, 28, 28, 1))
    variables = init_variables(model, jax.random.key(0), (28, 28, 1))
    argument = mode_argument(model)
    off = {argument: argument == "deterministic"}
    want = model.apply(variables, x, **off)
    np.testing.assert_array_equal(apply_inference(model, variables, x), want)
    logits, _ = train_unsharded(model, variables, x)
    assert not np.allclose(np.asarray(logits), np.asarray(want))


def test_a_class_path_takes_its_options_and_num_classes():
    _, model = _model("TrainingArgNet", "{width: 4, rate: 0.1}")
    assert isinstance(model, nn.Module) and (model.num_classes, model.width, model.rate) == (10, 4, 0.1)
    cfg = load_config(None, ["model.name=tests.user_models.bn_dropout_net:BNDropoutNet", "model.options={width: 4}"])
    net = build_model(cfg.model, 7)
    assert (net.num_classes, net.width) == (7, 4)


def test_a_batchnorm_with_its_own_axis_name_passes_the_model_check():
    """Flax's ImageNet example names BatchNorm's axis 'batch' (its pmap axis). The check
    traces training mode as the step runs it, the axis replaced by the mesh's: before, it
    failed with 'unbound axis name: batch'."""
    cfg = load_config(
        None,
        ["model.name=tests.user_models.bn_dropout_net:BNDropoutNet", "model.options={width: 4, axis_name: batch}"],
    )
    model = build_model(cfg.model, 10)
    # The parameter count, from the architecture (tests/user_models): conv 3x3 1->4 and
    # 4->8 without bias, a BatchNorm scale and bias per channel, Dense 8->10 with bias.
    # BatchNorm's running statistics are not parameters.
    bn_dropout = 3 * 3 * 1 * 4 + 2 * 4 + 3 * 3 * 4 * 8 + 2 * 8 + 8 * 10 + 10
    assert check_model(model, cfg.model, (28, 28, 1), 10) == bn_dropout == 438
    _, training = _model("TrainingArgNet")  # axis_name='batch' too, mode argument 'training'
    # Dense 784->16, BatchNorm(16), Dense 16->10.
    assert check_model(training, cfg.model, (28, 28, 1), 10) == 784 * 16 + 16 + 2 * 16 + 16 * 10 + 10


def test_refusals_name_the_real_cause():
    with pytest.raises(ConfigError, match="imports 'a_package_nobody_installed', which is not installed") as err:
        build_model(load_config(None, ["model.name=tests.user_models.needs_missing_dependency:build"]).model, 10)
    assert "fix: install a_package_nobody_installed" in str(err.value)
    cfg, model = _model("NoClassesNet")  # its 10 outputs written in: refused for another class count only
    with pytest.raises(ConfigError, match="takes no num_classes and returns logits of width 10, but the dataset has 7"):
        check_model(model, cfg.model, (28, 28, 1), 7)
    assert check_model(model, cfg.model, (28, 28, 1), 10) == 7850
    with pytest.raises(ConfigError, match=r"cannot import module 'tests\.user_models\.nowhere'"):
        build_model(load_config(None, ["model.name=tests.user_models.nowhere:Net"]).model, 10)
    cfg, model = _model("Cifar10Net")  # 32x32 RGB only: refused on the digits' shape by the check
    with pytest.raises(ConfigError, match=r"cannot run on images of shape \(28, 28, 1\)"):
        check_model(model, cfg.model, (28, 28, 1), 10)
    assert check_model(model, cfg.model, (32, 32, 3), 10) == 32 * 32 * 3 * 10 + 10  # its one Dense layer


def test_the_default_convention_keeps_its_call():
    """A module of Flax's examples' convention is called with train= as before."""
    _, model = _model("KeywordTrainNet")
    x = jnp.zeros((2, 28, 28, 1))
    variables = init_variables(model, jax.random.key(0), (28, 28, 1))
    np.testing.assert_array_equal(apply_inference(model, variables, x), model.apply(variables, x, train=False))


@pytest.mark.slow  # one run (about 10 s)
def test_flax_s_older_mnist_cnn_trains_and_predict_elsewhere_names_its_module(tmp_path, tfds_dir, monkeypatch):
    """The Linen CNN of Flax's older MNIST example (no mode argument), in a user's own file
    named by class: preflight, training, evaluation and prediction from the run directory.
    Predicted where that module does not import: one ConfigError naming the module and the
    fix, from the prediction's preflight and from the prediction itself; never a 'damaged
    checkpoint' (the checkpoint is intact)."""
    import shutil
    import sys

    from ensemble_core.errors import CheckpointError
    from ensemble_core.runs.prediction import files

    nets = tmp_path / "nets"
    nets.mkdir()
    shutil.copy("tests/user_models/conventions.py", nets / "my_sweep_nets.py")
    monkeypatch.syspath_prepend(str(nets))
    cfg = tiny_config(tfds_dir, "model.name=my_sweep_nets:FlaxMnistCNN")
    result = runs.run(cfg, tmp_path / "runs", "cnn")
    assert result.evaluation.ensemble["accuracy"] > 0.3  # 1 epoch on 256 digits: far above chance
    out = runs.predict_images(result.run_dir.path, np.zeros((3, 28, 28, 1), np.uint8))
    assert out["ensemble_probs"].shape == (3, 10)
    np.testing.assert_allclose(out["ensemble_probs"].sum(-1), 1.0, rtol=1e-5)
    images = tmp_path / "images.npy"
    np.save(images, np.zeros((2, 28, 28, 1), np.uint8))
    monkeypatch.undo()  # elsewhere: the module is gone
    sys.modules.pop("my_sweep_nets", None)
    for call in (
        lambda: files.preflight(str(images), None, str(result.run_dir.path), tmp_path / "runs", None),
        lambda: files.predict_file(result.run_dir.path, images, tmp_path / "out.npz"),
    ):
        with pytest.raises(ConfigError) as err:
            call()
        assert not isinstance(err.value, CheckpointError)
        assert "cannot import module 'my_sweep_nets'" in str(err.value) and "PYTHONPATH" in str(err.value)


@pytest.mark.slow  # over 1 CPU s with a warm compilation cache: make test-fast leaves it out (docs/development.md)
def test_flax_s_imagenet_resnet18_by_class_path_and_its_nnx_twin_pass_the_check():
    """ResNet18 as Flax's ImageNet example defines it (``stage_sizes=[2, 2, 2, 2]``, 64
    filters, BatchNorm with ``axis_name='batch'``), given as a class path with options, in
    Linen and in NNX: both pass the check on the digits' shape, with the same parameter
    count (11,175,370 for 10 classes on one input channel, as ResNet-18's 11.2M)."""
    options = "{stage_sizes: [2, 2, 2, 2], num_filters: 64}"
    counts = []
    for name in ("LinenResNet", "NnxResNet"):
        cfg = load_config(None, [f"model.name=tests.user_models.flax_resnets:{name}", f"model.options={options}"])
        counts.append(check_model(build_model(cfg.model, 10), cfg.model, (28, 28, 1), 10))
    assert counts[0] == counts[1]
    assert 11_000_000 < counts[0] < 11_300_000
