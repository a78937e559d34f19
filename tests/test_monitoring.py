"""The monitoring of unlabelled drops (ensemble_core/runs/monitoring): one night's figures
against hand computations and SciPy, the headline estimator's choice and refusals, the
history's rows and plot. The flow's command line is in tests/test_predict_images_cli.py, its
deployment and the retrain-on-drift automation in tests/test_deployment.py."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from scipy import stats

from ensemble_core.accuracy_estimation import fit_reference
from ensemble_core.drift_tests import reference_from
from ensemble_core.errors import ConfigError, DataError
from ensemble_core.runs.monitoring import drop, history


def _members(rng, e: int, n: int, c: int, sharp: float) -> np.ndarray:
    logits = rng.normal(0, sharp, (e, n, c))
    p = np.exp(logits - logits.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)).astype(np.float32)


def _result(member_probs: np.ndarray, names=None, decisions: bool = True) -> dict:
    mean = member_probs.mean(0)
    out = {
        "member_probs": member_probs,
        "predicted_class": mean.argmax(-1),
        "class_names": np.asarray(names or [f"c{i}" for i in range(member_probs.shape[2])]),
        "temperature": np.float32(np.nan),
    }
    if decisions:
        out["prediction_set"] = mean >= 0.3
        out["abstain"] = mean.max(-1) < 0.5
    return out


@pytest.fixture
def references():
    rng = np.random.default_rng(0)
    ref = _members(rng, 3, 400, 4, 2.0)
    labels = ref.mean(0).argmax(-1).copy()
    labels[:80] = (labels[:80] + 1) % 4  # 80% accurate
    return ref, reference_from(ref), fit_reference(ref, labels)


def test_night_figures_against_hand_computation_and_scipy(references):
    _, drift_ref, acc_ref = references
    rng = np.random.default_rng(1)
    new = _members(rng, 3, 300, 4, 0.7)  # flatter: more entropy, more disagreement
    result = _result(new)
    night = drop.summarize(result, drift_ref, acc_ref, alpha=0.05)

    preds = new.argmax(-1)  # the members' votes
    pairs = [np.mean(preds[i] != preds[j]) for i in range(3) for j in range(i + 1, 3)]
    assert night["accuracy"]["estimator"] == "disagreement"
    assert night["accuracy"]["estimate"] == pytest.approx(1 - np.mean(pairs))
    mean = new.astype(np.float64).mean(0)
    assert night["accuracy"]["estimates"]["average_confidence"] == pytest.approx(mean.max(-1).mean(), abs=1e-6)
    doc = acc_ref.accuracy - (acc_ref.mean_confidence - mean.max(-1).mean())
    assert night["accuracy"]["estimates"]["doc"] == pytest.approx(doc, abs=1e-6)

    entropy = -(mean * np.log(mean)).sum(-1)
    raw = stats.ks_2samp(np.asarray(drift_ref.entropy), entropy).pvalue
    test = night["drift"]["tests"]["predictive_entropy"]
    assert test["p_value"] == pytest.approx(raw, rel=1e-6)
    assert test["p_adjusted"] >= test["p_value"] and night["drifted"] is True
    assert drop.p_values(night)["predictive_entropy"] == test["p_adjusted"]

    assert night["abstention_rate"] == pytest.approx(np.mean(mean.max(-1) < 0.5))
    assert night["mean_set_size"] == pytest.approx((mean >= 0.3).sum(1).mean())
    counts = np.bincount(mean.argmax(-1), minlength=4)
    assert night["class_counts"] == {f"c{i}": int(counts[i]) for i in range(4)}
    assert sum(night["class_frequencies"].values()) == pytest.approx(1.0)
    assert night["reference_class_frequencies"]["c0"] == pytest.approx(drift_ref.class_counts[0] / 400)


def test_a_sample_of_the_reference_distribution_is_not_flagged(references):
    ref, drift_ref, acc_ref = references
    rng = np.random.default_rng(2)
    new = ref[:, rng.choice(400, 150, replace=False)]
    night = drop.summarize(_result(new), drift_ref, acc_ref, alpha=0.05)
    assert night["drifted"] is False
    assert min(drop.p_values(night).values()) > 0.05


def test_headline_estimator_falls_back_for_one_member_or_no_reference(references):
    ref, _, acc_ref = references
    one = ref[:1]
    assert drop.choose_estimator("auto", 3, acc_ref) == "disagreement"
    assert drop.choose_estimator("auto", 1, fit_reference(one, one.mean(0).argmax(-1))) == "doc"
    assert drop.choose_estimator("auto", 1, None) == "average_confidence"
    night = drop.summarize(_result(ref[:, :50], decisions=False), None, None)
    assert set(night["accuracy"]["estimates"]) == {"average_confidence", "agreement_with_ensemble", "disagreement"}
    assert night["drift"] is None and night["abstention_rate"] is None
    assert [line.split(":")[0] for line in night["not_computed"]] == [
        "fitted estimators (ATC, DoC, agreement_corrected)",
        "drift tests",
        "abstention and prediction sets",
    ]


def test_refusals_name_the_problem(references):
    ref, drift_ref, acc_ref = references
    with pytest.raises(ConfigError, match="not one of"):
        drop.check_settings(0.05, "accuracy")
    with pytest.raises(ConfigError, match=r"alpha 1.5 is not in \(0, 1\)"):
        drop.check_settings(1.5, "auto")
    with pytest.raises(ConfigError, match="needs two members"):
        drop.choose_estimator("disagreement", 1, None)
    with pytest.raises(ConfigError, match="no calibration split"):
        drop.choose_estimator("doc", 3, None)
    with pytest.raises(DataError, match="no image"):
        drop.summarize(_result(ref[:, :0]), drift_ref, acc_ref)
    with pytest.raises(ConfigError, match="letters, digits"):
        drop.check_night("../escape")
    assert drop.night_id("my drop/../x", __import__("datetime").datetime(2026, 1, 2, 3, 4, 5)) == (
        "20260102T030405Z-my-drop-..-x"
    )


def test_references_of_another_temperature_are_refused_either_way(references):
    ref, drift_ref, acc_ref = references
    scaled = _result(ref[:, :50])
    scaled["temperature"] = np.float32(1.5)  # the ensemble scaled, the references fitted without
    with pytest.raises(DataError, match=r"temperature None, its ensemble now has 1\.5"):
        drop.summarize(scaled, drift_ref, acc_ref)
    unscaled = _result(ref[:, :50])  # the references fitted with a temperature, the ensemble without
    with pytest.raises(DataError, match=r"temperature 2\.0, its ensemble now has None"):
        drop.summarize(unscaled, reference_from(ref, 2.0), None)


def test_empty_prediction_sets_are_counted_apart_from_the_mean_size(references):
    _, drift_ref, acc_ref = references
    rng = np.random.default_rng(3)
    result = _result(_members(rng, 3, 100, 4, 0.3))
    sizes = result["prediction_set"].sum(1)
    night = drop.summarize(result, drift_ref, acc_ref)
    assert night["empty_set_rate"] == pytest.approx(np.mean(sizes == 0)) and night["empty_set_rate"] > 0
    assert night["mean_set_size"] == pytest.approx(sizes.mean())


def _row(night: str, estimate: float, drifted: bool) -> dict:
    return {
        "night": night,
        "time": "2026-01-01T00:00:00+00:00",
        "n_images": 10,
        "estimator": "disagreement",
        "estimate": estimate,
        "estimates": {"disagreement": estimate},
        "p_values": {"predictive_entropy": 1e-6 if drifted else 0.5},
        "drifted": drifted,
        "alpha": 0.05,
        "class_frequencies": {"a": 1.0},
    }


def test_history_is_idempotent_per_night_keeps_order_and_drops_bad_lines(tmp_path, caplog, monkeypatch):
    history.append_history(tmp_path, _row("n1", 0.9, False))
    history.append_history(tmp_path, _row("n2", 0.7, True))
    rows = history.append_history(tmp_path, _row("n1", 0.8, False))  # a retried night replaces its row
    assert [(r["night"], r["estimate"]) for r in rows] == [("n2", 0.7), ("n1", 0.8)]
    path = tmp_path / "monitoring" / "history.jsonl"
    path.write_bytes(path.read_bytes() + b"{not json\n")
    with caplog.at_level(logging.WARNING):
        assert [r["night"] for r in history.read_history(tmp_path)] == ["n2", "n1"]
    assert "line 3 is not a monitored night" in caplog.text
    # The plot: what it draws (recorded as it is saved), and the PNG's pixels.
    from PIL import Image

    from ensemble_core import plotting

    seen = {}
    real_save = plotting.save

    def recording(fig, path):
        top, bottom = fig.axes
        seen["top"] = {line.get_label(): list(line.get_ydata()) for line in top.get_lines()}
        seen["bottom"] = {line.get_label(): list(line.get_ydata()) for line in bottom.get_lines()}
        seen["x"] = [list(line.get_xdata()) for line in (*top.get_lines(), *bottom.get_lines())]
        seen["shaded"] = [[p.get_x(), p.get_x() + p.get_width()] for p in (*top.patches, *bottom.patches)]
        seen["ticks"] = [t.get_text() for t in bottom.get_xticklabels()]
        seen["log"] = bottom.get_yscale()
        return real_save(fig, path)

    monkeypatch.setattr(plotting, "save", recording)
    png = history.plot_history(rows, tmp_path / "monitoring" / "history.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list(seen["top"].values()) == [pytest.approx([70.0, 80.0])]  # the rows' estimates, in %, in order
    assert seen["bottom"] == {"predictive_entropy": pytest.approx([1e-6, 0.5]), "alpha": pytest.approx([0.05, 0.05])}
    assert all(x == [0, 1] for x in seen["x"]) and seen["ticks"] == ["n2", "n1"] and seen["log"] == "log"
    assert seen["shaded"] == [pytest.approx([-0.4, 0.4])] * 2  # the drifted night n2, on both panels
    with Image.open(png) as image:
        pixels = np.asarray(image.convert("RGB"))
    assert pixels.shape == (600, 600, 3)  # 6 x 6 inches at 100 dpi
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 50  # curves, text: not blank
    c0 = (31, 119, 180)  # matplotlib's C0, the estimate's curve
    assert (pixels == c0).all(-1).sum() > 50
    with pytest.raises(ValueError, match="no monitored night"):
        history.plot_history([], tmp_path / "x.png")


def test_report_and_history_row_carry_the_figures(references):
    ref, drift_ref, acc_ref = references
    night = drop.summarize(_result(ref[:, :100]), drift_ref, acc_ref)
    record = {**night, "night": "n", "time": "t", "champion_run": "r"}
    row = history.history_row(record)
    assert row["estimate"] == night["accuracy"]["estimate"] and row["p_values"] == drop.p_values(night)
    json.dumps(row)  # JSON-able as written
    md = drop.report_markdown(record)
    assert "**disagreement** (headline)" in md and "| predictive_entropy | ks_2samp |" in md
    assert any(line.startswith("drift tests (Holm, alpha 0.05)") for line in drop.summary_lines(record))


def test_retention_leaves_the_monitoring_directory_alone(tmp_path):
    """The history's lock file (``monitoring/.lock``) once made retention count the folder
    as an unfinished run; it is the output directory's own, like ``corrupt-state``."""
    from ensemble_core.config.nightly_section import RetentionConfig
    from ensemble_core.runs.champion.retention import apply_retention

    history.append_history(tmp_path, _row("n1", 0.9, False))
    assert (tmp_path / "monitoring" / ".lock").exists()
    report = apply_retention(tmp_path, RetentionConfig())
    assert "monitoring" not in report.kept and not report.pruned
    assert history.read_history(tmp_path)[0]["night"] == "n1"
