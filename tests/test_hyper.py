"""Hyper-deep ensembles: per-member hyperparameters, the validation split, best epochs and
early stopping, checked against members trained alone and against recorded snapshots."""

import jax
import numpy as np
import optax
import pytest

from ensemble_core import data, rngs, runs
from ensemble_core import ensemble_setup as setup
from ensemble_core.config import PipelineConfig, load_config
from ensemble_core.errors import ConfigError, IncompatibleRunError, PreemptedError
from ensemble_core.train import unstacked
from tests.ensembles import assert_checkpoints_equal, stop_after, tiny_config, train_small
from tests.oracles import train_member_alone

N_TRAIN = 256
BATCH = 32
SEARCH = (
    "ensemble.search={learning_rate: {distribution: log_uniform, low: 0.01, high: 0.3}, "
    "weight_decay: {distribution: log_uniform, low: 1.0e-4, high: 1.0e-2}, "
    "label_smoothing: {distribution: uniform, low: 0.0, high: 0.2}, "
    "schedule: [constant, cosine, warmup_cosine, warmup_cosine], warmup_epochs: [0, 0, 0.5, 1.5]}"
)


def _config(*overrides: str) -> PipelineConfig:
    base = [
        "model.name=mlp",
        "model.hidden_sizes=[32]",
        "ensemble.size=4",
        f"train.batch_size={BATCH}",
        "train.epochs=2",
        "mesh.member_strategy=vmap",
    ]
    return load_config(None, [*base, *overrides])


# MARK: per-member hyperparameters


def test_member_values_depend_on_seed_and_member_index_only():
    space = (
        "ensemble.search={learning_rate: {distribution: log_uniform, low: 0.001, high: 1.0}, "
        "schedule: {distribution: choice, values: [constant, cosine]}}"
    )
    four = _config(space).member_hyperparameters()
    twelve = _config(space, "ensemble.size=12").member_hyperparameters()
    assert twelve[:4] == four
    assert len({hp["learning_rate"] for hp in twelve}) == 12
    assert all(0.001 <= hp["learning_rate"] <= 1.0 for hp in twelve)
    # another seed, other values; searching one more hyperparameter leaves the others alone
    assert _config(space, "seed=1").member_hyperparameters()[0]["learning_rate"] != four[0]["learning_rate"]
    more = space.replace("}}", "}, label_smoothing: {distribution: uniform, low: 0, high: 0.1}}")
    assert [hp["learning_rate"] for hp in _config(more).member_hyperparameters()] == [
        hp["learning_rate"] for hp in four
    ]
    # log-uniform: the log of 4,000 draws is uniform (Kolmogorov-Smirnov against scipy's uniform)
    from scipy import stats

    many = _config(space, "ensemble.size=4000").member_hyperparameters()
    logs = np.log10([hp["learning_rate"] for hp in many])
    assert stats.kstest(logs, stats.uniform(loc=-3, scale=3).cdf).pvalue > 0.01
    # without a search every member has the train section's values
    plain = _config("train.learning_rate=0.05", "train.label_smoothing=0.1").member_hyperparameters()
    assert all(hp["learning_rate"] == 0.05 and hp["label_smoothing"] == 0.1 for hp in plain)


def _optax_schedule(hp: dict, steps_per_epoch: int, epochs: int):
    """The member's schedule written from optax's documentation, for the oracle."""
    total = steps_per_epoch * epochs
    if hp["schedule"] == "constant":
        return hp["learning_rate"]
    warmup = round(hp["warmup_epochs"] * steps_per_epoch)
    if hp["schedule"] == "cosine" or warmup == 0:
        return optax.schedules.cosine_decay_schedule(hp["learning_rate"], total)
    return optax.schedules.warmup_cosine_decay_schedule(0.0, hp["learning_rate"], warmup, total)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_per_member_hyperparameters_equal_each_member_trained_alone(mnist_train, optimizer):
    images, labels = mnist_train[0][:N_TRAIN], mnist_train[1][:N_TRAIN]
    space = SEARCH if optimizer == "sgd" else SEARCH.replace("low: 0.01, high: 0.3", "low: 1.0e-4, high: 3.0e-3")
    cfg = _config(space, f"train.optimizer={optimizer}")
    built = setup.build(cfg, 10, num_devices=2)
    hps = built.hyperparameters()
    assert len({hp["schedule"] for hp in hps}) == 3 and all(hp["label_smoothing"] > 0 for hp in hps)
    keys = built.member_keys()
    state, _ = train_small(built, images, labels, epochs=2)
    steps = N_TRAIN // BATCH
    order = np.concatenate([rngs.epoch_order(keys["data"], k, N_TRAIN, BATCH) for k in range(2)])  # [2S, E, B]
    for m, hp in enumerate(hps):
        schedule = _optax_schedule(hp, steps, 2)
        if optimizer == "sgd":  # L2 in the gradient, then SGD with momentum
            tx = optax.chain(optax.add_decayed_weights(hp["weight_decay"]), optax.sgd(schedule, momentum=0.9))
        else:
            tx = optax.adamw(schedule, weight_decay=hp["weight_decay"])
        params0 = built.model.init(keys["init"][m], np.zeros((1, 28, 28, 1), np.float32))["params"]
        alone = train_member_alone(
            built.model, tx, params0, images, labels, order[:, m], label_smoothing=hp["label_smoothing"]
        )
        # Adam divides by sqrt(v) + eps, which amplifies float32 rounding differences of
        # the two programs for weights whose gradients are ~0; a wrong learning rate, decay
        # or smoothing moves most weights by far more.
        atol = 2e-5 if optimizer == "sgd" else 1e-4
        other = jax.tree.leaves(unstacked(state.params, (m + 1) % 4))
        for got, want, far in zip(
            jax.tree.leaves(unstacked(state.params, m)), jax.tree.leaves(alone), other, strict=True
        ):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=atol, rtol=1e-5)
            assert np.median(np.abs(np.asarray(got) - np.asarray(want))) < 1e-5
            assert np.mean(np.abs(np.asarray(want) - np.asarray(far)) > atol) > 0.5  # another member: far off


def test_learning_rate_table_is_each_members_optax_schedule():
    cfg = _config(SEARCH, "train.epochs=3")
    built = setup.build(cfg, 10, num_devices=1)
    rates = built.learning_rates(N_TRAIN)
    table = np.concatenate([rates(k) for k in range(3)])  # [3S, E]
    steps = N_TRAIN // BATCH
    for m, hp in enumerate(built.hyperparameters()):
        schedule = _optax_schedule(hp, steps, 3)
        want = [schedule(t) if callable(schedule) else schedule for t in range(3 * steps)]
        np.testing.assert_allclose(table[:, m], np.asarray(want, np.float32), rtol=1e-5, atol=1e-8)
    assert table[0, 2] == 0.0 and table[-1, 1] < table[0, 1] / 10  # warm-up from 0; cosine to ~0


# MARK: the validation split


@pytest.mark.parametrize("fraction", [0.1, 0.25, 0.5])
def test_validation_split_is_stratified_disjoint_and_fixed(mnist_train, fraction):
    labels = mnist_train[1]
    train_idx, val_idx = data.validation_split(labels, fraction)
    assert len(val_idx) == round(fraction * len(labels))
    assert np.intersect1d(train_idx, val_idx).size == 0
    np.testing.assert_array_equal(np.sort(np.concatenate([train_idx, val_idx])), np.arange(len(labels)))
    counts = np.bincount(labels, minlength=10)
    held = np.bincount(labels[val_idx], minlength=10)
    assert np.all(np.abs(held - fraction * counts) <= 1)  # every class keeps its share
    again = data.validation_split(labels.copy(), fraction)
    np.testing.assert_array_equal(again[1], val_idx)
    assert data.validation_split(labels, 0.0)[1].size == 0
    with pytest.raises(ValueError, match="outside"):
        data.validation_split(labels, 1.0)


def test_calibration_split_is_stratified_disjoint_and_leaves_validation_alone(mnist_train):
    labels = mnist_train[1]
    train, val, cal = data.calibration_split(labels, 0.1, 0.15)
    assert len(cal) == round(0.15 * len(labels)) and len(val) == round(0.1 * len(labels))
    # the validation split is the one without a calibration split: selection keeps its examples
    np.testing.assert_array_equal(val, data.validation_split(labels, 0.1)[1])
    assert np.intersect1d(cal, np.union1d(train, val)).size == 0
    np.testing.assert_array_equal(np.sort(np.concatenate([train, val, cal])), np.arange(len(labels)))
    counts = np.bincount(labels, minlength=10)
    assert np.all(np.abs(np.bincount(labels[cal], minlength=10) - 0.15 * counts) <= 1)  # stratified
    np.testing.assert_array_equal(data.calibration_split(labels.copy(), 0.1, 0.15)[2], cal)  # fixed
    assert data.calibration_split(labels, 0.1, 0.0)[2].size == 0
    with pytest.raises(ValueError, match="no training examples"):
        data.calibration_split(labels, 0.5, 0.5)


def test_run_trains_on_train_less_validation_and_never_sees_test(tfds_dir):
    cfg = tiny_config(tfds_dir, "data.validation_fraction=0.25", "data.calibration_fraction=0.1")
    dataset = runs.prepare(cfg.data)
    train_x, _ = _load(cfg, dataset, "train")
    val_x, _ = _load(cfg, dataset, "validation")
    test_x, _ = _load(cfg, dataset, "test")
    cal_x, _ = _load(cfg, dataset, "calibration")
    # 256 = 64 validation (25%) + 26 calibration (round(10% of 256)) + 166 training
    assert len(train_x) == 166 and len(val_x) == 64 and len(cal_x) == 26 and len(test_x) == 100
    full_x, _ = data.load_split(cfg.data.name, "train", dataset.tfds_data_dir, 256)
    # train, validation and calibration are the first 256 training digits, split without overlap
    whole = np.concatenate([train_x, val_x, cal_x])
    assert sorted(x.tobytes() for x in whole) == sorted(x.tobytes() for x in full_x)
    assert not {x.tobytes() for x in train_x} & {x.tobytes() for x in val_x}
    assert not {x.tobytes() for x in cal_x} & ({x.tobytes() for x in train_x} | {x.tobytes() for x in val_x})
    # the members train on exactly the training carve (the indices, not only the images)
    _, labels = data.load_split(cfg.data.name, "train", dataset.tfds_data_dir, 256)
    idx = runs.dataset.split_indices(cfg, labels)
    assert np.intersect1d(idx["calibration"], np.union1d(idx["train"], idx["validation"])).size == 0
    np.testing.assert_array_equal(np.sort(np.concatenate(list(idx.values()))), np.arange(256))
    assert runs.dataset.num_train(cfg, dataset) == len(train_x)


def _load(cfg, dataset, split):
    from ensemble_core.runs.dataset import load

    return load(cfg, dataset, split)


# MARK: best epochs and early stopping


@pytest.mark.slow
def test_best_parameters_are_the_members_parameters_at_its_best_epoch(mnist_train):
    images, labels = mnist_train[0][:N_TRAIN], mnist_train[1][:N_TRAIN]
    val_images = mnist_train[0][N_TRAIN : N_TRAIN + 200]
    # random labels: validation NLL rises once a member fits the training digits, so members stop
    val_labels = np.random.default_rng(0).permutation(mnist_train[1][N_TRAIN : N_TRAIN + 200])
    cfg = _config(
        "ensemble.size=4", "train.epochs=6", "train.patience=1", SEARCH.replace("0, 0, 0.5, 1.5", "0, 0, 1, 2")
    )
    built = setup.build(cfg, 10, num_devices=2)
    keys = built.member_keys()
    state = built.init_state(keys["init"], images.shape[1:])
    snapshots, records = [], []

    def on_epoch_end(epoch, st, record):
        snapshots.append(jax.tree.map(np.asarray, st.params))
        records.append(record)

    state, _ = train_small(
        built,
        images,
        labels,
        epochs=6,
        state=state,
        end_of_epoch=built.validation(val_images, val_labels),
        on_epoch_end=on_epoch_end,
    )
    nll = np.asarray([r["validation_nll"] for r in records])  # [epochs, E]
    best_epoch = np.asarray(state.best.epoch)
    stopped = np.asarray(state.best.stopped_epoch)
    assert stopped.any(), "no member stopped early; the test does not test stopping"
    for m in range(4):
        last = stopped[m] or 6
        want = int(np.argmin(nll[:last, m])) + 1  # first minimum among the epochs it trained
        assert best_epoch[m] == want
        assert np.float32(nll[want - 1, m]) == np.asarray(state.best.nll)[m]
        for got, kept in zip(
            jax.tree.leaves(unstacked(state.best.params, m)),
            jax.tree.leaves(unstacked(snapshots[want - 1], m)),
            strict=True,
        ):
            np.testing.assert_array_equal(np.asarray(got), kept)
        if stopped[m]:
            assert stopped[m] - best_epoch[m] == 1  # patience 1
            for later in snapshots[stopped[m] :]:  # a stopped member no longer updates
                for a, b in zip(
                    jax.tree.leaves(unstacked(later, m)),
                    jax.tree.leaves(unstacked(snapshots[stopped[m] - 1], m)),
                    strict=True,
                ):
                    np.testing.assert_array_equal(a, b)
    assert np.asarray(state.healthy).all()  # stopping is not divergence


@pytest.mark.slow
@pytest.mark.parametrize("stop_after_steps", [5, 13])
def test_hyper_ensemble_resumes_bitwise_wherever_it_stops(tmp_path, tfds_dir, stop_after_steps):
    cfg = tiny_config(
        tfds_dir,
        "ensemble.size=4",
        "train.epochs=4",
        "train.patience=1",
        "checkpoint.keep=5",
        "data.validation_fraction=0.25",
        SEARCH,
    )
    dataset = runs.prepare(cfg.data)
    full = runs.train(cfg, dataset, tmp_path / "full")
    with pytest.raises(PreemptedError):
        runs.train(cfg, dataset, tmp_path / "stopped", should_stop=stop_after(stop_after_steps))
    resumed = runs.train(cfg, dataset, tmp_path / "stopped")
    assert resumed.history == full.history and resumed.members == full.members
    assert_checkpoints_equal(cfg, dataset, tmp_path / "full", tmp_path / "stopped")


@pytest.mark.slow
def test_more_epochs_on_resume_are_refused_when_the_learning_rate_decays(tmp_path, tfds_dir):
    cfg = tiny_config(tfds_dir, "train.schedule=cosine")
    dataset = runs.prepare(cfg.data)
    runs.train(cfg, dataset, tmp_path / "r")
    longer = tiny_config(tfds_dir, "train.schedule=cosine", "train.epochs=2")
    with pytest.raises(IncompatibleRunError, match="decays its learning rate"):
        runs.preflight(longer, tmp_path, "r")


# MARK: config


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["ensemble.search={learning_rate: [0.1, 0.2]}"], "lists 2 values for ensemble.size=4"),
        (["ensemble.search={learning_rate: {distribution: log_uniform, low: 0, high: 1}}"], "low > 0"),
        (["ensemble.search={label_smoothing: {distribution: uniform, low: 0.5, high: 2}}"], "label_smoothing"),
        (["ensemble.search={momentum: [0.9, 0.9, 0.9, 0.9]}"], "ensemble.search.momentum"),
        (["ensemble.search={schedule: {distribution: choice, values: [linear]}}"], "schedule"),
        (["ensemble.select_size=4", "data.validation_fraction=0"], "need\\(s\\) a validation split"),
        (["train.patience=2", "data.validation_fraction=0"], "validation split"),
        (["train.schedule=warmup_cosine", "train.warmup_epochs=2"], "warms up for 2 epochs"),
    ],
)
def test_bad_search_or_selection_settings_are_one_line_errors(overrides, match):
    with pytest.raises(ConfigError, match=match) as err:
        _config(*overrides)
    assert "\n" not in str(err.value) and "fix:" in str(err.value)


# MARK: selection and temperature scaling in a run


@pytest.mark.slow
def test_selected_calibrated_run_evaluates_predicts_and_reports_the_selection(tmp_path, tfds_dir):
    from scipy import optimize, special
    from sklearn.metrics import log_loss

    from ensemble_core.runs.ensemble.load import restore

    cfg = tiny_config(
        tfds_dir,
        "ensemble.size=4",
        "train.epochs=2",
        "data.validation_fraction=0.25",
        "ensemble.select_size=4",
        "eval.temperature_scaling=true",
        SEARCH,
    )
    result = runs.run(cfg, tmp_path, "hyper")
    run = result.run_dir
    report = __import__("json").loads(run.report_json.read_text())
    sel = report["selection"]
    assert len(sel["members"]) == 4 and sum(sel["multiplicities"].values()) == 4
    assert [m["member"] for m in report["pool"]] == [0, 1, 2, 3]
    assert sum(m["selected"] for m in report["pool"]) == 4
    assert all(m["hyperparameters"]["label_smoothing"] > 0 and m["best_epoch"] in (1, 2) for m in report["pool"])
    assert all(len(h["validation_nll"]) == 4 for h in report["history"])

    with np.load(run.eval_dir / "validation.npz") as f:
        val_probs, val_labels = f["member_probs"], f["labels"]
    assert val_probs.shape == (4, 64, 10) and val_probs.dtype == np.float32
    chosen = val_probs[sel["members"]].mean(0)
    assert sel["validation_nll"][-1] == pytest.approx(log_loss(val_labels, chosen, labels=range(10)), abs=1e-6)

    def oracle_nll(probs, labels, t):
        logp = special.log_softmax(np.log(np.maximum(probs, 1e-300)) / t, axis=-1)
        return -np.mean(logp[np.arange(len(labels)), labels])

    ref = optimize.minimize_scalar(lambda t: oracle_nll(chosen, val_labels, t), bounds=(0.05, 20), method="bounded")
    assert sel["temperature"] == pytest.approx(ref.x, rel=1e-3)

    # the evaluated rows are the selected members' best-epoch networks, applied one by one
    dataset = runs.prepare(cfg.data)
    state, built = restore(cfg, run.path, dataset.num_classes, dataset.image_shape)
    with np.load(run.predictions) as f:
        rows, labels = f["member_probs"], f["labels"]
    test_x, _ = data.load_split(cfg.data.name, "test", dataset.tfds_data_dir, 100)
    for k, m in enumerate(sel["members"]):
        params = unstacked(state.best.params, m)
        probs = jax.nn.softmax(built.model.apply({"params": params}, test_x / np.float32(255)))
        np.testing.assert_allclose(rows[k], np.asarray(probs), atol=1e-5)
    mean = rows.mean(0)
    assert report["ensemble"]["nll"] == pytest.approx(log_loss(labels, mean, labels=range(10)), abs=1e-5)
    scaled = report["ensemble_temperature_scaled"]
    assert scaled["nll"] == pytest.approx(oracle_nll(mean, labels, sel["temperature"]), abs=1e-5)

    out = runs.predict_images(run.path, test_x)
    want = special.softmax(np.log(np.maximum(mean, 1e-300)) / sel["temperature"], axis=-1)
    np.testing.assert_allclose(out["ensemble_probs"], want, atol=1e-5)
    assert out["members"].tolist() == sel["members"]
    assert "Greedy ensemble selection" in run.report_md.read_text()
