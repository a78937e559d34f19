"""A user's network that floods the output (issue "reliability round five", class 4).

Under a flow with ``log_prints=True`` each ``print`` of a user's code became a Prefect API
log record (about 1,000-1,500 a second on 2 cores): a network whose construction printed
50,000 lines took 31-57 s to build, each of the five times it is built, and SIGTERM was not
obeyed until the records drained. Now what the user's code prints is captured, bounded, and
logged once (:func:`ensemble_core.output_capture.captured_output`).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINES = 50_000

FLOOD_MODULE = """
import os, time
import flax.linen as nn

LINES = int(os.environ["FLOOD_LINES"])


def _flood(tag):
    with open(os.environ["FLOOD_MARK"], "a") as f:
        f.write(f"{tag} start\\n")
    for i in range(LINES):
        print(f"{tag}: line {i} of the flood")
    with open(os.environ["FLOOD_MARK"], "a") as f:
        f.write(f"{tag} end\\n")


_flood("import")


class FloodNet(nn.Module):
    num_classes: int = 10

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.num_classes)(x.reshape(x.shape[0], -1))


def build(num_classes: int = 10):
    _flood("build")
    return FloodNet(num_classes)
"""


def test_user_code_output_is_bounded_and_logged_once(caplog):
    """In process: 100,000 printed lines (print and sys.stderr) become one log record with
    the first and last lines and the count of those between."""
    from ensemble_core.user_import import user_code

    with caplog.at_level(logging.INFO, logger="ensemble_core.user_import"), user_code("model 'flood'"):
        for i in range(100_000):
            print("line", i)
        print("to stderr", file=sys.stderr)
    records = [r.getMessage() for r in caplog.records if r.name == "ensemble_core.user_import"]
    assert len(records) == 1, records
    assert records[0].startswith("model 'flood' printed: line 0 | line 1"), records[0][:200]
    assert "... 99991 more lines ..." in records[0] and records[0].endswith("line 99999 | to stderr")


@pytest.mark.slow  # the command line with its temporary Prefect server: about 30 s on 2 busy cores
def test_a_flooding_network_builds_at_once_and_the_run_obeys_sigterm(tmp_path, tfds_dir):
    """A network whose import and construction print 50,000 lines each, through the
    command line under its temporary Prefect server: each build inside the flow takes
    well under a second (it took 31-57 s), and SIGTERM one second after the flow's build
    starts ends the command with exit code 75 within 15 s."""
    (tmp_path / "floodnet.py").write_text(FLOOD_MODULE)
    mark = tmp_path / "mark.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(FLOOD_LINES=str(LINES), FLOOD_MARK=str(mark), PYTHONPATH=str(tmp_path))
    sets = [
        f"data.data_dir={tfds_dir}",
        "model.name=floodnet:build",
        "eval.evaluators=[test]",
        "train.epochs=3",
    ]
    cmd = [sys.executable, "-m", "flows.train_ensemble", "--config", str(ROOT / "configs" / "tiny.yaml")]
    cmd += [a for s in sets for a in ("--set", s)] + ["--output-dir", str(tmp_path / "runs"), "--run-name", "flood"]
    # output to files, read once the process has ended: a pipe nobody reads fills up and
    # stalls a flooding process, and waiting on it in an assertion hung the test on old code
    out_file, err_file = tmp_path / "stdout", tmp_path / "stderr"
    with out_file.open("w") as out, err_file.open("w") as errors:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=errors, text=True)
    err = ""
    try:
        deadline = time.monotonic() + 240
        # the first build is the command line's own check (outside the flow); the second is the flow's
        while not (mark.exists() and mark.read_text().count("build start") >= 2):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the flow never built the network twice: {err_file.read_text()[-3000:]}")
            time.sleep(0.05)
        started = time.monotonic()
        while mark.read_text().count("build end") < 2 and time.monotonic() - started < 10:
            time.sleep(0.05)
        build_s = time.monotonic() - started
        time.sleep(max(0.0, 1.0 - build_s))
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        try:
            proc.wait(timeout=45)
            err = err_file.read_text(errors="replace")
        except subprocess.TimeoutExpired:
            pytest.fail(f"SIGTERM not obeyed within 45 s (the flow's build took {build_s:.1f} s of its 10 s allowance)")
        stop_s = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert build_s < 5, f"building the flooding network in the flow took {build_s:.1f} s"
    assert proc.returncode == 75 and stop_s < 15, (proc.returncode, round(stop_s, 1), err[-2000:])
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and "stopped" in last and "--run-name flood" in last, err[-2000:]
    assert len(err.splitlines()) < 1000  # the flood is not in the output line by line
    assert "... 49990 more lines ..." in err  # but is summarised, with its count
