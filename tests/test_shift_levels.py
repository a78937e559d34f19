"""Shift evaluators predict each distinct image once (issue 42): a level whose images are
the test split's (rotation by 0 degrees, translation by 0 pixels) reuses the test split's
predictions, and ``num_examples`` takes a seeded random sample of the test images, the same
at every level. The members are fixed linear maps, so every row is recomputed here from the
images themselves."""

from __future__ import annotations

import numpy as np
import pytest

from ensemble_core import evaluators, shifts
from ensemble_core.config import EvaluatorSpec, PipelineConfig
from ensemble_core.config.eval_section import (
    MIN_EXAMPLES_PER_LEVEL,
    SHIFT_BUDGET_TEST_SPLITS,
    default_evaluators,
    examples_per_level,
)
from ensemble_core.data import DatasetInfo
from ensemble_core.evaluators import EvalContext, shift_base

SHAPE, MEMBERS, CLASSES, N = (28, 28, 1), 3, 4, 10


def _members():
    rng = np.random.default_rng(0)
    weights = rng.normal(size=(MEMBERS, int(np.prod(SHAPE)), CLASSES)) / 30

    def probs(x):
        z = np.einsum("nd,edc->enc", np.asarray(x, np.float64).reshape(len(x), -1) / 255.0, weights)
        p = np.exp(z - z.max(-1, keepdims=True))
        return (p / p.sum(-1, keepdims=True)).astype(np.float32)

    return probs


def _context(tmp_path, images, labels, predicted: list[int]) -> EvalContext:
    members = _members()

    def predict(x):
        predicted.append(len(x))
        return members(x), 1.0

    split = {}

    def predict_split(name):  # cached, as evaluation caches it
        if name not in split:
            split[name] = predict(images)
        return split[name]

    info = DatasetInfo(
        name="digits", data_dir=str(tmp_path / "digits" / "1.0.0"), num_classes=CLASSES, image_shape=SHAPE,
        num_train=N, num_test=N,
    )  # fmt: skip
    return EvalContext(
        config=PipelineConfig.model_validate({"data": {"name": "digits"}}),
        dataset=info,
        healthy=np.ones(MEMBERS, bool),
        predict=predict,
        load=lambda name: (images, labels),
        predict_split=predict_split,
        cached=lambda key, build, shapes=None: build(),
        predict_logits=lambda x: np.log(members(x)),
        predict_split_logits=lambda name: np.log(members(images)),
    )


def _images():
    rng = np.random.default_rng(1)
    return rng.integers(0, 256, (N, *SHAPE), dtype=np.uint8), (np.arange(N) % CLASSES).astype(np.int32)


@pytest.mark.parametrize(
    ("name", "options", "transform", "levels"),
    [
        ("rotation", {"degrees": [0, 45, 90], "selective_degrees": 45}, shifts.rotate, [0, 45, 90]),
        ("translation", {"pixels": [3, 0, 7]}, shifts.translate, [3, 0, 7]),
    ],
)
@pytest.mark.parametrize("num_examples", [None, 4])
def test_identity_level_reuses_the_test_predictions(tmp_path, name, options, transform, levels, num_examples):
    images, labels = _images()
    predicted: list[int] = []
    ctx = _context(tmp_path, images, labels, predicted)
    ctx.predict_split("test")  # the test evaluator ran first
    predicted.clear()
    spec = EvaluatorSpec.model_validate({"type": name, **options, "num_examples": num_examples})
    out = evaluators.get(name).evaluate(ctx.for_evaluator(name, spec))
    n = num_examples or N
    at = shift_base.sample_indices(N, n)  # all N, or a sample of n
    assert len(at) == n and len(set(at.tolist())) == n
    # only the levels that change the images were predicted
    assert sum(predicted) == (len(levels) - 1) * n
    probs, members = out.arrays["member_probs"], _members()
    assert probs.shape == (MEMBERS, len(levels) * n, CLASSES)
    assert np.array_equal(out.arrays["labels"], np.tile(labels[at], len(levels)))
    for i, level in enumerate(levels):
        expected = members(transform(images[at], level))  # every level recomputed here
        np.testing.assert_allclose(probs[:, i * n : (i + 1) * n], expected, rtol=1e-6, atol=1e-7)
    assert len(out.metrics["levels"]) == len(levels)


def test_no_identity_level_predicts_everything_once(tmp_path):
    images, labels = _images()
    predicted: list[int] = []
    ctx = _context(tmp_path, images, labels, predicted)
    spec = EvaluatorSpec.model_validate({"type": "translation", "pixels": [2, 5]})
    out = evaluators.get("translation").evaluate(ctx.for_evaluator("translation", spec))
    assert predicted == [2 * N]  # one call, the test split not needed
    np.testing.assert_allclose(out.arrays["member_probs"][:, N:], _members()(shifts.translate(images, 5)), rtol=1e-6)


def test_num_examples_is_refused_below_one():
    from ensemble_core.evaluators import rotation

    with pytest.raises(ValueError, match="num_examples"):
        rotation.Options.model_validate({"num_examples": 0})


def test_no_dataset_default_sets_a_sample_size():
    """The sample sizes are eval.protocol's, decided at evaluation from the test split's size
    (:func:`examples_per_level`), not written into the default evaluators; configs/default.yaml
    spells out the same evaluators."""
    for specs in (default_evaluators("mnist5k"), default_evaluators("cifar10"), default_evaluators("shelf", "arrays")):
        assert all("num_examples" not in opts for opts in specs.values()), specs
    from pathlib import Path

    from ensemble_core.config import load_config

    cfg = load_config(str(Path(__file__).resolve().parents[1] / "configs" / "default.yaml"))
    assert cfg.eval.protocol == "sampled"
    for name in ("rotation", "translation", "corruptions", "common_corruptions"):
        assert cfg.eval.evaluators[name].options == {}, name


@pytest.mark.parametrize(
    ("test_examples", "levels", "expected"),
    [
        (300, 75, 100),  # an image folder's 300: the floor in each of the 75 corruption cells
        (300, 13, 100),
        (1000, 75, 100),  # mnist5k: 7,500 corrupted images (the old default was 50 per cell)
        (1000, 13, 231),  # ceil(3 * 1000 / 13)
        (1000, 15, 200),  # the old quick start's 200 per translation and MNIST-C corruption
        (10_000, 75, 400),  # Fashion-MNIST, CIFAR-10: 30,000 corrupted images, not 750,000
        (10_000, 13, 2308),
        (50, 13, 50),  # never more than the test split
        (1, 1, 1),
    ],
)
def test_the_default_sample_size_rule(test_examples, levels, expected):
    assert examples_per_level(test_examples, levels) == expected
    n = examples_per_level(test_examples, levels)
    assert n == min(test_examples, max(MIN_EXAMPLES_PER_LEVEL, -(-SHIFT_BUDGET_TEST_SPLITS * test_examples // levels)))
    # the full protocol: every test image at every level (the literature's; what
    # num_examples: null gave and still gives)
    assert examples_per_level(test_examples, levels, "full") == test_examples


def test_the_floor_bounds_an_accuracy_interval_to_ten_points():
    """MIN_EXAMPLES_PER_LEVEL is the textbook sample size for a proportion within +-0.1 at
    95% (z^2 / (4 E^2) = 96.04), and the Wilson interval of a level of that size is at most
    0.2 wide (at p = 0.5, the widest)."""
    from scipy import stats

    z = stats.norm.ppf(0.975)
    assert MIN_EXAMPLES_PER_LEVEL == 100 >= z**2 / (4 * 0.1**2)
    ci = stats.binomtest(50, MIN_EXAMPLES_PER_LEVEL).proportion_ci(0.95, method="wilson")
    assert ci.high - ci.low < 0.2


def test_the_sample_size_rule_refuses_an_unknown_protocol():
    with pytest.raises(ValueError, match="protocol"):
        examples_per_level(300, 75, "most")
    with pytest.raises(ValueError, match="levels"):
        examples_per_level(300, 0)


def test_the_full_protocol_key_scores_every_test_image_again(tmp_path):
    """``eval.protocol: full`` gives back the sizes before the sampled protocol (every test
    image at every level: the old default of every dataset but mnist5k), and an evaluator's
    own ``num_examples`` still wins over either protocol (``null``: the whole split)."""
    import dataclasses

    from ensemble_core.evaluators import common_corruptions, rotation

    n = 300
    images = np.zeros((n, *SHAPE), np.uint8)
    labels = np.repeat(np.arange(CLASSES), n // CLASSES).astype(np.int32)  # class by class, as an image folder
    sampled = _context(tmp_path, images, labels, [])
    full = dataclasses.replace(
        sampled, config=PipelineConfig.model_validate({"data": {"name": "digits"}, "eval": {"protocol": "full"}})
    )
    assert shift_base.level_examples(sampled, rotation.Options(), 13) == 100
    assert shift_base.level_examples(full, rotation.Options(), 13) == n
    assert shift_base.level_examples(sampled, common_corruptions.Options(), 75) == 100
    assert shift_base.level_examples(full, common_corruptions.Options(), 75) == n
    assert shift_base.level_examples(sampled, rotation.Options(num_examples=None), 13) == n
    assert shift_base.level_examples(full, rotation.Options(num_examples=40), 13) == 40
    at = shift_base.sample_indices(n, 100)
    assert len(np.unique(at)) == 100 and np.all(np.diff(at) > 0)  # 100 distinct images in split order
    np.testing.assert_array_equal(at, shift_base.sample_indices(n, 100))  # the same every time
    assert set(labels[:100].tolist()) == {0, 1}  # the first 100: two classes of the four
    assert np.bincount(labels[at], minlength=CLASSES).min() >= 15  # the sample: every class
