"""Stop signals at random moments inside one stage of the real flow (``python -m tests.stop_proc``).

    python -m tests.stop_proc OUTPUT_DIR TFDS_DIR STAGE TRIES [KEY=VALUE ...]

Runs the ``train-ensemble`` flow (Prefect's engine, with its own SIGTERM handler, on a
temporary Prefect server) once uninterrupted to time STAGE (``prepare``, ``train`` or
``evaluate``), then TRIES times: a run named ``try<i>`` whose STAGE, once started, gets a
real SIGTERM sent to this process after a uniformly random delay within the stage's
measured duration; each stopped run is then rerun under the same name. Prints one JSON
line per try: the stopped run's final state and message, the seconds from the signal to
the end of the stopped run, and the resumed run's state and test accuracy / NLL (to be
compared with the uninterrupted run's, printed first).
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import dataclasses
import json
import random
import signal
import sys
import threading
import time
from pathlib import Path

from ensemble_core.config import load_config
from flows import _ephemeral
from flows import train_ensemble as flow_module


def _metrics(run_dir: Path) -> dict:
    report = json.loads((run_dir / "report.json").read_text())
    return {"ensemble": report["ensemble"], "members": report["members"]}


def _stopped_run(run_dir: Path) -> dict:
    """What a stopped run left: its report (it must have none), the committed checkpoint
    steps, and orbax's uncommitted temporary directories (it must have none)."""
    ckpts = [p for d in (run_dir, *sorted(run_dir.glob("groups/*"))) for p in (d / "checkpoints").glob("*")]
    return {
        "report": (run_dir / "report.json").exists(),
        "checkpoints": sorted(str(p.relative_to(run_dir)) for p in ckpts if p.name.isdigit()),
        "uncommitted": sorted(str(p.relative_to(run_dir)) for p in ckpts if "tmp" in p.name),
    }


def main(argv: list[str]) -> int:
    out, tfds_dir, stages, tries, *overrides = argv
    cfg = load_config(None, [f"data.data_dir={tfds_dir}", "promotion.enabled=false", *overrides])
    started = {stage: threading.Event() for stage in stages.split(",")}
    durations: dict[str, list[float]] = {stage: [] for stage in started}
    ends: dict[str, float] = {}

    def marked(stage: str, call):
        def run_stage(*args, **kwargs):
            started[stage].set()
            t = time.monotonic()
            try:
                return call(*args, **kwargs)
            finally:
                ends[stage] = time.monotonic()
                durations[stage].append(ends[stage] - t)

        return run_stage

    wrapped = {stage: marked(stage, getattr(flow_module.STAGES, stage)) for stage in started}
    flow_module.STAGES = dataclasses.replace(flow_module.STAGES, **wrapped)

    def run(name: str):
        return flow_module.train_ensemble(config=cfg, output_dir=out, run_name=name, return_state=True)

    with _ephemeral.temporary_server():
        for name in ("reference", "timing"):  # the second: the stages' times with compilations cached
            state = run(name)
            assert state.is_completed(), state.message
        stage_s = {stage: times[-1] for stage, times in durations.items()}
        print(json.dumps({"reference": _metrics(Path(out) / "reference"), "stage_s": stage_s}), flush=True)
        for stage in started:
            for i in range(int(tries)):
                record = _try(run, out, f"{stage}-{i}", started[stage], stage_s[stage], lambda s=stage: ends[s], i == 0)
                print(json.dumps(record), flush=True)
    return 0


def _try(run, out: str, name: str, started: threading.Event, duration: float, stage_end, resume: bool) -> dict:
    started.clear()
    sent: list[float] = []

    def send() -> None:
        if started.wait(timeout=300):
            time.sleep(random.uniform(0.0, duration))
            sent.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGTERM)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    state = run(name)
    ended = time.monotonic()
    sender.join(timeout=300)
    record = {"run": name, "type": state.type.value, "message": state.message}
    record["latency_s"] = ended - sent[0] if sent else None
    # How long the stage went on after the signal (it ends at its next boundary).
    record["stage_after_signal_s"] = stage_end() - sent[0] if sent else None
    record.update(_stopped_run(Path(out) / name))
    if resume:
        resumed = run(name)
        record["resumed"] = resumed.type.value
        if resumed.is_completed():
            record["metrics"] = _metrics(Path(out) / name)
    return record


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
