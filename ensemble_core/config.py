"""The run configuration: one pydantic model, nested by concern.

The same model is the Prefect flow's parameter schema (each field's description shows up
in the deployment form) and what YAML files in ``configs/`` are validated against.
Unknown keys are errors, so a typo never silently falls back to a default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ensemble_core.errors import ConfigError

# MARK: sections


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DataConfig(_Section):
    """Which dataset to train and evaluate on."""

    name: str = Field(
        "mnist5k",
        description="TFDS dataset name. 'mnist5k' is the embedded offline MNIST subset "
        "(4,000 train / 1,000 test); any TFDS catalog image dataset (mnist, "
        "fashion_mnist, cifar10, ...) works when prepared in data_dir.",
    )
    data_dir: str | None = Field(
        None,
        description="TFDS data directory (prepared array_record files live here). "
        "Default: TFDS's own default (~/tensorflow_datasets or $TFDS_DATA_DIR).",
    )
    manual_dir: str | None = Field(
        None,
        description="Where the original dataset files were put by hand for offline "
        "preparation of a catalog dataset. Default: <data_dir>/downloads/manual.",
    )
    max_train_examples: int | None = Field(
        None, ge=1, description="Use only the first N training examples (None: all)."
    )
    max_test_examples: int | None = Field(None, ge=1, description="Use only the first N test examples (None: all).")


class ModelConfig(_Section):
    """Which network each member is, looked up by name in ensemble_core.models."""

    name: Literal["cnn", "mlp"] = Field(
        "cnn",
        description="'cnn': the Flax ensembling HOWTO CNN; 'mlp': a ReLU MLP.",
    )
    hidden_sizes: tuple[int, ...] = Field(
        (512, 512),
        description="MLP only: widths of the hidden layers.",
    )


class EnsembleConfig(_Section):
    """How many independently initialised members to train."""

    size: int = Field(8, ge=1, le=4096, description="Number of ensemble members E.")
    pad: bool = Field(
        False,
        description="If E does not divide over an explicit mesh.ensemble axis, train "
        "extra members to fill it (they are dropped from evaluation).",
    )


class TrainConfig(_Section):
    """Optimisation settings, shared by every member."""

    epochs: int = Field(10, ge=1, description="Passes over the training split.")
    batch_size: int = Field(128, ge=1, description="Examples per member per step.")
    learning_rate: float = Field(0.1, gt=0, description="Optimizer learning rate.")
    momentum: float = Field(0.9, ge=0, lt=1, description="SGD momentum (sgd only).")
    optimizer: Literal["sgd", "adam", "adamw"] = Field(
        "sgd", description="optax optimizer: sgd (with momentum), adam or adamw."
    )
    weight_decay: float = Field(0.0, ge=0, description="adamw weight decay.")
    on_divergence: Literal["freeze", "fail"] = Field(
        "freeze",
        description="When a member's loss or parameters become non-finite: 'freeze' it (its "
        "updates are masked, it is left out of the ensemble metrics) or 'fail' the run.",
    )


class MeshConfig(_Section):
    """The device mesh, axes ('ensemble', 'data')."""

    data: int = Field(1, ge=1, description="Devices that split each batch (gradients averaged).")
    ensemble: int | None = Field(
        None,
        ge=1,
        description="Devices that split the members. None: the largest divisor of E that fits in devices // data.",
    )
    member_strategy: Literal["auto", "vmap", "unroll"] = Field(
        "auto",
        description="How the members on one device are computed: 'vmap' (one batched "
        "kernel per layer), 'unroll' (one kernel per member). 'auto': unroll on CPU, where "
        "a vmapped convolution becomes a slow grouped convolution; vmap on GPU/TPU.",
    )


class CheckpointConfig(_Section):
    """orbax checkpointing under <run>/checkpoints/."""

    every_epochs: int = Field(1, ge=1, description="Save a checkpoint every N epochs.")
    keep: int = Field(3, ge=1, description="Keep the latest N checkpoints.")


class EvalConfig(_Section):
    """Evaluation on the test split."""

    batch_size: int = Field(
        250, ge=1, description="Test examples per device per forward pass (250 measured fastest on CPU)."
    )
    ece_bins: int = Field(15, ge=2, description="Equal-width bins for ECE.")


class PromotionConfig(_Section):
    """Champion/challenger: when a new ensemble replaces the current champion."""

    metric: Literal["nll", "brier", "ece", "accuracy"] = Field(
        "nll",
        description="Ensemble test metric compared with the champion's on the same test split "
        "(accuracy: higher is better; the others: lower is better).",
    )
    enabled: bool = Field(True, description="Compare with (and maybe replace) the champion after evaluation.")


# MARK: the whole config


class PipelineConfig(_Section):
    """A complete, validated run configuration."""

    seed: int = Field(0, ge=0, description="Root seed; member i depends on (seed, i).")
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    ensemble: EnsembleConfig = Field(default_factory=EnsembleConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    mesh: MeshConfig = Field(default_factory=MeshConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    promotion: PromotionConfig = Field(default_factory=PromotionConfig)


def _describe(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "<root>"
        if e["type"] == "extra_forbidden":
            parts.append(
                f"unknown config key '{key}'; fix: remove it or check its spelling "
                f"(known keys are listed in configs/default.yaml)"
            )
        else:
            parts.append(f"config key '{key}': {e['msg']} (got {e.get('input')!r}); fix: set a valid '{key}'")
    return "; ".join(parts)


def validate(raw: dict[str, Any]) -> PipelineConfig:
    """Validate a nested dict into a :class:`PipelineConfig`.

    Raises:
      ConfigError: naming every offending key and what to do about it.
    """
    try:
        return PipelineConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_describe(err)) from None


def _set_dotted(raw: dict[str, Any], assignment: str) -> None:
    if "=" not in assignment:
        raise ConfigError(f"override '{assignment}' has no '='; fix: write it as dotted.key=value")
    key, text = assignment.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"override key '{key}' is malformed; fix: e.g. train.epochs=3")
    node = raw
    for p in parts[:-1]:
        child = node.setdefault(p, {})
        if not isinstance(child, dict):
            raise ConfigError(f"config key '{p}' is not a section; cannot set '{key}'")
        node = child
    try:
        node[parts[-1]] = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError:
        node[parts[-1]] = text


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> PipelineConfig:
    """Read a YAML config (or the built-in defaults) and apply ``dotted.key=value`` overrides.

    Args:
      path: a YAML file whose top level is a mapping of the config sections; None means
        the defaults of :class:`PipelineConfig` (identical to ``configs/default.yaml``).
      overrides: ``["train.epochs=3", "ensemble.size=4"]``; values are parsed as YAML.

    Raises:
      ConfigError: unreadable file, not YAML, not a mapping, or any invalid key/value.
    """
    raw: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as err:
            raise ConfigError(
                f"cannot read config file '{p}': {err.strerror}; fix: pass an existing readable YAML file to --config"
            ) from None
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ConfigError(
                f"config file '{p}' is not valid YAML ({str(err).splitlines()[0]}); fix: correct the syntax"
            ) from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(
                f"config file '{p}' must hold a mapping of sections, not "
                f"{type(loaded).__name__}; fix: see configs/default.yaml"
            )
        raw = loaded
    for assignment in overrides or []:
        _set_dotted(raw, assignment)
    return validate(raw)
