"""The run layer: atomic writes, the resume policy, the evaluator interface, run()."""

import json
import types

import numpy as np
import pytest

from ensemble_core import atomic, evaluators, metrics, runs
from ensemble_core import ensemble_setup as setup
from ensemble_core.config import PipelineConfig, load_config
from ensemble_core.errors import ConfigError, IncompatibleRunError
from ensemble_core.runs.storage import layout
from ensemble_core.runs.storage.resume import check_resumable
from flows.command_line import in_flags
from tests.ensembles import tiny_config

# MARK: atomic writes


def test_a_failed_write_leaves_the_previous_file_and_no_temporary(tmp_path):
    path = tmp_path / "report.json"
    atomic.atomic_write_json(path, {"old": 1})

    def half_then_fail(f):
        f.write(b'{"new": ')
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        atomic.atomic_write(path, half_then_fail)
    assert json.loads(path.read_text()) == {"old": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_atomic_writes_get_the_permissions_open_gives(tmp_path):
    plain = tmp_path / "plain"
    plain.write_text("x")  # what open() gives under this process's umask
    atomic.atomic_write_text(tmp_path / "atomic", "x")
    assert (tmp_path / "atomic").stat().st_mode & 0o777 == plain.stat().st_mode & 0o777


def test_atomic_savez_round_trips_arrays(tmp_path):
    probs = np.random.default_rng(0).dirichlet(np.ones(10), size=(3, 7)).astype(np.float32)
    atomic.atomic_savez(tmp_path / "eval" / "x.npz", member_probs=probs, labels=np.arange(7, dtype=np.int32))
    with np.load(tmp_path / "eval" / "x.npz") as f:
        np.testing.assert_array_equal(f["member_probs"], probs)
        assert f["labels"].dtype == np.int32


# MARK: the resume policy


def _saved(cfg: PipelineConfig, epoch: int = 2, members: int | None = None) -> dict:
    members = setup.plan(cfg).padded_members if members is None else members
    return {"config": cfg.model_dump(mode="json"), "epoch": epoch, "members_trained": members}


def test_resume_allows_more_epochs_and_other_devices_only(tmp_path):
    cfg = load_config(None, ["ensemble.size=4", "train.epochs=3"])
    saved = _saved(cfg)
    check_resumable(saved, load_config(None, ["ensemble.size=4", "train.epochs=5", "mesh.data=2"]), tmp_path, 4)
    with pytest.raises(IncompatibleRunError, match=r"seed: 0 -> 1.*fix: use a new run_name"):
        check_resumable(saved, cfg.model_copy(update={"seed": 1}), tmp_path, 4)
    with pytest.raises(IncompatibleRunError, match="already trained 2 epochs"):
        check_resumable(saved, load_config(None, ["ensemble.size=4", "train.epochs=1"]), tmp_path, 4)
    with pytest.raises(IncompatibleRunError, match="trained 4 members"):
        check_resumable(saved, cfg, tmp_path, 8)


def test_core_names_parameters_and_the_cli_names_flags(tmp_path):
    (tmp_path / "output_dir").write_text("")  # a path that contains a parameter's name
    with pytest.raises(ConfigError) as err:
        layout.check_output_dir(tmp_path / "output_dir")
    assert str(err.value).endswith("fix: pass a directory to output_dir")
    assert in_flags(str(err.value)) == str(err.value).replace("to output_dir", "to --output-dir")
    assert in_flags("x; fix: use a new run_name; data.data_dir and my_run_name_x stay") == (
        "x; fix: use a new --run-name; data.data_dir and my_run_name_x stay"
    )


# MARK: registries


def test_models_and_evaluators_are_looked_up_by_module_name():
    with pytest.raises(ConfigError, match=r"model.name.*'cnn'.*'mlp'.*'resnet'"):
        load_config(None, ["model.name=resnet9000"])
    with pytest.raises(ConfigError, match=r"model.name.*not an import path"):
        load_config(None, ["model.name=my-models:build"])
    assert load_config(None, ["model.name=my_models.nets:build"]).model.name == "my_models.nets:build"
    with pytest.raises(ConfigError, match="'test' must be one of the evaluators"):
        load_config(None, ["eval.evaluators=[]"])
    with pytest.raises(ConfigError, match="unknown evaluator 'nope'"):
        evaluators.get("nope")
    assert evaluators.get("test").__name__ == "ensemble_core.evaluators.test"


@pytest.mark.slow  # over 1 CPU s with a warm compilation cache: make test-fast leaves it out (docs/development.md)
def test_a_run_without_figures_writes_every_metric_and_array_and_says_so(tmp_path, tfds_dir):
    """eval.plots=false (configs/tiny.yaml): no figure is drawn, the arrays and metrics are all
    there, and report.md says why it shows no figures. The same run's figures, with it true, are
    test_flow.py's finished run."""
    cfg = tiny_config(tfds_dir, "eval.evaluators=[test, rotation]", "promotion.enabled=false")
    assert cfg.eval.plots is False
    run = runs.run(cfg, tmp_path, "r").run_dir
    assert not run.plots.exists() or not any(run.plots.iterdir())
    report = json.loads(run.report_json.read_text())
    assert report["plots"] == {} and report["evaluations"]["rotation"]["plots"] == {}
    assert {"accuracy", "nll", "ece"} <= set(report["ensemble"])  # the test figures, computed
    with np.load(run.eval_dir / "rotation.npz") as f:
        assert f["member_probs"].shape[0] == 2  # the rotation arrays, written
    markdown = run.report_md.read_text()
    assert "Figures: not drawn (eval.plots is false)." in markdown and "![" not in markdown


@pytest.mark.slow  # over 1 CPU s with a warm compilation cache: make test-fast leaves it out (docs/development.md)
def test_an_evaluator_brings_its_data_metrics_arrays_and_report_section(tmp_path, tfds_dir, monkeypatch):
    """The interface the shift/OOD evaluators build on: a transformed test set, its own
    metric, its arrays in eval/<name>.npz and its section of report.json and report.md."""

    def evaluate(ctx):
        images, labels = ctx.load("test")
        flipped = images[:, :, ::-1]  # a shifted copy of the test split
        probs, _ = ctx.predict(flipped)
        return evaluators.EvaluatorOutput(
            metrics={"ensemble_accuracy": metrics.accuracy(metrics.ensemble_probs(probs), labels)},
            arrays={"member_probs": probs, "labels": labels},
        )

    fake = types.SimpleNamespace(
        __name__="flipped", evaluate=evaluate, markdown=lambda m: [f"Flipped: {m['ensemble_accuracy']:.4f}"]
    )
    real_get = evaluators.get
    monkeypatch.setattr(evaluators, "get", lambda name: fake if name == "flipped" else real_get(name))
    cfg = tiny_config(tfds_dir, "data.max_test_examples=120", "promotion.enabled=false")
    from ensemble_core.config import EvaluatorSpec

    specs = {"test": EvaluatorSpec(type="test"), "flipped": EvaluatorSpec.model_construct(type="flipped")}
    cfg = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"evaluators": specs})})

    result = runs.run(cfg, tmp_path, "r")

    run = result.run_dir
    with np.load(run.eval_dir / "flipped.npz") as f:
        probs, labels = f["member_probs"], f["labels"]
    assert probs.shape == (2, 120, 10)
    expected = float(np.mean(probs.mean(0).argmax(-1) == labels))
    report = json.loads(run.report_json.read_text())
    assert report["evaluations"]["flipped"]["metrics"]["ensemble_accuracy"] == pytest.approx(expected)
    assert f"Flipped: {expected:.4f}" in run.report_md.read_text()
    # the test split's figures stay where they were, computed from predictions.npz
    with np.load(run.predictions) as f:
        test_accuracy = float(np.mean(f["member_probs"].mean(0).argmax(-1) == f["labels"]))
    assert report["ensemble"]["accuracy"] == pytest.approx(test_accuracy)
    assert not np.array_equal(probs, np.load(run.predictions)["member_probs"])
