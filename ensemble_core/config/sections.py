"""The sections of the run configuration: one pydantic model per concern (data, model,
ensemble, train, mesh, distributed, checkpoint, eval, promotion).

Each field's description is what the Prefect deployment form and ``configs/default.yaml``
show. Unknown keys are errors, so a typo never silently falls back to a default; every float
refuses inf and NaN. :class:`~ensemble_core.config.pipeline.PipelineConfig` nests them and
checks across them.
"""

from __future__ import annotations

import itertools
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from ensemble_core import hyper
from ensemble_core.config.base import Section
from ensemble_core.config.limits import (
    FLOAT32_MAX,
    FLOAT32_MIN_NORMAL,
    HOST_DEVICES,
    MAX_DEPTH,
    MAX_DIM,
    MAX_EPOCHS,
    MAX_HIDDEN_WEIGHTS,
    MAX_WIDTH,
    as_float32,
)
from ensemble_core.config.messages import show
from ensemble_core.figures import figure_direction
from ensemble_core.registry import MODEL_NAMES

#: ``train.precision`` values: the compute precision of every member's forward and backward
#: pass (:mod:`ensemble_core.train.forward`); master weights, gradients and optimizer state
#: are float32 under each.
PRECISIONS = ("float32", "high", "bfloat16")
MEMBER_CHOICES = ("best_validation_nll", "best_validation_accuracy", "final")
"""``train.member_choice``: which epoch's parameters of each member are evaluated."""
#: Other names accepted for a ``train.precision`` value, and the value each stands for.
PRECISION_ALIASES = {"tf32": "high"}


class ModelConfig(Section):
    """Which network each member is: a module of ensemble_core.models, or the user's own by import path."""

    name: str = Field(
        "cnn",
        min_length=1,
        description="A module of ensemble_core/models/ ('cnn', the CNN of Flax's MNIST example; 'mlp', a ReLU "
        "MLP; 'resnet', He et al.'s CIFAR ResNet-20/32/56...; 'wide_resnet', WRN-d-k; 'lenet5', "
        "uncertainty-baselines' LeNet-5), or an import path 'package.module:function' to your own "
        "function(cfg: ModelConfig, num_classes: int) -> flax.linen.Module whose __call__(x, train) follows "
        "Flax's examples (BatchNorm, Dropout welcome).",
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="Options of the model (e.g. resnet: {depth: 56, width: 16, dropout_rate: 0.1}; "
        "wide_resnet: {depth: 28, widen_factor: 10}); checked by the model before any compute. "
        "Your own function reads them from cfg.options.",
    )
    hidden_sizes: tuple[Annotated[int, Field(ge=1, le=MAX_WIDTH)], ...] = Field(
        (512, 512),
        max_length=MAX_DEPTH,
        description=f"MLP only: widths of the hidden layers (each 1..{MAX_WIDTH}, at most {MAX_DEPTH} "
        f"layers, at most {MAX_HIDDEN_WEIGHTS} hidden-to-hidden weights; [] is a linear model).",
    )

    @field_validator("name")
    @classmethod
    def _known_model(cls, name: str) -> str:
        if ":" in name:
            module, _, function = name.partition(":")
            if not (
                all(p.isidentifier() for p in module.split(".")) and all(p.isidentifier() for p in function.split("."))
            ):
                raise ValueError(f"'{name}' is not an import path package.module:function of Python identifiers")
            return name
        if name not in MODEL_NAMES:
            raise ValueError(
                f"unknown model '{name}': not one of {MODEL_NAMES} nor an import path package.module:function"
            )
        return name

    @field_validator("hidden_sizes")
    @classmethod
    def _hidden_weights_fit(cls, sizes: tuple[int, ...]) -> tuple[int, ...]:
        weights = sum(a * b for a, b in itertools.pairwise(sizes))
        if weights > MAX_HIDDEN_WEIGHTS:
            raise ValueError(
                f"{weights} hidden-to-hidden weights per member is more than the {MAX_HIDDEN_WEIGHTS} allowed "
                f"(a width x the next width, summed over the layers)"
            )
        return sizes


class Distribution(Section):
    """A distribution one hyperparameter of ``ensemble.search`` is drawn from, per member."""

    distribution: Literal[hyper.DISTRIBUTIONS] = Field(  # type: ignore[valid-type]
        ..., description="log_uniform (low, high > 0), uniform (low, high) or choice (values)."
    )
    low: float | None = Field(None, description="log_uniform / uniform: the lower bound.")
    high: float | None = Field(None, description="log_uniform / uniform: the upper bound.")
    values: tuple[float | str, ...] | None = Field(None, min_length=1, description="choice: the values.")

    @model_validator(mode="after")
    def _complete(self) -> Distribution:
        if self.distribution == "choice":
            if self.values is None or self.low is not None or self.high is not None:
                raise ValueError("a choice takes 'values' (a list) and no 'low'/'high'")
            return self
        if self.low is None or self.high is None or self.values is not None:
            raise ValueError(f"{self.distribution} takes 'low' and 'high' and no 'values'")
        if not self.low < self.high:
            raise ValueError(f"low={self.low!r} must be below high={self.high!r}")
        if self.distribution == "log_uniform" and self.low <= 0:
            raise ValueError(f"log_uniform needs low > 0 (got {self.low!r})")
        return self


#: ``ensemble.search``: hyperparameter -> a :class:`Distribution` or one value per member.
SearchSpace = dict[Literal[hyper.SEARCHABLE], Any]  # type: ignore[valid-type]


def _search_entry(name: str, spec: Any) -> Distribution | tuple[float | str, ...]:
    if isinstance(spec, Distribution):
        return spec
    if isinstance(spec, dict):
        try:
            return Distribution.model_validate(spec)
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ValueError(
                f"'{name}': {first['msg'].removeprefix('Value error, ')}{f' ({where})' if where else ''}"
            ) from None
    if isinstance(spec, list | tuple) and spec and all(isinstance(v, int | float | str) for v in spec):
        return tuple(float(v) if isinstance(v, int | float) and not isinstance(v, bool) else v for v in spec)
    raise ValueError(
        f"'{name}' is {show(spec)}; it must be a distribution ({{distribution: log_uniform, low: 1e-3, "
        f"high: 1e-1}}, uniform likewise, or {{distribution: choice, values: [...]}}) or a list of one value "
        f"per member"
    )


class SelectionConfig(Section):
    """How the greedy ensemble selection (Caruana et al. 2004) picks ``ensemble.select_size``
    members on the validation split (every variant measured in docs/evaluation.md)."""

    replacement: bool = Field(
        True,
        description="Greedy selection with replacement (a member may be picked again, weighing more); "
        "false: each member at most once, so the selected ensemble holds select_size distinct networks.",
    )
    sorted_init: int = Field(
        0,
        ge=0,
        le=4096,
        description="Sorted initialisation (Caruana et al. 2004): start from this many best single members "
        "(by validation NLL), then add greedily; at most ensemble.select_size.",
    )
    bags: int = Field(
        0,
        ge=0,
        le=1000,
        description="Bagged selection: repeat the greedy selection on this many bootstrap samples of the "
        "validation split (drawn from (seed, bag)) and average the multiplicities, rounded to select_size "
        "picks; 0: one selection on the whole split.",
    )


class PackedConfig(Section):
    """Packed-Ensembles' hyperparameters (Laurent et al. 2023, Sec. 3.2)."""

    alpha: float = Field(
        2.0,
        gt=0,
        le=64,
        description="Width factor: each of the M members has alpha/M of the base network's channels "
        "(the paper's CIFAR setting: 2).",
    )
    gamma: int = Field(1, ge=1, le=64, description="Groups per member inside each packed layer (the paper's 1 or 2).")


class EnsembleConfig(Section):
    """How many members to train, with which hyperparameters, and which of them form the ensemble."""

    size: int = Field(8, ge=1, le=4096, description="Number of ensemble members E.")
    method: Literal["deep", "mc_dropout", "batch_ensemble", "packed"] = Field(
        "deep",
        description="What the E trained networks are. deep: each network is one member (a deep ensemble, "
        "Lakshminarayanan et al. 2017). mc_dropout: each network predicts with its dropout on, "
        "ensemble.mc_samples stochastic passes each, and every pass is a member of the evaluation (MC dropout, "
        "Gal & Ghahramani 2016); its networks need dropout (an nn.Dropout or nnx.Dropout of rate > 0, "
        "e.g. model.options.dropout_rate of cnn, resnet and wide_resnet). batch_ensemble (Wen et al. 2020) and "
        "packed (Packed-Ensembles, Laurent et al. 2023): each network holds ensemble.members_per_network "
        "members, a variant of model.name cnn or resnet; ensemble.size=1 is the papers' setting.",
    )
    members_per_network: int = Field(
        4,
        ge=1,
        le=64,
        description="batch_ensemble and packed only: the members M one network holds (the papers' 4).",
    )
    packed: PackedConfig = Field(
        default_factory=lambda: PackedConfig(),
        description="packed only: Packed-Ensembles' width factor alpha and groups per member gamma.",
    )
    mc_samples: int = Field(
        30,
        ge=1,
        le=1000,
        description="mc_dropout only: stochastic passes T per network; the evaluation's members are E x T "
        "(30: uncertainty-baselines' MC dropout on CIFAR-10).",
    )
    pad: bool = Field(
        False,
        description="If E does not divide over an explicit mesh.ensemble axis, train "
        "extra members to fill it (they are dropped from evaluation).",
    )
    search: SearchSpace | None = Field(
        None,
        description="Per-member hyperparameters (hyper-deep ensembles, Wenzel et al. 2020): a mapping from "
        f"{', '.join(hyper.SEARCHABLE)} to a distribution ({{distribution: log_uniform|uniform, low, high}} or "
        "{distribution: choice, values: [...]}) or to a list of E values. Member i's values depend on "
        "(seed, i) only. None: every member has the train section's values.",
    )

    @field_validator("search", mode="before")
    @classmethod
    def _not_precision(cls, search: Any) -> Any:
        if isinstance(search, dict) and "precision" in search:
            raise ValueError(
                "ensemble.search cannot vary precision: train.precision is the compute precision of the one "
                "program that trains every member; set train.precision instead and drop ensemble.search.precision"
            )
        return search

    @field_validator("search")
    @classmethod
    def _search_entries(cls, search: dict | None) -> dict | None:
        return None if search is None else {name: _search_entry(name, spec) for name, spec in search.items()}

    select_size: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="Greedy ensemble selection (Caruana et al. 2004) of this many members "
        "from the trained pool, on validation NLL (how: ensemble.selection); evaluation, prediction and "
        "promotion use the selected multiset. None: the ensemble is every healthy member.",
    )
    selection: SelectionConfig = Field(
        default_factory=lambda: SelectionConfig(replacement=False, bags=20),
        description="How the greedy selection picks the ensemble's select_size members. Default: bagged "
        "(20 bootstrap samples), without replacement: measured best in test NLL and accuracy on the stratified "
        "pools of docs/evaluation.md, where greedy selection with replacement overfits the validation split.",
    )
    first_selection: SelectionConfig = Field(
        default_factory=SelectionConfig,
        description="Hyper-deep ensembles: how the first selection picks from the search pool; its distinct "
        "settings are stratified. Default: greedy with replacement (Wenzel et al. 2020), which keeps the "
        "few best settings and so a small stratified pool.",
    )
    stratify: int | None = Field(
        None,
        ge=1,
        le=64,
        description="Hyper-deep ensemble (Wenzel et al. 2020, Algorithm 2): after the selection from the "
        "search pool, train each distinct selected setting again from this many new initialisations and "
        "select the final select_size members from that stratified pool. Needs ensemble.select_size and a "
        "validation split. None: select from the search pool (a hyper ensemble).",
    )


class TrainConfig(Section):
    """Optimisation settings: every member's, except those ``ensemble.search`` varies per member."""

    epochs: int = Field(10, ge=1, le=MAX_EPOCHS, description="Passes over the training split.")
    batch_size: int = Field(128, ge=1, le=MAX_DIM, description="Examples per member per step.")
    learning_rate: float = Field(
        0.1,
        gt=0,
        le=FLOAT32_MAX,
        description="Optimizer learning rate: finite, > 0 and a float32 number (optax holds it as float32).",
    )
    momentum: float = Field(0.9, ge=0, lt=1, description="SGD momentum (sgd only), 0 <= momentum < 1 in float32.")
    optimizer: Literal["sgd", "adam", "adamw"] = Field(
        "sgd", description="optax optimizer: sgd (with momentum), adam or adamw."
    )
    weight_decay: float = Field(
        0.0,
        ge=0,
        le=FLOAT32_MAX,
        description="Weight decay: decoupled for adamw, an L2 term added to the gradient (optax "
        "add_decayed_weights) for sgd and adam; finite, >= 0 and a float32 number.",
    )
    label_smoothing: float = Field(
        0.0, ge=0, lt=1, description="Label smoothing of the training loss (Szegedy et al. 2016), 0 <= a < 1."
    )
    schedule: Literal[hyper.SCHEDULES] = Field(  # type: ignore[valid-type]
        "constant",
        description="Learning-rate schedule over the whole training (optax): constant, cosine (decay to 0) "
        "or warmup_cosine (linear warm-up from 0 over train.warmup_epochs, then cosine decay to 0).",
    )
    warmup_epochs: float = Field(
        0.0, ge=0, le=MAX_EPOCHS, description="warmup_cosine only: epochs of linear warm-up (below train.epochs)."
    )
    patience: int | None = Field(
        None,
        ge=1,
        le=MAX_EPOCHS,
        description="Early stopping: a member whose validation NLL has not improved for this many epochs "
        "stops updating (masked, like a diverged member). None: every member trains every epoch. Either "
        "way, with a validation split each member's parameters of its best epoch (by validation NLL) are "
        "the ones evaluated.",
    )
    member_choice: Literal[MEMBER_CHOICES] = Field(  # type: ignore[valid-type]
        "best_validation_nll",
        description="Which parameters of each member are evaluated, checkpointed as the run's ensemble and "
        "predicted with: best_validation_nll (the epoch of lowest validation NLL, Prechelt 1998), "
        "best_validation_accuracy (the epoch of highest validation accuracy, the first of ties), or final (the "
        "last epoch's, as uncertainty-baselines and Lakshminarayanan et al. 2017 do: overfit members are "
        "more diverse). Without a validation split members are always evaluated at their final epoch; "
        "best_validation_accuracy needs one. train.patience stops early on the same criterion (validation "
        "NLL for final). Not changed on resume.",
    )
    on_divergence: Literal["freeze", "fail"] = Field(
        "freeze",
        description="When a member's loss or parameters become non-finite: 'freeze' it (its "
        "updates are masked, it is left out of the ensemble metrics) or 'fail' the run.",
    )
    precision: Literal[PRECISIONS] = Field(  # type: ignore[valid-type]
        "float32",
        description="Compute precision of every member's forward and backward pass, in training, validation, "
        "evaluation and prediction (one program for all members, not searchable); parameters, gradients, "
        "optimizer state and BatchNorm statistics stay float32, logits and probabilities are float32. "
        "float32: as written. high (alias tf32): matmuls and convolutions at jax.lax.Precision.HIGH, TF32 on "
        "NVIDIA Ampere and newer GPUs, bf16_3x on TPU, no effect on CPU. bfloat16: bfloat16 compute on float32 "
        "master weights, the loss in float32. May change on resume (recorded in the training session).",
    )

    @field_validator("learning_rate", "weight_decay")
    @classmethod
    def _not_lost_in_float32(cls, value: float) -> float:
        if 0 < value < FLOAT32_MIN_NORMAL:
            raise ValueError(
                f"{value!r} is below {FLOAT32_MIN_NORMAL!r}, the smallest normal float32, and is lost as the "
                f"float32 hyperparameter optax holds"
            )
        return value

    @field_validator("precision", mode="before")
    @classmethod
    def _known_precision(cls, value: Any) -> Any:
        if isinstance(value, str) and value in PRECISION_ALIASES:
            return PRECISION_ALIASES[value]
        if not isinstance(value, str) or value not in PRECISIONS:
            aliases = ", ".join(f"{alias} is an alias of {name}" for alias, name in PRECISION_ALIASES.items())
            raise ValueError(f"the compute precision must be one of {', '.join(PRECISIONS)} ({aliases})")
        return value

    @field_validator("momentum")
    @classmethod
    def _below_one_in_float32(cls, value: float) -> float:
        if as_float32(value) >= 1:
            raise ValueError(
                f"{value!r} becomes 1.0 as the float32 hyperparameter optax holds (0.9999999 stays below 1)"
            )
        return value


class MeshConfig(Section):
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


class DistributedConfig(Section):
    """Training beyond one process: the ensemble split into member groups, each trained by
    its own Prefect task run, locally or on a Dask cluster (prefect-dask's ``DaskTaskRunner``)."""

    member_groups: int = Field(
        1,
        ge=1,
        le=4096,
        description="G: the E members split into G groups of E/G consecutive members, each trained on its own "
        "(own process with task_runner=dask) and checkpointed under <run>/groups/<g>/; evaluation gathers "
        "them. The mesh settings apply within a group. 1: one program trains every member.",
    )
    task_runner: Literal["local", "dask"] = Field(
        "local",
        description="Where the groups' task runs run: 'local' (one after another in the flow's process) or "
        "'dask' (a Dask cluster: a local cluster of worker processes, or the scheduler at `address`).",
    )
    address: str | None = Field(
        None,
        description="The Dask scheduler's address (tcp://host:8786 or tls://host:8786); None: a local cluster "
        "of `workers` processes on loopback, started for the run and closed after it.",
    )
    workers: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="Worker processes of the local cluster (one thread each). None: min(G, CPU cores).",
    )
    pin_cores: bool = Field(
        True,
        description="Pin local worker k's process to CPU core k mod cores (so G workers on G cores do not "
        "oversubscribe each other's XLA thread pools).",
    )
    num_processes: int = Field(
        1,
        ge=1,
        le=HOST_DEVICES,
        description=f"N > 1: training is one program across N JAX processes on this machine (loopback, gloo "
        f"collectives), each with {HOST_DEVICES}/N of the {HOST_DEVICES} simulated CPU devices, the mesh spanning "
        "all of them; the "
        "command starts and coordinates them itself. 1: one process.",
    )
    group_lock_wait_s: float = Field(
        120.0,
        ge=0,
        description="Seconds a member group's task waits for the group's lock held by another process before "
        "refusing. When a worker host loses the cluster, Dask runs its group's task again on another host while "
        "the cut-off trainer stops at its next step, saving a checkpoint: the new task waits for that (one step "
        "and one checkpoint write).",
    )
    tls_ca_file: str | None = Field(None, description="CA certificate of a TLS Dask cluster (tls:// address).")
    tls_cert: str | None = Field(None, description="This client's TLS certificate for a tls:// address.")
    tls_key: str | None = Field(None, description="This client's TLS private key for a tls:// address.")


class CheckpointConfig(Section):
    """orbax checkpointing under <run>/checkpoints/."""

    every_epochs: int = Field(1, ge=1, description="Save a checkpoint every N epochs.")
    keep: int = Field(3, ge=1, description="Keep the latest N checkpoints.")


class PromotionConfig(Section):
    """Champion/challenger: when a new ensemble replaces the current champion."""

    metric: str = Field(
        "nll",
        min_length=1,
        max_length=200,
        description="The figure compared with the champion's on this run's data: an ensemble test metric "
        "(nll, brier, ece, accuracy) or a dotted path into report.json's evaluations.<name>.metrics, e.g. "
        "rotation.mean.ensemble.nll (mean NLL over rotations), common_corruptions.mean.ensemble.nll or "
        "ood.ensemble.auroc.energy; accuracy, accuracy@80% coverage, AUROC, AUPR-in and AUPR-out: higher is "
        "better; NLL, Brier, ECE, adaptive ECE, FPR@95%TPR, AURC and the confident-OOD fraction: lower is better.",
    )

    @field_validator("metric")
    @classmethod
    def _a_known_figure(cls, metric: str) -> str:
        figure_direction(metric)  # raises ValueError for an unknown figure
        return metric

    enabled: bool = Field(True, description="Compare with (and maybe replace) the champion after evaluation.")
