"""Where a run's time goes: ``ensemble_core.timing`` and ``report.json -> timing.stages``.

The stopwatch is checked against a fake clock; a whole run's stage times against timers
this test wraps around every stage from outside (``runs.Stages``) and its own wall clock
around :func:`ensemble_core.runs.run`.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from ensemble_core import timing

ROOT = Path(__file__).resolve().parents[1]


class FakeClock:
    """``time.perf_counter`` that advances only when told to."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", fake)
    return fake


def test_parts_nest_accumulate_and_leave_the_rest_as_other(clock):
    with timing.measure() as span:
        clock.now += 1.0  # unattributed
        with timing.part("a"):
            clock.now += 2.0
            with timing.part("inner"):
                clock.now += 0.5
        with timing.part("b"):
            clock.now += 3.0
        with timing.part("a"):  # entered again: accumulates
            clock.now += 4.0
    assert span.seconds == pytest.approx(10.5)
    out = span.to_json()
    assert out["seconds"] == pytest.approx(10.5)
    parts = out["parts"]
    assert list(parts) == ["a", "b", "other"]  # first-entry order, the remainder last
    assert parts["a"]["seconds"] == pytest.approx(6.5)
    assert parts["a"]["parts"]["inner"]["seconds"] == pytest.approx(0.5)
    assert parts["a"]["parts"]["other"]["seconds"] == pytest.approx(6.0)
    assert parts["b"] == {"seconds": pytest.approx(3.0)}
    assert parts["other"]["seconds"] == pytest.approx(1.0)


def test_a_part_outside_a_measurement_records_nothing_and_a_new_measurement_is_its_own_root(clock):
    with timing.part("nowhere"):
        clock.now += 1.0
    with timing.measure() as outer, timing.part("x"), timing.measure() as inner, timing.part("y"):
        clock.now += 2.0
    assert list(outer.parts) == ["x"] and outer.parts["x"].parts == {}  # y went to the inner root
    assert list(inner.parts) == ["y"] and inner.seconds == pytest.approx(2.0)
    with pytest.raises(ValueError, match="reserved"), timing.measure(), timing.part("other"):
        pass


def test_a_part_is_closed_when_its_block_raises(clock):
    with timing.measure() as span:
        with pytest.raises(RuntimeError), timing.part("fails"):
            clock.now += 1.5
            raise RuntimeError("boom")
        with timing.part("after"):
            clock.now += 1.0
    assert span.parts["fails"].seconds == pytest.approx(1.5)
    assert "after" in span.parts and span.parts["fails"].parts == {}


def _config(tfds_dir: str):
    from ensemble_core.config import load_config

    return load_config(
        str(ROOT / "configs" / "tiny.yaml"),
        [
            f"data.data_dir={tfds_dir}",
            "eval.evaluators={test: {}, rotation: {degrees: [0, 90], selective_degrees: 90}, "
            "ood: {source: uniform_noise}}",
            # the tiny config draws no figures; this test times the plotting too
            "eval.plots=true",
        ],
    )


@pytest.mark.slow
def test_stage_times_add_up_to_the_runs_wall_time_and_match_outside_timers(tfds_dir, tmp_path, monkeypatch):
    """Every stage of a run is in ``timing.stages``, each within 5% (or 50 ms) of a timer
    wrapped around it from outside, and they add up to the wall time of ``runs.run``
    measured here within 5%; training's and evaluation's parts add up to their stage.
    Evaluation predicts each distinct image set once: the test split once (its logits and
    their softmax), rotation's 0 degrees not again, and each program is warmed up once.

    Why slow: a whole (tiny) run, about 10 s."""
    from ensemble_core import runs
    from ensemble_core.runs.ensemble import load as ensemble_load

    predicted: list[tuple[int, bool]] = []  # (images, logits) of each Members.predict in evaluation
    passes: list[int] = []  # every member_probs call
    warm_ups: list[int] = []  # every compile_member_probs call (evaluation's warm-ups)
    in_evaluation = []
    original_predict, original_passes = ensemble_load.Members.predict, ensemble_load.member_probs
    original_warm_up = ensemble_load.compile_member_probs

    def predict(self, cfg, images, *, logits=False):
        if in_evaluation:
            predicted.append((len(images), logits))
        return original_predict(self, cfg, images, logits=logits)

    def member_probs(*args, **kwargs):
        if in_evaluation:
            passes.append(len(args[2]))
        return original_passes(*args, **kwargs)

    def compile_member_probs(predict, *args, **kwargs):
        if in_evaluation:
            warm_ups.append(len(args[1]))
        return original_warm_up(predict, *args, **kwargs)

    monkeypatch.setattr(ensemble_load.Members, "predict", predict)
    monkeypatch.setattr(ensemble_load, "member_probs", member_probs)
    monkeypatch.setattr(ensemble_load, "compile_member_probs", compile_member_probs)
    outside: dict[str, float] = {}

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                outside[name] = outside.get(name, 0.0) + time.perf_counter() - t0

        return wrapper

    base = runs.Stages()
    stages = runs.Stages(**{f.name: timed(f.name, getattr(base, f.name)) for f in dataclasses.fields(base)})
    evaluate = stages.evaluate

    def evaluating(*args, **kwargs):
        in_evaluation.append(True)
        try:
            return evaluate(*args, **kwargs)
        finally:
            in_evaluation.clear()

    stages = dataclasses.replace(stages, evaluate=evaluating)
    t0 = time.perf_counter()
    result = runs.run(_config(tfds_dir), tmp_path, "timed", stages)
    wall = time.perf_counter() - t0

    report = json.loads((result.run_dir.path / "report.json").read_text())
    t = report["timing"]
    recorded = t["stages"]
    # Stages' names in report.json -> the runs.Stages field this test timed
    field = {
        "preflight": "preflight",
        "prepare": "prepare",
        "unchanged_check": "check_unchanged",
        "drift_check": "detect_drift",
        "train": "train",
        "select": "select",
        "evaluate": "evaluate",
        "promote": "promote",
    }
    assert set(field) | {"class_map_check", "report"} == set(recorded)
    for name, f in field.items():
        assert recorded[name]["seconds"] == pytest.approx(outside[f], rel=0.05, abs=0.05), name
    # the report stage times itself up to writing report.json: inside the outside timer
    assert 0 < recorded["report"]["seconds"] <= outside["report"]
    total = sum(s["seconds"] for s in recorded.values())
    assert total == pytest.approx(wall, rel=0.05)
    assert t["wall_seconds"] == pytest.approx(wall, rel=0.05)
    for name in ("train", "evaluate"):
        parts = recorded[name]["parts"]
        assert sum(p["seconds"] for p in parts.values()) == pytest.approx(recorded[name]["seconds"], rel=1e-9)
    train = recorded["train"]["parts"]
    assert train["steps"]["seconds"] == result.training.timing.train_seconds > 0
    assert train["compile"]["seconds"] > 0 and train["validation"]["seconds"] > 0
    assert train["checkpoint writes"]["seconds"] > 0
    assert t["training_steps_seconds"] == pytest.approx(train["steps"]["seconds"])
    assert t["not_training_steps_fraction"] == pytest.approx(1 - train["steps"]["seconds"] / t["wall_seconds"])
    evaluate = recorded["evaluate"]["parts"]
    assert {"load ensemble", "test", "rotation", "ood", "waiting for writing and plotting", "other"} == set(evaluate)
    background = recorded["evaluate"]["background"]["writing and plotting"]
    for name in ("test", "rotation", "ood"):
        assert evaluate[name]["parts"]["forward passes"]["seconds"] > 0, name
        assert evaluate[name]["parts"]["metrics"]["seconds"] > 0, name  # its own scoring
        assert background[name] > 0, name  # the writer thread's time, beside the parts
    assert evaluate["test"]["parts"]["data"]["seconds"] > 0  # the first to read the test split
    assert evaluate["rotation"]["parts"]["derived sets"]["seconds"] > 0
    # scikit-learn's import, where an OOD evaluator is the first to need it, is a part of its own
    # (its metrics are a part of their own; test_command_timing bounds every "other")
    assert "imports" in evaluate["ood"]["parts"], evaluate["ood"]
    for plot in ("plots/reliability.png", "plots/rotation.png", "eval/rotation.npz"):
        assert (result.run_dir.path / plot).is_file(), plot
    # the run's result carries it, with retention (after the report) on top
    assert result.timing is not None and result.timing["stages"] == recorded
    assert result.timing["retention_seconds"] == pytest.approx(outside["retain"], rel=0.05, abs=0.05)
    assert "not training steps" in (result.run_dir.path / "report.md").read_text()
    # tiny.yaml: 200 test images; test + ood share one logits pass, rotation predicts 90 degrees
    # only, the noise is the ood set; the 51 calibration digits once, for the members' own
    # prediction-set and abstention rules (the ensemble's are decisions.json's): four forward
    # passes, two programs each warmed up once
    assert predicted == [(200, True), (51, False), (200, False), (200, True)]
    assert len(passes) == len(predicted)
    assert len(warm_ups) == 2  # the logits program and the softmax one, once each
