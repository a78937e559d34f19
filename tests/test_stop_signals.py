"""Stop signals that always stop: a real SIGTERM at random moments inside every stage of
the real flow (Prefect's engine and its own SIGTERM handler in place), one program and
member groups on the local runner, and the command line's one line and exit code 75.

Before :mod:`ensemble_core.stopping`, a SIGTERM during evaluation was raised by Prefect's
handler wherever the main thread was, and lost about half the time inside a
garbage-collection callback (the run completed); a member group on the thread-pool runner
trained to its last epoch. A stop request is now a flag every stage polls.
"""

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # flows under a temporary Prefect server, signals, resumes

ROOT = Path(__file__).resolve().parents[1]
TRIES = 10
SMALL = [
    "data.max_train_examples=512",
    "data.max_test_examples=200",
    "model.name=mlp",
    "model.hidden_sizes=[64]",
    "ensemble.size=4",
    "train.batch_size=64",
]


def _stop_proc(
    tmp_path: Path, tfds_dir: str, stages: str, *overrides: str, tries: int = TRIES
) -> tuple[dict, list[dict], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API") and k != "XLA_FLAGS"}
    cmd = [sys.executable, "-m", "tests.stop_proc", str(tmp_path / "runs"), tfds_dir, stages, str(tries)]
    done = subprocess.run([*cmd, *SMALL, *overrides], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    first, *tries = (json.loads(line) for line in done.stdout.splitlines() if line.startswith("{"))
    return first, tries, done.stderr


def _check_tries(first: dict, tries: list[dict], stderr: str) -> None:
    for t in tries:
        # Stopped, never completed: Crashed with the one line saying how to resume.
        assert t["type"] == "CRASHED", t
        assert t["message"].startswith("preempted: ") and f"(run_name {t['run']}) to resume" in t["message"], t
        stage = t["run"].rsplit("-", 1)[0]
        if "training stopped at epoch" in t["message"]:
            assert t["checkpoints"], t  # the step where it stopped is checkpointed
        elif stage == "evaluate":
            assert "stopped by SIGTERM during evaluation" in t["message"], t
            # At the next batch or evaluator: well before the stage's end (uninterrupted
            # it takes first["stage_s"]; without the checks it ran to its end and stopped there).
            assert t["stage_after_signal_s"] < max(0.5 * first["stage_s"]["evaluate"], 1.5), t
        else:  # at the stage's start or end (preparation takes milliseconds): the next boundary
            assert "stopped by SIGTERM" in t["message"], t
        assert not t["report"] and not t["uncommitted"], t
        # The stop ends the run within seconds: the next step or batch, then Prefect's bookkeeping.
        assert t["latency_s"] is not None and t["latency_s"] < 15, t
        if "resumed" in t:  # nothing lost: the rerun completes with the uninterrupted run's figures
            assert t["resumed"] == "COMPLETED" and t["metrics"] == first["reference"], t
    assert sum("resumed" in t for t in tries) == len({t["run"].rsplit("-", 1)[0] for t in tries})
    assert "Traceback" not in stderr and "Exception ignored" not in stderr


def test_sigterm_at_random_moments_in_every_stage(tmp_path, tfds_dir):
    first, tries, stderr = _stop_proc(tmp_path, tfds_dir, "prepare,train,evaluate", "train.epochs=2")
    assert len(tries) == 3 * TRIES
    _check_tries(first, tries, stderr)


def test_sigterm_stops_member_groups_on_the_local_runner(tmp_path, tfds_dir):
    first, tries, stderr = _stop_proc(tmp_path, tfds_dir, "train", "train.epochs=20", "distributed.member_groups=2")
    assert len(tries) == TRIES
    _check_tries(first, tries, stderr)
    # Groups train in a thread-pool thread, which never receives a signal: they stop at
    # their next step all the same (before, each trained to its last epoch, 20 x 7 steps).
    stopped_inside = [t for t in tries if "training stopped at epoch" in t["message"]]
    assert stopped_inside, tries
    for t in stopped_inside:
        step = int(re.search(r"global step (\d+)", t["message"]).group(1))
        assert step < 20 * 7 and any(c.endswith(f"/checkpoints/{step}") for c in t["checkpoints"]), t


def test_sigterm_reaches_member_groups_on_dask_workers(tmp_path, tfds_dir):
    """Groups on Dask workers (other processes: the signal reaches only the run's process)
    stop at their next step through the run directory's stop request; twice (each run
    starts a Dask cluster, seconds), signalled once a group has committed a checkpoint."""
    overrides = ["train.epochs=60", "distributed.member_groups=2", "distributed.task_runner=dask"]
    first, tries, stderr = _stop_proc(tmp_path, tfds_dir, "train@checkpoint", *overrides, tries=2)
    assert len(tries) == 2
    _check_tries(first, tries, stderr)
    for t in tries:
        assert "training stopped at epoch" in t["message"], t
        # Every group stopped before its end (60 epochs x 7 steps) and kept the step it stopped at.
        for g in (0, 1):
            steps = [int(c.rsplit("/", 1)[1]) for c in t["checkpoints"] if c.startswith(f"groups/{g}/")]
            assert steps and max(steps) < 60 * 7, t
        assert not (tmp_path / "runs" / t["run"] / ".stop-request").exists()  # the relay cleans up


def _evaluation_started(proc: subprocess.Popen, lines: list[str], seen: threading.Event) -> None:
    for line in proc.stderr:
        lines.append(line)
        if "Task run 'train_members" in line and "Finished in state" in line:
            seen.set()


def test_cli_stopped_during_evaluation_exits_75_with_one_line(tmp_path, tfds_dir):
    """The command line, SIGTERM at a random moment of evaluation: exit 75, one ``error:``
    line naming the stage and the resume command, no traceback; the rerun completes."""
    out = tmp_path / "runs"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API") and k != "XLA_FLAGS"}
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
