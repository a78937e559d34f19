"""The resume policy: which config changes a run's checkpoints allow.

What may differ between a run's checkpoint and the config that resumes it: how many
epochs in all (more, never fewer than are done), where the data files are, the device
layout, the compute precision (``train.precision``: the master weights and optimizer state
are float32 under each, so the checkpoint means the same; the session that changes it
records it, as for the mesh), checkpoint and evaluation settings, the divergence policy, ensemble selection,
promotion and where member groups run, not how many there are (nor the epochs of a run
whose learning rate decays over them). Every
other key changes what the saved steps mean (the model, the data and the classes trained
on, ``data.classes``, whose labels the saved heads predict, the seed, E, the optimizer and its
learning rate, the batch), so resuming under it is refused. ``data.classes`` is compared as
the config holds it, sorted (a reordered list is the same run; a class given by its name
instead of its index, or the other way round, is refused as a change).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ensemble_core.config import PipelineConfig
from ensemble_core.errors import IncompatibleRunError

RESUMABLE_KEYS = (
    "train.epochs",
    "train.on_divergence",
    "train.precision",
    "ensemble.select_size",
    "ensemble.selection.*",
    "ensemble.first_selection.*",
    "ensemble.stratify",
    "data.data_dir",
    "data.manual_dir",
    "mesh.*",
    "checkpoint.*",
    "eval.*",
    "promotion.*",
    "distributed.task_runner",
    "distributed.address",
    "distributed.workers",
    "distributed.pin_cores",
    "distributed.num_processes",
    "distributed.tls_ca_file",
    "distributed.tls_cert",
    "distributed.tls_key",
    "nightly.*",
    "retention.*",
    "prediction_sets.*",
    "abstention.*",
)


def flat(tree: dict, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (tuples become lists, as in JSON)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = list(value) if isinstance(value, tuple) else value
    return out


def resumable(key: str) -> bool:
    """Whether the dotted config ``key`` may change when a run resumes."""
    return any(key == k or (k.endswith(".*") and key.startswith(k[:-1])) for k in RESUMABLE_KEYS)


def resumable_settings(cfg: PipelineConfig) -> dict[str, Any]:
    """The values of every resumable key in ``cfg`` (what a training session records)."""
    return {k: v for k, v in flat(cfg.model_dump(mode="json")).items() if resumable(k)}


def as_trained(saved_config: dict) -> dict:
    """A saved config with the keys it predates that changed what it trained on set to what
    it trained with, not to today's defaults: ``data.calibration_fraction`` 0 (a run saved
    before the calibration split trained on the whole training split less validation; read
    with the default 0.1 it would resume on other examples)."""
    data = saved_config.get("data")
    if isinstance(data, dict) and "calibration_fraction" not in data:
        return {**saved_config, "data": {**data, "calibration_fraction": 0.0}}
    return saved_config


def config_changes(saved_config: dict, cfg: PipelineConfig) -> dict[str, tuple[Any, Any]]:
    """``{dotted key: (saved value, new value)}`` for every key that differs (a saved
    config is read with today's defaults for keys it predates, but for those of
    :func:`as_trained`)."""
    old = flat(PipelineConfig.model_validate(as_trained(saved_config)).model_dump(mode="json"))
    new = flat(cfg.model_dump(mode="json"))
    return {k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)}


def check_resumable(saved: dict, cfg: PipelineConfig, run_dir: Path, planned_members: int) -> None:
    """Refuse to resume ``run_dir`` (checkpoint metadata ``saved``) under ``cfg`` unless
    only :data:`RESUMABLE_KEYS` differ, ``train.epochs`` is not below the epochs done and
    the mesh trains the same number of members (``planned_members``, padding included).

    Raises:
      IncompatibleRunError: naming every key that may not change, old and new values.
    """
    changes = config_changes(saved["config"], cfg)
    refused = {k: v for k, v in changes.items() if not resumable(k)}
    if refused:
        listed = ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in refused.items())
        raise IncompatibleRunError(
            f"run '{run_dir}' was trained with another config ({listed}); resuming may change only "
            f"{', '.join(RESUMABLE_KEYS)}",
            fix="use a new run_name, or the run's original values",
        )
    epochs_changed = "train.epochs" in changes
    decaying = sorted({hp["schedule"] for hp in cfg.member_hyperparameters()} - {"constant"})
    if epochs_changed and decaying:
        old, new = changes["train.epochs"]
        raise IncompatibleRunError(
            f"run '{run_dir}' decays its learning rate ({', '.join(decaying)} schedule) over train.epochs={old}; "
            f"train.epochs={new} would change the schedule of the steps already taken; "
            f"fix: keep train.epochs={old}, or use a new run_name"
        )
    done = int(saved.get("epoch", 0))
    if cfg.train.epochs < done:
        raise IncompatibleRunError(
            f"run '{run_dir}' has already trained {done} epochs; train.epochs={cfg.train.epochs} would "
            f"report a model trained longer than the config says; "
            f"fix: set train.epochs >= {done}, or use a new run_name"
        )
    members = saved.get("members_trained")
    if members is not None and members != planned_members:
        raise IncompatibleRunError(
            f"run '{run_dir}' trained {members} members (padding included) and this mesh asks for {planned_members}",
            fix="use the run's mesh/ensemble.pad values or a new run_name",
        )
