"""Refusals that named the wrong cause (issue "reliability round five", class 5), through
the real entry points: an OOD image folder of one class (or of loose images) was refused
with "a classifier needs two or more" although an OOD set has no classes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ensemble_core import evaluators
from ensemble_core.config import load_config
from ensemble_core.errors import DataError


def _pngs(folder: Path, n: int, size: int = 20) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(folder / f"img{i:03d}.png")


def _config(tmp_path: Path, tfds_dir: str, ood_path: Path):
    yaml = tmp_path / "ood.yaml"
    yaml.write_text(
        f"data: {{data_dir: '{tfds_dir}', max_train_examples: 512, max_test_examples: 200}}\n"
        "model: {name: mlp, hidden_sizes: [16]}\n"
        "eval:\n  evaluators:\n    test: {}\n"
        f"    ood_parts: {{type: ood, source: image_folder, path: '{ood_path}', num_examples: 5}}\n"
    )
    return load_config(str(yaml), [])


@pytest.mark.parametrize("layout", ["one_class_folder", "split_one_class", "train_one_class", "loose_images"])
def test_an_ood_image_folder_needs_no_classes(tmp_path, tfds_dir, embedded_dir, layout):
    """One class folder (``<path>/<class>/``, ``<path>/test/<class>/``) or loose images
    (``<path>/*.png``) are the OOD set's images: the preflight's evaluator check accepts
    them (it refused them: "a classifier needs two or more"), and the images decode to
    the model's ``[H, W, C]``."""
    from ensemble_core import data
    from ensemble_core.evaluators import ood

    root = tmp_path / "other_parts"
    where = {
        "one_class_folder": root / "bolts",
        "split_one_class": root / "test" / "bolts",
        "train_one_class": root / "train" / "bolts",  # refused: "a classifier needs two or more"
        "loose_images": root,
    }
    _pngs(where[layout], 7)
    cfg = _config(tmp_path, tfds_dir, root)
    dataset = data.prepare(data.EMBEDDED, tfds_dir)
    evaluators.check_data(cfg, dataset)  # the preflight's check: no refusal
    opts = evaluators.options("ood_parts", cfg.eval.evaluators["ood_parts"])
    images = ood.dataset_images(opts, tuple(int(d) for d in dataset.image_shape), 5, tfds_dir)
    assert images.shape == (5, *dataset.image_shape) and images.dtype == np.uint8


def test_an_empty_ood_folder_is_refused_as_empty(tmp_path, tfds_dir):
    from ensemble_core import data

    root = tmp_path / "nothing"
    (root / "bolts").mkdir(parents=True)
    cfg = _config(tmp_path, tfds_dir, root)
    with pytest.raises(DataError) as err:
        evaluators.check_data(cfg, data.prepare(data.EMBEDDED, tfds_dir))
    line = str(err.value)
    assert "\n" not in line and "holds no image file" in line and "classifier" not in line, line


def test_images_with_an_empty_dimension_are_refused_as_such_not_as_a_crop_padding(tmp_path):
    """An arrays source of images ``[40, 0, 5, 1]`` and no augmentation: refused naming the
    empty dimension (it said "crop_padding=0 is not smaller than the 0x5 images; fix: use a
    padding below 0"), and a padding of 0 is never checked against the images."""
    from ensemble_core.data import DatasetInfo
    from ensemble_core.runs.preflight import check_against_dataset

    cfg = load_config(None, [])
    empty = DatasetInfo(name="a", data_dir="/d", num_classes=2, image_shape=(0, 5, 1), num_train=40, num_test=10)
    with pytest.raises(DataError) as err:
        check_against_dataset(cfg, empty)
    line = str(err.value)
    assert "empty dimension (shape 0x5x1)" in line and "crop_padding" not in line and "\n" not in line
    tiny = DatasetInfo(name="a", data_dir="/d", num_classes=2, image_shape=(1, 1, 1), num_train=400, num_test=10)
    check_against_dataset(cfg.model_copy(update={"data": cfg.data.model_copy(update={"validation_fraction": 0})}), tiny)


def test_a_symlink_to_a_device_is_not_called_broken(tmp_path):
    """In a class folder, a link to ``/dev/zero`` is a device like ``/dev/zero`` itself (passed
    over in training's walk, named as a character device where prediction refuses special
    files); only a link to nothing is a broken symlink."""
    from ensemble_core.data.image_folder import walk_files

    folder = tmp_path / "cls"
    _pngs(folder, 2)
    (folder / "zero.png").symlink_to("/dev/zero")
    assert [p.name for p in walk_files(folder)] == ["img000.png", "img001.png"]
    with pytest.raises(DataError, match="character device"):
        walk_files(folder, refuse_special=True)
    (folder / "zero.png").unlink()
    (folder / "gone.png").symlink_to(tmp_path / "nothing.png")
    with pytest.raises(DataError, match="is a broken symlink"):
        walk_files(folder)


def test_a_damaged_champion_pointer_is_named_as_such_not_as_no_champion(tmp_path):
    """A garbage champion.json beside a trained run: prediction without --run-dir says the
    pointer is damaged and names the run to pass, not 'no champion yet; fix: train one'."""
    from ensemble_core.runs.prediction.files import resolve_run

    (tmp_path / "base" / "checkpoints").mkdir(parents=True)
    (tmp_path / "champion.json").write_bytes(b"\x00\xffnot json at all\x13")
    with pytest.raises(DataError) as err:
        resolve_run(None, tmp_path)
    line = str(err.value)
    assert "damaged" in line.split("fix:")[0] and "no champion" not in line
    assert "--run-dir" in line and "base" in line.split("fix:")[1]
    assert not (tmp_path / "champion.json").exists()  # set aside, not deleted
    assert len(list((tmp_path / "corrupt-state").glob("champion.json.*"))) == 1
