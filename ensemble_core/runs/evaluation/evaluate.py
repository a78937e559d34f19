"""A trained run's members at work: restore them, run the evaluators, predict new images."""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from ensemble_core import diskspace, evaluators, stopping
from ensemble_core import metrics as metrics_lib
from ensemble_core.calibration import apply_temperature, fit_temperature, temperature_nll
from ensemble_core.config import PipelineConfig
from ensemble_core.data import DatasetInfo
from ensemble_core.errors import DivergenceError
from ensemble_core.mesh import member_sharding
from ensemble_core.predict import member_probs
from ensemble_core.runs.checkpoint import EnsembleCheckpointer
from ensemble_core.runs.dataset import load
from ensemble_core.runs.images import check_image_shape, check_image_values
from ensemble_core.runs.layout import RunDir, atomic_savez, atomic_write_json
from ensemble_core.runs.pool import final_pool, select_members, selection_record
from ensemble_core.runs.results import Evaluation, EvaluatorResult
from ensemble_core.runs.selection_file import read_selection
from ensemble_core.selection import Selection
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


@dataclasses.dataclass(frozen=True)
class Members:
    """The members an evaluation scores: the ensemble as configured.

    Without ``ensemble.select_size`` these are the E trained members (padding dropped,
    diverged ones marked in ``healthy``); with it, the greedy selection's multiset, one
    row per pick (a member picked twice has two equal rows, so the mean over rows is
    the selection's weighted ensemble).

    Attributes:
      variables: the Flax variables (parameters and mutable collections) of the distinct
        members that are predicted (leaves ``[U, ...]`` on ``setup``'s mesh; each member's
        best epoch with a validation split).
      setup: the :class:`~ensemble_core.setup.EnsembleSetup` they live on.
      rows: pool index of every evaluated row, int ``[K]``.
      healthy: bool ``[K]``.
      expand: int ``[K]``: row k is ``variables`` member ``expand[k]``.
    """

    variables: Any
    setup: EnsembleSetup
    rows: np.ndarray
    healthy: np.ndarray
    expand: np.ndarray

    def predict(self, cfg: PipelineConfig, images: np.ndarray) -> tuple[np.ndarray, float]:
        """Probabilities float32 ``[K, N, C]`` of every row on ``images`` and the
        steady-state throughput in member-images/s (the program is compiled first)."""
        predict = self.setup.predict_fn()
        one = self.setup.strategy == "unroll"
        batch = cfg.eval.batch_size
        member_probs(predict, self.variables, images[:batch], self.setup.mesh, batch, one_member_per_device=one)
        t0 = time.perf_counter()
        probs = member_probs(predict, self.variables, images, self.setup.mesh, batch, one_member_per_device=one)
        seconds = time.perf_counter() - t0
        distinct = int(self.expand.max()) + 1
        throughput = distinct * probs.shape[1] / seconds
        return probs[self.expand], throughput


def all_members(cfg: PipelineConfig, state: EnsembleState, setup: EnsembleSetup) -> Members:
    """Every trained member (padding dropped at prediction), evaluated at its final parameters."""
    e = cfg.ensemble.size
    return Members(
        variables=state.final_variables,
        setup=setup,
        rows=np.arange(e),
        healthy=np.asarray(state.healthy)[:e],
        expand=np.arange(e),
    )


def selected_members(
    cfg: PipelineConfig, state: EnsembleState, setup: EnsembleSetup, rows, num_classes: int
) -> Members:
    """The members ``rows`` (pool indices, repeats allowed): the distinct ones are moved
    onto a mesh of their own (:func:`ensemble_core.setup.build` for that many members)."""
    rows = np.asarray(rows, np.int64)
    distinct, expand = np.unique(rows, return_inverse=True)
    sub_cfg = cfg.model_copy(
        update={
            "ensemble": cfg.ensemble.model_copy(
                update={"size": len(distinct), "pad": False, "search": None, "select_size": None}
            ),
            "mesh": cfg.mesh.model_copy(update={"ensemble": None}),
        }
    )
    sub = build(sub_cfg, num_classes, strategy=setup.strategy)
    sharding = member_sharding(sub.mesh)
    variables = jax.tree.map(lambda x: jax.device_put(np.asarray(x)[distinct], sharding), state.final_variables)
    return Members(variables=variables, setup=sub, rows=rows, healthy=np.ones(len(rows), bool), expand=expand)


def choose_members(
    cfg: PipelineConfig, dataset: DatasetInfo, state: EnsembleState, setup: EnsembleSetup, run: RunDir, write: bool
) -> tuple[Members, dict | None]:
    """The members to evaluate and, with a validation split, what was decided on it.

    With a validation split every trained member predicts it (``eval/validation.npz``:
    ``member_probs`` float32 ``[E, N_val, C]``, ``labels``, ``healthy``); with
    ``ensemble.select_size`` the greedy selection ``ensemble.selection`` asks for
    (:func:`ensemble_core.runs.pool.select_members`) picks the members among the healthy
    ones; with ``eval.temperature_scaling`` one temperature is fitted to the chosen ensemble's validation NLL
    (:func:`ensemble_core.calibration.fit_temperature`).

    Returns:
      The :class:`Members`, and None (no validation split) or the ``selection`` record:
      :func:`ensemble_core.runs.pool.selection_record` (``members``: pool indices per pick,
      or every healthy member; ``validation_nll``: the ensemble's after each pick, one
      value without selection) plus ``temperature`` (None when not fitted) and
      ``validation_nll_temperature_scaled``.

    Raises:
      DivergenceError: selection without replacement, fewer healthy members than picks.
    """
    members = all_members(cfg, state, setup)
    if not cfg.has_validation:
        return members, None
    images, labels = load(cfg, dataset, "validation")
    probs, _ = members.predict(cfg, images)
    if write:
        atomic_savez(run.evaluator_arrays("validation"), member_probs=probs, labels=labels, healthy=members.healthy)
    member_nll = [metrics_lib.nll(p, labels) for p in probs]
    if cfg.ensemble.select_size is not None:
        picked = select_members(cfg, probs, labels, members.healthy)
        members = selected_members(cfg, state, setup, picked.members, dataset.num_classes)
    else:
        healthy = np.flatnonzero(members.healthy).tolist()
        picked = Selection(healthy, [metrics_lib.nll(metrics_lib.ensemble_probs(probs[healthy]), labels)])
    chosen = picked.members
    ensemble = metrics_lib.ensemble_probs(probs[chosen])
    temperature = fit_temperature(ensemble, labels) if cfg.eval.temperature_scaling else None
    record = selection_record(picked, member_nll, len(labels))
    record["temperature"] = temperature
    record["validation_nll_temperature_scaled"] = (
        None if temperature is None else temperature_nll(ensemble, labels, temperature)
    )
    if write:
        atomic_write_json(run.selection_json, {"members": record["members"], "temperature": temperature})
    return members, record


@diskspace.output_errors("run_dir")
def evaluate(
    cfg: PipelineConfig,
    dataset: DatasetInfo,
    run_dir: str | Path,
    *,
    strategy: str | None = None,
    write: bool = True,
) -> Evaluation:
    """Restore the latest checkpoint of the run's pool (the stratified pool of a hyper-deep
    ensemble, :func:`ensemble_core.runs.pool.final_pool`), choose the members
    (:func:`choose_members`) and run every evaluator of ``eval.evaluators`` on them.

    With ``write`` (default), each evaluator's arrays are written atomically
    (``predictions.npz`` for ``test``, ``eval/<name>.npz`` for the others; see
    :mod:`ensemble_core.evaluators`) and its plots drawn into ``plots/``.

    Raises:
      CheckpointError: see :func:`restore`.
      DivergenceError: every member diverged (there is no ensemble to evaluate).
    """
    run = RunDir(Path(run_dir))
    cfg, pool, _ = final_pool(cfg, run)  # the stratified pool of a hyper-deep ensemble
    state, setup = restore(cfg, pool.path, dataset.num_classes, dataset.image_shape, strategy=strategy)
    if not np.asarray(state.healthy)[: cfg.ensemble.size].any():
        raise DivergenceError(
            f"every member of '{run.path}' diverged, there is no ensemble to evaluate; fix: lower "
            f"train.learning_rate and train again"
        )
    members, selection = choose_members(cfg, dataset, state, setup, run, write)

    # Every evaluator starts from the test split: read it, and predict it, once per evaluation.
    def predict(images: np.ndarray) -> tuple[np.ndarray, float]:
        return members.predict(cfg, images)

    load_split = functools.cache(lambda split: load(cfg, dataset, split))
    ctx = evaluators.EvalContext(
        config=cfg,
        dataset=dataset,
        healthy=members.healthy,
        predict=predict,
        load=load_split,
        predict_split=functools.cache(lambda split: predict(load_split(split)[0])),
        cached=lambda key, build, shapes=None: cached_arrays(dataset, key, build, shapes),
        temperature=None if selection is None else selection["temperature"],
    )
    results = {}
    for name, spec in cfg.eval.evaluators.items():
        stopping.check()  # a stop request ends evaluation between evaluators (and batches)
        module = evaluators.get(spec.type)
        out = module.evaluate(dataclasses.replace(ctx, name=name, options=evaluators.options(name, spec)))
        plots: dict[str, str] = {}
        if out.skipped:
            log.warning("evaluator %s skipped: %s", name, out.skipped)
        elif write:
            atomic_savez(run.evaluator_arrays(name), **out.arrays)
            if hasattr(module, "plot"):
                drawn = module.plot(out.metrics, out.arrays, run.plots, cfg, name=name)
                plots = {key: str(path.relative_to(run.path)) for key, path in drawn.items()}
        results[name] = EvaluatorResult(name=name, type=spec.type, metrics=out.metrics, plots=plots)
    return Evaluation(results=results, selection=selection)


def derived_dir(dataset: DatasetInfo) -> Path:
    """Where arrays derived from a prepared dataset are cached (transformed test sets,
    rendered OOD sets): ``<TFDS data dir>/ensemble-derived/<dataset>/<version>/``."""
    variant = Path(dataset.data_dir)  # <root>/<name>/<version>
    return variant.parents[1] / "ensemble-derived" / variant.parent.name / variant.name


def cached_arrays(
    dataset: DatasetInfo,
    key: str,
    build: Callable[[], dict[str, np.ndarray]],
    shapes: dict[str, tuple[int, ...]] | None = None,
) -> dict[str, np.ndarray]:
    """``build()``'s arrays, read from ``derived_dir(dataset)/<key>.npz`` when present
    (written atomically the first time). A cache file that cannot be read, or whose
    arrays are not the ``shapes`` given (``{name: shape}``; e.g. a readable file with the
    wrong number of rows), is built again, with one warning.

    Raises:
      ValueError: ``key`` is not a plain file name.
    """
    if not key or "/" in key or key.startswith("."):
        raise ValueError(f"cache key {key!r} is not a plain file name")
    path = derived_dir(dataset) / f"{key}.npz"
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
        wrong = [
            f"{name} {arrays[name].shape if name in arrays else 'missing'} instead of {shape}"
            for name, shape in (shapes or {}).items()
            if name not in arrays or tuple(arrays[name].shape) != tuple(shape)
        ]
        if not wrong:
            return arrays
        log.warning("cached %s holds %s; building it again", path, ", ".join(wrong))
    except FileNotFoundError:
        pass
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        log.warning("cached %s is unreadable (%s); building it again", path, err)
    arrays = build()
    atomic_savez(path, **arrays)
    return arrays


def predict_images(run_dir: str | Path, images: np.ndarray, *, batch_size: int | None = None) -> dict[str, np.ndarray]:
    """Ensemble predictions of a trained run on new images.

    Args:
      run_dir: a run directory with checkpoints (its config is read from the checkpoint).
      images: uint8 ``[N, H, W, C]`` (0..255) or float ``[N, H, W, C]`` in [0, 1]
        (``[N, H, W]`` for one-channel images).
      batch_size: overrides the run's ``eval.batch_size``.

    Returns:
      ``ensemble_probs`` float32 ``[N, C]`` (temperature-scaled when the run fitted a
      temperature), ``predictive_entropy`` (of ``ensemble_probs``) and
      ``mutual_information`` float32 ``[N]`` (nats), ``member_probs`` float32 ``[K, N, C]``
      of the ensemble's healthy members (the selection's picks, one row each, when the
      run selects), ``predicted_class`` int32 ``[N]``, ``members`` int32 ``[K]`` (pool
      index of each row) and ``temperature`` (float32 scalar, NaN when not fitted).

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
    images = check_image_shape(images, shape)
    cfg, pool, _ = final_pool(cfg, run)
    state, setup = restore(cfg, pool.path, meta["dataset"]["num_classes"], shape)
    chosen = read_selection(run, cfg.ensemble.size)
    if chosen is not None and cfg.ensemble.select_size is not None:
        members = selected_members(cfg, state, setup, chosen["members"], meta["dataset"]["num_classes"])
    else:
        members = all_members(cfg, state, setup)
    probs, _ = members.predict(cfg, images)
    probs = probs[members.healthy]
    ensemble = metrics_lib.ensemble_probs(probs)
    temperature = None if chosen is None else chosen.get("temperature")
    if temperature is not None:
        ensemble = apply_temperature(ensemble, temperature)
    return {
        "ensemble_probs": ensemble.astype(np.float32),
        "predictive_entropy": metrics_lib.entropy(ensemble).astype(np.float32),
        "mutual_information": metrics_lib.mutual_information(probs).astype(np.float32),
        "member_probs": probs,
        "predicted_class": np.argmax(ensemble, -1).astype(np.int32),
        "members": members.rows[members.healthy].astype(np.int32),
        "temperature": np.float32(np.nan if temperature is None else temperature),
    }
