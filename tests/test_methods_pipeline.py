"""BatchEnsemble and Packed-Ensembles in the pipeline (``ensemble.method``,
:mod:`ensemble_core.networks`): a network of M members trains on the mean of its members'
losses, as Flax's own TrainState pattern trains it alone; its members are the
evaluation's rows; what a method cannot wrap is refused in one line. The layers
themselves are tested against explicit per-member networks in ``test_batch_ensemble.py``
and ``test_packed.py``."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from scipy.special import softmax

from ensemble_core import ensemble_setup, rngs, runs
from ensemble_core.config import PipelineConfig, load_config
from ensemble_core.errors import ConfigError, PreemptedError
from ensemble_core.networks import build_network
from ensemble_core.runs.ensemble.load import all_members
from ensemble_core.train import unstacked
from tests.ensembles import BATCH, assert_checkpoints_equal, stop_after, tiny_config, train_small
from tests.oracles import train_stateful_member_alone

N_TRAIN = 64
M = 3


def _built(method: str, devices: int = 8) -> ensemble_setup.EnsembleSetup:
    cfg = PipelineConfig.model_validate(
        {
            "model": {"name": "resnet", "options": {"depth": 8, "width": 4}},
            "ensemble": {"size": 2, "method": method, "members_per_network": M},
            "train": {"batch_size": BATCH, "learning_rate": 0.05},
            "mesh": {"member_strategy": "unroll"},
        }
    )
    return ensemble_setup.build(cfg, 10, num_devices=devices)


@pytest.mark.slow  # two networks compiled in the stacked step and alone
# make test: BatchEnsemble; make soak: Packed-Ensembles too (the same step, another network)
@pytest.mark.parametrize("method", ["batch_ensemble", pytest.param("packed", marks=pytest.mark.soak)])
def test_a_network_of_m_members_trains_as_flax_trains_it_alone(mnist_train, method):
    """Each of the E=2 networks (a ResNet-8 variant with BatchNorm, M=3 members) equals the
    same network trained alone with Flax's TrainState + batch_stats pattern on the mean of
    its members' cross-entropies (tests/oracles.py), after two steps on the 8-device mesh."""
    images, labels = mnist_train[0][:N_TRAIN], mnist_train[1][:N_TRAIN]
    built = _built(method)
    state, _ = train_small(built, images, labels)
    keys = rngs.member_keys(0, 2)
    order = rngs.epoch_order(keys["data"], 0, N_TRAIN, BATCH)  # [S, E, B]
    for u in range(2):
        variables = dict(built.model.init(keys["init"][u], np.zeros((1, 28, 28, 1), np.float32), train=False))
        step_keys = [
            tuple(jax.random.fold_in(jax.random.fold_in(keys["stochastic"][u], s), i) for i in (0, 1))
            for s in range(len(order))
        ]
        params, batch_stats = train_stateful_member_alone(
            built.model, built.optimizer, variables, images, labels, order[:, u], step_keys
        )
        for got, want in (
            (unstacked(state.params, u), params),
            (unstacked(state.model_state["batch_stats"], u), batch_stats),
        ):
            for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
                np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=5e-5, rtol=1e-4)


@pytest.mark.slow  # two programs compiled per method (about 7 s on 2 busy cores)
# make test: Packed-Ensembles (the other method of the train-step test above); make soak: both
@pytest.mark.parametrize("method", [pytest.param("batch_ensemble", marks=pytest.mark.soak), "packed"])
def test_every_member_of_every_network_is_a_row_of_the_evaluation(method):
    built = _built(method)
    state = built.init_state(built.member_keys()["init"], (28, 28, 1))
    members = all_members(built.config, state, built)
    assert list(members.expand) == [0, 0, 0, 1, 1, 1] and list(members.outputs) == [0, 1, 2, 0, 1, 2]
    images = np.random.default_rng(0).integers(0, 256, (5, 28, 28, 1), dtype=np.uint8)
    probs, _ = members.predict(built.config, images)
    assert probs.shape == (6, 5, 10)
    x = images.astype(np.float32) / 255.0
    for u in range(2):  # the network applied alone, in inference mode: [M, N, C] logits
        variables = jax.tree.map(lambda a, u=u: np.asarray(a)[u], state.final_variables)
        logits = np.asarray(built.model.apply(variables, x, train=False))
        np.testing.assert_allclose(probs[u * M : (u + 1) * M], softmax(logits, axis=-1), atol=1e-5)


def test_what_a_method_cannot_wrap_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"variants of the registry's cnn and resnet only, not model.name=lenet5"):
        build_network(load_config(None, ["ensemble.method=packed", "model.name=lenet5"]), 10)
    with pytest.raises(ConfigError, match=r"no dropout layer.*fix: drop model.options.dropout_rate"):
        build_network(load_config(None, ["ensemble.method=batch_ensemble", "model.options={dropout_rate: 0.1}"]), 10)
    with pytest.raises(ConfigError, match=r"ensemble.method=packed predicts with every member.*fix: drop"):
        load_config(None, ["ensemble.method=packed", "ensemble.select_size=2"])


@pytest.mark.slow  # three small runs per method (about 10 s each under load)
@pytest.mark.parametrize(
    "method",
    [
        "batch_ensemble",
        # make soak: the other two (make test: one method, the resume machinery is shared)
        pytest.param("packed", marks=pytest.mark.soak),
        pytest.param("mc_dropout", marks=pytest.mark.soak),
    ],
)
def test_each_method_resumes_bitwise_after_a_stop(tmp_path, tfds_dir, method):
    """Stopped after 5 of the 16 steps (a checkpoint per epoch of 8) and rerun: the same
    history, members and checkpoint arrays as the run never stopped, bit for bit."""
    cfg = tiny_config(
        tfds_dir,
        "model.name=cnn",
        "model.options={dropout_rate: 0.2}" if method == "mc_dropout" else "model.options={}",
        f"ensemble.method={method}",
        "ensemble.members_per_network=2",
        "ensemble.mc_samples=3",
        "train.epochs=2",
        "checkpoint.keep=5",
        "data.validation_fraction=0.25",
    )
    dataset = runs.prepare(cfg.data)
    full = runs.train(cfg, dataset, tmp_path / "full")
    with pytest.raises(PreemptedError):
        runs.train(cfg, dataset, tmp_path / "stopped", should_stop=stop_after(5))
    resumed = runs.train(cfg, dataset, tmp_path / "stopped")
    assert resumed.history == full.history and resumed.members == full.members
    assert_checkpoints_equal(cfg, dataset, tmp_path / "full", tmp_path / "stopped")


@pytest.mark.slow  # one small run through runs.run
def test_a_multi_member_run_keeps_its_selection_and_counts_member_images(tmp_path, tfds_dir):
    """The select stage's record names rows (E x M members) and the ensemble is loaded with
    its temperature; it was set aside as damaged ("not ... in [0, 1)") when read against
    the network count. The training throughput counts member-images (M per image)."""
    cfg = tiny_config(
        tfds_dir,
        "model.name=cnn",
        "ensemble.method=batch_ensemble",
        "ensemble.size=1",
        "ensemble.members_per_network=2",
        "data.validation_fraction=0.25",
        "eval.temperature_scaling=true",
    )
    result = runs.run(cfg, tmp_path, "r")
    loaded = runs.load_ensemble(cfg, result.run_dir.path, 10, (28, 28, 1))
    assert loaded.temperature is not None and len(loaded.members.rows) == 2
    assert not (tmp_path / "corrupt-state").exists() and not (result.run_dir.path / "corrupt-state").exists()
    assert "BatchEnsemble: each network holds 2 members" in (result.run_dir.path / "report.md").read_text()
    timing = result.training.timing
    assert timing.train_member_images_per_s == pytest.approx(timing.steps * 32 * 2 / timing.train_seconds)
