"""Clean logs on a newcomer's first run: the dataset preparation's lines (decoding progress,
files skipped) reach the flow run's logs in Prefect, whether the command line prepared the
dataset before starting its flow run or the flow run prepared it (a deployment); no Prefect
``UserWarning`` about logs sent without a flow run id; no TFDS progress bars or
variant-folder warnings unless ``ENSEMBLE_TFDS_VERBOSE=1``."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import warnings
from pathlib import Path

import httpx
import pytest

from tests._image_export import write_digit_folder
from tests.prefect_api import cli_env

ROOT = Path(__file__).resolve().parents[1]

#: tests/ensembles.py tiny_config's run, as --set overrides (2 MLP members, 1 epoch).
TINY = [
    "data.validation_fraction=0",
    "data.calibration_fraction=0",
    "model.name=mlp",
    "model.hidden_sizes=[16]",
    "ensemble.size=2",
    "train.batch_size=16",
    "train.epochs=1",
    "eval.evaluators=[test]",
    "retention.enabled=false",
]
PROGRESS_BAR = ("Generating splits", "examples/s", "Shuffling", "\x1b[A")


def _digit_folder(root: Path) -> Path:
    """64 training and 16 test digits (every class in training) as PNGs, and one file that is not an image (left out
    with ``data.on_bad_image=skip``, logged by name)."""
    write_digit_folder(root, 64, 16)
    (root / "train" / "3" / "broken.png").write_bytes(b"not a png")
    return root


def _flow_run_logs(api_url: str, flow_run_id: str) -> list[dict]:
    """The flow run's logs as the Prefect API serves them (``POST /logs/filter``)."""
    body = {"logs": {"flow_run_id": {"any_": [flow_run_id]}}, "sort": "TIMESTAMP_ASC", "limit": 200}
    response = httpx.post(f"{api_url}/logs/filter", json=body, timeout=30)
    response.raise_for_status()
    return response.json()


def _flow_run_id(output: str) -> str:
    (run_id,) = set(re.findall(r"/runs/flow-run/([0-9a-f-]{36})", output))
    return run_id


def _assert_preparation_logged(logs: list[dict], broken: Path) -> None:
    messages = {(log["name"], log["message"]) for log in logs}
    assert ("ensemble_core.data.user_source", "decoding train: 65/65 images") in messages, messages
    assert ("ensemble_core.data.user_source", "decoding test: 16/16 images") in messages
    assert any(name == "ensemble_core.data.image_folder" and f"skipped {broken}: " in m for name, m in messages)
    assert any("left out 1 file(s) that cannot be decoded" in m for _, m in messages)


# MARK: the mechanisms, without a server


@pytest.fixture
def project_api_handler(monkeypatch):
    """The ``ensemble_core`` logger with a Prefect API log handler of its own (as
    ``PREFECT_LOGGING_EXTRA_LOGGERS`` gives it), whose sends are collected in a list."""
    from prefect.logging import handlers

    import flows  # noqa: F401  (first: importing it attaches Prefect's own API handler, flows.environment)

    sent: list[dict] = []
    monkeypatch.setattr(handlers, "emit_api_log", sent.append)
    project = logging.getLogger("ensemble_core")
    saved = project.handlers[:]
    handler = handlers.APILogHandler()
    project.handlers[:] = [handler]
    try:
        yield sent
    finally:
        project.handlers[:] = saved


def test_preflight_records_are_held_for_the_flow_run_without_a_warning(project_api_handler):
    """A record of the project's loggers outside any run: Prefect's API handler warns (the
    newcomer's two UserWarnings) and drops it; inside ``logs_held_for_next_run`` (the
    command line's preflight) it is held, without a warning, for the flow run."""
    from flows import prefect_services

    log = logging.getLogger("ensemble_core.data.user_source")
    with pytest.warns(UserWarning, match="attempted to send logs to the API without a flow run id"):
        log.info("outside any run")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with prefect_services.logs_held_for_next_run():
            log.info("decoding %s: %d/%d images", "train", 3, 3)
    assert project_api_handler == []
    assert [r.getMessage() for r in prefect_services._HELD] == ["decoding train: 3/3 images"]
    assert prefect_services.send_held_logs() == 0  # no flow run here: nothing to send them to
    assert prefect_services._HELD == []


def test_a_flow_start_attaches_the_project_logger_to_prefects_handlers():
    """Where ``PREFECT_LOGGING_EXTRA_LOGGERS`` came too late (Prefect imported first, as in
    a deployment's flow-run process), ``attach_project_logger`` (called when a flow starts)
    gives ``ensemble_core`` the extra loggers' API handler."""
    from prefect.logging.configuration import ensure_logging_setup
    from prefect.logging.handlers import APILogHandler

    from flows import environment

    ensure_logging_setup()
    project = logging.getLogger("ensemble_core")
    saved = project.handlers[:]
    project.handlers[:] = []
    try:
        environment.attach_project_logger()
        environment.attach_project_logger()
        attached = [h for h in project.handlers if isinstance(h, APILogHandler)]
        assert len(attached) == 1 and attached[0] in logging.getLogger("prefect.extra").handlers
    finally:
        project.handlers[:] = saved


@pytest.mark.parametrize("verbose", [None, "1"])
def test_tfds_progress_bars_and_variant_lines_off_unless_asked(tmp_path, monkeypatch, caplog, verbose):
    """``quiet_tfds``: TFDS's progress bar is a no-op and its ``Variant folder ... has no
    dataset_info.json`` warning (logged when it checks a dataset not yet prepared) is
    dropped; with ``ENSEMBLE_TFDS_VERBOSE=1`` both stay as TFDS has them."""
    from absl import logging as absl_logging
    from tensorflow_datasets.core.utils import file_utils, tqdm_utils

    from flows import environment

    if verbose is None:
        monkeypatch.delenv(environment.TFDS_VERBOSE_ENV, raising=False)
    else:
        monkeypatch.setenv(environment.TFDS_VERBOSE_ENV, verbose)
    absl = absl_logging.get_absl_logger()
    was_active, was_filtered = tqdm_utils._active, environment._TFDS_FILTER in absl.filters
    tqdm_utils.display_progress_bar(True)
    absl.removeFilter(environment._TFDS_FILTER)
    try:
        environment.quiet_tfds()
        with caplog.at_level(logging.WARNING):
            assert not file_utils.is_valid_variant_dir(tmp_path / "mnist5k" / "1.0.0")
        variant_lines = [r for r in caplog.records if r.getMessage().startswith("Variant folder")]
        bar = tqdm_utils.tqdm(range(3), disable=True)
        if verbose:
            assert variant_lines and not isinstance(bar, tqdm_utils.EmptyTqdm)
        else:
            assert not variant_lines and isinstance(bar, tqdm_utils.EmptyTqdm)
    finally:
        tqdm_utils.display_progress_bar(was_active)
        absl.removeFilter(environment._TFDS_FILTER)
        if was_filtered:
            absl.addFilter(environment._TFDS_FILTER)


# MARK: through the command line and a flow run, on the session's Prefect server


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory, prefect_api):
    """``python -m flows.train_ensemble`` on a tiny image folder (with one broken file, left
    out) in a new TFDS data dir, so the command line's preflight decodes and prepares it."""
    tmp = tmp_path_factory.mktemp("clean-logs")
    folder = _digit_folder(tmp / "digits")
    sets = [*TINY, "data.source=image_folder", f"data.path={folder}", f"data.data_dir={tmp / 'tfds'}"]
    sets.append("data.on_bad_image=skip")
    cmd = [sys.executable, "-m", "flows.train_ensemble", "--output-dir", str(tmp / "runs"), "--run-name", "first"]
    env = cli_env(prefect_api)
    env.pop("ENSEMBLE_TFDS_VERBOSE", None)
    done = subprocess.run(
        [*cmd, *(arg for kv in sets for arg in ("--set", kv))],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return done, folder


@pytest.mark.slow  # a tiny run through the command line (and the session's Prefect server): 20-60 s
def test_an_image_folder_run_prints_no_user_warning_and_no_progress_bar(cli_run):
    done, folder = cli_run
    output = done.stdout + done.stderr
    assert done.returncode == 0, done.stderr[-3000:]
    assert "UserWarning" not in output and "Traceback" not in output, output[-3000:]
    assert not [bar for bar in PROGRESS_BAR if bar in output], output[-3000:]
    assert "Variant folder" not in output
    # the preparation's lines still show on the console, once each
    assert output.count("decoding train: 65/65 images") == 1
    assert output.count(f"skipped {folder / 'train' / '3' / 'broken.png'}: ") == 1


@pytest.mark.slow  # reads the run of test_an_image_folder_run_prints_no_user_warning_and_no_progress_bar
def test_the_command_lines_preparation_lines_are_in_the_flow_runs_logs(cli_run, prefect_api):
    """The preflight decoded the folder before the flow run existed; its lines are in that
    flow run's logs, read through the Prefect API."""
    done, folder = cli_run
    assert done.returncode == 0, done.stderr[-3000:]
    logs = _flow_run_logs(prefect_api, _flow_run_id(done.stdout + done.stderr))
    _assert_preparation_logged(logs, folder / "train" / "3" / "broken.png")


# What a deployment's flow-run process does (prefect.engine): Prefect imported, and its
# settings read, before the flow's module is loaded from its entrypoint.
_ENGINE_ORDER = """
import json, sys
import prefect
from prefect.flows import load_flow_from_entrypoint

flow = load_flow_from_entrypoint("flows/train_ensemble.py:train_ensemble")
state = flow(**json.loads(sys.argv[1]), return_state=True)
print("final state:", state.type.value)
"""


@pytest.mark.slow  # a tiny run in a flow-run process: about 25 s on 2 busy cores
def test_a_flow_loaded_after_prefect_sends_the_preparation_lines_to_its_run(tmp_path, prefect_api):
    """Without ``PREFECT_LOGGING_EXTRA_LOGGERS`` in the environment (a deployment created
    without prefect.yaml's job variables), the flow run's own preflight prepares the
    dataset and its lines reach the flow run's logs; no UserWarning."""
    folder = _digit_folder(tmp_path / "digits")
    config = {
        "data": {
            "source": "image_folder",
            "path": str(folder),
            "data_dir": str(tmp_path / "tfds"),
            "on_bad_image": "skip",
            "validation_fraction": 0,
            "calibration_fraction": 0,
        },
        "model": {"name": "mlp", "hidden_sizes": [16]},
        "ensemble": {"size": 2},
        "train": {"batch_size": 16, "epochs": 1},
        "eval": {"evaluators": ["test"]},
        "retention": {"enabled": False},
    }
    parameters = {"config": config, "output_dir": str(tmp_path / "runs"), "run_name": "deployed"}
    env = cli_env(prefect_api)
    for name in ("PREFECT_LOGGING_EXTRA_LOGGERS", "ENSEMBLE_TFDS_VERBOSE"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-c", _ENGINE_ORDER, json.dumps(parameters)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "final state: COMPLETED" in done.stdout, output[-3000:]
    assert "UserWarning" not in output and not [bar for bar in PROGRESS_BAR if bar in output], output[-3000:]
    logs = _flow_run_logs(prefect_api, _flow_run_id(output))
    _assert_preparation_logged(logs, folder / "train" / "3" / "broken.png")
