"""Every check that can fail before training, run once before any compute or write."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

from ensemble_core import diskspace, evaluators, mc_dropout
from ensemble_core import memory as memory_lib
from ensemble_core.config import PipelineConfig
from ensemble_core.data import DatasetInfo
from ensemble_core.ensemble_setup import plan, resolve_strategy
from ensemble_core.errors import ConfigError, DataError
from ensemble_core.models import check_model, import_model_function, is_import_path, model_options
from ensemble_core.networks import build_network, members_per_network
from ensemble_core.runs.champion.retraining import check_folder_class_map
from ensemble_core.runs.dataset import num_calibration, num_train, num_validation, prepare
from ensemble_core.runs.ensemble.pool import saved_plan, stratified_config
from ensemble_core.runs.evaluation.figure_check import check_promotion_figure
from ensemble_core.runs.storage.checkpoint import EnsembleCheckpointer
from ensemble_core.runs.storage.layout import RunDir, run_dir_for
from ensemble_core.runs.storage.lock import ensure_unlocked
from ensemble_core.runs.storage.resume import check_resumable
from ensemble_core.runs.training.launcher import check_mesh_spans_processes

log = logging.getLogger(__name__)

SCHEDULER_TIMEOUT_S = 5.0  # how long preflight waits for distributed.address to accept a connection

#: Datasets of digits or characters, where a horizontal flip changes the class (a mirrored
#: 2, 3, 7 or letter is another symbol or none): ``data.augment.flip`` is refused on them.
SYMBOL_DATASETS = ("mnist5k", "mnist", "emnist", "kmnist", "svhn_cropped", "binarized_mnist", "mnist_corrupted")


def check_against_dataset(cfg: PipelineConfig, dataset: DatasetInfo) -> None:
    """Config checks that need the dataset's size and shape.

    Raises:
      DataError: images with an empty dimension (H, W or C of 0).
      ConfigError: the batch is larger than the training split (validation split held
        out), the validation split would be empty, ``data.augment.flip`` on a dataset of
        digits or characters (:data:`SYMBOL_DATASETS`), or ``data.augment.crop_padding``
        not smaller than the images.
    """
    augment, (height, width, channels) = cfg.data.augment, tuple(dataset.image_shape)
    if min(height, width, channels) == 0:
        raise DataError(
            f"the images of '{dataset.name}' have an empty dimension (shape {height}x{width}x{channels}): there is "
            "nothing to train on",
            fix="give images of at least 1x1 pixels and 1 channel ([N, H, W, C] with H, W, C >= 1)",
        )
    if augment.flip and dataset.name in SYMBOL_DATASETS:
        raise ConfigError(
            f"data.augment.flip=true on '{dataset.name}', a dataset of digits or characters, where a mirrored image "
            "is another symbol or none",
            fix="set data.augment.flip=false (crop_padding may stay)",
        )
    if augment.crop_padding and augment.crop_padding >= min(height, width):  # 0: no crop, nothing to check
        raise ConfigError(
            f"data.augment.crop_padding={augment.crop_padding} is not smaller than the {height}x{width} images; "
            f"fix: use a padding below {min(height, width)} (4 is the usual for 32x32)"
        )
    n = num_train(cfg, dataset)
    if cfg.has_validation and num_validation(cfg, dataset) == 0:
        raise ConfigError(
            f"data.validation_fraction={cfg.data.validation_fraction} of the {n} training examples holds out none",
            fix="raise data.validation_fraction or use more training examples",
        )
    if cfg.has_calibration and num_calibration(cfg, dataset) == 0:
        raise ConfigError(
            f"data.calibration_fraction={cfg.data.calibration_fraction} of the training examples holds out none",
            fix="raise data.calibration_fraction, use more training examples, or set it to 0 (no prediction sets)",
        )
    if cfg.train.batch_size > n:
        raise ConfigError(
            f"train.batch_size={cfg.train.batch_size} is larger than the {n} training examples "
            f"(validation and calibration splits held out); "
            f"fix: set train.batch_size <= {n}"
        )


def check_memory(cfg: PipelineConfig, dataset: DatasetInfo) -> memory_lib.MemoryEstimate:
    """Refuse, before anything compiles, a model that cannot be built or run on the
    dataset (:func:`ensemble_core.models.check_model`: its import path, options, one member
    initialised and run in both modes on a dummy batch, abstractly), one MC dropout cannot
    wrap (:func:`ensemble_core.mc_dropout.check_network`) and a config whose
    training cannot fit in memory (:mod:`ensemble_core.memory`: a lower bound from shapes alone).

    Raises:
      ConfigError: the model's problem in one line, or the estimate and the memory there is.
    """
    shape = tuple(dataset.image_shape)
    model = build_network(cfg, dataset.num_classes)
    check_model(model, cfg.model, shape, dataset.num_classes, outputs=members_per_network(cfg))
    if cfg.ensemble.method == "mc_dropout":  # a network it can wrap, with dropout
        mc_dropout.check_network(model, cfg.model.name, shape)

    est = memory_lib.estimate(
        cfg, plan(cfg), dataset.num_classes, shape, num_train(cfg, dataset), resolve_strategy(cfg), model=model
    )
    memory_lib.check(est, cfg)
    return est


def preflight(cfg: PipelineConfig, output_dir: str | Path, run_name: str) -> DatasetInfo:
    """Every check that can fail before training, in order; writes nothing in the run dir.

    Mesh, output directory (a probe file written, fsynced and removed there: a full disk
    or a file system that takes no files, such as ``/proc``, is refused here,
    :func:`ensemble_core.diskspace.probe_writable`), run name, the run's lock, each evaluator's options, the model's
    import path and options, the dataset (prepared if needed) against the config (and the
    augmentation), a dotted ``promotion.metric`` against the figures its evaluator produces
    (:mod:`ensemble_core.runs.evaluation.figure_check`), the model on the dataset's shape, the memory
    training needs against what there is, and an existing run's checkpoint against the
    config (:mod:`ensemble_core.runs.storage.resume`).

    Returns:
      The dataset's :class:`~ensemble_core.data.DatasetInfo`.

    Raises:
      EnsembleError: the first problem found (ConfigError, MeshError, DataError,
        RunLockedError, IncompatibleRunError, DiskFullError, OutputError).
    """
    mesh_plan = plan(cfg)
    check_mesh_spans_processes(cfg)
    groups = cfg.distributed.member_groups
    group_plan = plan(cfg, group=True) if groups > 1 else mesh_plan
    run = run_dir_for(output_dir, run_name)
    diskspace.probe_writable(output_dir)  # a file really written, fsynced and removed
    group_dirs = [run.group(g) for g in range(groups)] if groups > 1 else []
    for where in [run, *group_dirs, run.stratified, *run.stratified.existing_groups()]:
        ensure_unlocked(where.path)
    check_scheduler(cfg)
    for name, spec in cfg.eval.evaluators.items():  # each evaluator's options
        evaluators.options(name, spec)
    model_options(cfg.model)
    if is_import_path(cfg.model.name):  # the path imports and names a function, before the dataset
        import_model_function(cfg.model.name)
    if not run.has_checkpoint():  # as runs.run: a resumed run keeps its class map
        check_folder_class_map(cfg, output_dir)  # a new class folder: refused before anything is decoded
    dataset = prepare(cfg.data)
    warn_classes_without_test_images(dataset)
    check_against_dataset(cfg, dataset)
    # every evaluator's requirements on the data (a default one that cannot run skipped with one
    # logged line, a named one refused) and the OOD sets that can be made for this dataset
    evaluators.check_data(cfg, dataset)
    check_promotion_figure(cfg, dataset)
    check_memory(cfg, dataset)
    checked = [(run, mesh_plan.padded_members, cfg)] + [(d, group_plan.padded_members, cfg) for d in group_dirs]
    # A run stopped while its member groups trained has checkpoints under groups/<g>/ only:
    # with another group count (e.g. 1, which looks at checkpoints/ alone) it would start
    # over and orphan them, so every group directory with a checkpoint is checked too.
    checked += [(d, group_plan.padded_members, cfg) for d in stopped_groups(run) if d not in group_dirs]
    checked += stratified_checkpoints(cfg, run)
    for where, members, where_cfg in checked:
        if not where.has_checkpoint():
            continue
        with EnsembleCheckpointer(where.checkpoints, read_only=True) as ckpt:
            try:
                meta = ckpt.read_meta()
            except Exception:  # noqa: BLE001  (a damaged latest step: training falls back itself)
                meta = None
        if meta is not None:
            check_resumable(meta, where_cfg, where.path, members)
    return dataset


def warn_classes_without_test_images(dataset: DatasetInfo) -> list[str]:
    """One warning naming the classes the run trains on that have no test example (an
    image folder whose ``test/`` lacks their folder): their accuracy and calibration are
    not measured, and the test figures average over the other classes only.

    Returns:
      those classes' names, in label order ([] when every class has test examples, or the
      dataset has no per-class counts).
    """
    snap = dataset.snapshot
    counts = None if snap is None else snap.class_counts.get("test")
    if not counts:
        return []
    kept = dataset.class_indices if dataset.class_indices is not None else range(len(counts))
    names = dataset.class_names or tuple(str(i) for i in kept)
    missing = [names[k] for k, i in enumerate(kept) if i >= len(counts) or counts[i] == 0]
    if missing:
        log.warning(
            "class%s %s ha%s no test images (the test split holds none): %s accuracy and calibration are not "
            "measured and the test figures cover the other classes only; fix: add %s folder%s under the test "
            "folder, or remove the test folder so that 20%% of each class's training images are held out",
            "es" if len(missing) > 1 else "",
            ", ".join(repr(m) for m in missing),
            "ve" if len(missing) > 1 else "s",
            "their" if len(missing) > 1 else "its",
            "their" if len(missing) > 1 else "its",
            "s" if len(missing) > 1 else "",
        )
    return missing


def stratified_checkpoints(cfg: PipelineConfig, run: RunDir) -> list[tuple[RunDir, int, PipelineConfig]]:
    """A hyper-deep ensemble's stratified pool with its planned member count and its
    config, when its plan exists (its checkpoints are then checked against the pool's
    config, like the run's against ``cfg``).

    Raises:
      CheckpointError: a damaged ``stratified/plan.json``.
      IncompatibleRunError: the plan was made for another ``ensemble.stratify``.
    """
    saved = saved_plan(cfg, run) if cfg.ensemble.stratify is not None else None
    if saved is None:
        return []
    pool_cfg = stratified_config(cfg, saved)
    return [(run.stratified, plan(pool_cfg).padded_members, pool_cfg)]


def stopped_groups(run: RunDir) -> list[RunDir]:
    """The member-group directories ``groups/<g>/`` of ``run`` that hold a checkpoint."""
    return [g for g in run.existing_groups() if g.has_checkpoint()]


def check_scheduler(cfg: PipelineConfig, timeout_s: float = SCHEDULER_TIMEOUT_S) -> None:
    """With ``distributed.address``, that something accepts TCP connections there
    (a Dask scheduler is checked for real when the run connects to it).

    Raises:
      ConfigError: the address does not parse or nothing answers within ``timeout_s``.
    """
    address = cfg.distributed.address
    if address is None:
        return
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(
            f"distributed.address={address} has no host:port", fix="give the scheduler as tcp://host:8786"
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as err:
        raise ConfigError(
            f"the Dask scheduler at distributed.address={address} does not answer "
            f"({err.strerror or type(err).__name__})",
            fix="start it (`dask scheduler`) or correct the address",
        ) from None
