"""Stop signals, continued (split from test_stop_signals.py so that the two halves run on
both test workers): member groups on Dask workers, and the command line stopped during
evaluation."""

import json
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.prefect_api import cli_env
from tests.test_stop_signals import ROOT, SMALL, TWO_EVALUATORS, _check_tries, _stop_proc

pytestmark = pytest.mark.slow  # flows under a temporary Prefect server, signals, resumes


def test_a_stop_of_the_run_is_relayed_to_its_groups_processes(tmp_path):
    """The run's stop request reaches member groups in other processes (Dask workers)
    through the run directory: :func:`stopping.relay_to_file` writes the file within its
    poll interval, holding the signal's name, a process that only sees the file
    (``file_requested``, checked here from a child process) stops, and the file is gone
    once the relay ends, a stale one from an earlier stop removed on entry."""
    from ensemble_core import stopping

    path = tmp_path / ".stop-request"
    path.write_text("SIGTERM")  # stale, from an earlier stop
    child = [
        sys.executable,
        "-c",
        "import sys; from ensemble_core import stopping; from pathlib import Path; "
        "sys.exit(0 if stopping.file_requested(Path(sys.argv[1]))() else 3)",
        str(path),
    ]
    stopping.clear()
    try:
        with stopping.relay_to_file(path, poll_s=0.02):
            time.sleep(0.1)
            assert not path.exists() and subprocess.run(child, cwd=ROOT).returncode == 3
            stopping.request(signal.SIGTERM)
            deadline = time.monotonic() + 10
            while not path.exists():
                assert time.monotonic() < deadline, "the stop request was not relayed within 10 s"
                time.sleep(0.01)
            assert path.read_text() == "SIGTERM"
            assert subprocess.run(child, cwd=ROOT).returncode == 0
        assert not path.exists()
    finally:
        stopping.clear()


@pytest.mark.soak  # make test: test_a_stop_of_the_run_is_relayed_to_its_groups_processes + the controlled-moment test
def test_sigterm_reaches_member_groups_on_dask_workers(tmp_path, tfds_dir):
    """Groups on Dask workers (other processes: the signal reaches only the run's process)
    stop at their next step through the run directory's stop request; once (each run
    starts a Dask cluster, seconds), signalled once a group has committed a checkpoint,
    and resumed to the uninterrupted run's figures.

    Why not shorter (1-2 min): three runs (reference, stopped, resumed), each starting a
    local Dask cluster whose worker processes import JAX."""
    overrides = ["train.epochs=30", "distributed.member_groups=2", "distributed.task_runner=dask", *TWO_EVALUATORS]
    first, tries, stderr = _stop_proc(tmp_path, tfds_dir, "train@checkpoint", *overrides, tries=1)
    assert len(tries) == 1
    _check_tries(first, tries, stderr)
    for t in tries:
        assert "training stopped at epoch" in t["message"], t
        # Every group stopped before its end (30 epochs x 7 steps) and kept the step it stopped at.
        for g in (0, 1):
            steps = [int(c.rsplit("/", 1)[1]) for c in t["checkpoints"] if c.startswith(f"groups/{g}/")]
            assert steps and max(steps) < 30 * 7, t
        assert not (tmp_path / "runs" / t["run"] / ".stop-request").exists()  # the relay cleans up


def _evaluation_started(proc: subprocess.Popen, lines: list[str], seen: threading.Event) -> None:
    for line in proc.stderr:
        lines.append(line)
        if "Task run 'train_members" in line and "Finished in state" in line:
            seen.set()


# make test: test_cli_process.py's SIGTERM (exit 75, one line), the controlled-moment test's evaluation
@pytest.mark.soak
def test_cli_stopped_during_evaluation_exits_75_with_one_line(tmp_path, tfds_dir, prefect_api):
    """The command line, SIGTERM at a random moment of evaluation: exit 75, one ``error:``
    line naming the stage and the resume command, no traceback; the rerun completes.

    Why not shorter (1-1.5 min under load): the command trains, is stopped in evaluation,
    and its rerun evaluates with every default evaluator (the shifted and OOD sets are
    built once, in the first run)."""
    out = tmp_path / "runs"
    env = cli_env(prefect_api)
    sets = [a for kv in [*SMALL, "train.epochs=1", f"data.data_dir={tfds_dir}"] for a in ("--set", kv)]
    cmd = [sys.executable, "-m", "flows.train_ensemble", *sets, "--output-dir", str(out), "--run-name", "cli"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    seen = threading.Event()
    reader = threading.Thread(target=_evaluation_started, args=(proc, lines, seen), daemon=True)
    reader.start()
    assert seen.wait(timeout=300), "".join(lines)[-3000:]
    time.sleep(random.uniform(0.0, 1.0))  # evaluation with every default evaluator takes seconds
    proc.send_signal(signal.SIGTERM)
    stdout = proc.stdout.read()
    proc.wait(timeout=120)
    reader.join(timeout=30)
    err = "".join(lines)
    assert proc.returncode == 75, err[-3000:]
    errors = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert errors == [
        "error: stopped by SIGTERM during evaluation; fix: rerun with the same run name (--run-name cli) to resume"
    ], err[-3000:]
    assert "Traceback" not in err + stdout
    assert not (out / "cli" / "report.json").exists()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((out / "cli" / "report.json").read_text())["ensemble"]["accuracy"] > 0.5
