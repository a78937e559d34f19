"""One program across two JAX processes on loopback (``distributed.num_processes=2``)
against one process: same members within 1e-5, with the mesh's ``data`` axis inside one
process and across the two; a process SIGKILLed mid-training stops the run in bounded
time and the rerun resumes."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ensemble_core import runs
from ensemble_core.config import load_config
from ensemble_core.errors import ConfigError
from ensemble_core.runs.training.launcher import EXIT_GRACE_S, HEARTBEAT_TIMEOUT_S
from tests.ensembles import predictions, tiny_config
from tests.xla_flags import xla_flags

ROOT = Path(__file__).resolve().parents[1]
COMMON = ("ensemble.size=4", "data.validation_fraction=0.2", "data.max_train_examples=320", "train.epochs=2")


@pytest.mark.slow  # real JAX processes joined over loopback
@pytest.mark.parametrize(
    "mesh, where",
    [
        # make soak: ensemble 4 x data 2, each member's data pair on one process (make test:
        # the same processes with every batch split across them, below)
        pytest.param("mesh.data=2", "inside", marks=pytest.mark.soak),
        # ensemble 1 x data 8: every batch split over both processes (make soak)
        pytest.param("mesh.data=8", "across", marks=pytest.mark.soak),
        # ensemble 4 x data 1 on 4 of the 8 devices: two members on each process (make test;
        # issue 43 class 8: it took the first 4 devices, all process 0's, and was refused)
        ("mesh.data=1", "spread"),
    ],
)
def test_two_processes_train_the_members_of_one(tfds_dir, tmp_path, mesh, where):
    """One program in two JAX processes (joined over loopback) trains the members one
    process trains, to float32 rounding, and says so in its report.

    Why not shorter (about a minute under load): the one-process run, then two JAX
    processes that each import JAX, join, compile and train."""
    one = runs.run(tiny_config(tfds_dir, *COMMON, mesh), tmp_path, "one")
    two = runs.run(tiny_config(tfds_dir, *COMMON, mesh, "distributed.num_processes=2"), tmp_path, "two")
    a, b = predictions(one.run_dir.path), predictions(two.run_dir.path)
    # Across processes the gradient all-reduce is gloo's, whose summation order differs
    # from XLA's in-process reduction: equal to float32 rounding, not bitwise.
    np.testing.assert_allclose(b["member_probs"], a["member_probs"], atol=1e-5)
    assert two.training.mesh == one.training.mesh
    topology = two.training.topology[0]
    assert topology["processes"] == 2 and topology["devices"] == 8 and topology["pid"] != os.getpid()
    assert "one program across 2 JAX processes" in (two.run_dir.path / "report.md").read_text()
    assert two.training.history[-1]["train_loss"] == pytest.approx(one.training.history[-1]["train_loss"], abs=1e-5)


def test_bad_process_counts_are_one_line_errors():
    with pytest.raises(ConfigError, match=r"num_processes=3 does not divide the 8 simulated CPU devices.*fix: use 1"):
        load_config(None, ["distributed.num_processes=3"])
    with pytest.raises(ConfigError, match="does not combine with member groups"):
        load_config(None, ["distributed.num_processes=2", "distributed.member_groups=2"])


# A run of ``runs.run`` in its own process (no Prefect: the launcher is the same): prints
# the run's report path, or ``error: ...`` and exits 75 for a preemption.
_RUN = """
import sys
from ensemble_core import runs
from ensemble_core.errors import PreemptedError
from tests.ensembles import predictions, tiny_config
try:
    result = runs.run(tiny_config(sys.argv[1], *sys.argv[4:]), sys.argv[2], sys.argv[3])
except PreemptedError as err:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(75)
print(result.run_dir.path)
"""


def _run_cmd(tfds_dir, out: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-c", _RUN, tfds_dir, str(out), "mp", *COMMON, *overrides]


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    found = []
    for child in map(int, out):
        found.append(child)
        found += _children(child)
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.mark.slow
def test_a_killed_jax_process_stops_the_run_in_bounded_time_and_the_rerun_resumes(tfds_dir, tmp_path):
    """One of two JAX processes SIGKILLed mid-training: the other stops within a bounded time
    (none left blocked in a collective), the run fails with one line, and a rerun resumes.

    Why not shorter (about a minute under load): two JAX processes start and train to a
    checkpoint, the survivor waits out the coordination service's heartbeat timeout, and
    the rerun starts both again."""
    env = {**os.environ, "XLA_FLAGS": xla_flags(8)}
    overrides = ("distributed.num_processes=2", "train.epochs=4", "data.max_train_examples=640", "mesh.data=8")
    cmd = _run_cmd(tfds_dir, tmp_path / "runs", *overrides)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ckpts = tmp_path / "runs" / "mp" / "checkpoints"
    deadline = time.monotonic() + 300
    while not any(p.name.isdigit() for p in ckpts.glob("*")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    jax_procs = [p for p in _children(proc.pid) if "ensemble_core.runs.training.processes" in _cmdline(p)]
    victim = next(p for p in jax_procs if "--process-id 1" in _cmdline(p))
    os.kill(victim, signal.SIGKILL)
    killed = time.monotonic()
    _, err = proc.communicate(timeout=300)
    took = time.monotonic() - killed
    assert proc.returncode == 75, err[-3000:]
    assert took < HEARTBEAT_TIMEOUT_S + EXIT_GRACE_S + 30
    line = [ln for ln in err.splitlines() if ln.startswith("error: ")][-1]
    assert "JAX process 1 of 2 was killed by SIGKILL" in line and "rerun with the same run name" in line
    assert "Traceback" not in err
    assert not [p for p in jax_procs if Path(f"/proc/{p}").exists() and "zombie" not in _cmdline(p)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "runs" / "mp" / "report.json").read_text())
    assert report["resumed_from_epoch"] is not None and report["resumed_from_epoch"] >= 1
    assert report["topology"][0]["processes"] == 2


# The default config (the Flax CNN, 8 members, a validation split) with only what makes it
# short: 1 epoch on 512 digits, the test evaluator. Prints the run directory, or
# ``error: ...`` and exits 75 for a preemption, 2 for a refusal.
_DEFAULT = """
import sys
from ensemble_core import runs
from ensemble_core.config import load_config
from ensemble_core.errors import EnsembleError, PreemptedError
cfg = load_config(None, [f"data.data_dir={sys.argv[1]}", *sys.argv[4:]])
try:
    result = runs.run(cfg, sys.argv[2], sys.argv[3])
except EnsembleError as err:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(75 if isinstance(err, PreemptedError) else 2)
print(result.run_dir.path)
"""
SHORT = ("distributed.num_processes=2", "data.max_train_examples=512", "train.epochs=1", "eval.evaluators=[test]")


def _left_behind(pid: int, tmp: Path) -> list[str]:
    """Processes of ``pid``'s tree still alive, and files in its temporary directory."""
    alive = [_cmdline(p) for p in _children(pid) if Path(f"/proc/{p}").exists()]
    return [c for c in alive if c] + [str(p) for p in tmp.iterdir()]


@pytest.mark.slow  # the CNN of configs/default.yaml, 8 members over two JAX processes
@pytest.mark.soak  # make test: test_two_processes_train_the_members_of_one (and the killed process's logs)
def test_the_default_cnn_trains_across_two_jax_processes(tfds_dir, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "XLA_FLAGS": xla_flags(8), "TMPDIR": str(tmp)}
    cmd = [sys.executable, "-c", _DEFAULT, tfds_dir, str(tmp_path / "runs"), "cnn", *SHORT]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in out + err and not [ln for ln in err.splitlines() if ln.startswith("error")]
    run = runs.RunDir(tmp_path / "runs" / "cnn")
    report = json.loads(run.report_json.read_text())
    assert report["config"]["model"]["name"] == "cnn" and report["config"]["ensemble"]["size"] == 8
    assert report["topology"][0]["processes"] == 2 and report["mesh"] == {"ensemble": 8, "data": 1}
    assert len(report["history"]) == 1 and np.isfinite(report["history"][0]["train_loss"]).all()
    assert predictions(run.path)["member_probs"].shape[0] == 8
    for p in range(2):  # each process's log is kept, this session's header first, no error in it
        log = run.process_log(p).read_text()
        assert log.startswith("== session started") and "Traceback" not in log and "\nF" not in log
    assert not _left_behind(proc.pid, tmp)


@pytest.mark.slow
def test_an_exception_in_one_jax_process_is_quoted_at_once_with_its_log(tfds_dir, tmp_path):
    """Before: the failed process waited 300 s in JAX's shutdown barrier at exit while the
    other waited for it in a collective; both then aborted and the error quoted a native
    stack frame. Now it exits at once and the one-line error quotes its exception."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "XLA_FLAGS": xla_flags(8), "TMPDIR": str(tmp)}
    overrides = ("distributed.num_processes=2", "train.epochs=50", "mesh.data=8")
    proc = subprocess.Popen(
        _run_cmd(tfds_dir, tmp_path / "runs", *overrides),
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    run = runs.RunDir(tmp_path / "runs" / "mp")
    deadline = time.monotonic() + 300
    while not any(p.name.isdigit() for p in run.checkpoints.glob("*")):  # training, in both processes
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    jax_procs = [p for p in _children(proc.pid) if "ensemble_core.runs.training.processes" in _cmdline(p)]
    os.kill(next(p for p in jax_procs if "--process-id 1" in _cmdline(p)), signal.SIGINT)  # KeyboardInterrupt
    sent = time.monotonic()
    out, err = proc.communicate(timeout=120)  # the fix's absence: 300 s in the shutdown barrier
    assert proc.returncode == 75, err[-3000:]
    assert time.monotonic() - sent < HEARTBEAT_TIMEOUT_S + EXIT_GRACE_S + 20  # not the barrier's 300 s
    assert "Traceback" not in out + err
    assert err.strip() == err.strip().splitlines()[-1] and err.startswith("error: ")  # one line
    assert f"JAX process 1 of 2 exited with code 1 (KeyboardInterrupt; log: {run.process_log(1)})" in err
    assert "fix: rerun with the same run name" in err
    assert "Traceback" in run.process_log(1).read_text()  # the whole story is in the kept log
    assert not _left_behind(proc.pid, tmp)


_ABORTED = """== session started 2026-11-25 15:13:50 (launcher pid 1)
Traceback (most recent call last):
  File "ensemble_core/runs/training/trainer.py", line 140, in _resume
RuntimeError: Fetching value for `jax.Array` that spans non-addressable devices is not possible.
E1125 15:19:05.695137   15784 coordination_service.cc:1549] Use error polling to propagate the error
F1125 15:19:05.696485   15795 client.h:80] Terminating process: the JAX distributed service detected fatal errors.
*** Check failure stack trace: ***
    @     0x7f8338740634  absl::lts_20260107::log_internal::LogMessage::SendToLog()
    @     0x7f83484a71f5  (unknown)
"""


@pytest.mark.parametrize(
    "log, line",
    [
        (_ABORTED, "RuntimeError: Fetching value for `jax.Array` that spans non-addressable devices is not possible."),
        (_ABORTED.replace("RuntimeError", "Runtime"), _ABORTED.splitlines()[5].strip()),  # the F line
        (
            "== session started x\nerror: checkpoint 7 is damaged; fix: x\n  File y\nKeyError: 'a'\n",
            "checkpoint 7 is damaged; fix: x",
        ),
        ("== session started x\n*** SIGABRT received at time=1 ***\n    @ 0x7f (unknown)\n", "(an empty log)"),
    ],
)
def test_a_failed_process_is_explained_by_its_error_line_not_a_stack_frame(log, line):
    from ensemble_core.runs.training.launcher import _explaining_line

    assert _explaining_line(log) == line


# What the survivor of a peer SIGKILLed mid-collective wrote (CI, 2026-12): gloo's TCP
# transport failed an enforce on the half-read message and the process aborted itself.
_GLOO_ABORT = """== session started 2026-12-05 10:00:00 (launcher pid 1)
epoch 2/4
terminate called after throwing an instance of 'gloo::EnforceNotMet'
  what():  [enforce fail at external/gloo/gloo/transport/tcp/pair.cc:446] op.preamble.length <= op.nbytes. 8 vs 4
*** SIGABRT received at time=1 ***
    @ 0x7f (unknown)
"""


@pytest.mark.parametrize(
    "dead, codes, tails, blamed",
    [
        # both found dead in one poll: the one SIGKILLed, not the one gloo aborted after
        ([0, 1], [-signal.SIGABRT, -signal.SIGKILL], [_GLOO_ABORT, "== session started x\nepoch 2/4\n"], 1),
        ([0, 1], [1, -signal.SIGKILL], ["x\nRuntimeError: Gloo allreduce failed: Connection closed by peer", ""], 1),
        # a process that aborted on its own is blamed before one SIGKILLed only when that
        # one's log shows it followed the other's death
        ([0, 1], [-signal.SIGABRT, -signal.SIGKILL], ["F1 a.cc:1] check failed", "heartbeat timeout"], 0),
        ([1, 0], [1, 1], ["ValueError: a", "ValueError: b"], 1),  # else the first found dead
    ],
)
def test_the_process_blamed_is_the_one_whose_death_the_others_followed(dead, codes, tails, blamed):
    from ensemble_core.runs.training.launcher import _blamed

    assert _blamed(dead, codes, tails) == blamed


def test_process_0s_epochs_reach_on_epoch_in_the_callers_context():
    """The flow's on_epoch logs through Prefect, whose settings (the API URL) live in
    context variables: without them it started a second Prefect server per run."""
    import contextvars
    import io

    from ensemble_core.runs.training.launcher import _start_reader

    where = contextvars.ContextVar("where", default="a new thread's empty context")
    where.set("the caller's")
    seen, records = [], []
    lines = [json.dumps({"epoch_record": {"epoch": e}}) for e in (1, 2)] + ["not json", "7", json.dumps({"summary": 1})]
    _start_reader(
        io.StringIO("\n".join(lines) + "\n"), records, lambda r: seen.append((r["epoch"], where.get()))
    ).join()
    assert seen == [(1, "the caller's"), (2, "the caller's")]
    assert records == [{"epoch_record": {"epoch": 1}}, {"epoch_record": {"epoch": 2}}, {"summary": 1}]


class FakeDevice:
    """What :func:`ensemble_core.mesh.mesh_devices` reads of a device: its id and process."""

    def __init__(self, device_id: int, process_index: int):
        self.id, self.process_index = device_id, process_index

    def __repr__(self) -> str:
        return f"d{self.id}@p{self.process_index}"


@pytest.mark.parametrize(
    "processes, count, expected",
    [
        (2, 4, [0, 1, 4, 5]),  # 4 members on 2 processes of 4 devices: two on each
        (2, 3, [0, 1, 4]),  # uneven: the first process takes the extra one
        (2, 2, [0, 4]),  # ensemble 1 x data 2 (widened): one device of each process
        (4, 4, [0, 2, 4, 6]),
        (2, 8, list(range(8))),  # the whole machine: in order
        (1, 3, [0, 1, 2]),  # one process: the first devices, as ever
    ],
)
def test_the_mesh_spreads_its_devices_over_the_jax_processes(processes, count, expected):
    from ensemble_core.mesh import mesh_devices

    per = 8 // processes
    devices = [FakeDevice(i, i // per) for i in range(8)]
    chosen = mesh_devices(devices, count)
    assert [d.id for d in chosen] == expected
    assert {d.process_index for d in chosen} == set(range(min(processes, count)))


@pytest.mark.parametrize(
    "sets, mesh",
    [
        (["ensemble.size=4"], (4, 1)),  # spread: no change
        (["ensemble.size=1"], (1, 2)),  # one member: its batch split over the two processes
        (["ensemble.size=1", "distributed.num_processes=4"], (1, 4)),
        (["ensemble.size=3", "distributed.num_processes=4"], (3, 2)),  # 6 devices: 2, 2, 1, 1 per process
    ],
)
def test_a_mesh_smaller_than_the_processes_widens_its_data_axis(sets, mesh):
    from ensemble_core.ensemble_setup import plan
    from ensemble_core.runs.training.launcher import check_mesh_spans_processes

    cfg = load_config(None, ["distributed.num_processes=2", *sets])
    check_mesh_spans_processes(cfg)  # accepted
    got = plan(cfg, 8, processes=cfg.distributed.num_processes)
    assert (got.ensemble, got.data) == mesh
    assert plan(cfg, 8, processes=1).data == 1  # the same config in one process is not widened


def test_a_mesh_no_placement_can_serve_is_refused_before_any_process_starts():
    from ensemble_core.errors import MeshError
    from ensemble_core.runs.training.launcher import check_mesh_spans_processes

    # one member and a batch of 7: no data axis (2, 4, 8 devices) divides it
    cfg = load_config(None, ["distributed.num_processes=2", "ensemble.size=1", "train.batch_size=7"])
    fix = "fix: use a train.batch_size divisible by 2"
    with pytest.raises(MeshError, match=r"1 device\(s\) for 2 JAX processes.*" + fix):
        check_mesh_spans_processes(cfg)
