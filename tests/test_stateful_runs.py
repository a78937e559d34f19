"""Stateful members (BatchNorm, Dropout, augmentation) through the run layer: checkpoints
that stock orbax reads, member groups, a killed run resumed bitwise, a user's own network
outside the repository through the CLIs, refusals before any compute, and checkpoints made
before members carried collections."""

from __future__ import annotations

import json
import random
import shutil
import signal
import time
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from ensemble_core import runs
from ensemble_core.config import load_config
from ensemble_core.errors import ConfigError, IncompatibleRunError
from ensemble_core.predict import member_probs
from ensemble_core.runs.ensemble.load import restore
from ensemble_core.runs.storage.checkpoint import STATE_FORMAT, EnsembleCheckpointer
from tests.ensembles import assert_checkpoints_equal, predictions, stop_after, tiny_config

ROOT = Path(__file__).resolve().parents[1]
USER_MODEL = (
    "model.name=tests.user_models.bn_dropout_net:build",
    "model.options={width: 4, dropout_rate: 0.25}",
    "data.augment={crop_padding: 2}",
)
COMMON = ("ensemble.size=4", "data.validation_fraction=0.2", "data.max_train_examples=320", "train.epochs=2")


@pytest.fixture(scope="module")
def one_program(tmp_path_factory, tfds_dir):
    out = tmp_path_factory.mktemp("g1")
    cfg = tiny_config(tfds_dir, *COMMON, *USER_MODEL)
    return cfg, runs.run(cfg, out, "g1")


@pytest.mark.slow
def test_the_checkpoint_holds_batch_stats_as_stock_orbax_reads_it(one_program):
    cfg, result = one_program
    with EnsembleCheckpointer(result.run_dir.checkpoints) as ckpt:
        step = ckpt.latest_step()
        assert ckpt.read_meta()["state_format"] == STATE_FORMAT
    tree = ocp.StandardCheckpointer().restore(result.run_dir.checkpoints / str(step) / "state")
    for where in (tree["model_state"], tree["best"]["model_state"]):
        stats = where["batch_stats"]["BatchNorm_0"]
        assert set(stats) == {"mean", "var"} and np.asarray(stats["mean"]).shape == (4, 4)  # [E, channels]
    state, _ = restore(cfg, result.run_dir.path, 10, (28, 28, 1))
    np.testing.assert_array_equal(
        np.asarray(state.best.model_state["batch_stats"]["BatchNorm_0"]["var"]),
        np.asarray(tree["best"]["model_state"]["batch_stats"]["BatchNorm_0"]["var"]),
    )


@pytest.mark.slow
def test_two_member_groups_give_the_same_batchnorm_members(one_program, tfds_dir, tmp_path):
    cfg1, ref = one_program
    cfg = tiny_config(tfds_dir, *COMMON, *USER_MODEL, "distributed.member_groups=2")
    result = runs.run(cfg, tmp_path, "g2")
    got, _ = restore(cfg, result.run_dir.path, 10, (28, 28, 1))
    want, _ = restore(cfg1, ref.run_dir.path, 10, (28, 28, 1))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(
        predictions(result.run_dir.path)["member_probs"], predictions(ref.run_dir.path)["member_probs"]
    )


@pytest.mark.slow
def test_a_stopped_run_resumes_bitwise_with_batchnorm_dropout_and_augmentation(one_program, tmp_path, tfds_dir):
    """Stopped mid-epoch (a stop request at step 5 of 16, as a SIGTERM makes) and resumed,
    BatchNorm statistics, dropout and augmentation keys included: the members, their
    histories and their predictions equal the run never stopped, bitwise. (The same
    through SIGKILL of a training process: the soak test below.)"""
    from ensemble_core.errors import PreemptedError

    cfg, full = one_program
    dataset = runs.prepare(cfg.data)
    with pytest.raises(PreemptedError):
        runs.train(cfg, dataset, tmp_path / "stopped", should_stop=stop_after(5))
    resumed = runs.train(cfg, dataset, tmp_path / "stopped")
    assert resumed.resumed_from is not None
    assert resumed.history == full.training.history and resumed.members == full.training.members
    assert_checkpoints_equal(cfg, dataset, full.run_dir.path, tmp_path / "stopped")


@pytest.mark.slow
@pytest.mark.soak  # make test: the stop and resume above, in one process (SIGKILL: test_reliability.py)
def test_sigkill_then_resume_is_bitwise_with_batchnorm_dropout_and_augmentation(tmp_path, tfds_dir):
    from tests.test_reliability import _finish, _proc, _wait_for_committed_checkpoint, _wait_for_epoch

    args = ("model.options={width: 8}", *USER_MODEL[:1], USER_MODEL[2])
    reference = tmp_path / "ref"
    rc, _, err = _finish(_proc(reference, tfds_dir, *args))
    assert rc == 0, err[-2000:]
    run = tmp_path / "run"
    p = _proc(run, tfds_dir, *args)
    _wait_for_epoch(p, 1)
    _wait_for_committed_checkpoint(run, p)
    time.sleep(random.uniform(0.0, 0.5))
    p.send_signal(signal.SIGKILL)
    p.wait()
    rc, out, err = _finish(_proc(run, tfds_dir, *args))
    assert rc == 0, err[-2000:]
    assert json.loads(out.strip().splitlines()[-1])["resumed_from"] is not None
    np.testing.assert_array_equal(predictions(run)["member_probs"], predictions(reference)["member_probs"])


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (["model.name=no_such_package.nets:build"], "cannot import module 'no_such_package.nets'"),
        (["model.name=tests.user_models.bn_dropout_net:nope"], "has no 'nope'; fix: name a function"),
        (["model.name=tests.user_models.bn_dropout_net:not_a_model"], "returned a dict, not a flax.linen or flax.nnx"),
        (["model.name=tests.user_models.bn_dropout_net:wrong_output"], "returns an array of shape (2, 3)"),
        (
            ["model.name=tests.user_models.bn_dropout_net:build", "model.options={depth: 3}"],
            "raised ValueError: unknown option(s) ['depth']",
        ),
        (["model.name=resnet", "model.options={depth: 21}"], "model.options.depth"),
        (["model.name=mlp", "model.options={width: 2}"], "takes no options"),
        (["data.augment.flip=true"], "data.augment.flip=true on 'mnist5k'"),
        (["data.augment.crop_padding=28"], "not smaller than the 28x28 images"),
    ],
)
def test_a_model_or_augmentation_that_cannot_work_is_one_line_before_any_compute(
    tfds_dir, tmp_path, overrides, fragment
):
    cfg = tiny_config(tfds_dir, *overrides)
    with pytest.raises(ConfigError) as err:
        runs.preflight(cfg, tmp_path / "out", "r")
    message = str(err.value)
    assert fragment in message and "fix:" in message and "\n" not in message, message
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_bad_import_path_through_the_command_line_exits_2(tmp_path, prefect_api):
    import subprocess
    import sys

    from tests.prefect_api import cli_env

    out = tmp_path / "runs"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "flows.train_ensemble",
            "--set",
            "model.name=nowhere.nets:build",
            "--output-dir",
            str(out),
        ],
        cwd=ROOT,
        env=cli_env(prefect_api),  # the session's server: no temporary one started and stopped
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "cannot import module 'nowhere.nets'" in lines[0], lines
    assert not out.exists() and not (tmp_path / "tfds").exists()  # refused before the dataset


def test_a_checkpoint_from_before_collections_is_restored(tmp_path, tfds_dir):
    """tests/data/format1_run: a finished run of the previous release (2 MLP members, no
    state_format in its metadata). Its members restore with empty collections and predict
    what that release recorded in predictions.npz."""
    run_dir = tmp_path / "format1"
    shutil.copytree(ROOT / "tests" / "data" / "format1_run", run_dir)
    with EnsembleCheckpointer(run_dir / "checkpoints") as ckpt:
        meta = ckpt.read_meta()
    assert "state_format" not in meta
    cfg = load_config(None, [f"data.data_dir={tfds_dir}"]).model_validate(
        {**meta["config"], "data": {**meta["config"]["data"], "data_dir": tfds_dir}}
    )
    state, setup = restore(cfg, run_dir, 10, (28, 28, 1))
    assert state.model_state == {} and state.best.model_state == {}
    want = predictions(run_dir)["member_probs"]
    from ensemble_core import data

    images, _ = data.load_split(
        data.EMBEDDED, "test", data.prepare(data.EMBEDDED, tfds_dir).tfds_data_dir, limit=want.shape[1]
    )
    got = member_probs(setup.predict_fn(), state.final_variables, images, setup.mesh, 64)
    # predictions.npz was recorded on CPU. On GPU, XLA computes float32 matmuls and convolutions
    # in TF32 by default (jax_default_matmul_precision): measured there up to 1.5e-4 apart
    # (benchmarks/results/gpu-h100-check.json).
    np.testing.assert_allclose(got, want, atol=1e-6 if jax.default_backend() == "cpu" else 1e-3)
    bn = cfg.model_copy(update={"model": load_config(None, [USER_MODEL[0]]).model})
    with pytest.raises(IncompatibleRunError, match="before members carried mutable collections"):
        restore(bn, run_dir, 10, (28, 28, 1))
    assert (run_dir / "checkpoints" / str(meta["step"])).is_dir()  # refused, not quarantined
