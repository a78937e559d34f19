"""The pipeline stages as plain functions (I/O here; the math lives in the other modules).

Each Prefect task in ``tasks/`` is a thin wrapper over one function below, and the same
functions can be called directly (that is what the benchmarks compare the flow against).
Stages exchange paths and small JSON-able dicts, never arrays.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from ensemble_core import champion as champion_lib
from ensemble_core import data as data_lib
from ensemble_core import memory as memory_lib
from ensemble_core import metrics as metrics_lib
from ensemble_core import report as report_lib
from ensemble_core.checkpoint import EnsembleCheckpointer
from ensemble_core.config import DataConfig, PipelineConfig
from ensemble_core.errors import (
    ConfigError,
    DataError,
    DivergenceError,
    IncompatibleRunError,
    PreemptedError,
)
from ensemble_core.evaluate import make_predict, member_probs
from ensemble_core.mesh import MeshPlan, make_mesh, plan_mesh, replicated
from ensemble_core.models import build_model
from ensemble_core.rngs import key_layout, keys_from_layout, member_keys
from ensemble_core.runlock import ensure_unlocked, run_lock
from ensemble_core.train import (
    default_strategy,
    fit,
    init_ensemble,
    make_optimizer,
    make_train_step,
    state_shardings,
)

CHECKPOINT_DIR = "checkpoints"
PREDICTIONS = "predictions.npz"


# MARK: validation before any compute


def plan(cfg: PipelineConfig, num_devices: int | None = None) -> MeshPlan:
    """The mesh for ``cfg`` on the devices present (raises MeshError before any compute)."""
    return plan_mesh(
        cfg.ensemble.size,
        jax.device_count() if num_devices is None else num_devices,
        data=cfg.mesh.data,
        ensemble=cfg.mesh.ensemble,
        pad=cfg.ensemble.pad,
        batch_size=cfg.train.batch_size,
    )


def resolve_strategy(cfg: PipelineConfig) -> str:
    """``mesh.member_strategy``, with 'auto' resolved for the current backend."""
    if cfg.mesh.member_strategy != "auto":
        return cfg.mesh.member_strategy
    return default_strategy(jax.default_backend())


def _num_train(cfg: PipelineConfig, dataset: dict) -> int:
    limit = cfg.data.max_train_examples
    return dataset["num_train"] if limit is None else min(dataset["num_train"], limit)


def check_memory(cfg: PipelineConfig, dataset: dict) -> memory_lib.MemoryEstimate:
    """Refuse, before anything compiles, a config whose training cannot fit in memory
    (:mod:`ensemble_core.memory`: a lower bound from shapes alone).

    Raises:
      ConfigError: with the estimate and the memory there is.
    """
    shape = tuple(dataset["image_shape"])
    n = _num_train(cfg, dataset)
    est = memory_lib.estimate(cfg, plan(cfg), dataset["num_classes"], shape, n, resolve_strategy(cfg))
    memory_lib.check(est, cfg)
    return est


def check_against_dataset(cfg: PipelineConfig, dataset: dict) -> None:
    """Config checks that need the dataset's size.

    Raises:
      ConfigError: the batch is larger than the training split.
    """
    n = _num_train(cfg, dataset)
    if cfg.train.batch_size > n:
        raise ConfigError(
            f"train.batch_size={cfg.train.batch_size} is larger than the {n} training examples; "
            f"fix: set train.batch_size <= {n}"
        )


# What may differ between a run's checkpoint and the config that resumes it: how many
# epochs in all (more, never fewer than are done), where the data files are, the device
# layout, checkpoint and evaluation settings, the divergence policy and promotion. Every
# other key changes what the saved steps mean (the model, the data, the seed, E, the
# optimizer and its learning rate, the batch), so resuming under it is refused.
RESUMABLE_KEYS = (
    "train.epochs",
    "train.on_divergence",
    "data.data_dir",
    "data.manual_dir",
    "mesh.*",
    "checkpoint.*",
    "eval.*",
    "promotion.*",
)


def _flat(tree: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = list(value) if isinstance(value, tuple) else value
    return out


def _resumable(key: str) -> bool:
    return any(key == k or (k.endswith(".*") and key.startswith(k[:-1])) for k in RESUMABLE_KEYS)


def config_changes(saved_config: dict, cfg: PipelineConfig) -> dict[str, tuple[Any, Any]]:
    """``{dotted key: (saved value, new value)}`` for every key that differs."""
    old = _flat(PipelineConfig.model_validate(saved_config).model_dump(mode="json"))
    new = _flat(cfg.model_dump(mode="json"))
    return {k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)}


def _compatible(saved: dict, cfg: PipelineConfig, run_dir: Path) -> None:
    """Refuse to resume ``run_dir`` (checkpoint metadata ``saved``) under ``cfg`` unless
    only :data:`RESUMABLE_KEYS` differ and ``train.epochs`` is not below the epochs done.

    Raises:
      IncompatibleRunError: naming every key that may not change, old and new values.
    """
    changes = config_changes(saved["config"], cfg)
    refused = {k: v for k, v in changes.items() if not _resumable(k)}
    if refused:
        listed = ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in refused.items())
        raise IncompatibleRunError(
            f"run '{run_dir}' was trained with another config ({listed}); resuming may change only "
            f"{', '.join(RESUMABLE_KEYS)}; fix: use a new --run-name, or the run's original values"
        )
    done = int(saved.get("epoch", 0))
    if cfg.train.epochs < done:
        raise IncompatibleRunError(
            f"run '{run_dir}' has already trained {done} epochs; train.epochs={cfg.train.epochs} would "
            f"report a model trained longer than the config says; "
            f"fix: set train.epochs >= {done}, or use a new --run-name"
        )
    members, planned = saved.get("members_trained"), plan(cfg).padded_members
    if members is not None and members != planned:
        raise IncompatibleRunError(
            f"run '{run_dir}' trained {members} members (padding included) and this mesh asks for "
            f"{planned}; fix: use the run's mesh/ensemble.pad values or a new --run-name"
        )


def _nearest_existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (what a later mkdir would create in)."""
    while not path.exists():
        path = path.parent
    return path


def check_output_dir(output_dir: str | Path) -> Path:
    """Check that ``output_dir`` is, or can be created as, a writable directory; creates
    nothing (the run creates it when it starts writing).

    Raises:
      ConfigError: it is not a directory, or it (or the directory it would be created in)
        is not writable.
    """
    out = Path(output_dir)
    if out.exists():
        if not out.is_dir():
            raise ConfigError(f"output directory '{out}' is a file; fix: pass a directory to --output-dir")
        if not os.access(out, os.W_OK | os.X_OK):
            raise ConfigError(f"output directory '{out}' is not writable; fix: pass a writable --output-dir")
        return out
    parent = _nearest_existing(out.absolute().parent)
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        what = "is a file" if not parent.is_dir() else "is not writable"
        raise ConfigError(
            f"cannot create output directory '{out}': '{parent}' {what}; fix: pass a writable --output-dir"
        )
    return out


RUN_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def check_run_name(run_name: str, output_dir: str | Path = ".") -> str:
    """A run name is one directory name of letters, digits, '.', '_' and '-' (starting with
    a letter or digit) that the file system of ``output_dir`` can hold: so the run
    directory, printed as the CLI's last line, is one unambiguous path.

    Raises:
      ConfigError: empty, another character (a path separator, a space, a newline, ...),
        or longer than the file system's NAME_MAX (255 bytes on Linux file systems).
    """
    if not isinstance(run_name, str) or not RUN_NAME_PATTERN.fullmatch(run_name):
        raise ConfigError(
            f"run name {run_name!r} is not a single directory name; fix: use letters, digits, '-', '_' or '.', "
            f"starting with a letter or digit"
        )
    parent = _nearest_existing(Path(output_dir).absolute())
    try:
        name_max = os.pathconf(parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    if len(run_name.encode()) > name_max:
        raise ConfigError(
            f"run name is {len(run_name.encode())} bytes, longer than the {name_max} the file system of "
            f"'{parent}' allows; fix: use a shorter --run-name"
        )
    return run_name


def preflight(cfg: PipelineConfig, output_dir: str | Path, run_name: str) -> dict:
    """Every check that can fail before training, in order; writes nothing in the run dir.

    Mesh, output directory, run name, the run's lock, the dataset (prepared if needed)
    against the config, the memory training needs against what there is, and an existing
    run's checkpoint against the config.

    Returns:
      The dataset info dict.

    Raises:
      EnsembleError: the first problem found (ConfigError, MeshError, DataError,
        RunLockedError, IncompatibleRunError).
    """
    plan(cfg)
    run_dir = check_output_dir(output_dir) / check_run_name(run_name, output_dir)
    ensure_unlocked(run_dir)
    dataset = prepare_dataset(cfg.data)
    check_against_dataset(cfg, dataset)
    check_memory(cfg, dataset)
    ckpt_dir = run_dir / CHECKPOINT_DIR
    if ckpt_dir.is_dir() and any(p.name.isdigit() for p in ckpt_dir.iterdir()):
        with EnsembleCheckpointer(ckpt_dir) as ckpt:
            try:
                meta = ckpt.read_meta()
            except Exception:  # noqa: BLE001  (a damaged latest step: training falls back itself)
                meta = None
        if meta is not None:
            _compatible(meta, cfg, run_dir)
    return dataset


# MARK: stages


def prepare_dataset(data_cfg: DataConfig) -> dict:
    """Prepare (or find) the dataset; returns :class:`DatasetInfo` as a dict plus
    ``tfds_data_dir`` (the data dir it was prepared in, None for TFDS's default)."""
    info = data_lib.prepare(data_cfg.name, data_cfg.data_dir, data_cfg.manual_dir)
    return {**info.__dict__, "image_shape": list(info.image_shape), "tfds_data_dir": data_cfg.data_dir}


def split_rngs(cfg: PipelineConfig, num_members: int) -> dict[str, list[list[int]]]:
    """Per-member keys (init, data, dropout) for members ``0..num_members-1`` as raw data."""
    return key_layout(member_keys(cfg.seed, num_members))


def _load(cfg: PipelineConfig, dataset: dict, split: str) -> tuple[np.ndarray, np.ndarray]:
    limit = cfg.data.max_train_examples if split == "train" else cfg.data.max_test_examples
    return data_lib.load_split(cfg.data.name, split, dataset["tfds_data_dir"], limit)


def _model_and_mesh(cfg: PipelineConfig, num_classes: int):
    mesh_plan = plan(cfg)
    mesh = make_mesh(mesh_plan)
    model = build_model(cfg.model, num_classes)
    return mesh_plan, mesh, model


def train_ensemble(
    cfg: PipelineConfig,
    dataset: dict,
    keys: dict[str, list[list[int]]],
    run_dir: str | Path,
    *,
    strategy: str | None = None,
    on_step: Callable[[int, int, int], None] | None = None,
    on_epoch: Callable[[dict], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> dict:
    """Train (or resume) the ensemble, checkpointing under ``run_dir/checkpoints``.

    Holds the run directory's lock for the whole training. If ``run_dir`` already holds a
    checkpoint of a compatible config, training resumes from its data position (epoch
    and step) with the same data order. Checkpoint names are global optimizer steps.
    SIGTERM or SIGINT (in the main thread) or ``should_stop()`` stops training at the next step
    boundary, after a checkpoint there has been written.

    Returns:
      ``{"checkpoint_dir", "checkpoint_step", "history", "timing", "mesh", "strategy",
      "backend", "devices", "resumed_from", "stretches", "diverged_members"}``;
      ``stretches``: one dict per stretch of training (the first run and each resume):
      ``start_epoch``/``end_epoch`` and steps, ``settings`` (the values of
      :data:`RESUMABLE_KEYS` it used), ``changed`` (``{key: [old, new]}`` against the
      checkpoint it resumed), mesh, strategy, backend, devices.

    Raises:
      IncompatibleRunError: the run directory holds checkpoints of another config.
      RunLockedError: another process trains in this run directory.
      PreemptedError: stopped by SIGTERM / SIGINT / ``should_stop`` (a checkpoint was saved).
      DivergenceError: a member diverged and ``train.on_divergence`` is ``fail``.
    """
    run_dir = Path(run_dir)
    check_against_dataset(cfg, dataset)
    mesh_plan, mesh, model = _model_and_mesh(cfg, dataset["num_classes"])
    strategy = strategy or resolve_strategy(cfg)
    tx = make_optimizer(cfg.train)
    member_key = keys_from_layout(keys)
    if len(member_key["init"]) != mesh_plan.padded_members:
        raise ConfigError(
            f"{len(member_key['init'])} member keys for {mesh_plan.padded_members} members; "
            f"fix: split_rngs with num_members={mesh_plan.padded_members}"
        )
    images, labels = _load(cfg, dataset, "train")

    ckpt_dir = run_dir / CHECKPOINT_DIR
    state = init_ensemble(model, tx, member_key["init"], tuple(dataset["image_shape"]), mesh)
    history: list[dict] = []
    position = {"epoch": 0, "step_in_epoch": 0, "loss_sum": None, "accuracy_sum": None}
    resumed_from = None
    stretches: list[dict] = []
    settings = {k: v for k, v in _flat(cfg.model_dump(mode="json")).items() if _resumable(k)}
    with run_lock(run_dir), EnsembleCheckpointer(ckpt_dir, keep=cfg.checkpoint.keep) as ckpt, _stop_signals() as term:
        changed: dict[str, list] = {}
        if ckpt.latest_step() is not None:
            state, meta, _ = ckpt.restore_latest_valid(state, check=lambda m: _compatible(m, cfg, run_dir))
            position = meta["data_position"]
            resumed_from = int(meta["epoch"])
            history = list(meta["history"])
            stretches = list(meta.get("stretches") or [])
            changed = {k: [old, new] for k, (old, new) in config_changes(meta["config"], cfg).items()}
        # What this stretch of training uses (each resume starts one): the keys that may
        # change on resume, what changed since the checkpoint, and the devices.
        stretches.append(
            {
                "start_epoch": position["epoch"],
                "start_step": int(state.step),
                "end_epoch": None,
                "end_step": None,
                "settings": settings,
                "changed": changed,
                "mesh": {"ensemble": mesh_plan.ensemble, "data": mesh_plan.data},
                "strategy": strategy,
                "backend": jax.default_backend(),
                "devices": jax.device_count(),
                "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
        )

        saved_steps: set[int] = set()

        def save(st, pos: dict) -> None:
            if int(st.step) in saved_steps:  # e.g. a stop right after an epoch's checkpoint
                return
            saved_steps.add(int(st.step))
            stretches[-1].update(end_epoch=pos["epoch"], end_step=int(st.step))
            ckpt.save(
                int(st.step),
                st,
                {
                    "config": cfg.model_dump(mode="json"),
                    "epoch": pos["epoch"],
                    "step": int(st.step),
                    "data_position": pos,
                    "members_trained": mesh_plan.padded_members,
                    "healthy": np.asarray(st.healthy).tolist(),
                    "dataset": {k: dataset[k] for k in ("name", "num_classes", "image_shape")},
                    "history": history,
                    "stretches": stretches,
                },
            )

        def on_epoch_end(epoch: int, st, record: dict) -> None:
            healthy = np.asarray(st.healthy)
            record["diverged_members"] = np.flatnonzero(~healthy).tolist()
            history.append(record)
            done = epoch + 1
            fail = cfg.train.on_divergence == "fail" and not healthy.all()
            if done % cfg.checkpoint.every_epochs == 0 or done == cfg.train.epochs or fail:
                save(st, {"epoch": done, "step_in_epoch": 0, "loss_sum": None, "accuracy_sum": None})
            if on_epoch is not None:
                on_epoch(record)
            if fail:
                ckpt.wait()
                raise DivergenceError(
                    f"member(s) {record['diverged_members']} diverged (non-finite loss or parameters) in epoch "
                    f"{done}; train.on_divergence=fail stops the run; fix: lower train.learning_rate, or set "
                    f"train.on_divergence=freeze to train on without them"
                )

        dev_images = jax.device_put(images, replicated(mesh))
        dev_labels = jax.device_put(labels, replicated(mesh))
        step_fn = make_train_step(model, tx, mesh, strategy)
        state, timing = fit(
            state,
            step_fn,
            dev_images,
            dev_labels,
            member_key["data"],
            mesh,
            epochs=cfg.train.epochs,
            batch_size=cfg.train.batch_size,
            start_epoch=position["epoch"],
            start_step=position["step_in_epoch"],
            partial=position,
            on_step=on_step,
            on_epoch_end=on_epoch_end,
            should_stop=lambda: term.is_set() or (should_stop is not None and should_stop()),
        )
        if stretches[-1]["end_step"] is None and timing["stopped_at"] is None:
            stretches.pop()  # a finished run re-run: nothing was trained
        if timing["stopped_at"] is not None:
            save(state, timing["stopped_at"])
            ckpt.wait()
            where = timing["stopped_at"]
            raise PreemptedError(
                f"training stopped at epoch {where['epoch'] + 1}, step {where['step_in_epoch']} (global step "
                f"{int(state.step)}); a checkpoint was saved there; fix: rerun with the same run name "
                f"(--run-name {run_dir.name}) to resume"
            )
        ckpt.wait()
        step = ckpt.latest_step()
    images_seen = timing["steps"] * cfg.train.batch_size * cfg.ensemble.size
    timing["train_member_images_per_s"] = images_seen / timing["train_seconds"] if timing["train_seconds"] else None
    return {
        "checkpoint_dir": str(ckpt_dir),
        "checkpoint_step": step,
        "history": history,
        "timing": timing,
        "mesh": {"ensemble": mesh_plan.ensemble, "data": mesh_plan.data},
        "members_trained": mesh_plan.padded_members,
        "strategy": strategy,
        "backend": jax.default_backend(),
        "devices": jax.device_count(),
        "resumed_from": resumed_from,
        "stretches": stretches,
        "diverged_members": np.flatnonzero(~np.asarray(state.healthy)[: cfg.ensemble.size]).tolist(),
    }


@contextlib.contextmanager
def _stop_signals():
    """While active (main thread only), SIGTERM and SIGINT (Ctrl-C) set the yielded event
    instead of killing: training stops at the next step boundary after a checkpoint."""
    event = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield event
        return
    previous = {sig: signal.signal(sig, lambda *_: event.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield event
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def restore_ensemble(cfg: PipelineConfig, run_dir: str | Path, num_classes: int, image_shape) -> tuple:
    """Restore the latest checkpoint of ``run_dir`` onto the mesh ``cfg`` asks for.

    Returns:
      ``(state, mesh, model)``: the :class:`EnsembleState` (leaves ``[E_trained, ...]``).

    Raises:
      CheckpointError: no checkpoint, or one that does not fit ``cfg``.
    """
    mesh_plan, mesh, model = _model_and_mesh(cfg, num_classes)
    tx = make_optimizer(cfg.train)
    keys = member_keys(cfg.seed, mesh_plan.padded_members)
    target = jax.eval_shape(lambda: init_ensemble(model, tx, keys["init"], tuple(image_shape), mesh))
    with EnsembleCheckpointer(Path(run_dir) / CHECKPOINT_DIR, keep=cfg.checkpoint.keep) as ckpt:
        state, _ = ckpt.restore(_with_shardings(target, mesh))
    return state, mesh, model


def predict_member_probs(
    cfg: PipelineConfig, state, mesh, model, images: np.ndarray, *, strategy: str | None = None
) -> tuple[np.ndarray, float]:
    """Member probabilities float32 ``[E, N, C]`` (padding members dropped) and the
    steady-state throughput in member-images/s (the program is compiled first)."""
    strategy = strategy or resolve_strategy(cfg)
    predict = make_predict(model, mesh, strategy)
    one = strategy == "unroll"
    member_probs(
        predict, state.params, images[: cfg.eval.batch_size], mesh, cfg.eval.batch_size, one_member_per_device=one
    )
    t0 = time.perf_counter()
    probs = member_probs(predict, state.params, images, mesh, cfg.eval.batch_size, one_member_per_device=one)
    seconds = time.perf_counter() - t0
    probs = probs[: cfg.ensemble.size]
    return probs, probs.shape[0] * probs.shape[1] / seconds


def evaluate(
    cfg: PipelineConfig,
    dataset: dict,
    run_dir: str | Path,
    *,
    strategy: str | None = None,
    write_predictions: bool = True,
) -> dict:
    """Restore the latest checkpoint, predict the test split with every member, score it.

    Writes ``run_dir/predictions.npz`` (unless ``write_predictions`` is False):
    ``member_probs`` float32 ``[E, N, C]``, ``labels`` int32 ``[N]`` and ``healthy`` bool
    ``[E]`` (False: the member diverged and was frozen; it is left out of the ensemble).

    Returns:
      :func:`ensemble_core.metrics.evaluate_all` plus ``"eval_member_images_per_s"``.
    """
    run_dir = Path(run_dir)
    state, mesh, model = restore_ensemble(cfg, run_dir, dataset["num_classes"], dataset["image_shape"])
    images, labels = _load(cfg, dataset, "test")
    probs, throughput = predict_member_probs(cfg, state, mesh, model, images, strategy=strategy)
    healthy = np.asarray(state.healthy)[: cfg.ensemble.size]
    if not healthy.any():
        raise DivergenceError(
            f"every member of '{run_dir}' diverged, there is no ensemble to evaluate; fix: lower "
            f"train.learning_rate and train again"
        )
    if write_predictions:
        atomic_savez(run_dir / PREDICTIONS, member_probs=probs, labels=labels.astype(np.int32), healthy=healthy)
    result = metrics_lib.evaluate_all(probs, labels, cfg.eval.ece_bins, healthy=healthy)
    result["eval_member_images_per_s"] = throughput
    return result


def compare_with_champion(
    cfg: PipelineConfig, dataset: dict, run_name: str, run_dir: str | Path, evaluation: dict, output_dir: str | Path
) -> dict:
    """Champion/challenger: promote this run if it is not worse than the champion.

    Both are scored on this run's test split: when the champion was measured on another
    data config, its checkpoint is re-evaluated on this one first. The champion pointer
    is replaced atomically and this run's row of ``history.jsonl`` is written (replaced
    when a retry writes it again). A damaged champion pointer, or a champion whose run
    cannot be read back, is set aside in ``<output_dir>/corrupt-state/`` with a warning and
    the run is judged as if there were no champion (:mod:`ensemble_core.champion`).

    Returns:
      ``{"promoted", "reason", "metric", "challenger", "champion", "champion_run",
      "history"}`` (``champion``: its ensemble metrics, None when there was none).
    """
    metric = cfg.promotion.metric
    data_key = cfg.data.model_dump(mode="json")
    current = champion_lib.read_champion(output_dir)
    champion_metrics = None
    if current is not None:
        if current["data"] == data_key:
            champion_metrics = current["metrics"]
        else:
            try:
                meta = EnsembleCheckpointer(Path(current["run_dir"]) / CHECKPOINT_DIR).read_meta()
                champion_cfg = PipelineConfig.model_validate({**meta["config"], "data": data_key})
                champion_metrics = evaluate(champion_cfg, dataset, current["run_dir"], write_predictions=False)[
                    "ensemble"
                ]
            except Exception as err:  # noqa: BLE001  (orbax/pydantic/JAX raise many types for a damaged run)
                # The champion's run cannot be re-evaluated (checkpoints damaged or of an
                # older format): set the pointer aside, as a damaged pointer is.
                champion_lib.set_aside(
                    output_dir,
                    champion_lib.CHAMPION_FILE,
                    f"its run {current['run_dir']} cannot be re-evaluated on this data config "
                    f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})",
                    consequence=champion_lib.NO_CHAMPION,
                )
                current, champion_metrics = None, None
    promoted, reason = champion_lib.decide(evaluation["ensemble"], champion_metrics, metric)
    if promoted:
        champion_lib.write_champion(
            output_dir,
            {
                "run_name": run_name,
                "run_dir": str(Path(run_dir).absolute()),
                "data": data_key,
                "metrics": evaluation["ensemble"],
            },
        )
    history = champion_lib.append_history(
        output_dir,
        {
            "run_name": run_name,
            **{k: round(v, 6) for k, v in evaluation["ensemble"].items()},
            "promoted": promoted,
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        },
    )
    return {
        "promoted": promoted,
        "reason": reason,
        "metric": metric,
        "challenger": evaluation["ensemble"],
        "champion": champion_metrics,
        "champion_run": current["run_name"] if current else None,
        "history": history,
    }


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
      images: uint8 ``[N, H, W, C]`` (0..255) or float ``[N, H, W, C]`` in [0, 1].

    Returns:
      ``ensemble_probs`` float32 ``[N, C]``, ``predictive_entropy`` and
      ``mutual_information`` float32 ``[N]`` (nats), ``member_probs`` float32 ``[E, N, C]``,
      ``predicted_class`` int32 ``[N]``.

    Raises:
      DataError: images of the wrong shape, or values :func:`check_image_values` refuses.
    """
    meta = EnsembleCheckpointer(Path(run_dir) / CHECKPOINT_DIR).read_meta()
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
    check_image_values(images)
    state, mesh, model = restore_ensemble(cfg, run_dir, meta["dataset"]["num_classes"], shape)
    probs, _ = predict_member_probs(cfg, state, mesh, model, images)
    return {
        "ensemble_probs": metrics_lib.ensemble_probs(probs).astype(np.float32),
        "predictive_entropy": metrics_lib.predictive_entropy(probs).astype(np.float32),
        "mutual_information": metrics_lib.mutual_information(probs).astype(np.float32),
        "member_probs": probs,
        "predicted_class": np.argmax(probs.mean(0), -1).astype(np.int32),
    }


def _with_shardings(abstract, mesh):
    shardings = state_shardings(abstract, mesh)
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)


def atomic_savez(path: Path, **arrays: Any) -> None:
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, path)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and ``os.replace``."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def write_report(
    run_name: str,
    config: dict,
    train_summary: dict,
    evaluation: dict,
    run_dir: str | Path,
    promotion: dict | None = None,
) -> dict:
    """Write ``report.json``, ``report.md`` and ``plots/*.png``; returns the report dict."""
    run_dir = Path(run_dir)
    rep = report_lib.build_report(run_name, config, train_summary, evaluation, run_dir, promotion)
    with np.load(run_dir / PREDICTIONS) as preds:
        report_lib.make_plots(rep, preds["member_probs"], preds["labels"], run_dir / "plots")
    write_json(run_dir / "report.json", rep)
    atomic_write_text(run_dir / "report.md", report_lib.render_markdown(rep))
    return rep
