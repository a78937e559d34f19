"""Shift evaluators predict each distinct image once (issue 42): a level whose images are
the test split's (rotation by 0 degrees, translation by 0 pixels) reuses the test split's
predictions, and ``num_examples`` takes the first test images per level. The members are
fixed linear maps, so every row is recomputed here from the images themselves."""

from __future__ import annotations

import numpy as np
import pytest

from ensemble_core import evaluators, shifts
from ensemble_core.config import EvaluatorSpec, PipelineConfig
from ensemble_core.config.eval_section import DEFAULT_SHIFTED_EXAMPLES_MNIST5K, default_evaluators
from ensemble_core.data import DatasetInfo
from ensemble_core.evaluators import EvalContext

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
    # only the levels that change the images were predicted
    assert sum(predicted) == (len(levels) - 1) * n
    probs, members = out.arrays["member_probs"], _members()
    assert probs.shape == (MEMBERS, len(levels) * n, CLASSES)
    assert np.array_equal(out.arrays["labels"], np.tile(labels[:n], len(levels)))
    for i, level in enumerate(levels):
        expected = members(transform(images[:n], level))  # every level recomputed here
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


def test_the_quick_start_dataset_alone_evaluates_shifts_on_a_part_of_its_test_split():
    quick = default_evaluators("mnist5k")
    for name in ("rotation", "translation", "corruptions"):
        assert quick[name] == {"num_examples": DEFAULT_SHIFTED_EXAMPLES_MNIST5K}, name
    for other in (default_evaluators("mnist"), default_evaluators("cifar10"), default_evaluators("shelf", "arrays")):
        assert other["rotation"] == other["translation"] == {}
        assert other.get("corruptions", {}) == {}
    # configs/default.yaml spells out the same evaluators
    from pathlib import Path

    from ensemble_core.config import load_config

    cfg = load_config(str(Path(__file__).resolve().parents[1] / "configs" / "default.yaml"))
    for name in ("rotation", "translation", "corruptions"):
        assert cfg.eval.evaluators[name].options == {"num_examples": DEFAULT_SHIFTED_EXAMPLES_MNIST5K}
