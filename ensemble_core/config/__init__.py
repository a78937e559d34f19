"""The run configuration: one pydantic model, nested by concern, and its loader.

The same model is the Prefect flow's parameter schema (each field's description shows up
in the deployment form) and what YAML files in ``configs/`` are validated against.
Unknown keys are errors, so a typo never silently falls back to a default.

Modules: :mod:`~ensemble_core.config.sections` (one model per section),
:mod:`~ensemble_core.config.pipeline` (:class:`PipelineConfig` and the checks across
sections), :mod:`~ensemble_core.config.limits` (bounds of the values),
:mod:`~ensemble_core.config.loader` (files, overrides, :func:`load_config`,
:func:`validate`), :mod:`~ensemble_core.config.strict_yaml` (YAML without duplicate keys),
:mod:`~ensemble_core.config.messages` (one-line errors). Which way each figure is better
lives outside, in :mod:`ensemble_core.figures`; the names below are re-exported for the
code that imports them from here.
"""

from ensemble_core.config.data_section import AugmentConfig, DataConfig
from ensemble_core.config.decision_section import AbstentionConfig, PredictionSetsConfig
from ensemble_core.config.eval_section import EvalConfig, EvaluatorSpec
from ensemble_core.config.limits import (
    FLOAT32_MAX,
    FLOAT32_MIN_NORMAL,
    HOST_DEVICES,
    MAX_CONFIG_BYTES,
    MAX_DEPTH,
    MAX_DIM,
    MAX_EPOCHS,
    MAX_HIDDEN_WEIGHTS,
    MAX_SEED,
    MAX_WIDTH,
)
from ensemble_core.config.loader import load_config, validate
from ensemble_core.config.nightly_section import DriftConfig, NightlyConfig, RetentionConfig
from ensemble_core.config.pipeline import PipelineConfig
from ensemble_core.config.sections import (
    CheckpointConfig,
    DistributedConfig,
    Distribution,
    EnsembleConfig,
    MeshConfig,
    ModelConfig,
    PromotionConfig,
    SearchSpace,
    TrainConfig,
)
from ensemble_core.config.strict_yaml import DuplicateKeyError
from ensemble_core.figures import FIGURE_HIGHER_IS_BETTER, TEST_METRICS, figure_direction
from ensemble_core.registry import EVALUATOR_NAMES, MODEL_NAMES

__all__ = [
    "EVALUATOR_NAMES",
    "FIGURE_HIGHER_IS_BETTER",
    "FLOAT32_MAX",
    "FLOAT32_MIN_NORMAL",
    "HOST_DEVICES",
    "MAX_CONFIG_BYTES",
    "MAX_DEPTH",
    "MAX_DIM",
    "MAX_EPOCHS",
    "MAX_HIDDEN_WEIGHTS",
    "MAX_SEED",
    "MAX_WIDTH",
    "MODEL_NAMES",
    "TEST_METRICS",
    "AbstentionConfig",
    "AugmentConfig",
    "CheckpointConfig",
    "DataConfig",
    "DistributedConfig",
    "Distribution",
    "DriftConfig",
    "DuplicateKeyError",
    "EnsembleConfig",
    "EvalConfig",
    "EvaluatorSpec",
    "MeshConfig",
    "ModelConfig",
    "NightlyConfig",
    "PipelineConfig",
    "PredictionSetsConfig",
    "PromotionConfig",
    "RetentionConfig",
    "SearchSpace",
    "TrainConfig",
    "figure_direction",
    "load_config",
    "validate",
]
