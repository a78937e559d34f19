"""``train.member_choice``: which epoch's parameters of each member are evaluated (best by
validation NLL, best by validation accuracy, or final), checked against per-epoch snapshots
and against accuracies computed here from the validation labels."""

import jax
import numpy as np
import pytest

from ensemble_core import ensemble_setup as setup
from ensemble_core.config import load_config
from ensemble_core.errors import ConfigError
from ensemble_core.predict import member_probs
from ensemble_core.train import unstacked
from tests.ensembles import train_small

N_TRAIN = 256
EPOCHS = 4


def _train(mnist_train, choice: str):
    images, labels = mnist_train[0][:N_TRAIN], mnist_train[1][:N_TRAIN]
    val_images = mnist_train[0][N_TRAIN : N_TRAIN + 200]
    # shuffled labels: validation accuracy wanders, so the best epoch is not simply the last
    val_labels = np.random.default_rng(1).permutation(mnist_train[1][N_TRAIN : N_TRAIN + 200])
    cfg = load_config(
        None,
        [
            "model.name=mlp",
            "model.hidden_sizes=[32]",
            "ensemble.size=4",
            "train.batch_size=32",
            f"train.epochs={EPOCHS}",
            "train.learning_rate=0.3",
            "mesh.member_strategy=vmap",
            f"train.member_choice={choice}",
        ],
    )
    built = setup.build(cfg, 10, num_devices=2)
    state = built.init_state(built.member_keys()["init"], images.shape[1:])
    snapshots = []

    def on_epoch_end(epoch, st, record):
        snapshots.append(jax.tree.map(np.asarray, st.params))

    state, _ = train_small(
        built,
        images,
        labels,
        epochs=EPOCHS,
        state=state,
        end_of_epoch=built.validation(val_images, val_labels),
        on_epoch_end=on_epoch_end,
    )
    # each epoch's validation accuracy, from the snapshot's probabilities and the labels here
    accuracy = np.asarray(
        [
            (
                member_probs(built.predict_fn(), {"params": snap}, val_images, built.mesh, 64).argmax(-1) == val_labels
            ).mean(-1)
            for snap in snapshots
        ]
    )  # [epochs, E]
    return state, snapshots, accuracy


def _assert_member_params(got, snapshot, m):
    for a, b in zip(jax.tree.leaves(unstacked(got, m)), jax.tree.leaves(unstacked(snapshot, m)), strict=True):
        np.testing.assert_array_equal(np.asarray(a), b)


@pytest.mark.slow  # over 1 CPU s with a warm compilation cache: make test-fast leaves it out (docs/development.md)
def test_best_validation_accuracy_evaluates_each_members_first_most_accurate_epoch(mnist_train):
    state, snapshots, accuracy = _train(mnist_train, "best_validation_accuracy")
    want = accuracy.argmax(axis=0) + 1  # argmax: the first of ties
    assert len(set(want.tolist())) > 1 or set(want.tolist()) != {EPOCHS}, "every member's best is its last epoch"
    np.testing.assert_array_equal(np.asarray(state.best.epoch), want)
    np.testing.assert_allclose(np.asarray(state.best.nll), 1 - accuracy.max(axis=0), atol=1e-6)  # error rate
    for m in range(4):
        _assert_member_params(state.final_params, snapshots[want[m] - 1], m)


@pytest.mark.slow  # over 1 CPU s with a warm compilation cache: make test-fast leaves it out (docs/development.md)
def test_final_evaluates_the_last_epoch_even_with_a_validation_split(mnist_train):
    state, snapshots, _ = _train(mnist_train, "final")
    assert state.best is not None and np.asarray(state.best.epoch).min() >= 1  # best epochs still tracked
    for m in range(4):
        _assert_member_params(state.final_params, snapshots[-1], m)
        _assert_member_params(state.final_variables["params"], snapshots[-1], m)


def test_best_by_accuracy_without_a_validation_split_is_refused():
    with pytest.raises((ConfigError, ValueError), match=r"member_choice=best_validation_accuracy.*validation split"):
        load_config(None, ["data.validation_fraction=0", "train.member_choice=best_validation_accuracy"])
    load_config(None, ["data.validation_fraction=0", "train.member_choice=final"])  # needs none
