"""Every check that can fail before training, run once before any compute or write."""

from __future__ import annotations

from pathlib import Path

from ensemble_core import memory as memory_lib
from ensemble_core.config import PipelineConfig
from ensemble_core.data import DatasetInfo
from ensemble_core.errors import ConfigError
from ensemble_core.runs.checkpoint import EnsembleCheckpointer
from ensemble_core.runs.dataset import num_train, num_validation, prepare
from ensemble_core.runs.layout import run_dir_for
from ensemble_core.runs.lock import ensure_unlocked
from ensemble_core.runs.resume import check_resumable
from ensemble_core.setup import plan, resolve_strategy


def check_against_dataset(cfg: PipelineConfig, dataset: DatasetInfo) -> None:
    """Config checks that need the dataset's size.

    Raises:
      ConfigError: the batch is larger than the training split (validation split held
        out), or the validation split would be empty.
    """
    n = num_train(cfg, dataset)
    if cfg.has_validation and num_validation(cfg, dataset) == 0:
        raise ConfigError(
            f"data.validation_fraction={cfg.data.validation_fraction} of the {n} training examples holds out "
            f"none; fix: raise data.validation_fraction or use more training examples"
        )
    if cfg.train.batch_size > n:
        raise ConfigError(
            f"train.batch_size={cfg.train.batch_size} is larger than the {n} training examples "
            f"(validation split held out); "
            f"fix: set train.batch_size <= {n}"
        )


def check_memory(cfg: PipelineConfig, dataset: DatasetInfo) -> memory_lib.MemoryEstimate:
    """Refuse, before anything compiles, a config whose training cannot fit in memory
    (:mod:`ensemble_core.memory`: a lower bound from shapes alone).

    Raises:
      ConfigError: with the estimate and the memory there is.
    """
    shape = tuple(dataset.image_shape)
    est = memory_lib.estimate(
        cfg, plan(cfg), dataset.num_classes, shape, num_train(cfg, dataset), resolve_strategy(cfg)
    )
    memory_lib.check(est, cfg)
    return est


def preflight(cfg: PipelineConfig, output_dir: str | Path, run_name: str) -> DatasetInfo:
    """Every check that can fail before training, in order; writes nothing in the run dir.

    Mesh, output directory, run name, the run's lock, the dataset (prepared if needed)
    against the config, the memory training needs against what there is, and an existing
    run's checkpoint against the config (:mod:`ensemble_core.runs.resume`).

    Returns:
      The dataset's :class:`~ensemble_core.data.DatasetInfo`.

    Raises:
      EnsembleError: the first problem found (ConfigError, MeshError, DataError,
        RunLockedError, IncompatibleRunError).
    """
    mesh_plan = plan(cfg)
    run = run_dir_for(output_dir, run_name)
    ensure_unlocked(run.path)
    dataset = prepare(cfg.data)
    check_against_dataset(cfg, dataset)
    check_memory(cfg, dataset)
    if run.has_checkpoint():
        with EnsembleCheckpointer(run.checkpoints) as ckpt:
            try:
                meta = ckpt.read_meta()
            except Exception:  # noqa: BLE001  (a damaged latest step: training falls back itself)
                meta = None
        if meta is not None:
            check_resumable(meta, cfg, run.path, mesh_plan.padded_members)
    return dataset
