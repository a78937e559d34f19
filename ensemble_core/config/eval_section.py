"""The ``eval`` section: evaluation on the test split, and the evaluators by name, each
with its own options (as big_vision's ``config.evals = {name: {type, ...}}``)."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ensemble_core.config.limits import MAX_DIM
from ensemble_core.registry import EVALUATOR_NAMES

#: Datasets of handwritten digits (28x28x1, MNIST's): their own shift and OOD sets apply.
DIGIT_DATASETS = ("mnist", "mnist5k")
#: Test images per (corruption, severity) cell of the default ``common_corruptions``: 75 cells
#: of 1,000 images cost about 130 s of CPU prediction for 8 CNNs (docs/evaluation.md).
DEFAULT_CORRUPTED_EXAMPLES = 1000
#: mnist5k's (the embedded default data): 50 per cell (3,750 images in all), and
#: :data:`DEFAULT_SHIFTED_EXAMPLES_MNIST5K`, so the quick start stays quick: with every
#: level of every shift on all of its 1,000 test images, evaluation was a third of the
#: run beside its training steps (docs/benchmarks.md, "Where a run's time goes").
DEFAULT_CORRUPTED_EXAMPLES_MNIST5K = 50
#: mnist5k's test images per level of ``rotation``, ``translation`` and MNIST-C
#: ``corruptions`` (the first 200 of its 1,000); other datasets use the whole test split.
DEFAULT_SHIFTED_EXAMPLES_MNIST5K = 200
#: What ``eval.evaluators`` runs on the default dataset (``mnist5k``) when the config does not say.
DEFAULT_EVALUATORS = (
    "test",
    "rotation",
    "translation",
    "common_corruptions",
    "ood",
    "corruptions",
    "letters",
    "fashion_mnist",
)


def default_evaluators(name: str = "mnist5k", source: str = "tfds", held_out: bool = False) -> dict[str, dict]:
    """``eval.evaluators`` when the config does not list its own, by dataset: ``test``,
    ``rotation``, ``translation``, ``common_corruptions`` (:data:`DEFAULT_CORRUPTED_EXAMPLES`
    test images per cell; on ``mnist5k`` :data:`DEFAULT_CORRUPTED_EXAMPLES_MNIST5K`, and
    :data:`DEFAULT_SHIFTED_EXAMPLES_MNIST5K` per shift level) and an ``ood`` evaluator
    (``held_out_classes`` when ``data.classes`` holds classes out, else ``uniform_noise``) for every dataset; for digits
    (:data:`DIGIT_DATASETS` from TFDS) also MNIST-C ``corruptions``, ``letters`` and
    ``fashion_mnist``.

    Args:
      name, source: ``data.name`` and ``data.source``; held_out: whether ``data.classes`` is set.
    """
    digits = source == "tfds" and name in DIGIT_DATASETS
    quick = digits and name == "mnist5k"
    cells = DEFAULT_CORRUPTED_EXAMPLES_MNIST5K if quick else DEFAULT_CORRUPTED_EXAMPLES
    shifted = {"num_examples": DEFAULT_SHIFTED_EXAMPLES_MNIST5K} if quick else {}
    specs: dict[str, dict] = {
        "test": {},
        "rotation": dict(shifted),
        "translation": dict(shifted),
        "common_corruptions": {"num_examples": cells},
        "ood": {"source": "held_out_classes" if held_out else "uniform_noise"},
    }
    if digits:
        specs.update({"corruptions": dict(shifted), "letters": {}, "fashion_mnist": {}})
    return specs


_INSTANCE_NAME = re.compile(r"[a-z][a-z0-9_]*")


def _or_a_list_of_names(schema: dict[str, Any]) -> None:
    """JSON schema of ``eval.evaluators``: the mapping, or the list of names it may be given
    as (the Prefect server validates deployment parameters against this schema)."""
    mapping = {k: v for k, v in schema.items() if k not in ("title", "description", "default")}
    names = {"type": "array", "items": {"type": "string", "enum": list(EVALUATOR_NAMES)}}
    for key in mapping:
        del schema[key]
    schema["anyOf"] = [mapping, names]


class EvaluatorSpec(BaseModel):
    """One evaluator of ``eval.evaluators``: the module that computes it (``type``, a file of
    ``ensemble_core/evaluators/``) and its options (every other key, checked against that
    module's ``Options`` before any compute, by the preflight)."""

    # ``type`` may be left out (it defaults to the evaluator's name, filled in by
    # EvalConfig before this model validates), so the JSON schema does not require it.
    model_config = ConfigDict(extra="allow", frozen=True, json_schema_extra=lambda schema: schema.pop("required", None))

    type: Literal[EVALUATOR_NAMES] = Field(  # type: ignore[valid-type]
        description="The evaluator module: 'test', 'rotation', 'translation', 'corruptions', 'letters', "
        "'fashion_mnist' or 'ood' (default: the evaluator's name)."
    )
    ece_bins: int | None = Field(
        None,
        ge=2,
        le=1000,
        description="Bins of this evaluator's ECE and adaptive ECE (2..1000; default: eval.ece_bins). "
        "uncertainty-baselines uses 10 for MNIST, 15 for CIFAR.",
    )

    def bins(self, default: int) -> int:
        """This evaluator's ECE bins: ``ece_bins``, or ``default`` (``eval.ece_bins``) when unset."""
        return default if self.ece_bins is None else self.ece_bins

    @property
    def options(self) -> dict[str, Any]:
        """The options given (every key but ``type``); unset options take the module's defaults."""
        return dict(self.model_extra or {})


class EvalConfig(BaseModel):
    """Evaluation on the test split."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    batch_size: int = Field(
        250, ge=1, le=MAX_DIM, description="Test examples per device per forward pass (250 measured fastest on CPU)."
    )
    ece_bins: int = Field(
        15,
        ge=2,
        le=1000,
        description="Bins for ECE (equal width) and adaptive ECE (equal mass), 2..1000; an evaluator's own "
        "ece_bins overrides it.",
    )
    temperature_scaling: bool = Field(
        False,
        description="Fit one temperature for the ensemble on the validation NLL (Guo et al. 2017, applied to "
        "the log of the ensemble's mean probabilities) and report the test and shift figures before and after; "
        "predictions then carry the scaled probabilities.",
    )
    evaluators: dict[str, EvaluatorSpec] = Field(
        default_factory=lambda: {name: EvaluatorSpec(type=name, **opts) for name, opts in default_evaluators().items()},
        description="Evaluators run after training, by name, each with its own options: "
        "{name: {type: <module>, <option>: <value>, ...}}, e.g. {test: {}, rotation: {degrees: [0, 45, 90]}, "
        "rotation_fine: {type: rotation, degrees: [0, 5, 10]}}; a list of names is short for {name: {}}. Types, "
        "modules of ensemble_core/evaluators/: 'test' (the test split: accuracy, NLL, Brier, ECE, diversity; "
        "required), 'rotation', 'translation', 'corruptions' (MNIST-C) under dataset shift, 'letters' and "
        "'fashion_mnist' out of distribution (digits), 'ood' out of distribution for any dataset (a synthetic set, "
        "or another dataset: {type: ood, source: uniform_noise|gaussian_noise|constant|tfds|image_folder|arrays, "
        "...}), 'common_corruptions' (Hendrycks & Dietterich's 15 corruptions at 5 severities, any dataset). "
        "Default, by dataset: test, rotation, translation, common_corruptions and ood (uniform_noise, or "
        "held_out_classes with data.classes), plus corruptions, letters and fashion_mnist for mnist and mnist5k. "
        "Results are stored under the name (report.json evaluations.<name>, eval/<name>.npz).",
        json_schema_extra=_or_a_list_of_names,
    )

    @field_validator("evaluators", mode="before")
    @classmethod
    def _by_name(cls, value: Any) -> Any:
        """A list of names -> ``{name: {}}``; ``type`` defaults to the name."""
        if isinstance(value, list | tuple):
            names = [str(v) for v in value]
            if len(set(names)) != len(names):
                raise ValueError("an evaluator is listed twice")
            value = {name: {} for name in names}
        if not isinstance(value, dict):
            return value  # pydantic refuses it with the expected type
        specs = {}
        for name, spec in value.items():
            if not isinstance(name, str) or not _INSTANCE_NAME.fullmatch(name):
                raise ValueError(f"evaluator name {name!r} is not a lower-case identifier ([a-z][a-z0-9_]*)")
            if spec is None:
                spec = {}
            if isinstance(spec, EvaluatorSpec):
                bins = {} if spec.ece_bins is None else {"ece_bins": spec.ece_bins}
                spec = {"type": spec.type, **bins, **spec.options}
            if not isinstance(spec, dict):
                raise ValueError(f"evaluator {name!r} must be a mapping of its options, not {type(spec).__name__}")
            specs[name] = {"type": name, **spec} if "type" not in spec else spec
        return specs

    @field_validator("evaluators")
    @classmethod
    def _test_first(cls, specs: dict[str, EvaluatorSpec]) -> dict[str, EvaluatorSpec]:
        if "test" not in specs or specs["test"].type != "test":
            raise ValueError(
                "'test' must be one of the evaluators, of type test (the report and the champion are judged on it)"
            )
        return specs
