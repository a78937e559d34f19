"""The decision rules (prediction sets and abstention) of an ensemble and of its members,
against the conformal and selective primitives applied by hand; decisions.json's damage rule."""

import json

import numpy as np
import pytest
import scipy.special

from ensemble_core import conformal, decisions, selective
from ensemble_core.config import PipelineConfig
from ensemble_core.runs.storage.layout import RunDir
from ensemble_core.runs.storage.records import read_decisions, write_decisions


def _draw(e=4, n=400, c=6, seed=0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(1, n, c)) * 2 + rng.normal(size=(e, n, c))
    probs = scipy.special.softmax(logits, axis=-1)
    labels = np.array([rng.choice(c, p=p) for p in probs.mean(0)])
    return probs, labels


def test_the_ensemble_rules_are_those_of_its_temperature_scaled_mean_and_members_their_own():
    cfg = PipelineConfig.model_validate({"abstention": {"target_risk": 0.3}})
    probs, labels = _draw()
    healthy = np.array([True, True, False, True])
    fit = decisions.fit_all(probs, labels, healthy, 1.7, cfg.prediction_sets, cfg.abstention, "calibration")
    # Guo et al.'s temperature on the pooled probabilities: softmax(log(mean) / T)
    ens = scipy.special.softmax(np.log(probs[healthy].mean(0)) / 1.7, axis=-1)
    for method in conformal.METHODS:
        want = conformal.calibrate(ens, labels, method, 0.1)
        assert fit.ensemble.prediction_sets[method].threshold == pytest.approx(want.threshold)
    want = selective.select_threshold(ens.max(-1), ens.argmax(-1) == labels, 0.3, 0.05, criterion="max_probability")
    assert fit.ensemble.abstention.threshold == pytest.approx(want.threshold)
    assert fit.members[2] is None  # a diverged member has no rules
    lac = conformal.calibrate(probs[1], labels, "lac", 0.1)
    assert fit.members[1].prediction_sets["lac"].threshold == pytest.approx(lac.threshold)

    new, new_labels = _draw(seed=1)
    scored = fit.score(new, new_labels, healthy, best_member=3)
    per_member = [decisions.score_rules(fit.members[i], new[i], new_labels) for i in (0, 1, 3)]
    mean_lac = np.mean([m["prediction_sets"]["lac"]["coverage"] for m in per_member])
    assert scored["member_mean"]["prediction_sets"]["lac"]["coverage"] == pytest.approx(mean_lac)
    assert scored["best_member"] == per_member[2]
    new_ens = scipy.special.softmax(np.log(new[healthy].mean(0)) / 1.7, axis=-1)
    sets = conformal.prediction_sets(new_ens, fit.ensemble.prediction_sets["lac"])
    assert scored["ensemble"]["prediction_sets"]["lac"]["coverage"] == pytest.approx(
        sets[np.arange(len(new_labels)), new_labels].mean()
    )


def test_mutual_information_abstention_falls_back_to_max_probability_for_one_network():
    cfg = PipelineConfig.model_validate({"abstention": {"criterion": "mutual_information", "target_risk": 0.3}})
    probs, labels = _draw()
    fit = decisions.fit_all(probs, labels, np.ones(4, bool), None, cfg.prediction_sets, cfg.abstention, "validation")
    assert fit.ensemble.abstention.criterion == "mutual_information"
    assert all(m.abstention.criterion == "max_probability" for m in fit.members)
    applied = decisions.apply_rules(fit.ensemble, probs.mean(0), probs)
    mi = selective.confidence("mutual_information", probs.mean(0), probs)
    np.testing.assert_array_equal(applied["abstain"], mi < fit.ensemble.abstention.threshold)


def test_rules_survive_json_and_a_damaged_file_is_set_aside(tmp_path, caplog):
    cfg = PipelineConfig()
    probs, labels = _draw()
    rules = decisions.fit_rules(probs.mean(0), labels, cfg.prediction_sets, cfg.abstention, "calibration")
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    write_decisions(run, rules.to_dict())
    again = read_decisions(run)
    assert again == rules
    run.decisions_json.write_text(json.dumps({"method": "aps"}))  # no calibration in it
    assert read_decisions(run) is None
    assert not run.decisions_json.exists()
    assert list((tmp_path / "run" / "corrupt-state").iterdir())
    assert "decisions.json is damaged" in caplog.text
    write_decisions(run, None)  # removing what is absent is no error


def test_a_checkpoint_saved_before_the_calibration_split_does_not_resume_on_other_examples():
    """A saved config without data.calibration_fraction trained on every example less the
    validation split: resuming it under today's default (0.1) would train on other
    examples, so it is a change (refused as one); with the fraction 0 it resumes."""
    from ensemble_core.runs.storage.resume import config_changes, resumable

    saved = PipelineConfig().model_dump(mode="json")
    del saved["data"]["calibration_fraction"]
    changes = config_changes(saved, PipelineConfig())
    assert changes == {"data.calibration_fraction": (0.0, 0.1)} and not resumable("data.calibration_fraction")
    assert config_changes(saved, PipelineConfig.model_validate({"data": {"calibration_fraction": 0}})) == {}
