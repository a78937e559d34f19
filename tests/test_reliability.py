"""Faults done for real: SIGKILL, SIGTERM, damaged checkpoints, a diverging member,
write errors, concurrent runs, and restoring with stock orbax on another device count."""

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from ensemble_core import runs
from ensemble_core.config import load_config
from ensemble_core.errors import DivergenceError, RunLockedError
from ensemble_core.runs.ensemble.load import restore
from ensemble_core.runs.storage.lock import run_lock
from ensemble_core.train import unstacked
from tests.ensembles import predictions, small_setup, tiny_config, train_small
from tests.xla_flags import xla_flags

pytestmark = pytest.mark.slow  # training processes killed and resumed

ROOT = Path(__file__).resolve().parents[1]


def _proc(run_dir, tfds_dir, *args, **kw):
    env = kw.pop("env", None) or {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.train_proc", str(run_dir), tfds_dir, *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def _finish(p, timeout=300):
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out, err


def _wait_for_epoch(p, epoch: int) -> None:
    for line in p.stdout:
        if json.loads(line).get("epoch_done") == epoch:
            return
    raise AssertionError("the training process ended early: " + p.stderr.read()[-2000:])


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tfds_dir):
    """An uninterrupted run: its predictions and final checkpoint arrays."""
    run = tmp_path_factory.mktemp("ref") / "run"
    rc, _out, err = _finish(_proc(run, tfds_dir))
    assert rc == 0, err[-2000:]
    return run


def _wait_for_committed_checkpoint(run: Path, p, timeout: float = 120.0) -> None:
    """Until a checkpoint directory named by its step (orbax's committed name) exists."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ckpts = run / "checkpoints"
        if ckpts.is_dir() and any(d.name.isdigit() for d in ckpts.iterdir()):
            return
        assert p.poll() is None, "the training process ended before a checkpoint was committed"
        time.sleep(0.05)
    raise AssertionError(f"no committed checkpoint under {run} after {timeout} s")


@pytest.mark.parametrize(
    "network",
    [
        None,  # tests.train_proc's: flax.nnx with BatchNorm and Dropout
        # make soak: the Linen conventions of a user's network (the same resume machinery)
        pytest.param("PacedLinenNet", marks=pytest.mark.soak),  # __call__(x, training), axis_name='batch'
        pytest.param("PacedNoModeNet", marks=pytest.mark.soak),  # __call__(x), no mode argument
        # make soak: MC dropout (ensemble.method=mc_dropout) killed and resumed, its
        # stochastic passes predicted from the resumed checkpoint
        pytest.param("PacedLinenNet+mc_dropout", marks=pytest.mark.soak),
        # make soak: BatchEnsemble and Packed-Ensembles (the registry's CNN variants: two
        # networks of two members each, killed and resumed, their members predicted)
        pytest.param("cnn+batch_ensemble", marks=pytest.mark.soak),
        pytest.param("cnn+packed", marks=pytest.mark.soak),
    ],
)
def test_sigkill_mid_training_then_resume_is_bitwise_identical(tmp_path, tfds_dir, reference, network):
    """SIGKILL while training (after a committed checkpoint): the rerun resumes from the
    latest checkpoint, loses at most one epoch, and ends bitwise equal to the run never
    killed; the resumed run serves predictions from its directory (``flows.predict``'s
    computation: the ensemble's probabilities equal the evaluation's on the same images).

    Why not shorter (about a minute under load, its fixture's reference run included):
    three training processes, two of them paced so that the kill lands mid-training."""
    name, _, method = (network or "").partition("+")
    args: tuple[str, ...] = ()
    if name.startswith("Paced"):
        args = (f"model.name=tests.user_models.paced_nets:{name}",)
    elif name:  # a registry network (not paced: a CNN's steps take long enough)
        args = (f"model.name={name}", "model.options={}", "ensemble.size=2", "ensemble.members_per_network=2")
    if method == "mc_dropout":
        args += ("ensemble.method=mc_dropout", "ensemble.mc_samples=3")
    elif method:
        args += (f"ensemble.method={method}",)
    if network is not None:
        reference = tmp_path / "reference"
        rc, _out, err = _finish(_proc(reference, tfds_dir, *args))
        assert rc == 0, err[-2000:]
    run = tmp_path / "run"
    p = _proc(run, tfds_dir, *args)
    _wait_for_epoch(p, 1)  # the first checkpoint is being written
    # Under CPU load the first (asynchronous) save can take seconds to commit; kill only
    # once one is committed, at a random moment while training (and the next save) go on.
    _wait_for_committed_checkpoint(run, p)
    time.sleep(random.uniform(0.0, 1.0))
    p.send_signal(signal.SIGKILL)
    p.wait()
    saved = sorted(int(d.name) for d in (run / "checkpoints").iterdir() if d.name.isdigit())
    assert saved[-1] < 4 * 16, f"the kill landed after training ended (checkpoints {saved})"
    rc, out, err = _finish(_proc(run, tfds_dir, *args))
    assert rc == 0, err[-2000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["resumed_from"] is not None and summary["resumed_from"] >= 1
    # At most one checkpoint interval (one epoch, 16 steps) of work was lost.
    assert saved and summary["resumed_from"] * 16 >= saved[-1] - 16
    got, want = predictions(run), predictions(reference)
    np.testing.assert_array_equal(got["member_probs"], want["member_probs"])
    _predict_serves(run, tfds_dir, got["member_probs"])


def _predict_serves(run: Path, tfds_dir: str, member_probs: np.ndarray) -> None:
    """``flows.predict``'s computation on a run directory (``runs.predict_images``: the run's
    network rebuilt from its config, its checkpoint, selection and temperature; the command
    line around it is tested in test_flow.py) on the first test images the run evaluated:
    the ensemble's probabilities are the mean of the members' in ``predictions.npz``."""
    from ensemble_core import data

    images, _ = data.load_split(data.EMBEDDED, "test", data.prepare(data.EMBEDDED, tfds_dir).tfds_data_dir, limit=8)
    out = runs.predict_images(run, images)
    np.testing.assert_allclose(out["ensemble_probs"], member_probs[:, :8].astype(np.float64).mean(0), atol=1e-5)


@pytest.mark.soak  # make test: test_cli_process.py's SIGTERM (checkpoint, exit 75, resume) and test_stop_signals.py
def test_sigterm_saves_at_the_step_boundary_and_resumes(tmp_path, tfds_dir, reference):
    run = tmp_path / "run"
    p = _proc(run, tfds_dir)
    _wait_for_epoch(p, 1)
    time.sleep(random.uniform(0.1, 0.8))
    p.send_signal(signal.SIGTERM)
    rc, _, err = _finish(p)
    assert rc == 75
    assert "checkpoint was saved" in err and "run_name run" in err
    (latest,) = sorted(int(d.name) for d in (run / "checkpoints").iterdir() if d.name.isdigit())[-1:]
    meta = json.loads((run / "checkpoints" / str(latest) / "meta" / "metadata").read_text())
    pos = meta["data_position"]
    assert latest == pos["epoch"] * 16 + pos["step_in_epoch"]  # the exact step boundary
    rc, _out, err = _finish(_proc(run, tfds_dir))
    assert rc == 0, err[-2000:]
    np.testing.assert_array_equal(predictions(run)["member_probs"], predictions(reference)["member_probs"])


def _largest_file(d: Path) -> Path:
    return max((f for f in d.rglob("*") if f.is_file()), key=lambda f: f.stat().st_size)


@pytest.mark.parametrize(
    "damage",
    ["truncate", pytest.param("delete", marks=pytest.mark.soak)],  # make soak: the same fallback, another damage
)
def test_damaged_latest_checkpoint_falls_back(tmp_path, tfds_dir, reference, damage):
    run = tmp_path / "run"
    rc, _, err = _finish(_proc(run, tfds_dir, "train.epochs=3"))
    assert rc == 0, err
    ckpts = run / "checkpoints"
    assert sorted(int(d.name) for d in ckpts.iterdir() if d.name.isdigit()) == [32, 48]
    victim = _largest_file(ckpts / "48" / "state")
    if damage == "truncate":
        victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    else:
        victim.unlink()
    leftover = ckpts / "64.orbax-checkpoint-tmp-1"  # an interrupted save's temporary dir
    leftover.mkdir()
    rc, out, err = _finish(_proc(run, tfds_dir))  # resume to 4 epochs
    assert rc == 0, err[-3000:]
    assert "checkpoint step 48" in err and "unreadable" in err
    assert json.loads(out.strip().splitlines()[-1])["resumed_from"] == 2
    assert any(p.name.startswith("48-") for p in (run / "corrupt-checkpoints").iterdir())
    assert not leftover.exists()
    np.testing.assert_array_equal(predictions(run)["member_probs"], predictions(reference)["member_probs"])


def test_write_error_during_save_is_clear_and_keeps_earlier_checkpoints(tmp_path, tfds_dir):
    run = tmp_path / "run"
    # From epoch 2 on, every write past 4 KiB fails (RLIMIT_FSIZE: a real failing write()).
    # Without the pause: the failing write is the subject, not a long training.
    mlp = ("model.options={hidden: 64, pause_s: 0}",)
    rc, _, err = _finish(_proc(run, tfds_dir, "--fsize-limit-after-epoch", "2", "4096", *mlp))
    assert rc == 2
    # orbax's writer thread may also print its traceback; our one-line error is among the lines.
    (line,) = [x for x in err.splitlines() if x.startswith("error: ")]
    # It names the underlying error, type and text. Which write hits the limit first varies
    # (orbax writes the state and metadata items concurrently): usually tensorstore's
    # "Error writing ...", but one fresh-clone CI run in three got another failing write.
    assert line.startswith("error: saving a checkpoint in")
    assert re.search(r" failed( \[E[A-Z]+\])? \(\w+: .+\); the finished checkpoints", line), line
    assert "finished checkpoints ['16'] are intact" in line and "fix: free disk space" in line
    # The earlier checkpoint is intact: a resume from it completes.
    rc, out, err = _finish(_proc(run, tfds_dir, *mlp))
    assert rc == 0, err[-2000:]
    assert json.loads(out.strip().splitlines()[-1])["resumed_from"] == 1


def test_diverging_member_is_frozen_and_the_others_train_on(mnist_train):
    images, labels = mnist_train[0][:256], mnist_train[1][:256]
    built = small_setup("mlp", 4)

    rates = built.learning_rates(len(images))

    def exploding(epoch: int):  # member 2's learning rate explodes, the others keep theirs
        table = np.array(rates(epoch))
        table[:, 2] = 1e12
        return table

    def train(blow_up: bool):
        state, _ = train_small(built, images, labels, epochs=2, learning_rates=exploding if blow_up else rates)
        return state

    bad, good = train(True), train(False)
    assert np.asarray(bad.healthy).tolist() == [True, True, False, True]
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(bad.params))
    for m in (0, 1, 3):
        for a, b in zip(
            jax.tree.leaves(unstacked(bad.params, m)), jax.tree.leaves(unstacked(good.params, m)), strict=True
        ):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_divergence_can_fail_the_run(tmp_path, tfds_dir):
    cfg = tiny_config(tfds_dir, "train.learning_rate=1e30", "train.on_divergence=fail")
    dataset = runs.prepare(cfg.data)
    with pytest.raises(DivergenceError, match=r"member\(s\) \[0, 1\] diverged"):
        runs.train(cfg, dataset, tmp_path / "run")


def test_frozen_members_are_left_out_of_the_ensemble(tmp_path, tfds_dir):
    from ensemble_core import metrics

    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(10), size=(3, 40)).astype(np.float32)
    labels = rng.integers(0, 10, 40)
    out = metrics.evaluate_all(probs, labels, healthy=np.array([True, False, True]))
    assert out["diverged_members"] == [1]
    assert out["ensemble"]["nll"] == pytest.approx(metrics.nll(probs[[0, 2]].mean(0), labels))
    assert [m["healthy"] for m in out["members"]] == [True, False, True]


def test_second_run_on_a_locked_directory_refuses(tmp_path):
    run = tmp_path / "run"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys,time; from ensemble_core.runs.storage.lock import run_lock\n"
            f"with run_lock({str(run)!r}):\n print('locked', flush=True); time.sleep(60)",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunLockedError, match=f"pid {holder.pid}"), run_lock(run):
            pass
        with run_lock(tmp_path / "other"):  # a different run directory is independent
            pass
    finally:
        holder.kill()
        holder.wait()
    with run_lock(run):  # released by the kernel when its holder died
        pass


def test_stock_orbax_restores_on_one_device(tmp_path, tfds_dir, reference):
    """No project code: CheckpointManager + StandardRestore, saved on 8 devices, 1 here; the
    members are a flax.nnx network's (tests.train_proc), their arrays plain nested dicts."""
    script = f"""
import os
os.environ["XLA_FLAGS"] = "{xla_flags(1)}"
import json, jax, numpy as np, orbax.checkpoint as ocp
registry = ocp.DefaultCheckpointHandlerRegistry()
for item, handler, save, restore in (
    ("state", ocp.StandardCheckpointHandler(), ocp.args.StandardSave, ocp.args.StandardRestore),
    ("meta", ocp.JsonCheckpointHandler(), ocp.args.JsonSave, ocp.args.JsonRestore),
):
    registry.add(item, save, handler)
    registry.add(item, restore, handler)
mngr = ocp.CheckpointManager({str(reference / "checkpoints")!r}, handler_registry=registry)
step = mngr.latest_step()
tree = mngr.metadata(step).item_metadata["state"].tree
dev = jax.sharding.SingleDeviceSharding(jax.devices()[0])
abstract = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=dev), tree)
out = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                                  meta=ocp.args.JsonRestore()))
kernel = out["state"]["params"]["out"]["kernel"]
print(json.dumps({{"devices": jax.device_count(), "step": step, "meta_step": out["meta"]["step"],
                  "shape": list(kernel.shape), "abs_sum": float(np.abs(np.asarray(kernel)).sum())}}))
"""
    proc = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "XLA_FLAGS"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["devices"] == 1 and got["step"] == got["meta_step"] == 64 and got["shape"] == [4, 64, 10]
    from tests.train_proc import BASE

    cfg = load_config(None, [*BASE, f"data.data_dir={tfds_dir}"])
    state, _ = restore(cfg, reference, 10, (28, 28, 1))
    expected = float(np.abs(np.asarray(state.params["out"]["kernel"])).sum())
    assert got["abs_sum"] == pytest.approx(expected, rel=1e-6)


def test_predict_refuses_nan_and_misshapen_images(reference):
    from ensemble_core.errors import DataError

    images = np.zeros((3, 28, 28, 1), np.float32)
    images[1, 3, 3, 0] = np.nan
    with pytest.raises(DataError, match="NaN or infinite"):
        runs.predict_images(reference, images)
    with pytest.raises(DataError, match=r"the model takes \[N, 28, 28, 1\]"):
        runs.predict_images(reference, np.zeros((3, 32, 32, 3), np.uint8))
    out = runs.predict_images(reference, np.zeros((3, 28, 28), np.uint8))  # [N, H, W] is accepted
    assert out["ensemble_probs"].shape == (3, 10)
    np.testing.assert_allclose(out["ensemble_probs"].sum(1), 1.0, rtol=1e-5)


@pytest.mark.parametrize(
    "images, fragment",
    [
        (np.zeros((0, 28, 28, 1), np.uint8), "empty"),
        (np.zeros((0,), np.float32), "empty"),
        (np.full((2, 28, 28, 1), 200.0, np.float32), r"range over \[200, 200\].*fix: divide by 255"),
        (np.linspace(-1, 1, 2 * 784, dtype=np.float32).reshape(2, 28, 28, 1), "rescale them to \\[0, 1\\]"),
        (np.full((2, 28, 28, 1), 40000, np.uint16), r"uint16 \(values 40000..40000\).*convert explicitly"),
        (np.full((2, 28, 28, 1), 7, np.int64), r"int64.*images.astype\(np.uint8\)"),
        (np.ones((2, 28, 28, 1), bool), "bool"),
        (np.full((2, 28, 28, 1), 0.5 + 0.5j), "complex128"),
    ],
)
def test_predict_refuses_images_it_would_misread(reference, images, fragment):
    from ensemble_core.errors import DataError

    with pytest.raises(DataError, match=fragment) as err:
        runs.predict_images(reference, images)
    assert "fix:" in str(err.value) and "\n" not in str(err.value)


def test_predict_takes_uint8_and_the_same_images_as_floats_alike(reference, tfds_dir):
    """uint8 0..255 and the same images / 255 as float32 or float64 give the same predictions."""
    from ensemble_core import data as data_lib

    images, _ = data_lib.load_split(
        data_lib.EMBEDDED, "test", data_lib.prepare(data_lib.EMBEDDED, tfds_dir).tfds_data_dir, 16
    )
    a = runs.predict_images(reference, images)["ensemble_probs"]
    b = runs.predict_images(reference, images.astype(np.float32) / 255.0)["ensemble_probs"]
    c = runs.predict_images(reference, images.astype(np.float64) / 255.0)["ensemble_probs"]
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6)


@pytest.mark.soak  # make test: test_readers.py's reader beside a saving process, the run lock tests here
def test_concurrent_runs_in_different_directories_share_caches(tmp_path, tfds_dir):
    env = {
        **{k: v for k, v in os.environ.items() if k != "XLA_FLAGS"},
        "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "shared-jax-cache"),
    }
    # Without the pause, one epoch (sharing caches does not need a long training): the
    # reference is the same config run in this process, with its own compilation cache.
    mlp = ("model.options={hidden: 64, pause_s: 0}", "train.epochs=1")
    procs = [_proc(tmp_path / name, tfds_dir, *mlp, env=env) for name in ("a", "b")]
    from tests.train_proc import BASE

    ref = runs.run(load_config(None, [*BASE, f"data.data_dir={tfds_dir}", *mlp]), tmp_path, "ref")
    for p in procs:
        rc, _, err = _finish(p)
        assert rc == 0, err[-2000:]
    want = predictions(ref.run_dir.path)["member_probs"]
    for name in ("a", "b"):
        np.testing.assert_array_equal(predictions(tmp_path / name)["member_probs"], want)
