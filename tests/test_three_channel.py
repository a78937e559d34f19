"""Three-channel data end to end: CIFAR-10 through the project's TFDS loading code (offline,
``tests/_cifar_mock.py``), the channel and feature refusals of ``data.prepare``, the
rotation and translation shifts on 32x32x3 against scipy per channel, the MNIST-only
evaluators skipped with one line that reaches the report, and one in-process run on the
mocked CIFAR-10 (cnn, 2 members, 1 epoch)."""

import json
from pathlib import Path

import numpy as np
import pytest
import scipy.ndimage
import tensorflow_datasets as tfds

from ensemble_core import data, runs, shifts
from ensemble_core.config import PipelineConfig, load_config
from ensemble_core.errors import DataError, EnsembleError
from ensemble_core.evaluators import EvalContext, corruptions, fashion_mnist, letters, ood_base, translation
from tests._cifar_mock import NUM_TEST, NUM_TRAIN, cifar10_tfds  # noqa: F401  (a fixture)

# MARK: CIFAR-10 through data.prepare / data.load_split


def test_cifar10_is_prepared_and_read_through_the_project(cifar10_tfds):  # noqa: F811
    info = data.prepare("cifar10", cifar10_tfds)
    assert info.name == "cifar10"
    assert info.image_shape == (32, 32, 3)
    assert info.num_classes == 10
    assert (info.num_train, info.num_test) == (NUM_TRAIN, NUM_TEST)
    assert info.tfds_data_dir == cifar10_tfds and info.data_dir.endswith("cifar10/3.0.2")
    splits = {}
    for split, n in (("train", NUM_TRAIN), ("test", NUM_TEST)):
        images, labels = data.load_split("cifar10", split, cifar10_tfds)
        assert images.shape == (n, 32, 32, 3) and images.dtype == np.uint8
        assert labels.shape == (n,) and labels.dtype == np.int32
        assert labels.min() >= 0 and labels.max() < 10
        assert len(np.unique(labels)) > 1 and images.std() > 0  # not one constant example
        splits[split] = images
    assert not np.array_equal(splits["train"][:NUM_TEST], splits["test"])
    images, labels = data.load_split("cifar10", "test", cifar10_tfds, limit=5)
    assert images.shape == (5, 32, 32, 3) and labels.shape == (5,)
    # The same examples on every read (the runs read a split once per stage).
    np.testing.assert_array_equal(images, data.load_split("cifar10", "test", cifar10_tfds)[0][:5])


def test_a_damaged_mocked_shard_is_found_by_the_real_check(cifar10_tfds):  # noqa: F811
    """The integrity checks run unmocked: a truncated shard is refused before reading."""
    info = data.prepare("cifar10", cifar10_tfds)
    data_dir = Path(info.data_dir)
    shard = next(p for p in data_dir.iterdir() if "test.array_record" in p.name)
    shard.write_bytes(shard.read_bytes()[:10])
    with pytest.raises(DataError, match=r"is damaged: shard file .*truncated or corrupt.*fix: delete") as err:
        data.load_split("cifar10", "test", cifar10_tfds)
    assert str(data_dir) in str(err.value) and "\n" not in str(err.value)


# MARK: refusals: channels, features


def _builder_class(name: str, features: dict, example):
    """A tiny TFDS builder named ``name`` (Tensor features: prepared without TensorFlow)."""

    def _info(self):
        return self.dataset_info_from_configs(features=tfds.features.FeaturesDict(features))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(4), "test": self._generate_examples(2)}

    def _generate_examples(self, n):
        for i in range(n):
            yield i, example(i)

    return type(
        name,
        (tfds.core.GeneratorBasedBuilder,),
        {
            "__module__": __name__,
            "VERSION": tfds.core.Version("1.0.0"),
            "_info": _info,
            "_split_generators": _split_generators,
            "_generate_examples": _generate_examples,
        },
    )


RGBA = _builder_class(
    "ThreeChannelTestRgba",
    {"image": tfds.features.Tensor(shape=(8, 8, 4), dtype=np.uint8), "label": tfds.features.ClassLabel(num_classes=2)},
    lambda i: {"image": np.full((8, 8, 4), i, np.uint8), "label": i % 2},
)
NO_LABEL = _builder_class(
    "ThreeChannelTestNoLabel",
    {
        "pixels": tfds.features.Tensor(shape=(8, 8, 1), dtype=np.uint8),
        "target": tfds.features.ClassLabel(num_classes=2),
    },
    lambda i: {"pixels": np.full((8, 8, 1), i, np.uint8), "target": i % 2},
)


def _prepared(builder_cls, tmp_path) -> str:
    """Prepare the builder with TFDS itself (as a catalog dataset prepared elsewhere would be)."""
    builder_cls(data_dir=str(tmp_path), file_format=data.FILE_FORMAT).download_and_prepare(file_format=data.FILE_FORMAT)
    return str(tmp_path)


def test_images_of_four_channels_are_refused_in_one_line(tmp_path):
    d = _prepared(RGBA, tmp_path)
    with pytest.raises(DataError) as err:
        data.prepare("three_channel_test_rgba", d)
    msg = str(err.value)
    assert msg == (
        "dataset 'three_channel_test_rgba' has images of shape (8, 8, 4) with 4 channels, not 1 (grey) or 3 (RGB); "
        "fix: choose a dataset of grey or RGB images"
    )


def test_a_dataset_without_image_and_label_is_refused_in_one_line(tmp_path):
    d = _prepared(NO_LABEL, tmp_path)
    with pytest.raises(DataError) as err:
        data.prepare("three_channel_test_no_label", d)
    msg = str(err.value)
    assert "'three_channel_test_no_label'" in msg and "not 'image' and 'label'" in msg and "fix:" in msg
    assert "\n" not in msg


# MARK: rotation and translation on [N, 32, 32, 3], scipy per channel as the oracle


@pytest.fixture(scope="module")
def rgb():
    """Six 32x32 RGB images whose channels differ (a bar, a disc, noise), and one 24x32."""
    rng = np.random.default_rng(0)
    images = np.zeros((6, 32, 32, 3), np.uint8)
    images[:, 4:14, 14:18, 0] = 255
    yy, xx = np.mgrid[:32, :32]
    images[:, (yy - 20) ** 2 + (xx - 10) ** 2 < 30, 1] = 200
    images[:, :, :, 2] = rng.integers(0, 256, (6, 32, 32))
    images[3:] = rng.integers(0, 256, (3, 32, 32, 3))
    return images


def _scipy_rotate(image: np.ndarray, degrees: float) -> np.ndarray:
    """Ovadia et al.'s rotation of one ``[H, W, C]`` image, channel by channel on ``[H, W]``."""
    h, w = image.shape[:2]
    out = []
    for c in range(image.shape[-1]):
        big = scipy.ndimage.rotate(image[..., c].astype(np.float32) / 255.0, degrees, axes=(1, 0), reshape=True)
        i0, j0 = big.shape[0] // 2 - h // 2, big.shape[1] // 2 - w // 2
        out.append(np.round(np.clip(big[i0 : i0 + h, j0 : j0 + w], 0, 1) * 255).astype(np.uint8))
    return np.stack(out, axis=-1)


@pytest.mark.parametrize("degrees", [15, 30, 90, 135, 180])
def test_rotate_rgb_matches_scipy_per_channel(rgb, degrees):
    got = shifts.rotate(rgb, degrees)
    assert got.shape == rgb.shape and got.dtype == np.uint8
    for i in range(len(rgb)):
        np.testing.assert_array_equal(got[i], _scipy_rotate(rgb[i], degrees))
    # Each channel on its own: the same as rotating it as a grey image.
    for c in range(3):
        np.testing.assert_array_equal(got[..., c : c + 1], shifts.rotate(rgb[..., c : c + 1], degrees))


def test_rotate_rgb_geometry(rgb):
    np.testing.assert_array_equal(shifts.rotate(rgb, 0), rgb)
    # 90 degrees counterclockwise as displayed is np.rot90 over (rows, cols), up to interpolation;
    # 180 is a flip of both axes.
    assert np.abs(shifts.rotate(rgb, 90).astype(int) - np.rot90(rgb, 1, axes=(1, 2))).max() <= 1
    assert np.abs(shifts.rotate(rgb, 180).astype(int) - rgb[:, ::-1, ::-1]).max() <= 1
    wide = rgb[:, 4:28]  # 24x32: no square assumption
    got = shifts.rotate(wide, 30)
    assert got.shape == wide.shape
    np.testing.assert_array_equal(got[0], _scipy_rotate(wide[0], 30))


@pytest.mark.parametrize("pixels", [0, 1, 5, 14, 31, 32])
def test_translate_rgb_matches_scipy_shift_per_channel(rgb, pixels):
    got = shifts.translate(rgb, pixels)
    assert got.shape == rgb.shape and got.dtype == np.uint8
    for i in range(len(rgb)):
        for c in range(3):
            expected = scipy.ndimage.shift(rgb[i, :, :, c], (0, pixels), order=0, mode="grid-wrap")
            np.testing.assert_array_equal(got[i, :, :, c], expected)
    if pixels % 32 == 0:
        np.testing.assert_array_equal(got, rgb)


def test_shapes_the_shifts_refuse(rgb):
    for bad in (rgb[..., :2], rgb.astype(np.float32), rgb[0]):
        with pytest.raises(ValueError, match=r"expected uint8 \[N, H, W, C\] with C in \(1, 3\)"):
            shifts.rotate(bad, 15)
        with pytest.raises(ValueError):
            shifts.translate(bad, 3)
    with pytest.raises(ValueError, match="28, 28, 1"):
        shifts.corrupt(rgb, "fog")  # MNIST-C stays MNIST's


# MARK: evaluators on a 32x32x3 dataset, without training

CIFAR_INFO = data.DatasetInfo(
    name="cifar10", data_dir="/nonexistent", num_classes=10, image_shape=(32, 32, 3), num_train=64, num_test=12
)


def _context(rgb, **kwargs) -> EvalContext:
    """An EvalContext on 12 RGB test images whose 'members' (2) score by mean colour."""
    images = np.concatenate([rgb, rgb[:, ::-1]])
    labels = np.arange(len(images), dtype=np.int32) % 10

    def predict_logits(x):
        logits = np.stack([x[..., c].mean(axis=(1, 2)) / 64.0 for c in range(3)] * 4, axis=-1)[:, :10]
        return np.stack([logits, logits[:, ::-1]]).astype(np.float32)

    def predict(x):
        z = predict_logits(x)
        return (np.exp(z) / np.exp(z).sum(-1, keepdims=True)).astype(np.float32), 1.0

    return EvalContext(
        config=PipelineConfig.model_validate({"data": {"name": "cifar10"}}),
        dataset=CIFAR_INFO,
        healthy=np.ones(2, bool),
        predict=predict,
        load=lambda split: (images, labels),
        predict_split=lambda split: predict(images),
        cached=lambda key, build, shapes=None: build(),
        predict_logits=predict_logits,
        predict_split_logits=lambda split: predict_logits(images),
        **kwargs,
    )


def test_mnist_only_evaluators_are_skipped_with_one_line(rgb):
    ctx = _context(rgb)
    reasons = {m.__name__.rsplit(".", 1)[-1]: m.evaluate(ctx).skipped for m in (corruptions, letters, fashion_mnist)}
    assert reasons == {
        "corruptions": "MNIST-C corruptions are defined for 28x28x1 images, not (32, 32, 3)",
        "letters": "the letters are rendered at 28x28x1, not (32, 32, 3)",
        "fashion_mnist": "Fashion-MNIST images are 28x28x1, the model takes (32, 32, 3)",
    }
    # The shared OOD helper refuses OOD images of another shape the same way.
    out = ood_base.evaluate_ood(ctx, np.zeros((4, 28, 28, 1), np.uint8), "digits")
    assert out.skipped == "the OOD images (digits) are (28, 28, 1), the model takes (32, 32, 3)"
    assert out.arrays == {}


def test_translation_evaluator_and_its_plots_on_rgb(rgb, tmp_path, monkeypatch):
    from PIL import Image

    from ensemble_core.evaluators import shift_base

    ctx = _context(rgb, options=translation.Options(pixels=(0, 8, 16)), name="translation")
    out = translation.evaluate(ctx)
    assert out.skipped is None
    assert [r["level"] for r in out.metrics["levels"]] == [0.0, 8.0, 16.0]
    assert out.arrays["member_probs"].shape == (2, 36, 10)
    assert out.arrays["examples"].shape == (3, 8, 32, 32, 3)
    test_images = ctx.load("test")[0][:8]
    np.testing.assert_array_equal(out.arrays["examples"][1], shifts.translate(test_images, 8))
    # What the plots draw, recorded as each is saved.
    drawn = {}
    real_save = shift_base.save

    def recording(fig, path):
        drawn[path.name] = fig.axes
        return real_save(fig, path)

    monkeypatch.setattr(shift_base, "save", recording)
    paths = translation.plot(out.metrics, out.arrays, tmp_path, ctx.config)
    assert set(drawn) == {p.name for p in paths.values()} == {"translation.png", "translation_examples.png"}
    rows = out.metrics["levels"]
    for ax, figure in zip(drawn["translation.png"], ("accuracy", "nll", "brier", "ece"), strict=True):
        lines = {line.get_label(): line for line in ax.get_lines()}
        for who in ("ensemble", "member_mean", "best_member"):
            line = lines[who.replace("_", " ")]
            np.testing.assert_array_equal(line.get_xdata(), [0.0, 8.0, 16.0])
            np.testing.assert_allclose(line.get_ydata(), [r[who][figure] for r in rows], rtol=1e-12)
    # The examples grid: a row per shift, each tile the translated RGB image, in colour.
    tiled = np.asarray(drawn["translation_examples.png"][0].images[0].get_array())
    assert tiled.shape == (3 * 34 - 2, 8 * 34 - 2, 3)
    for level, k in enumerate((0, 8, 16)):
        for j in (0, 5):
            tile = tiled[34 * level : 34 * level + 32, 34 * j : 34 * j + 32]
            np.testing.assert_array_equal(tile, shifts.translate(test_images[j : j + 1], k)[0])
    # The PNGs: 16 x 3.6 inches at 100 dpi with the ensemble's red curves; the examples in colour.
    with Image.open(paths["translation"]) as image:
        curves = np.asarray(image.convert("RGB"))
    assert curves.shape == (360, 1600, 3) and (curves == (214, 39, 40)).all(-1).sum() > 50
    with Image.open(paths["translation_examples"]) as image:
        grid = np.asarray(image.convert("RGB")).astype(int)
    colourful = (np.abs(grid[..., 0] - grid[..., 1]) > 30) | (np.abs(grid[..., 1] - grid[..., 2]) > 30)
    assert colourful.mean() > 0.05  # RGB drawn as RGB, not grey


def test_rgb_examples_are_drawn_in_colour(rgb):
    """The examples grid tiles the images in one imshow: RGB stays RGB, one channel is grey,
    and each tile is the image itself (against slicing the tiled array back)."""
    import matplotlib.pyplot as plt

    from ensemble_core.plotting import image_grid

    images = np.stack([rgb[:3], rgb[3:6]])  # [2, 3, 32, 32, 3]
    fig = image_grid(images, ["a", "b"], "t")
    tiled = fig.axes[0].images[0].get_array()
    assert tiled.shape == (2 * 34 - 2, 3 * 34 - 2, 3)
    np.testing.assert_array_equal(tiled[34:66, 68:100], rgb[5])
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["a", "b"]
    plt.close(fig)
    fig = image_grid(images[..., :1])
    image = fig.axes[0].images[0]
    assert image.get_array().shape == (66, 100) and image.get_cmap().name == "gray"
    np.testing.assert_array_equal(image.get_array()[:32, 34:66], rgb[1, ..., 0])
    plt.close(fig)
    with pytest.raises(ValueError, match="uint8"):
        image_grid(images.astype(np.float32))
    with pytest.raises(ValueError, match="row labels"):
        image_grid(images, ["only one"])


# MARK: one run on the mocked CIFAR-10 (8.5-13 s on 2 busy cores: slow)


@pytest.mark.slow
def test_cnn_ensemble_with_augmentation_trains_and_evaluates_on_cifar10(
    cifar10_tfds,  # noqa: F811
    tmp_path,
    caplog,
    monkeypatch,
):
    """With crop-and-flip augmentation on the RGB dataset (BatchNorm/Dropout networks on
    RGB images: tests/test_models_zoo.py; through the step: tests/test_stateful_members.py).
    The augmentation ran: the train step called it with the configured padding and flip,
    the batches it returned differ from those it was given (crops and flips of them), and
    the members differ from those of the same run without augmentation (same seed, same
    dropout keys: only the batches differ)."""
    import jax
    import jax.numpy as jnp

    from ensemble_core.train import augment as augment_lib
    from ensemble_core.train import step as train_step

    seen = []  # (crop_padding, flip) per traced call of the step's augment
    changed = []  # per train step and member: the fraction of its batch the augmentation changed

    def spy(key, images, **kw):
        out = augment_lib.augment(key, images, **kw)
        seen.append((kw["crop_padding"], kw["flip"]))
        fraction = jnp.mean(jnp.any(out != images, axis=(-3, -2, -1)))
        jax.debug.callback(lambda f: changed.append(float(np.mean(f))), fraction)
        return out

    monkeypatch.setattr(train_step, "augment", spy)

    def config(augment: str, evaluators: str):
        return load_config(
            None,
            [
                "data.name=cifar10",
                f"data.data_dir={cifar10_tfds}",
                "data.validation_fraction=0",
                "model.name=cnn",
                f"data.augment={augment}",
                "ensemble.size=2",
                "train.epochs=1",
                "train.batch_size=16",
                f"eval.evaluators={evaluators}",
                "promotion.enabled=false",
            ],
        )

    cfg = config("{crop_padding: 4, flip: true}", "[test,rotation]")
    # MNIST-C named by the user on RGB images: refused in the preflight, nothing trained.
    named = cfg.model_copy(update={"eval": load_config(None, ["eval.evaluators=[test,rotation,corruptions]"]).eval})
    with pytest.raises(EnsembleError, match=r"corruptions.*cannot run on dataset 'cifar10'.*28x28x1"):
        runs.preflight(named, tmp_path / "refused", "r")
    assert not (tmp_path / "refused" / "r").exists()
    result = runs.run(cfg, tmp_path / "out", "r")
    report = json.loads(result.run_dir.report_json.read_text())
    # Test figures for 10 classes, recomputed from predictions.npz.
    saved = np.load(result.run_dir.path / "predictions.npz")
    probs, labels = saved["member_probs"], saved["labels"]
    assert probs.shape == (2, NUM_TEST, 10)
    np.testing.assert_array_equal(labels, data.load_split("cifar10", "test", cifar10_tfds)[1])
    ens = probs.mean(0)
    assert report["ensemble"]["accuracy"] == pytest.approx(np.mean(ens.argmax(-1) == labels))
    assert report["ensemble"]["nll"] == pytest.approx(-np.mean(np.log(ens[np.arange(NUM_TEST), labels])), rel=1e-4)
    assert len(report["members"]) == 2
    # Rotation ran on the RGB test split.
    rotation = report["evaluations"]["rotation"]["metrics"]
    assert [r["level"] for r in rotation["levels"]] == [float(d) for d in shifts.ROTATION_DEGREES]
    examples = np.load(result.run_dir.eval_dir / "rotation.npz")["examples"]
    assert examples.shape[2:] == (32, 32, 3)
    # The augmentation reached the step as configured and changed the batches: a random
    # crop of 9 x 9 offsets and a coin flip leave an image as it was 1 time in 162.
    assert seen and all(call == (4, True) for call in seen), seen
    assert len(changed) >= NUM_TRAIN // 16 and np.mean(changed) > 0.9, changed
    # The same run without augmentation: other members (the only difference is the batches).
    seen.clear()
    changed.clear()
    plain = runs.run(config("{}", "[test]"), tmp_path / "plain", "r")
    assert seen and all(call == (0, False) for call in seen) and max(changed) == 0, (seen, changed)
    with np.load(plain.run_dir.path / "predictions.npz") as f:
        plain_probs = f["member_probs"]
    assert plain_probs.shape == probs.shape
    differ = np.abs(plain_probs - probs).max(axis=(1, 2))
    assert (differ > 1e-4).all(), differ
