"""Out-of-distribution: Fashion-MNIST test images (Xiao et al. 2017), real photographs of
clothing, for an ensemble trained on digits. Read, validated, from the test files Debian's
``dataset-fashion-mnist`` installs (:func:`ensemble_core.data.read_idx_split`); when they
are absent the evaluator is skipped with one line saying how to get them, and the run goes
on. As many Fashion-MNIST images as test images (the first ones in file order, whose
classes are interleaved: balanced). Skipped for a 28x28x1 mismatch or when the run trains
on Fashion-MNIST itself.

Only the 10,000 test images are read (0.07 s): no TFDS snapshot of the whole dataset is
prepared for it, which cost about 11 s of CPU in every new ``data.data_dir`` (its 60,000
training images written and shuffled for an evaluator that never reads them).

Arrays (``eval/fashion_mnist.npz``): as :mod:`ensemble_core.evaluators.letters`.
"""

from __future__ import annotations

from pathlib import Path

from ensemble_core import data as data_lib
from ensemble_core import timing
from ensemble_core.config import PipelineConfig
from ensemble_core.data import DatasetInfo
from ensemble_core.evaluators import DATA, EvalContext, EvaluatorOutput, ood_base, skipped

NAME = "fashion_mnist"


def requirements(config: PipelineConfig, dataset: DatasetInfo, opts=None) -> str | None:
    """What this evaluator needs of the data that ``dataset`` lacks (28x28x1 images), or
    None; checked in the preflight (:func:`ensemble_core.evaluators.check_data`) and again here."""
    shape = tuple(int(d) for d in dataset.image_shape)
    return None if shape == (28, 28, 1) else f"Fashion-MNIST images are 28x28x1, the model takes {shape}"


def evaluate(ctx: EvalContext) -> EvaluatorOutput:
    """The test split vs Fashion-MNIST's test split; see :mod:`ensemble_core.evaluators.ood_base`."""
    if ctx.config.data.name == NAME:
        return skipped("the ensemble is trained on Fashion-MNIST: it is not out-of-distribution here")
    if (unmet := requirements(ctx.config, ctx.dataset, ctx.options)) is not None:
        return skipped(unmet)
    if (directory := data_lib.idx_files_available(NAME)) is None:
        where, fix = data_lib.IDX_SOURCES[NAME]
        return skipped(f"the Fashion-MNIST files are not in {where}; fix: {fix}")
    n = len(ctx.load("test")[0])
    with timing.part(DATA):
        images, _ = data_lib.read_idx_split(directory, "test")
    return ood_base.evaluate_ood(ctx, images[:n], "Fashion-MNIST test split (dataset-fashion-mnist)")


def plot(metrics: dict, arrays: dict, plots_dir: Path, config: PipelineConfig, name: str = NAME) -> dict[str, Path]:
    """Entropy histograms and ROC curves (:func:`ensemble_core.evaluators.ood_base.plot_ood`)."""
    return ood_base.plot_ood(metrics, arrays, plots_dir, name)


def markdown(metrics: dict) -> list[str]:
    """The detection table."""
    return ood_base.markdown(metrics, "OOD: Fashion-MNIST")


def table(metrics: dict) -> list[dict]:
    """The Prefect table artifact's rows (:func:`ensemble_core.evaluators.ood_base.table`)."""
    return ood_base.table(metrics)
