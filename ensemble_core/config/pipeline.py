"""The whole run configuration, :class:`PipelineConfig`: the sections nested, and the checks
that need more than one section (per-member hyperparameters, validation split, member
groups and Dask cluster, the promotion figure's evaluator).

The same model is the Prefect flow's parameter schema and what YAML files in ``configs/``
are validated against (:func:`ensemble_core.config.load_config`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, ValidationError, ValidationInfo, model_validator

from ensemble_core import hyper
from ensemble_core.config.base import Section
from ensemble_core.config.data_section import DataConfig
from ensemble_core.config.decision_section import AbstentionConfig, PredictionSetsConfig
from ensemble_core.config.eval_section import EvalConfig, default_evaluators
from ensemble_core.config.limits import HOST_DEVICES, MAX_SEED
from ensemble_core.config.messages import show
from ensemble_core.config.nightly_section import NightlyConfig, RetentionConfig
from ensemble_core.config.sections import (
    CheckpointConfig,
    DistributedConfig,
    EnsembleConfig,
    MeshConfig,
    ModelConfig,
    PromotionConfig,
    TrainConfig,
)
from ensemble_core.figures import TEST_METRICS


class PipelineConfig(Section):
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
    nightly: NightlyConfig = Field(default_factory=NightlyConfig)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
    prediction_sets: PredictionSetsConfig = Field(default_factory=PredictionSetsConfig)
    abstention: AbstentionConfig = Field(default_factory=AbstentionConfig)

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

    @property
    def has_calibration(self) -> bool:
        """Whether a calibration split is held out (``data.calibration_fraction > 0``)."""
        return self.data.calibration_fraction > 0

    @property
    def decision_split(self) -> str | None:
        """The split prediction sets and abstention are fitted on (``prediction_sets.calibrate_on``):
        ``'calibration'``, ``'validation'`` or None (none asked for, or the split is not held out)."""
        where = self.prediction_sets.calibrate_on
        if where == "calibration" and self.has_calibration:
            return "calibration"
        if where == "validation" and self.has_validation:
            return "validation"
        return None

    @model_validator(mode="before")
    @classmethod
    def _evaluators_by_dataset(cls, raw: Any) -> Any:
        """``eval.evaluators`` not given: the dataset's defaults (:func:`default_evaluators`)."""
        if not isinstance(raw, dict):
            return raw
        ev = raw.get("eval")
        given = ev.model_fields_set if isinstance(ev, EvalConfig) else set(ev) if isinstance(ev, dict) else set()
        if "evaluators" in given or (ev is not None and not isinstance(ev, EvalConfig | dict)):
            return raw
        data = raw.get("data")
        fields = data.model_dump() if isinstance(data, DataConfig) else data if isinstance(data, dict) else {}
        specs = default_evaluators(
            str(fields.get("name") or "mnist5k"),
            str(fields.get("source") or "tfds"),
            fields.get("classes") is not None,
        )
        if isinstance(ev, EvalConfig):
            ev = ev.model_copy(update={"evaluators": EvalConfig(evaluators=specs).evaluators})
        else:
            ev = {**(ev or {}), "evaluators": specs}
        return {**raw, "eval": ev}

    @model_validator(mode="after")
    def _members_valid(self, info: ValidationInfo) -> PipelineConfig:
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
                        f"ensemble.search gives member {i} train.{key}={show(first.get('input'))}: {first['msg']}; "
                        f"fix: narrow the search space of {key}"
                    ) from None
        for i, hp in enumerate(self.member_hyperparameters()):
            if hp["schedule"] == "warmup_cosine" and hp["warmup_epochs"] >= self.train.epochs:
                raise ValueError(
                    f"member {i} warms up for {hp['warmup_epochs']:g} epochs of train.epochs={self.train.epochs}; "
                    f"fix: keep train.warmup_epochs below train.epochs"
                )
        ens = self.ensemble
        if ens.method != "deep":
            chosen = [k for k, on in (("ensemble.select_size", ens.select_size), ("ensemble.search", ens.search)) if on]
            if chosen:
                raise ValueError(
                    f"ensemble.method={ens.method} predicts with every member of its networks; {chosen[0]} "
                    f"chooses among networks of a deep ensemble; fix: drop {chosen[0]}, or use ensemble.method=deep"
                )
        if ens.stratify is not None and ens.select_size is None:
            raise ValueError(
                f"ensemble.stratify={ens.stratify} trains the settings a selection keeps, but ensemble.select_size "
                f"is not set; fix: set ensemble.select_size (e.g. 8) or drop ensemble.stratify"
            )
        # A stratified pool (ensemble_core.runs.ensemble.pool) may be smaller than K: with replacement it
        # still gives K picks, and without, the first selection keeps K settings.
        stratified_pool = bool(info.context and info.context.get("stratified_pool"))
        if ens.select_size is not None and ens.select_size > ens.size and not stratified_pool:
            raise ValueError(
                f"ensemble.select_size={ens.select_size} is larger than the pool of ensemble.size={ens.size} "
                f"members; fix: select at most {ens.size}, or train a larger pool"
            )
        for name, sel in (("selection", ens.selection), ("first_selection", ens.first_selection)):
            if ens.select_size is not None and sel.sorted_init > ens.select_size:
                raise ValueError(
                    f"ensemble.{name}.sorted_init={sel.sorted_init} starts from more members than "
                    f"ensemble.select_size={ens.select_size} picks; fix: use at most {ens.select_size}"
                )
        if (
            ens.stratify is not None
            and ens.select_size is not None
            and ens.stratify < ens.select_size
            and not ens.selection.replacement
            and ens.first_selection.replacement
        ):
            raise ValueError(
                f"ensemble.selection.replacement=false picks {ens.select_size} distinct members of the stratified "
                f"pool, but with ensemble.stratify={ens.stratify} it may hold only {ens.stratify} (the first selection "
                f"can keep one setting); fix: set ensemble.stratify to at least {ens.select_size}, or "
                f"ensemble.first_selection.replacement=false"
            )
        needs = {
            "ensemble.select_size": self.ensemble.select_size is not None,
            "ensemble.stratify": self.ensemble.stratify is not None,
            "train.patience": self.train.patience is not None,
            "eval.temperature_scaling": self.eval.temperature_scaling,
        }
        # best_validation_nll without a validation split evaluates the final epoch, as before the key
        needs["train.member_choice=best_validation_accuracy"] = self.train.member_choice == "best_validation_accuracy"
        asked = [k for k, on in needs.items() if on]
        if asked and not self.has_validation:
            raise ValueError(
                f"{', '.join(asked)} need(s) a validation split but data.validation_fraction=0; "
                f"fix: set data.validation_fraction (e.g. 0.1) or drop {', '.join(asked)}"
            )
        data = self.data
        if data.validation_fraction + data.calibration_fraction >= 1:
            raise ValueError(
                f"data.validation_fraction={data.validation_fraction} and data.calibration_fraction="
                f"{data.calibration_fraction} leave no training examples; fix: lower one of them"
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
