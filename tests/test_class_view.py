"""The class-level view of the test split (``ensemble_core/class_metrics.py``, the test
evaluator's ``per_class`` / ``confusion_matrix`` figures, example arrays and plots, the
report's class-level section and artifact tables), each figure against an independent
computation: plain loops, scikit-learn's ``confusion_matrix``. No training, a few seconds."""

from __future__ import annotations

import math

import numpy as np
import pytest
from PIL import Image
from sklearn.metrics import confusion_matrix as sklearn_confusion_matrix

from ensemble_core import class_metrics, evaluators
from ensemble_core.config import EvaluatorSpec, PipelineConfig
from ensemble_core.data import DatasetInfo
from ensemble_core.evaluators import EvalContext
from ensemble_core.evaluators import test as test_evaluator
from ensemble_core.plotting import labelled_image_grid, save, short_label
from ensemble_core.runs.report import write as report_write

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FASHION = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")


def _probs(rng, n: int, c: int, concentration: float = 0.5) -> np.ndarray:
    return rng.dirichlet(np.full(c, concentration), size=n)


def _loop_ece(probs: np.ndarray, labels: np.ndarray, bins: int) -> float:
    """ECE by its definition, one example at a time: bin b holds confidences in
    (b/bins, (b+1)/bins] (a confidence of 0 would join bin 0)."""
    sums: dict[int, list[float]] = {}
    for p, y in zip(probs, labels, strict=True):
        conf = max(p)
        b = min(max(math.ceil(conf * bins) - 1, 0), bins - 1)
        acc, cnf, n = sums.setdefault(b, [0.0, 0.0, 0.0])
        sums[b] = [acc + float(int(np.argmax(p)) == int(y)), cnf + conf, n + 1]
    total = len(labels)
    return sum(n / total * abs(acc / n - cnf / n) for acc, cnf, n in sums.values())


def _loop_confusion(labels, predicted, c: int) -> np.ndarray:
    m = np.zeros((c, c), np.int64)
    for y, p in zip(labels, predicted, strict=True):
        m[y, p] += 1
    return m


def _is_png(path) -> bool:
    with open(path, "rb") as f:
        if f.read(8) != PNG_SIGNATURE:
            return False
    with Image.open(path) as im:
        im.verify()
    return True


# --- class_metrics -------------------------------------------------------------------


@pytest.mark.parametrize(("n", "c", "bins"), [(300, 10, 15), (50, 2, 10), (40, 7, 3)])
def test_per_class_scores_equal_a_loop_over_each_class(n, c, bins):
    rng = np.random.default_rng(n + c)
    probs = _probs(rng, n, c)
    labels = rng.integers(0, c, n)
    rows = class_metrics.per_class_scores(probs, labels, bins, [f"c{k}" for k in range(c)])
    assert [r["class"] for r in rows] == list(range(c)) and [r["name"] for r in rows] == [f"c{k}" for k in range(c)]
    for k, row in enumerate(rows):
        idx = [i for i in range(n) if labels[i] == k]
        assert row["count"] == len(idx)
        if not idx:
            continue
        recall = sum(int(np.argmax(probs[i])) == k for i in idx) / len(idx)
        nll = -sum(math.log(probs[i][k]) for i in idx) / len(idx)
        assert row["accuracy"] == pytest.approx(recall, abs=1e-12)
        assert row["nll"] == pytest.approx(nll, rel=1e-12)
        assert row["ece"] == pytest.approx(_loop_ece(probs[idx], labels[idx], bins), abs=1e-12)
    # the counts add up, and the recall-weighted mean is the overall accuracy
    assert sum(r["count"] for r in rows) == n
    overall = sum(r["accuracy"] * r["count"] for r in rows if r["count"]) / n
    assert overall == pytest.approx(np.mean(np.argmax(probs, -1) == labels))


def test_a_class_without_test_examples_has_count_0_and_no_figures():
    rng = np.random.default_rng(1)
    probs = _probs(rng, 30, 4)
    labels = np.array([0, 1, 3] * 10)  # class 2 never occurs
    rows = class_metrics.per_class_scores(probs, labels)
    assert rows[2] == {"class": 2, "count": 0, "accuracy": None, "nll": None, "ece": None}
    assert all(r["nll"] is not None and np.isfinite(r["nll"]) for r in rows if r["count"])
    cm = class_metrics.confusion_matrix(labels, np.argmax(probs, -1), 4)
    normalized = class_metrics.normalized_confusion(cm)
    assert not normalized[2].any() and not np.isnan(normalized).any()
    np.testing.assert_allclose(normalized[[0, 1, 3]].sum(1), 1.0)


def test_one_example_and_two_classes():
    probs, labels = np.array([[0.3, 0.7]]), np.array([0])
    rows = class_metrics.per_class_scores(probs, labels, 15, ["no", "yes"])
    nll, ece = pytest.approx(-math.log(0.3)), pytest.approx(0.7)  # confidence 0.7, wrong: |0 - 0.7|
    assert rows[0] == {"class": 0, "name": "no", "count": 1, "accuracy": 0.0, "nll": nll, "ece": ece}
    assert rows[1]["count"] == 0 and rows[1]["accuracy"] is None
    cm = class_metrics.confusion_matrix(labels, [1], 2)
    assert cm.dtype == np.int64 and cm.tolist() == [[0, 1], [0, 0]]
    assert class_metrics.most_confused_pairs(cm, 5, ["no", "yes"]) == [
        {"true": 0, "predicted": 1, "true_name": "no", "predicted_name": "yes", "count": 1, "fraction": 1.0}
    ]
    assert class_metrics.most_uncertain(probs, 16).tolist() == [0]
    assert class_metrics.most_confident_wrong(probs, labels, 16).tolist() == [0]
    assert class_metrics.most_confident_wrong(probs, [1], 16).tolist() == []


@pytest.mark.parametrize(("n", "c"), [(500, 10), (20, 2), (60, 30), (0, 3)])
def test_confusion_matrix_equals_scikit_learn_and_a_loop(n, c):
    rng = np.random.default_rng(c)
    labels, predicted = rng.integers(0, c, n), rng.integers(0, c, n)
    cm = class_metrics.confusion_matrix(labels, predicted, c)
    assert cm.dtype == np.int64 and cm.shape == (c, c)
    np.testing.assert_array_equal(cm, _loop_confusion(labels, predicted, c))
    if n:
        np.testing.assert_array_equal(cm, sklearn_confusion_matrix(labels, predicted, labels=list(range(c))))


def test_confusion_matrix_refuses_labels_outside_the_classes():
    with pytest.raises(ValueError, match="class indices"):
        class_metrics.confusion_matrix([0, 3], [0, 1], 3)
    with pytest.raises(ValueError, match="one shape"):
        class_metrics.confusion_matrix([0, 1], [0], 3)
    with pytest.raises(ValueError, match="labels must be"):
        class_metrics.per_class_scores(np.full((3, 2), 0.5), [0, 1], 15)
    with pytest.raises(ValueError, match="class_names"):
        class_metrics.per_class_scores(np.full((2, 2), 0.5), [0, 1], 15, ["a"])


def test_most_confused_pairs_are_the_largest_off_diagonal_counts():
    cm = np.array([[50, 3, 9, 0], [1, 40, 0, 9], [2, 0, 30, 0], [0, 0, 0, 0]])
    pairs = class_metrics.most_confused_pairs(cm, 4)
    # 9 twice (true 0 first, then true 1), then 3, then 2; the diagonal never counts
    assert [(p["true"], p["predicted"], p["count"]) for p in pairs] == [(0, 2, 9), (1, 3, 9), (0, 1, 3), (2, 0, 2)]
    assert pairs[0]["fraction"] == pytest.approx(9 / 62)
    assert len(class_metrics.most_confused_pairs(np.diag([5, 5]), 3)) == 0  # nothing confused: no pair


def test_most_uncertain_and_most_confident_wrong_equal_brute_force():
    rng = np.random.default_rng(7)
    probs = _probs(rng, 200, 5)
    labels = rng.integers(0, 5, 200)
    entropy = [-sum(p * math.log(p) for p in row if p > 0) for row in probs]
    want = sorted(range(200), key=lambda i: -entropy[i])[:16]
    assert class_metrics.most_uncertain(probs, 16).tolist() == want
    wrong = [i for i in range(200) if int(np.argmax(probs[i])) != labels[i]]
    want = sorted(wrong, key=lambda i: -max(probs[i]))[:16]
    got = class_metrics.most_confident_wrong(probs, labels, 16)
    assert got.dtype == np.int64 and got.tolist() == want
    assert len(class_metrics.most_confident_wrong(np.eye(5)[labels], labels, 16)) == 0  # all right


# --- the test evaluator --------------------------------------------------------------


def _context(tmp_path, names=FASHION, n=120, shape=(28, 28, 1), members=3) -> EvalContext:
    rng = np.random.default_rng(0)
    c = len(names)
    images = rng.integers(0, 256, (n, *shape), dtype=np.uint8)
    labels = (np.arange(n) % c).astype(np.int32)
    # members that mostly see the label, and confuse Shirt (6) with T-shirt/top (0)
    base = np.full((n, c), 0.2)
    base[np.arange(n), labels] = 4.0
    base[labels == 6, 0] = 5.0
    member_probs = np.stack([rng.dirichlet(base[i] * 3) for _ in range(members) for i in range(n)])
    member_probs = member_probs.reshape(members, n, c).astype(np.float32)

    def predict(x):
        return member_probs[:, : len(x)], 1.0

    info = DatasetInfo(
        name="fashion", data_dir=str(tmp_path / "fashion" / "1.0.0"), num_classes=c, image_shape=shape,
        num_train=n, num_test=n, class_names=tuple(names),
    )  # fmt: skip
    return EvalContext(
        config=PipelineConfig.model_validate({"data": {"name": "fashion"}}),
        dataset=info,
        healthy=np.ones(members, bool),
        predict=predict,
        load=lambda split: (images, labels),
        predict_split=lambda split: predict(images),
        cached=lambda key, build, shapes=None: build(),
        predict_logits=lambda x: np.log(predict(x)[0]),
        predict_split_logits=lambda split: np.log(member_probs),
    )


def _evaluate(ctx):
    spec = EvaluatorSpec.model_validate({"type": "test"})
    return evaluators.get("test").evaluate(ctx.for_evaluator("test", spec))


@pytest.mark.slow  # over 1 CPU s with a warm compilation cache: make test-fast leaves it out (docs/development.md)
def test_the_test_evaluator_reports_the_class_level_view(tmp_path):
    ctx = _context(tmp_path)
    out = _evaluate(ctx)
    m, a = out.metrics, out.arrays
    images, labels = ctx.load("test")
    ens = a["member_probs"].astype(np.float64).mean(0)
    predicted = np.argmax(ens, -1)
    # the existing keys are still there, the new ones beside them
    assert {"ensemble", "members", "member_mean", "diversity", "diverged_members", "ece_bins"} <= set(m)
    assert [r["name"] for r in m["per_class"]] == list(FASHION)
    assert m["per_class"][6]["nll"] == pytest.approx(-np.mean(np.log(ens[labels == 6, 6])))
    cm = m["confusion_matrix"]
    assert set(cm) == {"counts", "normalized", "class_names", "most_confused"}
    np.testing.assert_array_equal(cm["counts"], sklearn_confusion_matrix(labels, predicted, labels=range(10)))
    np.testing.assert_allclose(
        cm["normalized"], np.asarray(cm["counts"]) / np.sum(cm["counts"], 1, keepdims=True), atol=1e-6
    )
    assert cm["class_names"] == list(FASHION)
    top = cm["most_confused"][0]
    assert (top["true_name"], top["predicted_name"]) == ("Shirt", "T-shirt/top")
    # the example arrays: 16 of each, the images those of the chosen test indices
    for key in ("uncertain", "confident_wrong"):
        idx = a[f"{key}_indices"]
        k = len(idx)
        assert a[f"{key}_images"].dtype == np.uint8 and a[f"{key}_images"].shape == (k, 28, 28, 1)
        np.testing.assert_array_equal(a[f"{key}_images"], images[idx])
        np.testing.assert_array_equal(a[f"{key}_labels"], labels[idx])
        np.testing.assert_array_equal(a[f"{key}_predicted"], predicted[idx])
        assert a[f"{key}_probs"].shape == (k, 10) and a[f"{key}_probs"].dtype == np.float32
    assert len(a["uncertain_indices"]) == test_evaluator.EXAMPLES
    assert 0 < len(a["confident_wrong_indices"]) <= test_evaluator.EXAMPLES
    assert (a["confident_wrong_labels"] != a["confident_wrong_predicted"]).all()

    paths = test_evaluator.plot(m, a, tmp_path / "plots", ctx.config, name="test")
    for key in ("reliability", "members", "confusion_matrix", "uncertain_examples", "confident_wrong_examples"):
        assert paths[key].name == f"{key}.png" and _is_png(paths[key]), key


@pytest.mark.slow  # over 1 CPU s with a warm compilation cache: make test-fast leaves it out (docs/development.md)
def test_names_with_unicode_long_names_many_classes_and_no_wrong_prediction(tmp_path):
    names = [f"Klasse {i} \u2013 ünïcødé 漢字 $x$ | a name much longer than any plot cell" for i in range(40)]
    names[3] = "tab\tand\nnewline\u200d"
    ctx = _context(tmp_path, names=names, n=80, shape=(12, 10, 3), members=1)
    out = _evaluate(ctx)
    assert out.metrics["confusion_matrix"]["class_names"] == names  # report.json keeps the names whole
    paths = test_evaluator.plot(out.metrics, out.arrays, tmp_path / "plots", ctx.config, name="second")
    assert paths["confusion_matrix"].name == "second_confusion_matrix.png"
    assert all(_is_png(p) for p in paths.values())
    # all right: no confident-wrong grid is drawn (and nothing fails)
    arrays = dict(out.arrays)
    for suffix in ("indices", "labels", "predicted"):
        arrays[f"confident_wrong_{suffix}"] = arrays[f"confident_wrong_{suffix}"][:0]
    arrays["confident_wrong_images"] = arrays["confident_wrong_images"][:0]
    arrays["confident_wrong_probs"] = arrays["confident_wrong_probs"][:0]
    paths = test_evaluator.plot(out.metrics, arrays, tmp_path / "plots2", ctx.config)
    assert "confident_wrong_examples" not in paths and _is_png(paths["uncertain_examples"])


# A CJK glyph the default font (DejaVu Sans) lacks is drawn as a box, with matplotlib's warning.
@pytest.mark.filterwarnings("ignore:Glyph .* missing from font")
def test_short_label_and_the_labelled_grid(tmp_path):
    assert short_label("Shirt") == "Shirt"
    assert short_label("a" * 40, 10) == "a" * 9 + "\u2026"
    assert short_label("line\nbreak\ttab\u200d") == "line break tab"
    assert short_label("漢字ünï🙂") == "漢字ünï🙂"
    assert short_label("\n\t") == "?"
    captions = test_evaluator.example_captions(
        np.array([6, 0]), np.array([0, 6]), np.array([[0.93] + [0.0] * 9, [0.0] * 6 + [0.5] + [0.0] * 3]), list(FASHION)
    )
    assert captions == ["true: Shirt /\npred: T-shirt/top (p=0.93)", "true: T-shirt/top /\npred: Shirt (p=0.50)"]
    images = np.zeros((3, 8, 8, 3), np.uint8)
    fig = labelled_image_grid(images, ["漢字 $a$", short_label("x" * 200), "ok"], cols=2, title="t")
    assert _is_png(save(fig, tmp_path / "grid.png"))
    with pytest.raises(ValueError, match="captions"):
        labelled_image_grid(images, ["one"])
    with pytest.raises(ValueError, match="uint8"):
        labelled_image_grid(images[:0], [])


# --- the report ----------------------------------------------------------------------


def test_report_section_and_artifact_tables(tmp_path):
    out = _evaluate(_context(tmp_path))
    m = out.metrics
    rows = [*m["per_class"]]
    rows[2] = {"class": 2, "name": "Pull|over", "count": 0, "accuracy": None, "nll": None, "ece": None}
    report = {
        "per_class": rows,
        "confusion_matrix": {**m["confusion_matrix"], "class_names": [*FASHION[:9], "Shirt"]},  # a repeated name
        "plots": {"reliability": "plots/reliability.png", "confusion_matrix": "plots/confusion_matrix.png"},
    }
    lines = report_write.class_level_lines(report)
    text = "\n".join(lines)
    assert "| 6 | Shirt |" in text and "| 2 | Pull\\|over | 0 |  |  |  |" in text
    assert "**Most confused**" in text and "Shirt -> T-shirt/top" in text
    assert "![confusion matrix](plots/confusion_matrix.png)" in text and "reliability" not in text
    assert "![" not in "\n".join(report_write.class_level_lines(report, plots=False))
    tables = report_write.class_level_tables(report)
    assert tables["per_class"][2] == {
        "class": 2,
        "name": "Pull|over",
        "count": 0,
        "accuracy": None,
        "nll": None,
        "ece": None,
    }
    matrix = tables["confusion_matrix"]
    assert len(matrix) == 10 and next(iter(matrix[0])) == "true class"
    assert list(matrix[0])[1:] == [*FASHION[:9], "Shirt (9)"]
    assert [list(r.values())[1:] for r in matrix] == m["confusion_matrix"]["counts"]
    assert report_write.class_level_lines({"plots": {}}) == [] and report_write.class_level_tables({}) == {}
