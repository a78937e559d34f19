"""Hyper-deep ensembles (Wenzel et al. 2020, Algorithm 2): the stratification stage.

The stratified members against each (setting, initialisation) trained alone by the
seed tutorial's single-model loop (tests/oracles.py), the one-line refusals, and the
report of a stratified run read back from its files, and the stratified pool stopped
mid-training and resumed. The SIGKILL resume is in tests/test_stratify_resume.py (a soak
test: a training process killed and resumed).
"""

import json
import shutil

import jax
import numpy as np
import optax
import pytest

from ensemble_core import rngs, runs
from ensemble_core.config import load_config
from ensemble_core.errors import CheckpointError, ConfigError
from ensemble_core.runs.dataset import load
from ensemble_core.runs.ensemble.load import restore
from ensemble_core.runs.ensemble.pool import final_pool
from ensemble_core.runs.storage.records import plan_path
from ensemble_core.train import unstacked
from tests.ensembles import assert_checkpoints_equal, stop_after
from tests.oracles import train_member_alone
from tests.test_hyper import _optax_schedule

BATCH = 32
SEARCH = (
    "ensemble.search={learning_rate: {distribution: log_uniform, low: 0.02, high: 0.3}, "
    "weight_decay: {distribution: log_uniform, low: 1.0e-5, high: 1.0e-3}, "
    "label_smoothing: {distribution: uniform, low: 0.0, high: 0.1}, "
    "schedule: {distribution: choice, values: [constant, cosine, warmup_cosine]}, "
    "warmup_epochs: {distribution: uniform, low: 0.2, high: 1.0}}"
)


def _cfg(tfds_dir, *overrides):
    base = [
        f"data.data_dir={tfds_dir}",
        "data.max_train_examples=640",
        "data.validation_fraction=0.25",  # 480 train (15 steps of 32), 160 validation
        "data.max_test_examples=200",
        "model.name=mlp",  # small rounding differences between the pool's program and the oracle's
        "model.hidden_sizes=[32]",
        "ensemble.size=4",
        "ensemble.select_size=3",
        "ensemble.stratify=2",
        "ensemble.first_selection={replacement: false}",  # three distinct settings: a pool of 6
        f"train.batch_size={BATCH}",
        "train.epochs=2",
        "promotion.enabled=false",
        "eval.evaluators=[test]",
        "eval.temperature_scaling=true",
        SEARCH,
    ]
    return load_config(None, [*base, *overrides])


@pytest.fixture(scope="module")
def stratified(tmp_path_factory, tfds_dir):
    cfg = _cfg(tfds_dir)
    out = tmp_path_factory.mktemp("strat")
    result = runs.run(cfg, out, "hd")
    return cfg, result


@pytest.mark.slow  # a hyper-deep run (about 10 s)
def test_stratified_members_equal_each_setting_and_initialisation_trained_alone(stratified, tfds_dir):
    cfg, result = stratified
    strat = result.stratification
    assert len(strat.settings) == 3 and strat.inits == 2
    pool_cfg, pool_run, plan = final_pool(cfg, result.run_dir)
    assert pool_cfg.ensemble.size == 6 and plan.settings == strat.settings
    dataset = runs.prepare(cfg.data)
    state, built = restore(pool_cfg, pool_run.path, dataset.num_classes, dataset.image_shape)
    images, labels = load(cfg, dataset, "train")
    steps = len(images) // BATCH
    search_hp = cfg.member_hyperparameters()
    for m in (0, 3, 5):
        s, j = plan.member(m)
        keys = rngs.stratified_member_keys(cfg.seed, [(s, j)])
        hp = search_hp[s]  # the setting's values, drawn for search-pool member s
        order = np.concatenate([rngs.epoch_order(keys["data"], k, len(images), BATCH) for k in range(2)])
        tx = optax.chain(
            optax.add_decayed_weights(hp["weight_decay"]),
            optax.sgd(_optax_schedule(hp, steps, 2), momentum=cfg.train.momentum),
        )
        params0 = built.model.init(keys["init"][0], np.zeros((1, 28, 28, 1), np.float32))["params"]
        alone = train_member_alone(
            built.model, tx, params0, images, labels, order[:, 0], label_smoothing=hp["label_smoothing"]
        )
        other = jax.tree.leaves(unstacked(state.params, (m + 2) % 6))  # another setting
        for got, want, far in zip(
            jax.tree.leaves(unstacked(state.params, m)), jax.tree.leaves(alone), other, strict=True
        ):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=1e-5)
            assert np.median(np.abs(np.asarray(got) - np.asarray(want))) < 1e-5
            assert np.mean(np.abs(np.asarray(want) - np.asarray(far)) > 2e-5) > 0.5
    # the search pool's member s is another network than stratified member (s, j)
    search_state, _ = restore(cfg, result.run_dir.path, dataset.num_classes, dataset.image_shape)
    s0 = plan.settings[0]
    assert not np.allclose(
        jax.tree.leaves(unstacked(search_state.params, s0))[0], jax.tree.leaves(unstacked(state.params, 0))[0]
    )


@pytest.mark.slow  # the hyper-deep run of the fixture, and the stratified pool again
def test_the_stratified_pool_stopped_mid_training_resumes_bitwise(stratified, tmp_path):
    """The stratification stage of a run whose search pool has trained, stopped at step 7
    of the stratified pool's 30 (a stop request, as a SIGTERM makes) and run again: the
    same plan, and the stratified pool's history, members and final arrays bitwise those of
    the run never stopped."""
    from ensemble_core.errors import PreemptedError
    from ensemble_core.runs.ensemble.stratify import stratify

    cfg, result = stratified
    run = tmp_path / "hd"
    shutil.copytree(
        result.run_dir.path, run, ignore=lambda d, names: ["stratified"] if d == str(result.run_dir.path) else []
    )
    dataset = runs.prepare(cfg.data)
    with pytest.raises(PreemptedError):
        stratify(cfg, dataset, run, should_stop=stop_after(7))
    stopped_at = sorted(int(c.name) for c in (run / "stratified" / "checkpoints").iterdir() if c.name.isdigit())
    assert stopped_at and stopped_at[-1] < 30  # stopped inside the pool's training, checkpointed
    resumed = stratify(cfg, dataset, run)
    want = result.stratification
    assert (resumed.settings, resumed.inits, resumed.first_selection) == (
        want.settings,
        want.inits,
        want.first_selection,
    )
    assert resumed.training.resumed_from is not None
    assert resumed.training.history == want.training.history and resumed.training.members == want.training.members
    plan = runs.RunDir(run)
    assert json.loads(plan_path(plan.stratified.path).read_text()) == json.loads(
        plan_path(result.run_dir.stratified.path).read_text()
    )
    pool_cfg, _, _ = final_pool(cfg, plan)
    assert_checkpoints_equal(pool_cfg, dataset, result.run_dir.stratified.path, plan.stratified.path)


@pytest.mark.slow
def test_stratified_run_reports_the_first_selection_the_pool_and_the_final_selection(stratified):
    cfg, result = stratified
    run = result.run_dir
    report = json.loads(run.report_json.read_text())
    strat = report["stratification"]
    plan = json.loads(plan_path(run.stratified.path).read_text())
    assert strat["settings"] == plan["settings"] == result.stratification.settings
    assert [(r["setting"], r["init"]) for r in strat["pool"]] == [(s, j) for s in plan["settings"] for j in range(2)]
    # the final selection indexes the stratified pool; prediction uses those rows
    selection = json.loads(run.selection_json.read_text())
    assert len(selection["members"]) == 3 and all(0 <= m < 6 for m in selection["members"])
    picked = {m: selection["members"].count(m) for m in set(selection["members"])}
    assert {r["member"]: r["selected"] for r in strat["pool"] if r["selected"]} == picked
    assert strat["distinct_networks"] == len(picked)
    # the search pool's rows carry the first selection; without replacement 3 distinct settings
    first = {int(k): v for k, v in plan["first_selection"]["multiplicities"].items()}
    assert {r["member"]: r["selected"] for r in report["pool"] if r["selected"]} == first
    assert sorted(first) == sorted(plan["settings"])
    # the validation NLL of the selected ensemble, recomputed from the stratified pool's arrays
    val = np.load(run.evaluator_arrays("validation"))
    assert val["member_probs"].shape[0] == 6
    p = val["member_probs"][selection["members"]].astype(np.float64).mean(0)
    want = -np.mean(np.log(p[np.arange(len(val["labels"])), val["labels"]]))
    assert report["selection"]["validation_nll"][-1] == pytest.approx(want, rel=1e-6)
    md = run.report_md.read_text()
    assert "**Stratification**" in md and "| stratified member | setting | initialisation" in md
    # prediction on new images uses the stratified pool's selected members
    images = np.load(run.predictions)["member_probs"]
    out = runs.predict_images(run.path, load(cfg, runs.prepare(cfg.data), "test")[0][:20])
    assert list(out["members"]) == selection["members"]
    np.testing.assert_allclose(out["member_probs"], images[:, :20], atol=1e-6)


@pytest.mark.slow  # a hyper-deep run (about 10 s)
def test_a_damaged_plan_is_refused_with_one_line(stratified, tmp_path):
    import shutil

    cfg, result = stratified
    copy = tmp_path / "hd"
    shutil.copytree(result.run_dir.path, copy)
    plan_path(runs.RunDir(copy).stratified.path).write_text("{not json")
    with pytest.raises(CheckpointError, match=r"stratified/plan\.json is damaged") as err:
        final_pool(cfg, runs.RunDir(copy))
    assert "\n" not in str(err.value) and "fix:" in str(err.value)
    assert runs.RunDir(copy).stratified.path.is_dir()  # nothing deleted


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["ensemble.select_size=null"], "ensemble.stratify=2 trains the settings a selection keeps"),
        (["data.validation_fraction=0"], "ensemble.stratify.* need\\(s\\) a validation split"),
        (["ensemble.select_size=5"], "ensemble.select_size=5 is larger than the pool of ensemble.size=4"),
        (["ensemble.selection={sorted_init: 4}"], "sorted_init=4 starts from more members"),
        (["ensemble.stratify=0"], "ensemble.stratify"),
        (["ensemble.selection={bags: -1}"], "ensemble.selection.bags"),
        (["ensemble.first_selection={sorted_init: 4}"], "first_selection.sorted_init=4 starts from more"),
        (
            ["ensemble.first_selection={replacement: true}"],
            "picks 3 distinct members of the stratified pool, but with ensemble.stratify=2 it may hold only 2",
        ),
    ],
)
def test_stratification_misconfigurations_are_one_line_refusals(tfds_dir, tmp_path, overrides, match):
    with pytest.raises(ConfigError, match=match) as err:
        _cfg(tfds_dir, *overrides)
    assert "\n" not in str(err.value) and "fix:" in str(err.value)
    assert not any(tmp_path.iterdir())
