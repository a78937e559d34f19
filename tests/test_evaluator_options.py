"""Evaluators by name, each with its own options (``eval.evaluators``): the list form is
short for the mapping, one evaluator type runs under two names with other options, and a
bad name, type or option is refused in one line before any compute."""

import json

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, log_loss

from ensemble_core import evaluators, runs
from ensemble_core.config import load_config
from ensemble_core.errors import ConfigError
from tests.ensembles import tiny_config


def test_a_list_of_names_is_short_for_the_mapping():
    listed = load_config(None, ["eval.evaluators=[test, rotation, corruptions]"])
    mapped = load_config(None, ["eval.evaluators={test: {}, rotation: {type: rotation}, corruptions: null}"])
    assert listed == mapped
    assert [spec.type for spec in listed.eval.evaluators.values()] == ["test", "rotation", "corruptions"]
    assert listed.eval.evaluators["rotation"].options == {}
    # defaults of the options are the evaluators' published settings
    assert evaluators.options("rotation", listed.eval.evaluators["rotation"]).degrees == tuple(range(0, 181, 15))


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("[test, rotation, rotation]", "listed twice"),
        ("[rotation]", "'test' must be one of the evaluators"),
        ("{test: {type: rotation}}", "of type test"),
        ("{test: {}, r: {type: nope}}", "eval.evaluators.r.type"),
        ("{test: {}, Rot-2: {type: rotation}}", "not a lower-case identifier"),
        ("{test: {}, r: 3}", "mapping of its options"),
    ],
)
def test_bad_evaluator_names_and_types_are_one_line_errors(value, needle):
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"eval.evaluators={value}"])
    assert needle in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("{type: rotation, angles: [0, 90]}", "eval.evaluators.r.angles"),
        ("{type: rotation, degrees: [0, 400]}", "eval.evaluators.r"),
        ("{type: rotation, degrees: [0, 90], selective_degrees: 45}", "selective_degrees 45"),
        ("{type: translation, pixels: [30]}", "[0, 27]"),
        ("{type: corruptions, corruptions: [fog, snow]}", "among"),
        ("{type: letters, size: 3}", "eval.evaluators.r.size"),
    ],
)
def test_bad_options_are_refused_by_the_preflight_before_any_compute(tmp_path, tfds_dir, spec, needle):
    cfg = tiny_config(tfds_dir, f"eval.evaluators={{test: {{}}, r: {spec}}}")
    with pytest.raises(ConfigError) as err:
        runs.preflight(cfg, tmp_path / "runs", "r")
    assert needle in str(err.value) and "fix:" in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "runs").exists()


@pytest.fixture(scope="module")
def two_rotations(tmp_path_factory, tfds_dir):
    """One tiny run with rotation twice (every angle; 0 and 90 degrees only) and the
    corruptions evaluator on two corruptions."""
    out = tmp_path_factory.mktemp("options")
    cfg = tiny_config(
        tfds_dir,
        "train.epochs=1",
        "data.max_test_examples=100",
        "eval.evaluators={test: {}, rotation: {}, quarter: {type: rotation, degrees: [0, 90], selective_degrees: 90},"
        " corruptions: {corruptions: [fog, shot_noise]}}",
        "promotion.enabled=false",
        "eval.plots=true",
    )
    result = runs.run(cfg, out, "r")
    return result, json.loads(result.run_dir.report_json.read_text())


@pytest.mark.slow  # one tiny training with three shift evaluators
def test_each_instance_runs_with_its_own_options(two_rotations, monkeypatch, tmp_path):
    result, report = two_rotations
    every, quarter = report["evaluations"]["rotation"], report["evaluations"]["quarter"]
    assert every["type"] == quarter["type"] == "rotation"
    assert [r["level"] for r in quarter["metrics"]["levels"]] == [0.0, 90.0]
    assert len(every["metrics"]["levels"]) == 13
    # The same members on the same rotated digits: the 90-degree figures agree across the two.
    row = {r["level"]: r for r in every["metrics"]["levels"]}[90.0]
    assert quarter["metrics"]["levels"][1]["ensemble"] == pytest.approx(row["ensemble"], rel=1e-6)
    assert "selective_at_90" in quarter["metrics"] and "selective_at_60" in every["metrics"]
    # Each instance's arrays and plots under its own name; the figures recomputed from them.
    with np.load(result.run_dir.eval_dir / "quarter.npz") as f:
        probs, labels, level = f["member_probs"], f["labels"], f["level"]
    assert sorted(set(level.tolist())) == [0.0, 90.0]
    at = level == 90.0
    ens = probs[:, at].astype(np.float64).mean(0)
    assert quarter["metrics"]["levels"][1]["ensemble"]["accuracy"] == pytest.approx(
        accuracy_score(labels[at], ens.argmax(-1))
    )
    assert quarter["metrics"]["levels"][1]["ensemble"]["nll"] == pytest.approx(
        log_loss(labels[at], ens, labels=np.arange(10)), rel=1e-6
    )
    # Each instance's plots show its own levels and figures: drawn again by the rotation
    # evaluator's plot from report.json and the .npz (each figure recorded as it is saved),
    # equal pixel for pixel to the run's PNGs.
    from PIL import Image

    from ensemble_core.config import PipelineConfig
    from ensemble_core.evaluators import rotation, shift_base

    drawn = {}

    def recording(fig, path, real=shift_base.save):
        drawn[path.name] = fig.axes
        return real(fig, path)

    monkeypatch.setattr(shift_base, "save", recording)
    monkeypatch.setattr(rotation, "save", recording)
    cfg = PipelineConfig.model_validate(report["config"])
    for name, section in (("quarter", quarter), ("rotation", every)):
        with np.load(result.run_dir.eval_dir / f"{name}.npz") as f:
            arrays = dict(f)
        rotation.plot(section["metrics"], arrays, tmp_path, cfg, name=name)
        levels = [r["level"] for r in section["metrics"]["levels"]]
        for ax, figure in zip(drawn[f"{name}.png"], ("accuracy", "nll", "brier", "ece"), strict=True):
            assert ax.get_title() == f"{figure} under {name}"
            (line,) = (x for x in ax.get_lines() if x.get_label() == "ensemble")
            np.testing.assert_array_equal(line.get_xdata(), levels)
            want = [r["ensemble"][figure] for r in section["metrics"]["levels"]]
            np.testing.assert_allclose(line.get_ydata(), want, rtol=1e-12)
        selective = drawn[f"{name}_selective.png"][0].get_title()
        assert selective == f"Selective prediction at {90 if name == 'quarter' else 60} degrees"
        for file in (f"{name}.png", f"{name}_selective.png", f"{name}_examples.png"):
            with Image.open(result.run_dir.plots / file) as a, Image.open(tmp_path / file) as b:
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=file)
    names = [r["name"] for r in report["evaluations"]["corruptions"]["metrics"]["levels"]]
    assert names == ["fog", "shot_noise"]
    assert "**quarter** (rotation):" in result.run_dir.report_md.read_text()


@pytest.mark.slow
def test_instances_with_other_options_do_not_share_cached_arrays(two_rotations, tfds_dir):
    """The shifted test sets are cached by what they hold: the two rotations' angle sets,
    and a subset of the corruptions under a key of its own (its levels are indices)."""
    import re

    from ensemble_core.runs.evaluation.cache import derived_dir

    dataset = runs.dataset.prepare(load_config(None, [f"data.data_dir={tfds_dir}"]).data)
    cached = sorted(p.name for p in derived_dir(dataset).glob("*.npz"))
    assert "rotation-v1-n100-0_90.npz" in cached, cached
    assert any(re.fullmatch(r"rotation-v1-n100-0_15_30(_\d+)+\.npz", name) for name in cached), cached
    assert any(re.fullmatch(r"corruptions-[0-9a-f]{12}-v1-n100-0_1\.npz", name) for name in cached), cached
