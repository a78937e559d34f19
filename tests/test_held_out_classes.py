"""Training on a subset of the classes (``data.classes``) and scoring the rest as
out-of-distribution (the ``ood`` evaluator's ``source: held_out_classes``): what each
split holds, checked against an independent numpy filter of the raw splits; names and
indices; every refusal in one line; one tiny run end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from ensemble_core import data, evaluators, runs
from ensemble_core.config import EvaluatorSpec, load_config
from ensemble_core.errors import ConfigError, DataError, IncompatibleRunError
from ensemble_core.runs import dataset as run_dataset
from ensemble_core.runs.champion.promotion import champion_class_names, class_map_changed
from ensemble_core.runs.champion.retraining import check_class_map
from ensemble_core.runs.preflight import preflight
from tests.ensembles import predictions, tiny_config

KEPT = (1, 3, 7)
HELD_OUT = {"held_out": {"type": "ood", "source": "held_out_classes"}}


def _cfg(tfds_dir: str, *overrides: str):
    return load_config(None, [f"data.data_dir={tfds_dir}", *overrides])


def _one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text and "; fix: " in text, text
    return text


def _filtered(images, labels, kept, limit=None):
    """The independent reference: numpy's mask of the kept classes, the first ``limit``,
    labels by position in ``kept``."""
    mask = np.zeros(len(labels), bool)
    for c in kept:
        mask |= labels == c
    idx = np.nonzero(mask)[0][:limit]
    remap = {c: k for k, c in enumerate(sorted(kept))}
    return images[idx], np.array([remap[int(v)] for v in labels[idx]], np.int32)


def _others(images, labels, kept, limit=None):
    idx = np.nonzero(~np.isin(labels, list(kept)))[0][:limit]
    return images[idx], labels[idx]


# MARK: what each split holds


@pytest.mark.parametrize("caps", [(None, None), (500, 120)], ids=["whole", "capped"])
def test_held_out_classes_never_reach_training(tfds_dir, mnist_train, mnist_test, caps):
    max_train, max_test = caps
    cfg = _cfg(
        tfds_dir,
        "data.classes=[7, 1, 3]",
        f"data.max_train_examples={max_train or 'null'}",
        f"data.max_test_examples={max_test or 'null'}",
    )
    full = data.prepare(data.EMBEDDED, tfds_dir)
    view = run_dataset.prepare(cfg.data)
    # the run's view: K classes, their names; the snapshot and its files are the dataset's
    assert (view.num_classes, view.class_names, view.class_indices) == (3, ("1", "3", "7"), KEPT)
    assert view.snapshot == full.snapshot and view.tfds_data_dir == full.tfds_data_dir
    assert len(view.snapshot.class_names) == 10

    kept_train = _filtered(*mnist_train, KEPT, max_train)
    train, val, cal = (run_dataset.load(cfg, view, s) for s in ("train", "validation", "calibration"))
    for _, labels in (train, val, cal):
        assert labels.dtype == np.int32 and set(labels.tolist()) == {0, 1, 2}
    # train, validation and calibration are the kept classes' examples (filtered, then capped), carved
    carved = data.calibration_split(kept_train[1], cfg.data.validation_fraction, cfg.data.calibration_fraction)
    for (images, labels), idx in zip((train, val, cal), carved, strict=True):
        assert np.array_equal(images, kept_train[0][idx]) and np.array_equal(labels, kept_train[1][idx])
    assert len(train[0]) + len(val[0]) + len(cal[0]) == len(kept_train[0]) == (max_train or view.num_train)
    assert run_dataset.num_train(cfg, view) == len(train[0])

    test = run_dataset.load(cfg, view, "test")
    expected = _filtered(*mnist_test, KEPT, max_test)
    assert np.array_equal(test[0], expected[0]) and np.array_equal(test[1], expected[1])
    assert set(test[1].tolist()) == {0, 1, 2}

    held = run_dataset.load_held_out(cfg, view)
    other = _others(*mnist_test, KEPT, max_test)
    assert held[0].dtype == np.uint8 and held[1].dtype == np.int32
    assert np.array_equal(held[0], other[0]) and np.array_equal(held[1], other[1])
    assert not set(held[1].tolist()) & set(KEPT) and set(held[1].tolist()) == set(range(10)) - set(KEPT)
    # the kept classes' test images and the held-out ones are the test split, less the cap
    if max_test is None:
        assert len(test[0]) + len(held[0]) == len(mnist_test[0])


def test_one_snapshot_serves_every_subset(tfds_dir):
    """No snapshot is prepared for a subset: the same directory, the same fingerprint."""
    views = [run_dataset.prepare(_cfg(tfds_dir, f"data.classes={c}").data) for c in ("[1, 3, 7]", "[0, 2]", "null")]
    assert len({v.snapshot.fingerprint for v in views}) == 1 and len({v.tfds_data_dir for v in views}) == 1
    assert [v.num_classes for v in views] == [3, 2, 10]
    assert views[2].class_indices is None and views[2] == data.prepare(data.EMBEDDED, tfds_dir)


@pytest.fixture(scope="module")
def animals(tmp_path_factory):
    """An arrays source with class names (ant, bee, cat, dog) and its TFDS data dir."""
    root = tmp_path_factory.mktemp("animals")
    (root / "zoo").mkdir()
    rng = np.random.default_rng(3)
    for split, n in (("train", 48), ("test", 24)):  # labels 0, 1, 2, 3, 0, 1, ...
        np.savez(
            root / "zoo" / f"{split}.npz", image=rng.integers(0, 256, (n, 6, 5), dtype=np.uint8), label=np.arange(n) % 4
        )
    return root


def _animals_cfg(animals, *overrides: str):
    return load_config(
        None,
        [
            "data.source=arrays",
            f"data.path={animals / 'zoo'}",
            "data.class_names=[ant, bee, cat, dog]",
            f"data.data_dir={animals / 'tfds'}",
            *overrides,
        ],
    )


@pytest.mark.parametrize("classes", ["[dog, ant]", "[0, 3]", "[3, 0]", "[ant, 3]", "[dog, 0]"])
def test_names_and_indices_give_the_same_subset(animals, classes):
    cfg = _animals_cfg(animals, f"data.classes={classes}")
    view = run_dataset.prepare(cfg.data)
    assert (view.class_indices, view.class_names, view.num_classes) == ((0, 3), ("ant", "dog"), 2)
    reference = _animals_cfg(animals, "data.classes=[0, 3]")
    for split in run_dataset.SPLITS:
        got, want = run_dataset.load(cfg, view, split), run_dataset.load(reference, view, split)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    held = run_dataset.load_held_out(cfg, view)
    assert set(held[1].tolist()) == {1, 2} and len(held[0]) == 12  # bee and cat: 6 test images each


def test_the_order_of_the_list_is_not_the_config(tfds_dir):
    """A reordered list is the same config (sorted: indices, then names), so resuming and
    the unchanged-data check see no change."""
    a, b = (_cfg(tfds_dir, f"data.classes={c}") for c in ("[7, 1, 3]", "[3, 7, 1]"))
    assert a == b and a.data.classes == KEPT
    assert _cfg(tfds_dir, "data.classes=[b, 2, a]").data.classes == (2, "a", "b")


# MARK: refusals, one line each


@pytest.mark.parametrize(
    ("classes", "says"),
    [
        ("[3]", "fewer than two classes"),
        ("[3, 3]", "lists class 3 twice"),
        ("[-1, 2]", "neither a class index"),
        ("[true, 2]", "must be class indices"),
    ],
)
def test_a_list_the_config_refuses(tfds_dir, classes, says):
    with pytest.raises(ConfigError) as err:
        _cfg(tfds_dir, f"data.classes={classes}")
    assert says in _one_line(err) and "data.classes" in str(err.value)


def test_an_index_out_of_range_is_refused(tfds_dir):
    with pytest.raises(ConfigError) as err:
        run_dataset.prepare(_cfg(tfds_dir, "data.classes=[3, 10]").data)
    assert "class index 10 is out of range" in _one_line(err) and "(0..9)" in str(err.value)


def test_an_unknown_name_is_refused_naming_the_known_ones(animals):
    with pytest.raises(ConfigError) as err:
        run_dataset.prepare(_animals_cfg(animals, "data.classes=[ant, zebra]").data)
    text = _one_line(err)
    assert "no class named 'zebra'" in text and all(f"'{n}'" in text for n in ("ant", "bee", "cat", "dog"))


def test_a_class_named_and_indexed_is_listed_twice(animals):
    with pytest.raises(ConfigError) as err:
        run_dataset.prepare(_animals_cfg(animals, "data.classes=[0, ant, cat]").data)
    assert "lists class 0 ('ant') twice" in _one_line(err)


def _first_appearance(labels, kept):
    """Among the kept classes' training examples in order: the class that appears last,
    and how many kept examples come before it."""
    order = np.nonzero(np.isin(labels, kept))[0]
    firsts = {c: int(np.argmax(labels[order] == c)) for c in kept}
    late = max(firsts, key=firsts.get)
    return late, firsts[late]


def test_a_class_without_training_examples_after_the_cap_is_refused_before_any_compute(tfds_dir, mnist_train, tmp_path):
    late, before = _first_appearance(mnist_train[1], [1, 3, 7])
    cfg = tiny_config(tfds_dir, "data.classes=[1, 3, 7]", f"data.max_train_examples={max(before, 1)}")
    with pytest.raises(DataError) as err:
        preflight(cfg, tmp_path / "out", "r")
    text = _one_line(err)
    assert f"class '{late}' (index {late}) has no training examples among the first {before}" in text
    assert "data.max_train_examples" in str(err.value).split("; fix: ")[1]
    assert not (tmp_path / "out" / "r").exists()
    # with the cap where the class appears it trains
    run_dataset.prepare(tiny_config(tfds_dir, "data.classes=[1, 3, 7]", f"data.max_train_examples={before + 1}").data)


def test_a_class_the_validation_carve_empties_is_refused(animals):
    """The first 3 training examples of ant and dog are ant, dog, ant; a validation fraction
    of a half holds out 2 of them, one of each class by the largest remainder: dog's only one."""
    with pytest.raises(DataError) as err:
        run_dataset.prepare(
            _animals_cfg(
                animals, "data.classes=[ant, dog]", "data.max_train_examples=3", "data.validation_fraction=0.5"
            ).data
        )
    assert "once data.validation_fraction=0.5 and data.calibration_fraction=0.1 hold out its 1" in _one_line(err)


def test_held_out_classes_without_data_classes_is_refused_before_any_compute(tfds_dir, tmp_path):
    cfg = tiny_config(tfds_dir, f"eval.evaluators={json.dumps({'test': {}, **HELD_OUT})}")
    with pytest.raises(DataError) as err:
        preflight(cfg, tmp_path / "out", "r")
    text = _one_line(err)
    assert "eval.evaluators.held_out: source held_out_classes" in text
    assert text.endswith("fix: set data.classes to the classes to train on")
    assert not (tmp_path / "out" / "r").exists()
    every = tiny_config(
        tfds_dir, "data.classes=[0,1,2,3,4,5,6,7,8,9]", f"eval.evaluators={json.dumps({'test': {}, **HELD_OUT})}"
    )
    with pytest.raises(DataError) as err:
        preflight(every, tmp_path / "out", "r")
    assert "lists all 10 classes of 'mnist5k'" in _one_line(err)


@pytest.mark.parametrize("option", ["path: /x", "name: mnist", "split: train", "data_dir: /x"])
def test_held_out_classes_takes_no_dataset_options(option):
    spec = EvaluatorSpec.model_validate({"type": "ood", "source": "held_out_classes", **_yaml(option)})
    with pytest.raises(ConfigError) as err:
        evaluators.options("held_out", spec)
    assert "held_out_classes" in _one_line(err)


def _yaml(option: str) -> dict:
    key, _, value = option.partition(": ")
    return {key: value}


# MARK: the class map against the champion


def test_the_champions_class_map_is_that_of_its_classes(tfds_dir):
    view = run_dataset.prepare(_cfg(tfds_dir, "data.classes=[1, 3, 7]").data)
    record = {"snapshot": view.snapshot.model_dump(mode="json"), "data": {"classes": [7, "1", 3]}}
    assert champion_class_names(record) == ("1", "3", "7") and not class_map_changed(record, view)
    whole = {"snapshot": view.snapshot.model_dump(mode="json"), "data": {"classes": None}}
    assert len(champion_class_names(whole)) == 10 and class_map_changed(whole, view)


# MARK: end to end


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tfds_dir):
    """A tiny run on digits 1, 3 and 7 (2 MLP members, 1 epoch), the other seven scored as OOD."""
    out = tmp_path_factory.mktemp("held-out")
    specs = json.dumps({"test": {}, **HELD_OUT})
    cfg = tiny_config(tfds_dir, "data.classes=[7, 1, 3]", "data.max_test_examples=null", f"eval.evaluators={specs}")
    result = runs.run(cfg, out, "r")
    return cfg, out, result, json.loads(result.run_dir.report_json.read_text())


@pytest.mark.slow  # over 1 CPU s with a warm compilation cache: make test-fast leaves it out (docs/development.md)
def test_a_run_on_three_digits_scores_the_other_seven_as_ood(finished, mnist_test):
    _, _, result, report = finished
    kept_test = _filtered(*mnist_test, KEPT)
    other = _others(*mnist_test, KEPT)
    probs = predictions(result.run_dir.path)
    assert probs["member_probs"].shape == (2, len(kept_test[1]), 3)  # K = 3 outputs
    assert np.array_equal(probs["labels"], kept_test[1])
    ood = report["evaluations"]["held_out"]["metrics"]
    assert ood["num_in"] == len(kept_test[1]) and ood["num_ood"] == len(other[1])
    assert "held_out_classes 0, 2, 4, 5, 6, 8, 9" in ood["source"]
    with np.load(result.run_dir.path / "eval" / "held_out.npz") as f:
        scored, is_ood = f["member_probs"], f["is_ood"]
    assert scored.shape == (2, len(kept_test[1]) + len(other[1]), 3)
    assert int(is_ood.sum()) == len(other[1]) and not is_ood[: len(kept_test[1])].any()
    # The scored rows are the test digits' predictions, then the network's predictions of
    # the seven other digits (predicted here from the raw test split, independently).
    np.testing.assert_allclose(scored[:, ~is_ood], probs["member_probs"], atol=1e-5)
    predicted = runs.predict_images(result.run_dir.path, other[0])
    assert predicted["member_probs"].shape == (2, len(other[1]), 3)
    np.testing.assert_allclose(scored[:, is_ood], predicted["member_probs"], atol=1e-5)
    # AUROC of the ensemble's predictive entropy: scikit-learn's on the entropy written out
    # here, and a real detector (a digit the network never saw is the more uncertain;
    # random scores give 0.5, inverted ones 1 - this).
    ens = scored.astype(np.float64).mean(0)
    entropy = -np.sum(ens * np.log(np.maximum(ens, 1e-300)), -1)
    auroc = roc_auc_score(is_ood, entropy)
    assert ood["ensemble"]["auroc"]["entropy"] == pytest.approx(auroc, abs=1e-6)
    assert auroc > 0.6, auroc  # 0.75 here
    # The checkpoint records the run's class map: output k is digit KEPT[k], not "k".
    assert list(predicted["class_names"]) == ["1", "3", "7"]


def test_resuming_under_other_classes_is_refused(finished, tfds_dir):
    _, out, _, _ = finished

    def config(classes: str):
        specs = json.dumps({"test": {}, **HELD_OUT})
        return tiny_config(
            tfds_dir, f"data.classes={classes}", "data.max_test_examples=null", f"eval.evaluators={specs}"
        )

    preflight(config("[3, 7, 1]"), out, "r")  # the same classes in another order: the same run
    with pytest.raises(IncompatibleRunError) as err:
        preflight(config("[1, 3, 8]"), out, "r")
    assert "data.classes: [1, 3, 7] -> [1, 3, 8]" in _one_line(err)


def test_a_champion_on_other_classes_refuses_the_run(finished, tfds_dir):
    """The run became its output directory's champion: a run on other classes is refused
    before training, one on the same classes passes."""
    cfg, out, _, _ = finished
    same = run_dataset.prepare(cfg.data)
    check_class_map(cfg, same, out)
    other_cfg = tiny_config(tfds_dir, "data.classes=[1, 3, 8]")
    with pytest.raises(DataError) as err:
        check_class_map(other_cfg, run_dataset.prepare(other_cfg.data), out)
    assert "class '8' is new since champion r" in _one_line(err)
