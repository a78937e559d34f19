"""The default OOD set of a dataset without one of its own: its test images with their
patches shuffled (:func:`ensemble_core.shifts.shuffle_patches`, the ``ood`` evaluator's
``shuffled_patches`` source). Every image keeps its pixels exactly, loses its layout, and
the set is deterministic."""

from __future__ import annotations

import numpy as np
import pytest

from ensemble_core import data, evaluators, shifts
from ensemble_core.config import EvaluatorSpec, PipelineConfig
from ensemble_core.config.eval_section import default_evaluators
from ensemble_core.errors import ConfigError
from ensemble_core.evaluators import ood, shift_base


@pytest.fixture(scope="module")
def digits() -> np.ndarray:
    """The embedded dataset's first 200 digits, uint8 [200, 28, 28, 1]."""
    images, _ = data.read_mnist5k_csv()
    return images[:200]


def _histograms(images: np.ndarray) -> np.ndarray:
    return np.sort(images.reshape(len(images), -1), axis=1)


@pytest.mark.parametrize("grid", [2, 4, 7])
def test_every_image_keeps_its_pixels_exactly_and_changes(digits, grid):
    out = shifts.shuffle_patches(digits, grid, seed=0)
    assert out.shape == digits.shape and out.dtype == digits.dtype
    np.testing.assert_array_equal(_histograms(out), _histograms(digits))  # per image, every value kept
    assert np.all((out != digits).reshape(len(digits), -1).any(axis=1))  # and every digit moved


def test_the_tiles_are_the_images_own_tiles_in_another_order(digits):
    out = shifts.shuffle_patches(digits[:20], 4, seed=1)
    for before, after in zip(digits[:20], out, strict=True):
        tiles = lambda x: sorted(x[r : r + 7, c : c + 7].tobytes() for r in range(0, 28, 7) for c in range(0, 28, 7))  # noqa: E731
        assert tiles(before) == tiles(after)


@pytest.mark.parametrize("shape", [(32, 32, 3), (30, 31, 3), (9, 13, 1)])
def test_any_geometry_and_dtype_keeps_each_images_values(shape):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (5, *shape), dtype=np.uint8)
    out = shifts.shuffle_patches(images, 4, seed=2)
    assert out.shape == images.shape and out.dtype == np.uint8
    np.testing.assert_array_equal(_histograms(out), _histograms(images))
    h, w = 4 * (shape[0] // 4), 4 * (shape[1] // 4)
    np.testing.assert_array_equal(out[:, h:], images[:, h:])  # the rows left over stay
    np.testing.assert_array_equal(out[:, :, w:], images[:, :, w:])
    floats = images.astype(np.float32) / 255
    np.testing.assert_array_equal(shifts.shuffle_patches(floats, 4, seed=2), out.astype(np.float32) / 255)


def test_seeded_never_the_identity_and_refused_when_it_cannot_shuffle(digits):
    a, b = shifts.shuffle_patches(digits, 4, seed=5), shifts.shuffle_patches(digits, 4, seed=5)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, shifts.shuffle_patches(digits, 4, seed=6))
    orders = shifts.patches.patch_orders(10_000, 2 * 2, seed=0)  # 1 in 24 would be the identity
    assert not (orders == np.arange(4)).all(axis=1).any()
    assert (np.sort(orders, axis=1) == np.arange(4)).all()
    with pytest.raises(ValueError, match="does not fit"):
        shifts.shuffle_patches(digits, 29)
    with pytest.raises(ValueError, match="does not fit"):
        shifts.shuffle_patches(digits, 1)


def test_the_ood_evaluator_scores_the_shuffled_test_images(tmp_path, digits):
    from tests.test_shift_levels import CLASSES, _context

    labels = (np.arange(len(digits)) % CLASSES).astype(np.int32)
    seen: list[np.ndarray] = []
    ctx = _context(tmp_path, digits, labels, [])
    logits = ctx.predict_logits

    def predict_logits(x):
        seen.append(x)
        return logits(x)

    import dataclasses

    ctx = dataclasses.replace(ctx, predict_logits=predict_logits)
    spec = EvaluatorSpec.model_validate({"type": "ood", "source": "shuffled_patches", "num_examples": 50})
    out = evaluators.get("ood").evaluate(ctx.for_evaluator("ood_patches", spec))
    at = shift_base.sample_indices(len(digits), 50)
    np.testing.assert_array_equal(seen[0], shifts.shuffle_patches(digits[at], 4, seed=0))
    assert out.metrics["num_ood"] == 50 and out.metrics["num_in"] == len(digits)
    assert out.metrics["source"].startswith("shuffled_patches 4x4")


def test_a_users_own_data_gets_shuffled_patches_by_default_and_digits_do_not():
    for source in ("image_folder", "arrays"):
        specs = default_evaluators("shelf", source)
        assert specs["ood"] == {"source": "uniform_noise"}
        assert specs["ood_patches"] == {"type": "ood", "source": "shuffled_patches"}
    assert "ood_patches" in default_evaluators("cifar10")
    assert "ood_patches" not in default_evaluators("mnist5k")  # letters and Fashion-MNIST instead
    cfg = PipelineConfig.model_validate({"data": {"source": "image_folder", "path": "/x", "name": "shelf"}})
    assert cfg.eval.evaluators["ood_patches"].options == {"source": "shuffled_patches"}


def test_shuffled_patches_options_are_checked_before_any_compute(tmp_path):
    with pytest.raises(ValueError, match="synthetic"):
        ood.Options(source="shuffled_patches", path="/data")
    info = data.DatasetInfo(
        name="tiny", data_dir=str(tmp_path / "tiny" / "1.0.0"), num_classes=2, image_shape=(8, 8, 1),
        num_train=4, num_test=4,
    )  # fmt: skip
    cfg = PipelineConfig()
    ood.check(cfg, info, "ood_patches", ood.Options(source="shuffled_patches", patches=8))
    with pytest.raises(ConfigError, match="patches"):
        ood.check(cfg, info, "ood_patches", ood.Options(source="shuffled_patches", patches=9))
