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
#: ``eval.protocol``: ``sampled`` (default) scores every shift level and corruption cell on a
#: seeded random sample of the test split (:func:`examples_per_level` images, the same at
#: every level), each figure with its 95% confidence interval; ``full`` scores every test
#: image at every level (the literature's protocol: Hendrycks & Dietterich 2019, Ovadia et al. 2019).
PROTOCOLS = ("sampled", "full")
#: The sampled protocol's floor per level: the sample size that bounds the 95% Wilson
#: interval of a level's accuracy to +-10 points at worst, ``n = z^2 p (1 - p) / E^2`` at
#: ``p = 0.5``, ``E = 0.1`` (96; the usual sample-size formula for a proportion, e.g. Cochran
#: 1977, "Sampling Techniques", eq. 4.2), rounded up.
MIN_EXAMPLES_PER_LEVEL = 100
#: The sampled protocol's budget: a shift evaluator's levels together score about this many
#: test splits' worth of images (spread evenly over its levels, never fewer than
#: :data:`MIN_EXAMPLES_PER_LEVEL` per level), so evaluation grows with the test split as the
#: test evaluator does, not with levels x test split (75 x for the common corruptions).
#: Measured on an image folder of 2,700 + 300 digits (2 shared cores): 10,300 shifted images
#: instead of 30,900, the shift evaluators' time halved, the evaluation stage 21-28% of the
#: training stage (docs/evaluation.md, "How many test images").
SHIFT_BUDGET_TEST_SPLITS = 3
#: ``eval.derived_cache_mb``'s default: the derived sets (shifted, corrupted and OOD images
#: cached beside a prepared dataset) of one dataset snapshot are kept within this many MiB;
#: the least recently used are removed first (:mod:`ensemble_core.runs.evaluation.cache`).
DEFAULT_DERIVED_CACHE_MB = 512


def examples_per_level(test_examples: int, levels: int, protocol: str = "sampled") -> int:
    """Test images per level (shift level, corruption cell) of a shift evaluator with
    ``levels`` levels on a test split of ``test_examples`` images, by ``eval.protocol``:
    ``full``: all of them; ``sampled``: ``ceil(SHIFT_BUDGET_TEST_SPLITS * test_examples /
    levels)``, at least :data:`MIN_EXAMPLES_PER_LEVEL`, at most the test split.

    Examples: 300 test images: 100 per common-corruption cell (75 cells, 7,500 images: the
    floor), 100 per rotation (13 angles); mnist5k's 1,000: 100 per cell, 231 per rotation,
    200 per translation; 10,000: 400 per cell, 2,308 per rotation.

    Raises:
      ValueError: an unknown protocol, or fewer than one level or test image.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown eval.protocol {protocol!r}; one of {PROTOCOLS}")
    if levels < 1 or test_examples < 1:
        raise ValueError(f"examples_per_level needs levels >= 1 and test_examples >= 1; got {levels}, {test_examples}")
    if protocol == "full":
        return test_examples
    share = -(-SHIFT_BUDGET_TEST_SPLITS * test_examples // levels)
    return min(test_examples, max(MIN_EXAMPLES_PER_LEVEL, share))


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
    ``rotation``, ``translation``, ``common_corruptions`` and an ``ood`` evaluator
    (``held_out_classes`` when ``data.classes`` holds classes out, else ``uniform_noise``) for
    every dataset; for digits (:data:`DIGIT_DATASETS` from TFDS) also MNIST-C
    ``corruptions``, ``letters`` and ``fashion_mnist`` (real OOD sets of other images), for
    every other dataset (a user's image folder or arrays, any other TFDS dataset)
    ``ood_patches``: its own test images with their patches shuffled (the same pixels, no
    meaning; :func:`ensemble_core.shifts.shuffle_patches`). How many test images each shift
    level scores is ``eval.protocol``'s (:func:`examples_per_level`), not set here.

    Args:
      name, source: ``data.name`` and ``data.source``; held_out: whether ``data.classes`` is set.
    """
    digits = source == "tfds" and name in DIGIT_DATASETS
    specs: dict[str, dict] = {
        "test": {},
        "rotation": {},
        "translation": {},
        "common_corruptions": {},
        "ood": {"source": "held_out_classes" if held_out else "uniform_noise"},
    }
    if digits:
        specs.update({"corruptions": {}, "letters": {}, "fashion_mnist": {}})
    else:
        specs["ood_patches"] = {"type": "ood", "source": "shuffled_patches"}
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
    protocol: Literal["sampled", "full"] = Field(
        "sampled",
        description="How many test images each shift level and corruption cell scores: 'sampled' (default) a "
        "seeded random sample of the test split, the same at every level, of max(100, 3 x test split / levels) "
        "images (at most the split), each figure with its 95% confidence interval; 'full' every test image at "
        "every level (the literature's protocol; up to levels / 3 times slower). An evaluator's "
        "own num_examples overrides it.",
    )
    derived_cache_mb: int = Field(
        DEFAULT_DERIVED_CACHE_MB,
        ge=0,
        le=2**30,
        description="Disk cap in MiB of the derived sets (shifted, corrupted and OOD images) cached beside one "
        "prepared dataset: the least recently used are removed to stay within it, a set larger than the cap is "
        "not kept (0: keep none).",
    )
    plots: bool = Field(
        True,
        description="Draw the run's figures: every evaluator's plots and training_curves.png in plots/, linked "
        "from report.md. false writes every metric, array and report without them: matplotlib's drawing, about "
        "0.2 CPU s per figure, is most of a small run's evaluation (27 figures in a run on the embedded digits). "
        "configs/tiny.yaml, a smoke test, sets false.",
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
        "or another dataset: {type: ood, source: uniform_noise|gaussian_noise|constant|shuffled_patches|tfds|"
        "image_folder|arrays, "
        "...}), 'common_corruptions' (Hendrycks & Dietterich's 15 corruptions at 5 severities, any dataset). "
        "Default, by dataset: test, rotation, translation, common_corruptions and ood (uniform_noise, or "
        "held_out_classes with data.classes), plus corruptions, letters and fashion_mnist for mnist and mnist5k, "
        "ood_patches (the test images with shuffled patches) for every other dataset. "
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
