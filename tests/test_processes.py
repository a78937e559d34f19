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
from ensemble_core.runs.processes import EXIT_GRACE_S, HEARTBEAT_TIMEOUT_S
from tests.ensembles import predictions, tiny_config

ROOT = Path(__file__).resolve().parents[1]
COMMON = ("ensemble.size=4", "data.validation_fraction=0.2", "data.max_train_examples=320", "train.epochs=2")


@pytest.mark.slow  # real JAX processes joined over loopback
@pytest.mark.parametrize(
    "mesh, where",
    [
        ("mesh.data=2", "inside"),  # ensemble 4 x data 2: each member's data pair on one process
        ("mesh.data=8", "across"),  # ensemble 1 x data 8: every batch split over both processes
    ],
)
def test_two_processes_train_the_members_of_one(tfds_dir, tmp_path, mesh, where):
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
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    overrides = ("distributed.num_processes=2", "train.epochs=4", "data.max_train_examples=640", "mesh.data=8")
    cmd = _run_cmd(tfds_dir, tmp_path / "runs", *overrides)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ckpts = tmp_path / "runs" / "mp" / "checkpoints"
    deadline = time.monotonic() + 300
    while not any(p.name.isdigit() for p in ckpts.glob("*")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    jax_procs = [p for p in _children(proc.pid) if "ensemble_core.runs.processes" in _cmdline(p)]
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
