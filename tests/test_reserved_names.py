"""Run names that collide with the output directory's own files, and output directories
whose path is not one line, are refused in one line before anything is written (issue 43,
class 5): ``--run-name champion.json`` gave a traceback, ``--run-name corrupt-state``
trained into the quarantine directory and became the champion."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ensemble_core.errors import ConfigError
from ensemble_core.runs.storage.layout import RESERVED_NAMES, check_output_dir, check_run_name, run_dir_for
from tests.prefect_api import cli_env

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", [*RESERVED_NAMES, "Champion.JSON", "CORRUPT-STATE", "History.jsonl"])
def test_every_name_the_output_directory_uses_is_refused(name, tmp_path):
    with pytest.raises(ConfigError, match="uses for itself") as caught:
        check_run_name(name, tmp_path)
    assert "\n" not in str(caught.value) and "fix: choose another run name" in str(caught.value)


@pytest.mark.parametrize("name", ["champion", "champion.json.1", "history", "corrupt-state-2", "nightly"])
def test_names_beside_them_are_accepted(name, tmp_path):
    assert check_run_name(name, tmp_path) == name


@pytest.mark.parametrize("what", ["file", "link-to-file", "broken-link", "fifo"])
def test_a_run_name_taken_by_something_else_than_a_directory_is_refused(tmp_path, what):
    """``--run-name notes.txt`` where the output directory holds a file of that name: it
    ended in a traceback (FileExistsError) after the data was prepared."""
    taken = tmp_path / "notes.txt"
    if what == "file":
        taken.write_text("the user's notes\n")
    elif what == "fifo":
        os.mkfifo(taken)
    else:
        (tmp_path / "elsewhere.txt").write_text("x")
        taken.symlink_to(tmp_path / ("elsewhere.txt" if what == "link-to-file" else "missing"))
    with pytest.raises(ConfigError, match=r"notes.txt' is a .*not a run directory.*fix: choose another run name"):
        run_dir_for(tmp_path, "notes.txt")
    assert taken.is_symlink() or taken.exists()  # untouched
    (tmp_path / "run-1").mkdir()
    assert run_dir_for(tmp_path, "run-1").path == tmp_path / "run-1"  # a directory is a run to resume


@pytest.mark.parametrize("path", ["runs\nfake", "runs\r", "a\tb", "x\x1b[31m"])
def test_an_output_directory_with_a_control_character_is_refused(path, tmp_path):
    with pytest.raises(ConfigError, match="control character"):
        check_output_dir(tmp_path / path)


@pytest.mark.slow  # the CLI in subprocesses: about 5 s each
@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        # one reserved name through the CLI (the others go through the same check, above)
        (["--run-name", "champion.json"], "uses for itself"),
        (["--output-dir", "runs\nsecond-line"], "control character"),
    ],
    ids=["champion.json", "newline-output-dir"],
)
def test_the_cli_refuses_them_in_one_line_and_writes_nothing(tmp_path, args, fragment, prefect_api):
    cmd = [sys.executable, "-m", "flows.train_ensemble", "--set", "train.epochs=1"]
    if "--output-dir" not in args:
        args = [*args, "--output-dir", "runs"]
    # on the session's server: a command line without one starts its own temporary server
    # while it checks (tests/test_cli_process.py proves that server stops on a refusal)
    env = cli_env(prefect_api, PYTHONPATH=str(ROOT))
    proc = subprocess.run([*cmd, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and fragment in errors[0] and "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing created
