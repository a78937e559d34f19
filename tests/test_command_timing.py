"""``report.json -> timing.stages`` covers the whole command line: the seconds before the
flow (interpreter, imports, config, preflight, Prefect's temporary server), Prefect's flow
engine, retention and the seconds after the flow add up, with the run's stages, to the
command's wall time measured from outside the process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ensemble_core.runs.report.timing import (
    COMMAND_END,
    COMMAND_START,
    FLOW_ENGINE,
    RETENTION,
    command_timing,
    timing_lines,
)
from ensemble_core.timing import OTHER, process_seconds

ROOT = Path(__file__).resolve().parents[1]


def _run_timing() -> dict:
    stages = {
        "prepare": {"seconds": 0.5},
        "train": {"seconds": 4.0, "parts": {"steps": {"seconds": 3.0}, OTHER: {"seconds": 1.0}}},
        "evaluate": {"seconds": 2.0},
        "report": {"seconds": 0.25},
    }
    return {"wall_seconds": 6.9, "stages": stages, "training_steps_seconds": 3.0, "retention_seconds": 0.1}


def test_command_entries_complete_the_run_stages_to_the_command_seconds():
    t = command_timing(_run_timing(), start_seconds=5.0, flow_seconds=8.0, end_seconds=0.5)
    names = list(t["stages"])
    assert names[0] == COMMAND_START and names[-3:] == [RETENTION, FLOW_ENGINE, COMMAND_END]
    assert names[1:-3] == ["prepare", "train", "evaluate", "report"]
    # the flow's 8 s = run stages 6.75 + retention 0.1 + the engine's remainder 1.15
    assert t["stages"][FLOW_ENGINE]["seconds"] == pytest.approx(8.0 - 6.75 - 0.1)
    assert sum(s["seconds"] for s in t["stages"].values()) == pytest.approx(13.5)
    assert t["command_seconds"] == pytest.approx(13.5)
    assert t["command_not_training_steps_fraction"] == pytest.approx(1 - 3.0 / 13.5)
    # made again from its run's stages: the same (a rerun of the rewrite does not nest)
    assert command_timing(t, 5.0, 8.0, 0.5) == t
    lines = timing_lines(t)
    assert lines[0] == "command start: 5.0 s (37%)" and lines[-1].startswith("command: 13.5 s")


def test_process_seconds_counts_from_the_process_start():
    code = "import time; time.sleep(1.0); from ensemble_core.timing import process_seconds; print(process_seconds())"
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    outside = time.monotonic() - t0
    assert 1.0 <= float(out) <= outside + 0.02  # the sleep and the interpreter's start, at 10 ms ticks
    assert process_seconds() > 0


@pytest.mark.slow  # the tiny config through the command line with its temporary Prefect server: 15-40 s
def test_the_command_lines_stages_add_up_to_its_wall_time(tmp_path, tfds_dir):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") and k != "XLA_FLAGS"}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    cmd = [sys.executable, "-m", "flows.train_ensemble", "--config", str(ROOT / "configs" / "tiny.yaml")]
    cmd += ["--set", f"data.data_dir={tfds_dir}", "--output-dir", str(tmp_path / "runs"), "--run-name", "t"]
    t0 = time.monotonic()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    outside = time.monotonic() - t0
    assert done.returncode == 0, done.stderr[-3000:]
    timing = json.loads((tmp_path / "runs" / "t" / "report.json").read_text())["timing"]
    stages = timing["stages"]
    assert next(iter(stages)) == COMMAND_START and list(stages)[-1] == COMMAND_END
    total = sum(s["seconds"] for s in stages.values())
    assert total == pytest.approx(timing["command_seconds"])
    assert abs(total - outside) <= 0.05 * outside, (total, outside, stages)
    # every stage's parts explain it, and every part's own parts (each evaluator's data,
    # forward passes, metrics, ...): no unexplained remainder above 10% of what it is part of
    # (plus 20 ms for a stage, 50 ms for a part of one: an evaluator of the tiny config takes
    # 10-250 ms, and a few lines of its own between its timed parts wait for busy cores)
    spans = [(name, stage, 0.02) for name, stage in stages.items()]
    while spans:
        name, span, slack = spans.pop()
        parts = span.get("parts") or {}
        other = parts.get(OTHER, {"seconds": 0.0})["seconds"]
        assert other <= 0.1 * span["seconds"] + slack, (name, span)
        spans += [(f"{name}/{part}", p, 0.05) for part, p in parts.items() if part != OTHER]
    evaluate = stages["evaluate"]["parts"]
    for evaluator in ("test", "rotation", "ood"):
        assert evaluate[evaluator]["parts"]["metrics"]["seconds"] > 0, evaluator
    # the closing lines and report.md say the same
    assert f"command: {timing['command_seconds']:.1f} s" in done.stdout
    assert f"- {COMMAND_START}: {stages[COMMAND_START]['seconds']:.1f} s" in (tmp_path / "runs/t/report.md").read_text()
