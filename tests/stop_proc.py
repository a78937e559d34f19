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
    # "train@checkpoint": signal once a checkpoint is committed (training is under way in
    # other processes, e.g. Dask workers, whose start-up time varies too much to time).
    stages, at_checkpoint = stages.replace("@checkpoint", ""), "@checkpoint" in stages
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

    # A signal can land after a run has ended (its handlers gone, the sender not yet told):
    # Python's default action would kill this harness; ignored here, and the try is done again.
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    with _ephemeral.temporary_server():
        # The second run times the stages with compilations cached (not needed at a checkpoint).
        for name in ("reference",) if at_checkpoint else ("reference", "timing"):
            state = run(name)
            assert state.is_completed(), state.message
        stage_s = {stage: times[-1] for stage, times in durations.items()}
        print(json.dumps({"reference": _metrics(Path(out) / "reference"), "stage_s": stage_s}), flush=True)
        for stage in started:
            for i in range(int(tries)):
                # A run whose stage ended before its random moment (the machine's load varies:
                # the stage may run faster than when it was timed) got no signal, or got it
                # after the stage, in a later one: it is done again under a new name, up to 3 times.
                for attempt in range(3):
                    name = f"{stage}-{i}" if attempt == 0 else f"{stage}-{i}.{attempt}"
                    delay = _after_checkpoint(Path(out) / name) if at_checkpoint else stage_s[stage]
                    record = _try(run, out, name, started[stage], delay, lambda s=stage: ends[s], i == 0)
                    if record["latency_s"] is not None and record["stage_after_signal_s"] >= 0:
                        break
                print(json.dumps(record), flush=True)
    return 0


def _after_checkpoint(run_dir: Path):
    """A delay function: wait for a committed checkpoint of ``run_dir`` (or of one of its
    member groups), then 0-0.5 s."""

    def wait() -> float:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            dirs = [run_dir / "checkpoints", *run_dir.glob("groups/*/checkpoints")]
            if any(p.name.isdigit() for d in dirs if d.is_dir() for p in d.iterdir()):
                break
            time.sleep(0.02)
        return 0.5

    return wait


def _try(run, out: str, name: str, started: threading.Event, duration, stage_end, resume: bool) -> dict:
    """One stopped run: SIGTERM after a random part of ``duration`` (seconds, or a function
    that waits and returns them) from the stage's start; never after the run ended."""
    started.clear()
    finished = threading.Event()
    sent: list[float] = []

    def send() -> None:
        if started.wait(timeout=300):
            limit = duration() if callable(duration) else 0.8 * duration
            if not finished.wait(random.uniform(0.0, limit)):
                sent.append(time.monotonic())
                os.kill(os.getpid(), signal.SIGTERM)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    state = run(name)
    ended = time.monotonic()
    finished.set()
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
