"""The literature's Fashion-MNIST configs (``configs/fashion_mnist_best.yaml``, the project's
recipe, and ``configs/fashion_mnist_lenet5.yaml``, uncertainty-baselines' like for like) run
end to end at a toy size, so that they cannot rot: every key they set is still understood,
and every evaluator they name still runs. The real Fashion-MNIST files are cut to a few
hundred images and dropped in ``data.manual_dir`` (the loading code is the real one); the
figures are checked against the run's own predictions, recomputed here."""

import json
from pathlib import Path

import numpy as np
import pytest

from ensemble_core import data, runs
from ensemble_core.config import load_config
from ensemble_core.data.sources import IDX_SOURCES
from ensemble_core.data.validation_split import calibration_split

ROOT = Path(__file__).resolve().parents[1]
FASHION_DIR = Path(IDX_SOURCES["fashion_mnist"][0])
LITERATURE_CONFIGS = ["fashion_mnist_best.yaml", "fashion_mnist_lenet5.yaml"]


@pytest.mark.parametrize("name", LITERATURE_CONFIGS)
def test_the_literature_configs_train_on_50000_images_as_uncertainty_baselines(name):
    """uncertainty-baselines trains on 50,000 of Fashion-MNIST's 60,000 training images
    (baselines/mnist/deterministic.py); the validation and calibration splits come out of the
    other 10,000, not out of the 50,000 (the calibration split's default 10% would leave 44,000)."""
    cfg = load_config(ROOT / "configs" / name)
    labels = np.repeat(np.arange(10), 6000)  # Fashion-MNIST's training split: 6,000 a class
    train, validation, calibration = calibration_split(
        labels, cfg.data.validation_fraction, cfg.data.calibration_fraction
    )
    assert len(train) == 50_000
    assert len(validation) + len(calibration) == 10_000 and len(validation) > 0


@pytest.fixture(scope="module")
def toy_fashion_mnist(tmp_path_factory) -> Path:
    """The first 400 training and 200 test images of the real Fashion-MNIST, as IDX files."""
    if not (FASHION_DIR / "t10k-images-idx3-ubyte.gz").exists():
        pytest.skip("Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)")
    train = data.read_idx_split(FASHION_DIR, "train")
    test = data.read_idx_split(FASHION_DIR, "test")
    directory = tmp_path_factory.mktemp("fashion-mnist-toy")
    data.write_idx_dataset(directory, (train[0][:400], train[1][:400]), (test[0][:200], test[1][:200]))
    return directory


@pytest.mark.slow  # two whole runs with every evaluator the configs name
@pytest.mark.parametrize("name", LITERATURE_CONFIGS)
def test_the_literature_configs_run_at_a_toy_size(tmp_path, toy_fashion_mnist, name):
    file_cfg = load_config(ROOT / "configs" / name)
    cfg = load_config(
        ROOT / "configs" / name,
        [
            f"data.manual_dir={toy_fashion_mnist}",
            f"data.data_dir={tmp_path / 'tfds'}",
            "train.epochs=1",
            "train.warmup_epochs=0.5",
            "ensemble.size=2",
        ],
    )
    result = runs.run(cfg, tmp_path / "runs", "toy")
    report = json.loads(result.run_dir.report_json.read_text())
    assert report["member_choice"] == file_cfg.train.member_choice
    with np.load(result.run_dir.path / "predictions.npz") as f:
        probs, labels = f["member_probs"], f["labels"]
    assert probs.shape == (2, 200, 10)
    mean = probs.mean(axis=0)
    assert report["ensemble"]["accuracy"] == pytest.approx(np.mean(mean.argmax(-1) == labels))
    nll = -np.mean(np.log(np.clip(mean[np.arange(len(labels)), labels], 1e-12, None)))
    assert report["ensemble"]["nll"] == pytest.approx(nll, rel=1e-3)
    if file_cfg.eval.temperature_scaling:
        assert report["temperature"] > 0 and "nll" in report["ensemble_temperature_scaled"]
    evaluations = report.get("evaluations") or {}
    for evaluator, spec in file_cfg.eval.evaluators.items():
        if evaluator == "test":
            continue
        metrics = evaluations[evaluator]["metrics"]
        if spec.type == "common_corruptions":
            assert len(metrics["levels"]) == 75  # 15 corruptions x 5 severities
        elif spec.type == "ood":
            assert metrics["num_ood"] > 0
            assert all(0.0 <= v <= 1.0 for v in metrics["ensemble"]["auroc"].values())
