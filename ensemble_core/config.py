"""The run configuration: one pydantic model, nested by concern.

The same model is the Prefect flow's parameter schema (each field's description shows up
in the deployment form) and what YAML files in ``configs/`` are validated against.
Unknown keys are errors, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import pkgutil
import reprlib
import struct
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ensemble_core import hyper
from ensemble_core.errors import ConfigError

# MARK: registries (names only: nothing is imported here)


def _registered(package: str) -> tuple[str, ...]:
    """The modules of ``ensemble_core/<package>/`` (one per model or evaluator), by name."""
    found = pkgutil.iter_modules([str(Path(__file__).parent / package)])
    return tuple(sorted(m.name for m in found if not m.name.startswith("_")))


#: ``model.name`` values: one file per model in ``ensemble_core/models/``.
MODEL_NAMES = _registered("models")
#: ``eval.evaluators`` values: one file per evaluator in ``ensemble_core/evaluators/``.
EVALUATOR_NAMES = _registered("evaluators")

# MARK: limits

#: Largest root seed. With JAX's default (x64 disabled) ``jax.random.key(seed)`` accepts any
#: int in [-2**63, 2**63) but keeps only its low 32 bits (measured with jax 0.10.2):
#: ``key(2**32)`` is ``key(0)`` and ``key(-1)`` is ``key(2**32 - 1)``, and 2**63 raises
#: OverflowError. Seeds are therefore [0, 2**32 - 1]: every accepted seed gives its own keys.
MAX_SEED = 2**32 - 1
#: Epoch k's data order is ``fold_in(data_key, k)``, which takes a uint32 (k = 2**32 raises
#: OverflowError), so the last epoch index is 2**32 - 1.
MAX_EPOCHS = 2**32
#: Array dimensions (batch sizes) beyond int32 cannot be built.
MAX_DIM = 2**31 - 1
#: MLP limits: width of one hidden layer, number of hidden layers, and the hidden-to-hidden
#: weights of one member (2**28 float32 = 1 GiB, e.g. one 16384 x 16384 layer).
MAX_WIDTH = 65536
MAX_DEPTH = 64
MAX_HIDDEN_WEIGHTS = 2**28
#: A config file larger than this is not a config.
MAX_CONFIG_BYTES = 1 << 20
#: optax (inject_hyperparams) holds learning rate, momentum and weight decay as float32:
#: a larger value becomes inf, a nonzero value below the smallest normal float32 becomes 0
#: (or a denormal), and momentum 1 - 1e-9 becomes 1.
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_MIN_NORMAL = 1.1754943508222875e-38


def _as_float32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]


# MARK: sections


class _Section(BaseModel):
    # allow_inf_nan=False: every float field refuses inf and NaN (also '.inf'/'nan' strings).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class DataConfig(_Section):
    """Which dataset to train and evaluate on."""

    name: str = Field(
        "mnist5k",
        min_length=1,
        pattern=r"^[^\x00-\x1f\x7f]+$",
        description="TFDS dataset name. 'mnist5k' is the embedded offline MNIST subset "
        "(4,000 train / 1,000 test); any TFDS catalog image dataset (mnist, "
        "fashion_mnist, cifar10, ...) works when prepared in data_dir.",
    )
    data_dir: str | None = Field(
        None,
        min_length=1,
        pattern=r"^[^\x00-\x1f\x7f]+$",
        description="TFDS data directory (prepared array_record files live here). "
        "Default: TFDS's own default (~/tensorflow_datasets or $TFDS_DATA_DIR).",
    )
    manual_dir: str | None = Field(
        None,
        min_length=1,
        pattern=r"^[^\x00-\x1f\x7f]+$",
        description="Where the original dataset files were put by hand for offline "
        "preparation of a catalog dataset. Default: <data_dir>/downloads/manual.",
    )
    max_train_examples: int | None = Field(
        None, ge=1, description="Use only the first N training examples (None: all)."
    )
    max_test_examples: int | None = Field(None, ge=1, description="Use only the first N test examples (None: all).")
    validation_fraction: float = Field(
        0.1,
        ge=0,
        le=0.5,
        description="Fraction of the training split held out as the validation split (stratified by label, "
        "the same examples for every seed; data.max_train_examples applies first). Per-member validation, "
        "early stopping, ensemble selection and temperature scaling use it, never the test split. "
        "0: train on the whole split (no validation).",
    )


class ModelConfig(_Section):
    """Which network each member is, looked up by name in ensemble_core.models."""

    name: Literal[MODEL_NAMES] = Field(  # type: ignore[valid-type]
        "cnn",
        description="A module of ensemble_core/models/: 'cnn', the Flax ensembling HOWTO CNN; 'mlp', a ReLU MLP.",
    )
    hidden_sizes: tuple[Annotated[int, Field(ge=1, le=MAX_WIDTH)], ...] = Field(
        (512, 512),
        max_length=MAX_DEPTH,
        description=f"MLP only: widths of the hidden layers (each 1..{MAX_WIDTH}, at most {MAX_DEPTH} "
        f"layers, at most {MAX_HIDDEN_WEIGHTS} hidden-to-hidden weights; [] is a linear model).",
    )

    @field_validator("hidden_sizes")
    @classmethod
    def _hidden_weights_fit(cls, sizes: tuple[int, ...]) -> tuple[int, ...]:
        weights = sum(a * b for a, b in zip(sizes, sizes[1:], strict=False))
        if weights > MAX_HIDDEN_WEIGHTS:
            raise ValueError(
                f"{weights} hidden-to-hidden weights per member is more than the {MAX_HIDDEN_WEIGHTS} allowed "
                f"(a width x the next width, summed over the layers)"
            )
        return sizes


class Distribution(_Section):
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
        f"'{name}' is {_show(spec)}; it must be a distribution ({{distribution: log_uniform, low: 1e-3, "
        f"high: 1e-1}}, uniform likewise, or {{distribution: choice, values: [...]}}) or a list of one value "
        f"per member"
    )


class EnsembleConfig(_Section):
    """How many members to train, with which hyperparameters, and which of them form the ensemble."""

    size: int = Field(8, ge=1, le=4096, description="Number of ensemble members E.")
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

    @field_validator("search")
    @classmethod
    def _search_entries(cls, search: dict | None) -> dict | None:
        return None if search is None else {name: _search_entry(name, spec) for name, spec in search.items()}

    select_size: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="Greedy ensemble selection with replacement (Caruana et al. 2004) of this many members "
        "from the trained pool, on validation NLL; evaluation, prediction and promotion use the selected "
        "multiset. None: the ensemble is every healthy member.",
    )


class TrainConfig(_Section):
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
    on_divergence: Literal["freeze", "fail"] = Field(
        "freeze",
        description="When a member's loss or parameters become non-finite: 'freeze' it (its "
        "updates are masked, it is left out of the ensemble metrics) or 'fail' the run.",
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

    @field_validator("momentum")
    @classmethod
    def _below_one_in_float32(cls, value: float) -> float:
        if _as_float32(value) >= 1:
            raise ValueError(
                f"{value!r} becomes 1.0 as the float32 hyperparameter optax holds (0.9999999 stays below 1)"
            )
        return value


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


HOST_DEVICES = 8  # simulated CPU devices of one program on one machine (flows/_env.py sets as many)


class DistributedConfig(_Section):
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
    tls_ca_file: str | None = Field(None, description="CA certificate of a TLS Dask cluster (tls:// address).")
    tls_cert: str | None = Field(None, description="This client's TLS certificate for a tls:// address.")
    tls_key: str | None = Field(None, description="This client's TLS private key for a tls:// address.")


class CheckpointConfig(_Section):
    """orbax checkpointing under <run>/checkpoints/."""

    every_epochs: int = Field(1, ge=1, description="Save a checkpoint every N epochs.")
    keep: int = Field(3, ge=1, description="Keep the latest N checkpoints.")


class EvalConfig(_Section):
    """Evaluation on the test split."""

    batch_size: int = Field(
        250, ge=1, le=MAX_DIM, description="Test examples per device per forward pass (250 measured fastest on CPU)."
    )
    ece_bins: int = Field(15, ge=2, le=1000, description="Equal-width bins for ECE (2..1000).")
    temperature_scaling: bool = Field(
        False,
        description="Fit one temperature for the ensemble on the validation NLL (Guo et al. 2017, applied to "
        "the log of the ensemble's mean probabilities) and report the test and shift figures before and after; "
        "predictions then carry the scaled probabilities.",
    )
    evaluators: tuple[Literal[EVALUATOR_NAMES], ...] = Field(  # type: ignore[valid-type]
        ("test", "rotation", "translation", "corruptions", "letters", "fashion_mnist"),
        description="Evaluators run after training, by module name in ensemble_core/evaluators/: 'test' (the "
        "test split: accuracy, NLL, Brier, ECE, diversity; required), 'rotation', 'translation', 'corruptions' "
        "(MNIST-C) under dataset shift, 'letters' and 'fashion_mnist' out of distribution.",
    )

    @field_validator("evaluators")
    @classmethod
    def _test_first(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        if "test" not in names:
            raise ValueError("'test' must be one of the evaluators (the report and the champion are judged on it)")
        if len(set(names)) != len(names):
            raise ValueError("an evaluator is listed twice")
        return names


#: Figures promotion can compare, and whether higher is better.
FIGURE_HIGHER_IS_BETTER = {
    "accuracy": True,
    "auroc": True,
    "aupr": True,
    "nll": False,
    "brier": False,
    "ece": False,
    "fpr_at_95_tpr": False,
    "aurc": False,
    "confident_ood_fraction": False,
}
#: The ensemble test metrics ``promotion.metric`` may name without a path.
TEST_METRICS = ("nll", "brier", "ece", "accuracy")


def figure_direction(metric: str) -> bool:
    """Whether higher is better for ``promotion.metric`` (the last segment of the dotted
    path that names a known figure decides, e.g. ``letters.ensemble.entropy.auroc``).

    Raises:
      ValueError: not a test metric, no evaluator name first, or no known figure in the path.
    """
    if metric in TEST_METRICS:
        return FIGURE_HIGHER_IS_BETTER[metric]
    parts = metric.split(".")
    if len(parts) < 2 or parts[0] not in EVALUATOR_NAMES or not all(parts):
        raise ValueError(
            f"'{metric}' is neither a test metric {TEST_METRICS} nor a dotted path <evaluator>.<figure path> "
            f"with an evaluator of {EVALUATOR_NAMES}"
        )
    for part in reversed(parts):
        if part in FIGURE_HIGHER_IS_BETTER:
            return FIGURE_HIGHER_IS_BETTER[part]
    raise ValueError(f"'{metric}' names none of the figures {tuple(FIGURE_HIGHER_IS_BETTER)}")


class PromotionConfig(_Section):
    """Champion/challenger: when a new ensemble replaces the current champion."""

    metric: str = Field(
        "nll",
        min_length=1,
        max_length=200,
        description="The figure compared with the champion's on this run's data: an ensemble test metric "
        "(nll, brier, ece, accuracy) or a dotted path into report.json's evaluations.<name>.metrics, e.g. "
        "rotation.mean.ensemble.nll (mean NLL over rotations) or letters.ensemble.auroc.mutual_information; "
        "accuracy, AUROC and AUPR: higher is better; NLL, Brier, ECE, FPR@95%TPR, AURC and the confident-OOD "
        "fraction: lower is better.",
    )

    @field_validator("metric")
    @classmethod
    def _a_known_figure(cls, metric: str) -> str:
        figure_direction(metric)  # raises ValueError for an unknown figure
        return metric

    enabled: bool = Field(True, description="Compare with (and maybe replace) the champion after evaluation.")


# MARK: the whole config


class PipelineConfig(_Section):
    """A complete, validated run configuration."""

    seed: int = Field(
        0,
        ge=0,
        le=MAX_SEED,
        description=f"Root seed (0..{MAX_SEED}: a JAX PRNG key holds 32 bits); member i depends on (seed, i).",
    )
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    ensemble: EnsembleConfig = Field(default_factory=EnsembleConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    mesh: MeshConfig = Field(default_factory=MeshConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    promotion: PromotionConfig = Field(default_factory=PromotionConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)

    def member_hyperparameters(self, num_members: int | None = None) -> list[dict[str, Any]]:
        """Every member's learning rate, weight decay, label smoothing, schedule and warm-up
        (:func:`ensemble_core.hyper.member_hyperparameters`), for ``num_members`` members
        (default: ``ensemble.size``; padding members count)."""
        base = self.train.model_dump()
        search = None
        if self.ensemble.search is not None:
            search = {k: v.model_dump() if isinstance(v, BaseModel) else v for k, v in self.ensemble.search.items()}
        return hyper.member_hyperparameters(base, search, self.seed, num_members or self.ensemble.size)

    @property
    def has_validation(self) -> bool:
        """Whether a validation split is held out (``data.validation_fraction > 0``)."""
        return self.data.validation_fraction > 0

    @model_validator(mode="after")
    def _members_valid(self) -> PipelineConfig:
        for name, spec in (self.ensemble.search or {}).items():
            if isinstance(spec, tuple) and len(spec) != self.ensemble.size:
                raise ValueError(
                    f"ensemble.search.{name} lists {len(spec)} values for ensemble.size={self.ensemble.size} "
                    f"members; fix: give one value per member, or a distribution"
                )
        if self.ensemble.search:
            base = self.train.model_dump()
            for i, hp in enumerate(self.member_hyperparameters()):
                try:
                    TrainConfig.model_validate({**base, **hp})
                except ValidationError as err:
                    first = err.errors()[0]
                    key = ".".join(str(p) for p in first["loc"])
                    raise ValueError(
                        f"ensemble.search gives member {i} train.{key}={_show(first.get('input'))}: {first['msg']}; "
                        f"fix: narrow the search space of {key}"
                    ) from None
        for i, hp in enumerate(self.member_hyperparameters()):
            if hp["schedule"] == "warmup_cosine" and hp["warmup_epochs"] >= self.train.epochs:
                raise ValueError(
                    f"member {i} warms up for {hp['warmup_epochs']:g} epochs of train.epochs={self.train.epochs}; "
                    f"fix: keep train.warmup_epochs below train.epochs"
                )
        needs = {
            "ensemble.select_size": self.ensemble.select_size is not None,
            "train.patience": self.train.patience is not None,
            "eval.temperature_scaling": self.eval.temperature_scaling,
        }
        asked = [k for k, on in needs.items() if on]
        if asked and not self.has_validation:
            raise ValueError(
                f"{', '.join(asked)} need(s) a validation split but data.validation_fraction=0; "
                f"fix: set data.validation_fraction (e.g. 0.1) or drop {', '.join(asked)}"
            )
        return self

    @model_validator(mode="after")
    def _groups_valid(self) -> PipelineConfig:
        dist, size = self.distributed, self.ensemble.size
        if HOST_DEVICES % dist.num_processes:
            divisors = [d for d in range(1, HOST_DEVICES + 1) if HOST_DEVICES % d == 0]
            raise ValueError(
                f"distributed.num_processes={dist.num_processes} does not divide the {HOST_DEVICES} simulated CPU "
                f"devices of the program; fix: use {', '.join(map(str, divisors[:-1]))} or {divisors[-1]}"
            )
        if dist.num_processes > 1 and (dist.member_groups > 1 or dist.task_runner != "local"):
            raise ValueError(
                f"distributed.num_processes={dist.num_processes} runs one program across processes; it does not "
                f"combine with member groups (member_groups={dist.member_groups}, task_runner={dist.task_runner}); "
                f"fix: use one of the two"
            )
        if size % dist.member_groups:
            divisors = [d for d in range(1, size + 1) if size % d == 0]
            raise ValueError(
                f"distributed.member_groups={dist.member_groups} does not divide ensemble.size={size}; "
                f"fix: use one of {divisors}"
            )
        if dist.task_runner != "dask":
            given = [k for k in ("address", "workers", "tls_ca_file", "tls_cert", "tls_key") if getattr(dist, k)]
            if given:
                raise ValueError(
                    f"distributed.{given[0]} is set but distributed.task_runner={dist.task_runner}; "
                    f"fix: set distributed.task_runner=dask, or drop distributed.{given[0]}"
                )
        if dist.address is not None:
            if dist.workers is not None:
                raise ValueError(
                    "distributed.workers sizes a local cluster but distributed.address names a running one; "
                    "fix: drop one of them"
                )
            scheme = dist.address.split("://")[0] if "://" in dist.address else "tcp"
            if scheme not in ("tcp", "tls"):
                raise ValueError(
                    f"distributed.address={dist.address} is not a tcp:// or tls:// Dask scheduler address; "
                    f"fix: give it as tcp://host:port or tls://host:port"
                )
            tls = [dist.tls_ca_file, dist.tls_cert, dist.tls_key]
            if scheme == "tls" and not all(tls):
                raise ValueError(
                    f"distributed.address={dist.address} uses TLS but distributed.tls_ca_file, tls_cert and tls_key "
                    f"are not all set; fix: give the cluster's CA certificate and this client's certificate and key"
                )
            if scheme == "tcp" and any(tls):
                raise ValueError(
                    f"TLS files are set but distributed.address={dist.address} is not tls://; "
                    f"fix: use the scheduler's tls:// address"
                )
        elif any([dist.tls_ca_file, dist.tls_cert, dist.tls_key]):
            raise ValueError(
                "distributed.tls_* files are for a running cluster's tls:// address, but distributed.address is "
                "not set (the local cluster makes its own temporary certificates); fix: set distributed.address"
            )
        return self

    @model_validator(mode="after")
    def _promotion_figure_is_evaluated(self) -> PipelineConfig:
        evaluator = self.promotion.metric.split(".")[0]
        if self.promotion.metric not in TEST_METRICS and evaluator not in self.eval.evaluators:
            raise ValueError(
                f"promotion.metric={self.promotion.metric} needs the evaluator '{evaluator}', which is not in "
                f"eval.evaluators {list(self.eval.evaluators)}; fix: add it there"
            )
        return self


# MARK: messages


# Everything str.splitlines() breaks on: a message stays one line whatever the input holds.
_ONE_LINE = str.maketrans(
    {c: c.encode("unicode_escape").decode("ascii") for c in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"}
)
_MAX_ERRORS = 8

_short = reprlib.Repr()
_short.maxlevel, _short.maxstring, _short.maxother = 2, 80, 80
_short.maxlist = _short.maxtuple = _short.maxdict = _short.maxset = 5


def _error(message: str) -> ConfigError:
    """A :class:`ConfigError` whose message is one line."""
    return ConfigError(message.translate(_ONE_LINE))


def _show(value: Any) -> str:
    """A short one-line repr of an input value (huge, deep or aliased values included)."""
    try:
        return _short.repr(value)
    except ValueError:  # an int over Python's int-to-str digit limit
        return f"<int of {value.bit_length()} bits>" if isinstance(value, int) else f"<{type(value).__name__}>"
    except Exception:  # noqa: BLE001  (never let the report of an error raise)
        return f"<{type(value).__name__}>"


def _describe(err: ValidationError) -> str:
    errors = err.errors()
    parts = []
    for e in errors[:_MAX_ERRORS]:
        key = ".".join(str(p) for p in e["loc"]) or "<root>"
        if not e["loc"] and e["type"] == "value_error":  # a check across sections: its message says it all
            parts.append(e["msg"].removeprefix("Value error, "))
        elif e["type"] == "extra_forbidden":
            parts.append(
                f"unknown config key '{key}'; fix: remove it or check its spelling "
                f"(known keys are listed in configs/default.yaml)"
            )
        else:
            parts.append(f"config key '{key}': {e['msg']} (got {_show(e.get('input'))}); fix: set a valid '{key}'")
    if len(errors) > _MAX_ERRORS:
        parts.append(f"and {len(errors) - _MAX_ERRORS} more invalid value(s)")
    return "; ".join(parts)


def validate(raw: dict[str, Any]) -> PipelineConfig:
    """Validate a nested dict into a :class:`PipelineConfig`.

    Raises:
      ConfigError: naming every offending key and what to do about it.
    """
    try:
        return PipelineConfig.model_validate(raw)
    except ValidationError as err:
        raise _error(_describe(err)) from None
    except RecursionError:
        raise _error("config nests too deeply; fix: use the layout of configs/default.yaml") from None


# MARK: YAML


_MERGE_TAG = "tag:yaml.org,2002:merge"


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A YAML mapping holds the same key twice (YAML would silently keep the last)."""

    def __init__(self, key: str, first_line: int, second_line: int) -> None:
        self.key, self.first_line, self.second_line = key, first_line, second_line
        super().__init__(None, None, f"duplicate key '{key}' ({self.lines})", None)

    @property
    def lines(self) -> str:
        """``lines 3 and 7``, or ``both on line 3``."""
        if self.first_line == self.second_line:
            return f"both on line {self.first_line}"
        return f"lines {self.first_line} and {self.second_line}"


class StrictLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader that refuses a key given twice in one mapping, at any depth.

    Merge keys (``<<: *anchor``) still work: a key of the mapping itself overrides a
    merged one, as YAML specifies; only keys written twice in one mapping are refused.
    """

    def construct_document(self, node: yaml.Node) -> Any:
        self._key_paths: dict[int, str] = {}
        self._checked: set[int] = set()
        stack = [(node, "")]
        while stack:  # dotted path of every mapping, for the error message (aliases: first path)
            n, path = stack.pop()
            if id(n) in self._key_paths:
                continue
            if isinstance(n, yaml.MappingNode):
                self._key_paths[id(n)] = path
                for k, v in n.value:
                    name = k.value if isinstance(k, yaml.ScalarNode) else "?"
                    stack.append((v, f"{path}.{name}" if path else name))
            elif isinstance(n, yaml.SequenceNode):
                self._key_paths[id(n)] = path
                stack.extend((v, f"{path}.{i}" if path else str(i)) for i, v in enumerate(n.value))
        return super().construct_document(node)

    def _check_unique(self, node: yaml.MappingNode) -> None:
        if id(node) in self._checked:  # once, before flatten_mapping merges keys into node.value
            return
        self._checked.add(id(node))
        prefix = getattr(self, "_key_paths", {}).get(id(node), "")
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key in seen:
                    name = key_node.value if isinstance(key_node, yaml.ScalarNode) else _show(key)
                    raise DuplicateKeyError(f"{prefix}.{name}" if prefix else str(name), seen[key], line)
                seen[key] = line
            except TypeError:  # an unhashable key: SafeConstructor reports it
                continue

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        self._check_unique(node)
        super().flatten_mapping(node)

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            self._check_unique(node)
        return super().construct_mapping(node, deep=deep)


def _load_yaml(text: str) -> Any:
    """``yaml.load`` with :class:`StrictLoader`: safe tags only, no duplicate keys."""
    return yaml.load(text, Loader=StrictLoader)  # noqa: S506  (StrictLoader is a SafeLoader)


# MARK: loading


def _set_dotted(raw: dict[str, Any], assignment: str) -> None:
    if "=" not in assignment:
        raise _error(f"override '{assignment}' has no '='; fix: write it as dotted.key=value")
    key, text = assignment.split("=", 1)
    key = key.strip()
    parts = key.split(".")
    if not all(parts):
        raise _error(f"override key '{key}' is malformed; fix: e.g. train.epochs=3")
    node = raw
    for depth, p in enumerate(parts[:-1]):
        child = node.get(p)
        if child is None:  # absent, or an empty section ('train:' in a file)
            child = node[p] = {}
        if not isinstance(child, dict):
            section = ".".join(parts[: depth + 1])
            raise _error(
                f"config key '{section}' is not a section (got {_show(child)}), so '{key}' cannot be set; "
                f"fix: make '{section}' a mapping of keys or drop the override '{key}'"
            )
        node = child
    try:
        node[parts[-1]] = _load_yaml(text) if text.strip() else None
    except DuplicateKeyError as err:
        raise _error(f"override '{key}' has key '{err.key}' twice; fix: give each key of '{key}' once") from None
    except yaml.YAMLError:
        node[parts[-1]] = text
    except (RecursionError, ValueError) as err:  # nesting too deep; an int with too many digits
        raise _error(
            f"config key '{key}': override value cannot be read ({type(err).__name__}: nesting too deep "
            f"or a number with too many digits); fix: set a valid '{key}'"
        ) from None


def _read_text(p: Path) -> str:
    """The text of config file ``p``: at most MAX_CONFIG_BYTES of UTF-8.

    Raises:
      ConfigError: missing, unreadable, a directory, too large, binary or not UTF-8.
    """
    fix = "fix: pass a readable YAML text file (UTF-8, like configs/default.yaml) to config_path"
    try:
        with p.open("rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except IsADirectoryError:
        raise _error(f"config file '{p}' is a directory, not a file; {fix}") from None
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise _error(
            f"cannot read config file '{p}': {reason}; fix: pass an existing readable YAML file to config_path"
        ) from None
    except ValueError as err:  # e.g. a NUL byte in the path
        raise _error(f"cannot read config file '{p}': {err}; {fix}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise _error(f"config file '{p}' is larger than {MAX_CONFIG_BYTES} bytes, so it is not a config; {fix}")
    if b"\x00" in data:
        raise _error(f"config file '{p}' is binary, not text (NUL byte at offset {data.index(0)}); {fix}")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        bad = data[err.start]
        raise _error(f"config file '{p}' is not UTF-8 text (byte 0x{bad:02x} at offset {err.start}); {fix}") from None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> PipelineConfig:
    """Read a YAML config (or the built-in defaults) and apply ``dotted.key=value`` overrides.

    Args:
      path: a YAML file whose top level is a mapping of the config sections; None means
        the defaults of :class:`PipelineConfig` (identical to ``configs/default.yaml``).
      overrides: ``["train.epochs=3", "ensemble.size=4"]``; values are parsed as YAML.

    Raises:
      ConfigError: unreadable, binary, non-UTF-8 or oversized file, not YAML, a key given
        twice, not a mapping, or any invalid key/value. The message is one line.
    """
    raw: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        text = _read_text(p)
        try:
            loaded = _load_yaml(text)
        except DuplicateKeyError as err:
            raise _error(
                f"config file '{p}' has key '{err.key}' twice ({err.lines}); "
                f"fix: keep only one '{err.key}' (YAML would silently use the last one)"
            ) from None
        except yaml.YAMLError as err:
            first = (str(err).splitlines() or [type(err).__name__])[0]
            raise _error(f"config file '{p}' is not valid YAML ({first}); fix: correct the syntax") from None
        except (RecursionError, ValueError) as err:  # nesting too deep; an int with too many digits
            raise _error(
                f"config file '{p}' cannot be read as a config ({type(err).__name__}: nesting too deep or a "
                f"number with too many digits); fix: use the layout of configs/default.yaml"
            ) from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise _error(
                f"config file '{p}' must hold a mapping of sections, not "
                f"{type(loaded).__name__}; fix: see configs/default.yaml"
            )
        raw = loaded
    for assignment in overrides or []:
        _set_dotted(raw, assignment)
    return validate(raw)
