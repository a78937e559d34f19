"""A read-only home directory (issue 43, class 6): the command lines with no Prefect server
configured start a temporary one whose SQLite database lives in ``PREFECT_HOME``
(``~/.prefect``). Where that cannot be written, they refuse in one line naming the
directory and the fix, before the data is prepared; it used to be reported after the
data was prepared, as Prefect's server failing at startup ("check PREFECT_HOME's database").
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # two command lines in subprocesses

ROOT = Path(__file__).resolve().parents[1]
TRAIN = [sys.executable, "-m", "flows.train_ensemble", "--config", str(ROOT / "configs" / "tiny.yaml")]
PREDICT = [sys.executable, "-m", "flows.predict", "--tfds-name", "mnist5k"]


@contextlib.contextmanager
def read_only_home(tmp_path: Path) -> Iterator[Path]:
    """A home directory nobody can write: a read-only tmpfs as root (who may write any
    directory whatever its mode), a directory of mode 0555 otherwise."""
    home = tmp_path / "home"
    home.mkdir()
    if os.geteuid() == 0:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(home)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a read-only tmpfs: {done.stderr.decode().strip()}")
        try:
            yield home
        finally:
            subprocess.run(["umount", "-l", str(home)], check=False)
    else:
        home.chmod(0o555)
        try:
            yield home
        finally:
            home.chmod(0o755)


def _env(home: Path) -> dict[str, str]:
    """The user's environment with no Prefect setting (no server configured, PREFECT_HOME
    from HOME) and no device flag (the command sets its own)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") and k != "XLA_FLAGS"}
    return {**env, "HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "Warning" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "fix:" in lines[0], proc.stderr
    return lines[0]


def test_read_only_home_is_named_before_any_compute(tmp_path):
    data, out = tmp_path / "data", tmp_path / "runs"
    with read_only_home(tmp_path) as home:
        train = subprocess.run(
            [*TRAIN, "--set", f"data.data_dir={data}", "--output-dir", str(out), "--run-name", "r"],
            cwd=ROOT,
            env=_env(home),
            capture_output=True,
            text=True,
            timeout=300,
        )
        predict = subprocess.run(
            [*PREDICT, "--data-dir", str(data), "--run-dir", str(ROOT / "tests"), "--output", str(tmp_path / "p.npz")],
            cwd=ROOT,
            env=_env(home),
            capture_output=True,
            text=True,
            timeout=300,
        )
    line = _one_error_line(train)
    cause, fix = line.split("fix:")
    assert f"{home} is read-only" in cause or f"{home} is not writable" in cause, line
    assert f"{home}/.prefect" in cause and "PREFECT_HOME" in fix, line
    assert not out.exists()  # nothing written
    assert not data.exists() or not any(data.rglob("*.array_record*"))  # the data was not prepared
    assert f"{home}/.prefect" in _one_error_line(predict)  # checked before the run dir (not a run)
    assert not (tmp_path / "p.npz").exists()
