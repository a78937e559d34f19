"""orbax round trip, keep-last-N, and a resume that continues exactly where it stopped."""

import json

import jax
import numpy as np
import pytest

from ensemble_core import ensemble_setup as setup
from ensemble_core import runs
from ensemble_core.errors import IncompatibleRunError
from ensemble_core.runs.storage.checkpoint import EnsembleCheckpointer
from tests.ensembles import tiny_config


def _cfg(tfds_dir, *extra):
    return tiny_config(
        tfds_dir, "model.hidden_sizes=[32]", "ensemble.size=4", "train.epochs=3", "checkpoint.keep=2", *extra
    )


def _run(cfg, run_dir):
    dataset = runs.prepare(cfg.data)
    return runs.train(cfg, dataset, run_dir), dataset


def _params(cfg, dataset, run_dir):
    runs.evaluate(cfg, dataset, run_dir)
    with np.load(run_dir / "predictions.npz") as f:
        return f["member_probs"]


@pytest.mark.slow
def test_round_trip_and_keep_last(tmp_path, tfds_dir):
    cfg = _cfg(tfds_dir)
    summary, _dataset = _run(cfg, tmp_path / "run")
    ckpt = EnsembleCheckpointer(tmp_path / "run" / "checkpoints", keep=2)
    assert ckpt.all_steps() == [16, 24]  # global steps: 8 per epoch
    meta = ckpt.read_meta()
    assert meta["epoch"] == 3
    assert meta["data_position"] == {"epoch": 3, "step_in_epoch": 0, "loss_sum": None, "accuracy_sum": None}
    assert meta["config"] == json.loads(cfg.model_dump_json())
    assert len(meta["history"]) == 3 and summary.checkpoint_step == 24
    ckpt.close()


@pytest.mark.slow
def test_resume_continues_where_it_stopped(tmp_path, tfds_dir):
    full_cfg = _cfg(tfds_dir)
    _, dataset = _run(full_cfg, tmp_path / "full")
    part_cfg = _cfg(tfds_dir, "train.epochs=1")
    _run(part_cfg, tmp_path / "resumed")
    summary, _ = _run(full_cfg, tmp_path / "resumed")
    assert summary.resumed_from == 1
    assert [r["epoch"] for r in summary.history] == [1, 2, 3]
    a = _params(full_cfg, dataset, tmp_path / "full")
    b = _params(full_cfg, dataset, tmp_path / "resumed")
    np.testing.assert_array_equal(a, b)


@pytest.mark.slow
@pytest.mark.parametrize(
    "change, named",
    [
        ("ensemble.size=2", "ensemble.size: 4 -> 2"),
        ("model.hidden_sizes=[16]", "model.hidden_sizes: [32] -> [16]"),
        ("train.learning_rate=0.05", "train.learning_rate: 0.1 -> 0.05"),
        ("train.batch_size=16", "train.batch_size: 32 -> 16"),
        ("train.optimizer=adam", "train.optimizer: 'sgd' -> 'adam'"),
        ("seed=3", "seed: 0 -> 3"),
        ("data.max_train_examples=128", "data.max_train_examples: 256 -> 128"),
    ],
)
def test_resume_under_another_config_is_refused_and_writes_nothing(tmp_path, tfds_dir, change, named):
    _run(_cfg(tfds_dir, "train.epochs=1"), tmp_path / "run")
    before = sorted((p.relative_to(tmp_path), p.stat().st_mtime_ns) for p in (tmp_path / "run").rglob("*"))
    # More epochs as well: the refusal must not train the new epochs under the new value.
    with pytest.raises(IncompatibleRunError, match=named.replace("[", r"\[").replace("]", r"\]")) as err:
        _run(_cfg(tfds_dir, change, "train.epochs=2"), tmp_path / "run")
    assert "fix:" in str(err.value) and "\n" not in str(err.value)
    after = sorted((p.relative_to(tmp_path), p.stat().st_mtime_ns) for p in (tmp_path / "run").rglob("*"))
    assert [p for p, _ in after if "lock" not in p.name] == [p for p, _ in before if "lock" not in p.name]
    assert EnsembleCheckpointer(tmp_path / "run" / "checkpoints").all_steps() == [8]


@pytest.mark.slow
def test_fewer_epochs_than_done_is_refused(tmp_path, tfds_dir):
    _run(_cfg(tfds_dir, "train.epochs=2"), tmp_path / "run")
    with pytest.raises(IncompatibleRunError, match=r"already trained 2 epochs.*train.epochs >= 2"):
        _run(_cfg(tfds_dir, "train.epochs=1"), tmp_path / "run")


@pytest.mark.slow
def test_sessions_record_what_each_part_of_training_used(tmp_path, tfds_dir):
    """1 epoch, then resumed to 3 epochs with other (allowed) checkpoint and mesh settings:
    two sessions, each with its epochs, steps and settings; the checkpoint holds them too."""
    first, _ = _run(_cfg(tfds_dir, "train.epochs=1"), tmp_path / "run")

    def spans(summary):
        return [(s["start_epoch"], s["end_epoch"], s["start_step"], s["end_step"]) for s in summary.sessions]

    assert spans(first) == [(0, 1, 0, 8)]
    second, _ = _run(_cfg(tfds_dir, "checkpoint.keep=3", "mesh.ensemble=2"), tmp_path / "run")
    assert spans(second) == [(0, 1, 0, 8), (1, 3, 8, 24)]
    one, two = second.sessions
    assert one["settings"]["train.epochs"] == 1 and two["settings"]["train.epochs"] == 3
    assert one["mesh"] == {"ensemble": 4, "data": 1} and two["mesh"] == {"ensemble": 2, "data": 1}
    assert two["changed"] == {"train.epochs": [1, 3], "checkpoint.keep": [2, 3], "mesh.ensemble": [None, 2]}
    meta = EnsembleCheckpointer(tmp_path / "run" / "checkpoints").read_meta()
    assert meta["sessions"] == second.sessions
    # A finished run re-run trains nothing and adds no session.
    third, _ = _run(_cfg(tfds_dir, "checkpoint.keep=3", "mesh.ensemble=2"), tmp_path / "run")
    assert third.sessions == second.sessions and third.timing.steps == 0


def test_sessions_of_a_previous_release_checkpoint_are_read():
    """Checkpoints of the previous release call the sessions ``stretches``: a resume reads
    them (and records new ones under ``sessions``)."""
    from ensemble_core.runs.storage.checkpoint import training_sessions

    old = {"stretches": [{"start_epoch": 0, "end_epoch": 1}]}
    assert training_sessions(old) == old["stretches"] and training_sessions(old) is not old["stretches"]
    assert training_sessions({"sessions": [{"start_epoch": 2}], "stretches": old["stretches"]}) == [{"start_epoch": 2}]
    assert training_sessions({}) == []


@pytest.mark.slow
def test_restore_onto_fewer_devices(tmp_path, tfds_dir):
    cfg = _cfg(tfds_dir, "train.epochs=1")
    _, _dataset = _run(cfg, tmp_path / "run")  # saved sharded over 4 devices
    ckpt = EnsembleCheckpointer(tmp_path / "run" / "checkpoints")
    one = setup.build(cfg, 10, num_devices=1)
    target = one.init_state(one.member_keys()["init"], (28, 28, 1))
    state, meta = ckpt.restore(target)
    ckpt.close()
    assert meta["epoch"] == 1
    leaf = state.params["Dense_0"]["kernel"]
    assert len(leaf.sharding.device_set) == 1 and int(state.step) == 256 // 32
    assert not np.allclose(np.asarray(leaf), np.asarray(target.params["Dense_0"]["kernel"]))
    assert jax.tree.structure(state) == jax.tree.structure(target)


@pytest.mark.slow
@pytest.mark.parametrize("stop_after_steps", [None, 11])  # None: right after epoch 1's checkpoint
def test_stop_then_resume_matches_an_uninterrupted_run(tmp_path, tfds_dir, stop_after_steps):
    from ensemble_core.errors import PreemptedError

    cfg = _cfg(tfds_dir)
    _, dataset = _run(cfg, tmp_path / "full")

    epochs_done, steps_done = [], []

    def should_stop():
        steps_done.append(1)
        return bool(epochs_done) if stop_after_steps is None else len(steps_done) >= stop_after_steps

    with pytest.raises(PreemptedError, match="rerun with the same run name"):
        runs.train(cfg, dataset, tmp_path / "stopped", on_epoch=epochs_done.append, should_stop=should_stop)
    summary, _ = _run(cfg, tmp_path / "stopped")
    assert summary.resumed_from == 1
    full = _run(cfg, tmp_path / "full")[0]
    assert summary.history == full.history  # partial-epoch sums survive the stop
    np.testing.assert_array_equal(_params(cfg, dataset, tmp_path / "full"), _params(cfg, dataset, tmp_path / "stopped"))
