"""The training command line with a user's network that floods the output while it is traced
(issue "reliability round five", class 4), under the flow's ``log_prints``: stopped by
SIGTERM in the middle of a trace inside the flow it ends within seconds with exit code 75,
and the rerun completes with the flood summarised in a few lines.

Every wait is bounded and the command's output goes to files (a pipe nobody reads would
block it): on code that turned each printed line into a Prefect API record (each trace of
200,000 lines took minutes) the test fails at its first deadline instead of hanging.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINES = 200_000

TRACE_FLOOD = """
import os
import flax.linen as nn

LINES = int(os.environ["FLOOD_LINES"])


class Net(nn.Module):
    num_classes: int = 10

    @nn.compact
    def __call__(self, x, train: bool = False):
        with open(os.environ["FLOOD_MARK"], "a") as f:
            f.write("trace\\n")
        for i in range(LINES):  # each time the network is traced: the check, training, evaluation
            print(f"flood line {i} while traced")
        os.write(2, b"flood on fd 2\\n")
        return nn.Dense(self.num_classes)(x.reshape((x.shape[0], -1)))
"""


def _start(tmp_path: Path, tfds_dir: str, name: str) -> tuple[subprocess.Popen, Path, Path]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(FLOOD_LINES=str(LINES), FLOOD_MARK=str(tmp_path / "mark.txt"), PYTHONPATH=str(tmp_path))
    sets = [f"data.data_dir={tfds_dir}", "model.name=trace_flood:Net", "eval.evaluators=[test]"]
    cmd = [sys.executable, "-m", "flows.train_ensemble", "--config", str(ROOT / "configs" / "tiny.yaml")]
    cmd += [a for s in sets for a in ("--set", s)] + ["--output-dir", str(tmp_path / "runs"), "--run-name", "flood"]
    out, err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
    with open(out, "w") as o, open(err, "w") as e:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=o, stderr=e, start_new_session=True)
    return proc, out, err


def _end(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _wait(what: str, until, proc: subprocess.Popen, err: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = err.read_text(errors="replace")[-1500:]
            pytest.fail(f"{what}: not within {timeout:.0f} s (exit {proc.poll()}); stderr ends {tail!r}")
        time.sleep(0.1)


@pytest.mark.slow  # two runs of the command line with its temporary Prefect server: about 2 minutes on 2 cores
def test_sigterm_during_a_flooding_trace_in_the_flow_then_the_rerun_completes(tmp_path, tfds_dir):
    """A network printing 200,000 lines each time it is traced: SIGTERM half a second into
    a trace inside the flow ends the command with exit code 75 within 15 s (one
    ``error: stopped`` line naming the rerun), and the rerun with the same run name
    completes, its output a few dozen lines with each trace's count."""
    (tmp_path / "trace_flood.py").write_text(TRACE_FLOOD)
    mark = tmp_path / "mark.txt"
    proc, _, err = _start(tmp_path, str(tfds_dir), "stopped")
    try:
        _wait("the flow run's start", lambda: "Beginning flow run" in err.read_text(errors="replace"), proc, err, 240)
        traces = mark.read_text().count("trace") if mark.exists() else 0
        _wait("a trace inside the flow", lambda: mark.read_text().count("trace") > traces, proc, err, 60)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        try:
            proc.wait(timeout=45)
        except subprocess.TimeoutExpired:
            pytest.fail("SIGTERM not obeyed within 45 s of a trace that prints 200,000 lines")
        stop_s = time.monotonic() - sent
    finally:
        _end(proc)
    text = err.read_text(errors="replace")
    last = text.strip().splitlines()[-1]
    assert proc.returncode == 75 and stop_s < 15, (proc.returncode, round(stop_s, 1), text[-2000:])
    assert last.startswith("error: ") and "stopped" in last and "--run-name flood" in last, text[-2000:]
    assert "Traceback" not in text and len(text.splitlines()) < 200, text[-2000:]

    proc, out, err = _start(tmp_path, str(tfds_dir), "rerun")
    try:
        proc.wait(timeout=300)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the rerun did not end within 300 s; stderr ends {err.read_text(errors='replace')[-1500:]!r}")
    finally:
        _end(proc)
    text, output = err.read_text(errors="replace"), out.read_text(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    assert output.strip().splitlines()[-1] == str(tmp_path / "runs" / "flood"), output[-1000:]
    assert "Traceback" not in text and len(text.splitlines()) < 200 and len(output.splitlines()) < 50, text[-2000:]
    summaries = [line for line in text.splitlines() if "flood line 0 while traced" in line]
    counts = {int(n) for line in summaries for n in re.findall(r"\.\.\. (\d+) more lines \.\.\.", line)}
    assert summaries and counts and min(counts) >= LINES - 10, summaries[:3]
    assert sum(line.count("flood line") for line in text.splitlines()) <= 10 * len(summaries)
