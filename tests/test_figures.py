"""Figures of merit (ensemble_core.figures) and the names ensemble_core.config still exports."""

import dataclasses

import pytest

from ensemble_core import figures
from ensemble_core.config import PromotionConfig, load_config
from ensemble_core.errors import ConfigError

# The table ensemble_core.config held before the figures moved out of it.
OLD_FIGURE_HIGHER_IS_BETTER = {
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


def test_the_compatibility_names_hold_what_they_held():
    from ensemble_core.config import FIGURE_HIGHER_IS_BETTER, TEST_METRICS, figure_direction

    # Every old figure keeps its direction; "aupr" (OOD positive) became "aupr_out", beside
    # "aupr_in"; adaptive ECE and the accuracy at 80% coverage were added (issue 41).
    renamed = {"aupr": ("aupr_in", "aupr_out")}
    added = {"adaptive_ece": False, "accuracy_at_80_coverage": True}
    expected = {}
    for name, higher in OLD_FIGURE_HIGHER_IS_BETTER.items():
        for new in renamed.get(name, (name,)):
            expected[new] = higher
    assert {**expected, **added} == FIGURE_HIGHER_IS_BETTER
    assert TEST_METRICS == ("nll", "brier", "ece", "accuracy")
    assert figure_direction is figures.figure_direction


@pytest.mark.parametrize(
    "metric, higher",
    [
        ("nll", False),
        ("accuracy", True),
        ("rotation.mean.ensemble.nll", False),
        ("letters.ensemble.auroc.mutual_information", True),
        ("letters.ensemble.entropy.auroc", True),
        ("fashion_mnist.ensemble.fpr_at_95_tpr.max_prob", False),
        ("corruptions.mean.ensemble.aurc", False),
        ("letters.confident_ood_fraction.ensemble", False),
    ],
)
def test_a_promotion_metric_names_its_figure_and_direction(metric, higher):
    assert figures.figure_direction(metric) is higher
    assert figures.figure(metric).higher_is_better is higher
    assert load_config(None, [f"promotion.metric={metric}"]).promotion.metric == metric


@pytest.mark.parametrize(
    "metric, fragment",
    [
        ("auroc", "neither a test metric"),
        ("nosuch.ensemble.nll", "neither a test metric"),
        ("rotation..nll", "neither a test metric"),
        ("rotation.mean.ensemble.loss", "names none of the figures"),
    ],
)
def test_an_unknown_figure_is_refused(metric, fragment):
    with pytest.raises(ValueError, match=fragment):
        figures.figure(metric)
    with pytest.raises(ConfigError, match=r"config key 'promotion.metric'"):
        load_config(None, [f"promotion.metric={metric}"])


def test_figures_are_frozen_and_compare_in_their_direction():
    with pytest.raises(dataclasses.FrozenInstanceError):
        figures.NLL.higher_is_better = True
    with pytest.raises(TypeError):
        figures.FIGURES["nll"] = figures.ACCURACY
    assert figures.NLL.not_worse(0.2, 0.3) and figures.NLL.not_worse(0.3, 0.3) and not figures.NLL.not_worse(0.4, 0.3)
    assert figures.ACCURACY.not_worse(0.9, 0.8) and not figures.ACCURACY.not_worse(0.7, 0.8)
    assert all(name == f.name and f.label and f.source for name, f in figures.FIGURES.items())


def test_the_promotion_metric_description_agrees_with_the_figures():
    higher, lower = PromotionConfig.model_fields["metric"].description.split("higher is better;")
    for f in figures.FIGURES.values():
        assert f.label in (higher if f.higher_is_better else lower), f


def test_every_name_imported_from_ensemble_core_config_is_still_there():
    import ensemble_core.config as config

    names = [
        "AugmentConfig",
        "CheckpointConfig",
        "DataConfig",
        "DistributedConfig",
        "DriftConfig",
        "EnsembleConfig",
        "EvalConfig",
        "EvaluatorSpec",
        "MeshConfig",
        "ModelConfig",
        "NightlyConfig",
        "RetentionConfig",
        "PipelineConfig",
        "PromotionConfig",
        "TrainConfig",
        "PredictionSetsConfig",
        "AbstentionConfig",
        "Distribution",
        "SearchSpace",
        "load_config",
        "validate",
        "DuplicateKeyError",
        "MODEL_NAMES",
        "EVALUATOR_NAMES",
        "HOST_DEVICES",
        "MAX_SEED",
        "MAX_EPOCHS",
        "MAX_DIM",
        "MAX_WIDTH",
        "MAX_DEPTH",
        "MAX_HIDDEN_WEIGHTS",
        "MAX_CONFIG_BYTES",
        "FLOAT32_MAX",
        "FLOAT32_MIN_NORMAL",
        "FIGURE_HIGHER_IS_BETTER",
        "TEST_METRICS",
        "figure_direction",
    ]
    assert all(hasattr(config, n) for n in names), [n for n in names if not hasattr(config, n)]
    assert sorted(config.__all__) == sorted(names)
