"""The pipeline stages as plain functions (I/O here; the math lives in the other modules).

Each Prefect task in ``tasks/`` is a thin wrapper over one function below, and the same
functions can be called directly (that is what the benchmarks compare the flow against).
Stages exchange paths and small JSON-able dicts, never arrays.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from ensemble_core import data as data_lib
from ensemble_core import metrics as metrics_lib
from ensemble_core import report as report_lib
from ensemble_core.checkpoint import EnsembleCheckpointer
from ensemble_core.config import DataConfig, PipelineConfig
from ensemble_core.errors import CheckpointError, ConfigError
from ensemble_core.evaluate import make_predict, member_probs
from ensemble_core.mesh import MeshPlan, make_mesh, plan_mesh, replicated
from ensemble_core.models import build_model
from ensemble_core.rngs import key_layout, keys_from_layout, member_keys
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


def check_against_dataset(cfg: PipelineConfig, dataset: dict) -> None:
    """Config checks that need the dataset's size.

    Raises:
      ConfigError: the batch is larger than the training split.
    """
    n = (
        dataset["num_train"]
        if cfg.data.max_train_examples is None
        else min(dataset["num_train"], cfg.data.max_train_examples)
    )
    if cfg.train.batch_size > n:
        raise ConfigError(
            f"train.batch_size={cfg.train.batch_size} is larger than the {n} training examples; "
            f"fix: set train.batch_size <= {n}"
        )


def _compatible(saved: dict, cfg: PipelineConfig, run_dir: Path) -> None:
    old = PipelineConfig.model_validate(saved["config"])
    for key in ("model", "data"):
        if getattr(old, key) != getattr(cfg, key):
            raise CheckpointError(
                f"run '{run_dir}' was started with a different '{key}' config "
                f"({getattr(old, key).model_dump()} vs {getattr(cfg, key).model_dump()}); "
                f"fix: use a new --run-name or the original config"
            )
    if old.ensemble.size != cfg.ensemble.size or old.seed != cfg.seed:
        raise CheckpointError(
            f"run '{run_dir}' holds a checkpoint of ensemble.size={old.ensemble.size}, "
            f"seed={old.seed}; this config asks for size={cfg.ensemble.size}, seed={cfg.seed}; "
            f"fix: use a new --run-name or the original values"
        )


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


def _model_and_mesh(cfg: PipelineConfig, dataset: dict):
    mesh_plan = plan(cfg)
    mesh = make_mesh(mesh_plan)
    model = build_model(cfg.model, dataset["num_classes"])
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
) -> dict:
    """Train (or resume) the ensemble, checkpointing under ``run_dir/checkpoints``.

    If ``run_dir`` already holds a checkpoint of a compatible config, training resumes
    after its last completed epoch with the same data order.

    Returns:
      ``{"checkpoint_dir", "checkpoint_step", "history", "timing", "mesh", "strategy",
      "backend", "devices", "resumed_from"}``.

    Raises:
      CheckpointError: the run directory holds an incompatible checkpoint.
    """
    run_dir = Path(run_dir)
    check_against_dataset(cfg, dataset)
    mesh_plan, mesh, model = _model_and_mesh(cfg, dataset)
    strategy = strategy or default_strategy(jax.default_backend())
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
    start_epoch = 0
    resumed_from = None
    with EnsembleCheckpointer(ckpt_dir, keep=cfg.checkpoint.keep) as ckpt:
        if ckpt.latest_step() is not None:
            _compatible(ckpt.read_meta(), cfg, run_dir)
            state, meta = ckpt.restore(state)
            start_epoch = resumed_from = int(meta["epoch"])
            history = list(meta["history"])

        def on_epoch_end(epoch: int, st, record: dict) -> None:
            history.append(record)
            done = epoch + 1
            if done % cfg.checkpoint.every_epochs == 0 or done == cfg.train.epochs:
                ckpt.save(
                    done,
                    st,
                    {
                        "config": cfg.model_dump(mode="json"),
                        "epoch": done,
                        "step": int(st.step),
                        "data_position": {"next_epoch": done, "step_in_epoch": 0},
                        "members_trained": mesh_plan.padded_members,
                        "history": history,
                    },
                )
            if on_epoch is not None:
                on_epoch(record)

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
            start_epoch=start_epoch,
            on_step=on_step,
            on_epoch_end=on_epoch_end,
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
    }


def evaluate(cfg: PipelineConfig, dataset: dict, run_dir: str | Path, *, strategy: str | None = None) -> dict:
    """Restore the latest checkpoint, predict the test split with every member, score it.

    Writes ``run_dir/predictions.npz``: ``member_probs`` float32 ``[E, N, C]`` (padding
    members dropped) and ``labels`` int32 ``[N]``.

    Returns:
      :func:`ensemble_core.metrics.evaluate_all` plus ``"eval_member_images_per_s"``.
    """
    run_dir = Path(run_dir)
    mesh_plan, mesh, model = _model_and_mesh(cfg, dataset)
    strategy = strategy or default_strategy(jax.default_backend())
    tx = make_optimizer(cfg.train)
    keys = member_keys(cfg.seed, mesh_plan.padded_members)
    target = jax.eval_shape(lambda: init_ensemble(model, tx, keys["init"], tuple(dataset["image_shape"]), mesh))
    with EnsembleCheckpointer(run_dir / CHECKPOINT_DIR, keep=cfg.checkpoint.keep) as ckpt:
        state, _ = ckpt.restore(_with_shardings(target, mesh))
    images, labels = _load(cfg, dataset, "test")
    predict = make_predict(model, mesh, strategy)
    member_probs(predict, state.params, images[: cfg.eval.batch_size], mesh, cfg.eval.batch_size)  # compile
    t0 = time.perf_counter()
    probs = member_probs(predict, state.params, images, mesh, cfg.eval.batch_size)
    seconds = time.perf_counter() - t0
    probs = probs[: cfg.ensemble.size]
    _atomic_savez(run_dir / PREDICTIONS, member_probs=probs, labels=labels.astype(np.int32))
    result = metrics_lib.evaluate_all(probs, labels, cfg.eval.ece_bins)
    result["eval_member_images_per_s"] = probs.shape[0] * probs.shape[1] / seconds
    return result


def _with_shardings(abstract, mesh):
    shardings = state_shardings(abstract, mesh)
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)


def _atomic_savez(path: Path, **arrays: Any) -> None:
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


def write_report(run_name: str, config: dict, train_summary: dict, evaluation: dict, run_dir: str | Path) -> dict:
    """Write ``report.json``, ``report.md`` and ``plots/*.png``; returns the report dict."""
    run_dir = Path(run_dir)
    rep = report_lib.build_report(run_name, config, train_summary, evaluation, run_dir)
    with np.load(run_dir / PREDICTIONS) as preds:
        report_lib.make_plots(rep, preds["member_probs"], preds["labels"], run_dir / "plots")
    write_json(run_dir / "report.json", rep)
    atomic_write_text(run_dir / "report.md", report_lib.render_markdown(rep))
    return rep
