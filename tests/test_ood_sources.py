"""The ``ood`` evaluator's sets: synthetic OOD sets of the literature, their options, and
the conversion of another dataset to the training images' geometry. Scored on a trained
ensemble (uniform noise, an RGB image folder): tests/test_evaluators.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.stats
from PIL import Image

from ensemble_core import runs
from ensemble_core.config import load_config
from ensemble_core.errors import ConfigError
from ensemble_core.evaluators import ood
from ensemble_core.image_decoding import convert_images
from tests.ensembles import tiny_config


@pytest.mark.parametrize("source", ood.SYNTHETIC)
def test_synthetic_sets_are_seeded_and_keep_the_shape(source):
    a = ood.synthetic_images(source, 50, (9, 7, 3), seed=3)
    assert a.dtype == np.uint8 and a.shape == (50, 9, 7, 3)
    assert np.array_equal(a, ood.synthetic_images(source, 50, (9, 7, 3), seed=3))
    assert not np.array_equal(a, ood.synthetic_images(source, 50, (9, 7, 3), seed=4))


def test_synthetic_sets_follow_their_definitions():
    n, shape = 400, (16, 16, 1)
    uniform = ood.synthetic_images("uniform_noise", n, shape, 0).ravel()
    counts = np.bincount(uniform, minlength=256)
    assert scipy.stats.chisquare(counts).pvalue > 1e-3  # uniform on 0..255
    gauss = ood.synthetic_images("gaussian_noise", n, shape, 0).astype(np.float64).ravel() / 255
    # N(0.5, 1) clipped to [0, 1]: P(0) = P(1) = Phi(-0.5)
    expected = scipy.stats.norm.cdf(-0.5)
    assert abs(np.mean(gauss == 0) - expected) < 0.01 and abs(np.mean(gauss == 1) - expected) < 0.01
    const = ood.synthetic_images("constant", n, (5, 5, 3), 0)
    assert (const == const[:, :1, :1, :]).all() and len(np.unique(const[:, 0, 0, 0])) > 100


@pytest.mark.parametrize(
    ("options", "pattern"),
    [
        ({"source": "image_folder"}, "needs path"),
        ({"source": "tfds"}, "needs name"),
        ({"source": "uniform_noise", "path": "/x"}, "is synthetic"),
        ({"source": "pictures"}, "source"),
        ({"num_examples": 0}, "num_examples"),
    ],
)
def test_bad_ood_options_are_refused_before_any_compute(tfds_dir, options, pattern):
    spec = json.dumps({"test": {}, "far": {"type": "ood", **options}}).replace('"', "")
    with pytest.raises(ConfigError, match=pattern):
        runs.preflight(load_config(None, [f"data.data_dir={tfds_dir}", f"eval.evaluators={spec}"]), "/tmp", "x")


def test_images_are_converted_as_files_are():
    rgb = np.random.default_rng(0).integers(0, 256, (3, 20, 30, 3), dtype=np.uint8)
    grey = convert_images(rgb, (10, 12), 1)
    assert grey.shape == (3, 10, 12, 1)
    expected = np.asarray(Image.fromarray(rgb[1]).convert("L").resize((12, 10), Image.Resampling.BILINEAR))
    assert np.array_equal(grey[1, ..., 0], expected)
    assert convert_images(grey, None, None) is grey  # already the geometry asked for
    with pytest.raises(ValueError, match="neither 1"):
        convert_images(np.zeros((1, 4, 4, 2), np.uint8), None, None)


def _folder(root, bad: bool):
    """Two class folders of 28x28 grey PNGs under ``train`` and ``test``; with ``bad``, one
    test file that is not an image."""
    rng = np.random.default_rng(3)
    for split in ("train", "test"):
        for c in ("x", "y"):
            (root / split / c).mkdir(parents=True)
            for i in range(3):
                Image.fromarray(rng.integers(0, 256, (28, 28), dtype=np.uint8)).save(root / split / c / f"{i}.png")
    if bad:
        (root / "test" / "x" / "notes.png").write_text("not an image")
    return root


def test_an_ood_dataset_that_cannot_be_made_is_refused_before_training(tfds_dir, tmp_path):
    """The preflight prepares the OOD dataset as evaluation would (evaluators' ``check``):
    a folder with a file that is not an image is refused in one line naming the evaluator,
    before anything is trained or written; a good folder passes and is reused."""
    from ensemble_core.errors import DataError

    bad = _folder(tmp_path / "bad_parts", bad=True)
    spec = f"{{test: {{}}, parts: {{type: ood, source: image_folder, path: {bad}}}}}"
    cfg = tiny_config(tfds_dir, f"eval.evaluators={spec}")
    out = tmp_path / "runs"
    with pytest.raises(DataError) as err:
        runs.preflight(cfg, out, "r")
    msg = str(err.value)
    assert msg.startswith("eval.evaluators.parts: ") and "notes.png" in msg and "fix:" in msg and "\n" not in msg
    assert not (out / "r").exists()
    good = _folder(tmp_path / "good_parts", bad=False)
    cfg = tiny_config(tfds_dir, f"eval.evaluators={spec.replace(str(bad), str(good))}")
    runs.preflight(cfg, out, "r")


@pytest.mark.parametrize("bins", [1, 0])
def test_ece_bins_below_two_are_refused_per_evaluator(tfds_dir, bins):
    with pytest.raises(ConfigError, match=r"eval\.evaluators.*ece_bins.*greater than or equal to 2"):
        tiny_config(tfds_dir, f"eval.evaluators={{test: {{ece_bins: {bins}}}}}")
    with pytest.raises(ConfigError, match=r"eval\.ece_bins.*greater than or equal to 2"):
        tiny_config(tfds_dir, f"eval.ece_bins={bins}")
