"""promotion.metric is checked against the figures the configured evaluator really
produces, before any compute: a path that leads nowhere and an evaluator skipped on the
dataset are refused in one line (that the probe's figure paths equal a trained run's is
tests/test_evaluators.py::test_the_probe_produces_the_figure_paths_of_a_trained_run)."""

from __future__ import annotations

import pytest

from ensemble_core import data, runs
from ensemble_core.errors import ConfigError, DataError
from ensemble_core.runs.evaluation.figure_check import check_promotion_figure
from tests._cifar_mock import cifar10_tfds  # noqa: F401  (fixture)
from tests.ensembles import tiny_config


@pytest.mark.parametrize(
    "evaluators, metric, fragment",
    [
        ("[test,rotation]", "rotation.means.ensemble.nll", "e.g. rotation.mean.ensemble.nll"),
        ("[test,rotation]", "rotation.levels.99.ensemble.nll", "produces no figure at 'levels.99.ensemble.nll'"),
        ("[test,letters]", "letters.ensemble.entropy.auroc", "e.g. letters.ensemble.auroc.entropy"),
        ("[test,corruptions]", "corruptions.levels.14.aurc", "e.g. corruptions.levels."),
        ("[test,corruptions]", "corruptions.levels.14.ensemble.aurc", None),
        ("[test,corruptions]", "corruptions.mean.ensemble.aurc", None),
        ("[test,common_corruptions]", "common_corruptions.mean.ensemble.nll", None),
        ("[test,common_corruptions]", "common_corruptions.by_corruption.fog.best_member.ece", None),
        ("[test,ood]", "ood.ensemble.auroc.energy", None),
        ("[test,ood]", "ood.ensemble.aupr_in.disagreement", None),
        ("[test,ood]", "ood.ensemble.energy.auroc", "e.g. ood.ensemble.auroc."),
        ("[test,rotation]", "rotation.selective_at_60.ensemble.3.accuracy", None),
        ("[test,letters]", "letters.ensemble.auroc.mutual_information", None),
        ("[test]", "nll", None),
    ],
)
def test_a_promotion_path_is_checked_against_what_the_evaluator_produces(tfds_dir, evaluators, metric, fragment):
    cfg = tiny_config(tfds_dir, f"eval.evaluators={evaluators}", f"promotion.metric={metric}")
    dataset = data.prepare(cfg.data.name, cfg.data.data_dir)
    if fragment is None:
        check_promotion_figure(cfg, dataset)
        return
    with pytest.raises(ConfigError) as err:
        check_promotion_figure(cfg, dataset)
    msg = str(err.value)
    assert fragment in msg and "fix:" in msg and "\n" not in msg, msg


def test_an_evaluator_skipped_on_the_dataset_is_refused_in_preflight(tmp_path, cifar10_tfds):  # noqa: F811
    """The letters are 28x28x1: on CIFAR-10 they are skipped, so a promotion figure of
    theirs could never be compared; preflight says so and writes nothing."""
    cfg = tiny_config(
        cifar10_tfds,
        "data.name=cifar10",
        "data.validation_fraction=0",
        "train.batch_size=16",
        "eval.evaluators=[test,letters]",
        "promotion.metric=letters.ensemble.auroc.entropy",
    )
    out = tmp_path / "runs"
    # named by the user, letters cannot run on 32x32x3 images: refused before its figure is looked at
    with pytest.raises(DataError, match=r"letters.*cannot run on dataset 'cifar10'"):
        runs.preflight(cfg, out, "r")
    assert not out.exists()
