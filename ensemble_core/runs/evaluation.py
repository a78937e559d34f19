"""A trained run's members at work: restore them, run the evaluators, predict new images."""

from __future__ import annotations

import functools
import logging
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ensemble_core import evaluators
from ensemble_core import metrics as metrics_lib
from ensemble_core.config import PipelineConfig
from ensemble_core.data import DatasetInfo
from ensemble_core.errors import DataError, DivergenceError
from ensemble_core.predict import member_probs
from ensemble_core.runs.checkpoint import EnsembleCheckpointer
from ensemble_core.runs.dataset import load
from ensemble_core.runs.layout import RunDir, atomic_savez
from ensemble_core.runs.results import Evaluation, EvaluatorResult
from ensemble_core.setup import EnsembleSetup, build
from ensemble_core.train import EnsembleState

log = logging.getLogger(__name__)


def restore(
    cfg: PipelineConfig, run_dir: str | Path, num_classes: int, image_shape, *, strategy: str | None = None
) -> tuple[EnsembleState, EnsembleSetup]:
    """Restore the latest checkpoint of ``run_dir`` onto the mesh ``cfg`` asks for
    (``strategy`` overrides ``mesh.member_strategy``).

    Returns:
      ``(state, setup)``: the :class:`~ensemble_core.train.EnsembleState` (leaves
      ``[E_trained, ...]``) and the :class:`~ensemble_core.setup.EnsembleSetup` it lives on.

    Raises:
      CheckpointError: no checkpoint, or one that does not fit ``cfg``.
    """
    setup = build(cfg, num_classes, strategy=strategy)
    run = RunDir(Path(run_dir))
    with EnsembleCheckpointer(run.checkpoints, keep=cfg.checkpoint.keep) as ckpt:
        state, _ = ckpt.restore(setup.abstract_state(tuple(image_shape)))
    return state, setup


def predict_member_probs(
    cfg: PipelineConfig, state: EnsembleState, setup: EnsembleSetup, images: np.ndarray
) -> tuple[np.ndarray, float]:
    """Member probabilities float32 ``[E, N, C]`` (padding members dropped) and the
    steady-state throughput in member-images/s (the program is compiled first)."""
    predict = setup.predict_fn()
    one = setup.strategy == "unroll"
    batch = cfg.eval.batch_size
    member_probs(predict, state.params, images[:batch], setup.mesh, batch, one_member_per_device=one)
    t0 = time.perf_counter()
    probs = member_probs(predict, state.params, images, setup.mesh, batch, one_member_per_device=one)
    seconds = time.perf_counter() - t0
    probs = probs[: cfg.ensemble.size]
    return probs, probs.shape[0] * probs.shape[1] / seconds


def evaluate(
    cfg: PipelineConfig,
    dataset: DatasetInfo,
    run_dir: str | Path,
    *,
    strategy: str | None = None,
    write: bool = True,
) -> Evaluation:
    """Restore the latest checkpoint and run every evaluator of ``eval.evaluators``.

    With ``write`` (default), each evaluator's arrays are written atomically
    (``predictions.npz`` for ``test``, ``eval/<name>.npz`` for the others; see
    :mod:`ensemble_core.evaluators`) and its plots drawn into ``plots/``.

    Raises:
      CheckpointError: see :func:`restore`.
      DivergenceError: every member diverged (there is no ensemble to evaluate).
    """
    run = RunDir(Path(run_dir))
    state, setup = restore(cfg, run.path, dataset.num_classes, dataset.image_shape, strategy=strategy)
    healthy = np.asarray(state.healthy)[: cfg.ensemble.size]
    if not healthy.any():
        raise DivergenceError(
            f"every member of '{run.path}' diverged, there is no ensemble to evaluate; fix: lower "
            f"train.learning_rate and train again"
        )

    # Every evaluator starts from the test split: read it, and predict it, once per evaluation.
    def predict(images: np.ndarray) -> tuple[np.ndarray, float]:
        return predict_member_probs(cfg, state, setup, images)

    load_split = functools.cache(lambda split: load(cfg, dataset, split))
    ctx = evaluators.EvalContext(
        config=cfg,
        dataset=dataset,
        healthy=healthy,
        predict=predict,
        load=load_split,
        predict_split=functools.cache(lambda split: predict(load_split(split)[0])),
        cached=lambda key, build: cached_arrays(dataset, key, build),
    )
    results = {}
    for name in cfg.eval.evaluators:
        module = evaluators.get(name)
        out = module.evaluate(ctx)
        plots: dict[str, str] = {}
        if out.skipped:
            log.warning("evaluator %s skipped: %s", name, out.skipped)
        elif write:
            atomic_savez(run.evaluator_arrays(name), **out.arrays)
            if hasattr(module, "plot"):
                drawn = module.plot(out.metrics, out.arrays, run.plots, cfg)
                plots = {key: str(path.relative_to(run.path)) for key, path in drawn.items()}
        results[name] = EvaluatorResult(name=name, metrics=out.metrics, plots=plots)
    return Evaluation(results=results)


def derived_dir(dataset: DatasetInfo) -> Path:
    """Where arrays derived from a prepared dataset are cached (transformed test sets,
    rendered OOD sets): ``<TFDS data dir>/ensemble-derived/<dataset>/<version>/``."""
    variant = Path(dataset.data_dir)  # <root>/<name>/<version>
    return variant.parents[1] / "ensemble-derived" / variant.parent.name / variant.name


def cached_arrays(dataset: DatasetInfo, key: str, build: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """``build()``'s arrays, read from ``derived_dir(dataset)/<key>.npz`` when present
    (written atomically the first time). A cache file that cannot be read is rebuilt.

    Raises:
      ValueError: ``key`` is not a plain file name.
    """
    if not key or "/" in key or key.startswith("."):
        raise ValueError(f"cache key {key!r} is not a plain file name")
    path = derived_dir(dataset) / f"{key}.npz"
    try:
        with np.load(path, allow_pickle=False) as f:
            return {k: f[k] for k in f.files}
    except FileNotFoundError:
        pass
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        log.warning("cached %s is unreadable (%s); building it again", path, err)
    arrays = build()
    atomic_savez(path, **arrays)
    return arrays


def check_image_values(images: np.ndarray) -> None:
    """Images must be what the model was trained on: uint8 in 0..255, or floats in [0, 1].

    Anything else is refused rather than guessed at: floats outside [0, 1] (e.g. 0..255
    stored as float, or standardised values), other integer types (16-bit scans, int64
    labels mistaken for images), booleans, and NaN or infinite values would all give
    confident, wrong predictions and uncertainty.

    Args:
      images: ``[N, H, W, C]``.

    Raises:
      DataError: no images, a dtype other than uint8 or float, values out of range, or
        non-finite values; the message gives the range found and the conversion to apply.
    """
    if images.size == 0:
        raise DataError(f"the image array is empty (shape {tuple(images.shape)}); fix: pass at least one image")
    if images.dtype == np.uint8:
        return
    if np.issubdtype(images.dtype, np.integer) or images.dtype == np.bool_:
        lo, hi = (int(images.min()), int(images.max())) if images.dtype != np.bool_ else (0, 1)
        fix = (
            "images.astype(np.uint8)"
            if lo >= 0 and hi <= 255
            else f"rescale them to 0..255 and cast to uint8 (e.g. (images / {hi} * 255).round().astype(np.uint8))"
        )
        raise DataError(
            f"images are {images.dtype} (values {lo}..{hi}); the model takes uint8 in 0..255 or floats in [0, 1]; "
            f"fix: convert explicitly, {fix}"
        )
    if not np.issubdtype(images.dtype, np.floating):
        raise DataError(f"images are {images.dtype}; fix: pass uint8 in 0..255 or floats in [0, 1]")
    if not np.all(np.isfinite(images)):
        raise DataError("images contain NaN or infinite values; fix: clean them before predicting")
    lo, hi = float(images.min()), float(images.max())
    if lo < 0.0 or hi > 1.0:
        hint = "divide by 255" if lo >= 0.0 and hi <= 255.0 else "rescale them to [0, 1] as the training data was"
        raise DataError(
            f"float images range over [{lo:g}, {hi:g}] but the model takes [0, 1] (uint8 0..255 / 255); fix: {hint}"
        )


def predict_images(run_dir: str | Path, images: np.ndarray, *, batch_size: int | None = None) -> dict[str, np.ndarray]:
    """Ensemble predictions of a trained run on new images.

    Args:
      run_dir: a run directory with checkpoints (its config is read from the checkpoint).
      images: uint8 ``[N, H, W, C]`` (0..255) or float ``[N, H, W, C]`` in [0, 1]
        (``[N, H, W]`` for one-channel images).
      batch_size: overrides the run's ``eval.batch_size``.

    Returns:
      ``ensemble_probs`` float32 ``[N, C]``, ``predictive_entropy`` and
      ``mutual_information`` float32 ``[N]`` (nats), ``member_probs`` float32 ``[E, N, C]``,
      ``predicted_class`` int32 ``[N]``.

    Raises:
      DataError: images of the wrong shape, or values :func:`check_image_values` refuses.
      CheckpointError: the run has no readable checkpoint.
    """
    run = RunDir(Path(run_dir))
    with EnsembleCheckpointer(run.checkpoints) as ckpt:
        meta = ckpt.read_meta()
    cfg = PipelineConfig.model_validate(meta["config"])
    if batch_size:
        cfg = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"batch_size": batch_size})})
    shape = tuple(meta["dataset"]["image_shape"])
    check_image_values(images)
    if images.ndim == 3 and shape[-1] == 1:
        images = images[..., None]
    if images.ndim != 4 or tuple(images.shape[1:]) != shape:
        dims = ", ".join(map(str, shape))
        raise DataError(
            f"images have shape {tuple(images.shape)} but the model takes [N, {dims}]; fix: reshape them to [N, {dims}]"
        )
    state, setup = restore(cfg, run.path, meta["dataset"]["num_classes"], shape)
    probs, _ = predict_member_probs(cfg, state, setup, images)
    return {
        "ensemble_probs": metrics_lib.ensemble_probs(probs).astype(np.float32),
        "predictive_entropy": metrics_lib.predictive_entropy(probs).astype(np.float32),
        "mutual_information": metrics_lib.mutual_information(probs).astype(np.float32),
        "member_probs": probs,
        "predicted_class": np.argmax(probs.mean(0), -1).astype(np.int32),
    }
