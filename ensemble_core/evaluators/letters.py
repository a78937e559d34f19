"""Out-of-distribution: letters A-J rendered from the DejaVu fonts that ship with
matplotlib, with seeded affine jitter (:func:`ensemble_core.shifts.letters`), a stand-in
for notMNIST, the classic OOD set for MNIST. As many letters as test images (balanced).
Only for 28x28 one-channel images.

Arrays (``eval/letters.npz``): ``member_probs`` float32 ``[E, 2N, C]``, ``is_ood`` bool
``[2N]`` (test images first), ``labels`` int32 (-1 for the letters), ``healthy`` bool ``[E]``.
"""

from __future__ import annotations

from pathlib import Path

from ensemble_core import shifts
from ensemble_core.config import PipelineConfig
from ensemble_core.data import DatasetInfo
from ensemble_core.evaluators import EvalContext, EvaluatorOutput, ood_base, skipped

SEED = 0
CACHE_VERSION = 1


def requirements(config: PipelineConfig, dataset: DatasetInfo, opts=None) -> str | None:
    """What this evaluator needs of the data that ``dataset`` lacks (28x28x1 images), or
    None; checked in the preflight (:func:`ensemble_core.evaluators.check_data`) and again here."""
    shape = tuple(int(d) for d in dataset.image_shape)
    return None if shape == (28, 28, 1) else f"the letters are rendered at 28x28x1, not {shape}"


def evaluate(ctx: EvalContext) -> EvaluatorOutput:
    """The test split vs rendered letters; see :mod:`ensemble_core.evaluators.ood_base`."""
    if (unmet := requirements(ctx.config, ctx.dataset, ctx.options)) is not None:
        return skipped(unmet)
    n = len(ctx.load("test")[0])
    per_letter = -(-n // 10)
    key = f"letters-v{CACHE_VERSION}-{per_letter}-seed{SEED}"
    shape = {"images": (10 * per_letter, 28, 28, 1)}
    images = ctx.cached(key, lambda: {"images": shifts.letters(per_letter, SEED)}, shape)["images"][:n]
    return ood_base.evaluate_ood(ctx, images, "letters A-J rendered from DejaVu fonts, seeded affine jitter")


def plot(
    metrics: dict, arrays: dict, plots_dir: Path, config: PipelineConfig, name: str = "letters"
) -> dict[str, Path]:
    """Entropy histograms and ROC curves (:func:`ensemble_core.evaluators.ood_base.plot_ood`)."""
    return ood_base.plot_ood(metrics, arrays, plots_dir, name)


def markdown(metrics: dict) -> list[str]:
    """The detection table."""
    return ood_base.markdown(metrics, "OOD: letters")


def table(metrics: dict) -> list[dict]:
    """The Prefect table artifact's rows (:func:`ensemble_core.evaluators.ood_base.table`)."""
    return ood_base.table(metrics)
