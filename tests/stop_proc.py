"""Stop signals inside one stage of the real flow (``python -m tests.stop_proc``).

    python -m tests.stop_proc OUTPUT_DIR TFDS_DIR STAGE[@MOMENT][,...] TRIES [KEY=VALUE ...]

Runs the ``train-ensemble`` flow (Prefect's engine, with its own SIGTERM handler, on a
temporary Prefect server) once uninterrupted (``reference``), then TRIES times per STAGE
(``prepare``, ``train`` or ``evaluate``): a run named ``<stage>-<i>`` that gets a real
SIGTERM sent to this process at MOMENT of STAGE; each stage's first stopped run is then
rerun under the same name. MOMENT is what the test controls:

- ``random`` (the default): after a uniformly random delay within the stage's measured
  duration (a second uninterrupted run, ``timing``, measures it with compilations cached);
  the statistical version, for ``make soak``;
- ``start``: as soon as the stage has started;
- ``checkpoint``: as soon as a checkpoint of the run (or of one of its member groups) is
  committed (training under way, in this process or in others such as Dask workers);
  training in this process then waits after that checkpoint until the stop request is
  recorded, so the signal lands mid-training whatever the machine's load, and the signal
  goes to the thread that saved it (a member group's, on the thread pool), where the
  kernel may deliver a process's signal: the main thread must still act on it;
- ``evaluator``: as soon as the second evaluator of ``eval.evaluators`` starts.

Prints one JSON line per try: the stopped run's final state and message, the seconds from
the signal to the end of the stopped run, and the resumed run's state and test accuracy /
NLL (to be compared with the uninterrupted run's, printed first).
"""

import os

from tests.xla_flags import xla_flags  # no JAX import

os.environ.setdefault("XLA_FLAGS", xla_flags(8))

import dataclasses
import json
import random
import signal
import sys
import threading
import time
from pathlib import Path

from ensemble_core.config import load_config
from flows import ephemeral
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
    out, tfds_dir, spec, tries, *overrides = argv
    moments = dict((*item.split("@"), "random")[:2] for item in spec.split(","))
    unknown = set(moments.values()) - set(MOMENTS)
    assert not unknown, f"unknown moment(s) {unknown}; use one of {MOMENTS}"
    cfg = load_config(None, [f"data.data_dir={tfds_dir}", "promotion.enabled=false", *overrides])
    started = {stage: threading.Event() for stage in moments}
    durations: dict[str, list[float]] = {stage: [] for stage in started}
    ends: dict[str, float] = {}
    evaluator_started, second_evaluator = _watch_evaluators()
    hold = _hold_after_first_save()

    def marked(stage: str, call):
        def run_stage(*args, **kwargs):
            if stage == "evaluate":
                evaluator_started()  # count this run's evaluators from zero
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
    with ephemeral.temporary_server():
        # A second run times the stages with compilations cached (random moments only).
        for name in ("reference", "timing") if "random" in moments.values() else ("reference",):
            state = run(name)
            assert state.is_completed(), state.message
        stage_s = {stage: times[-1] for stage, times in durations.items()}
        print(json.dumps({"reference": _metrics(Path(out) / "reference"), "stage_s": stage_s}), flush=True)
        for stage, moment in moments.items():
            for i in range(int(tries)):
                # A run whose stage ended before its random moment (the machine's load varies:
                # the stage may run faster than when it was timed) got no signal, or got it
                # after the stage, in a later one: it is done again under a new name, up to 3 times.
                for attempt in range(3):
                    name = f"{stage}-{i}" if attempt == 0 else f"{stage}-{i}.{attempt}"
                    delay = {
                        "random": lambda s=stage: random.uniform(0.0, 0.8 * stage_s[s]),
                        "start": lambda: 0.0,
                        "checkpoint": _after_checkpoint(Path(out) / name),
                        "evaluator": second_evaluator,
                    }[moment]
                    hold.arm(moment == "checkpoint")
                    record = _try(
                        run, out, name, started[stage], delay, lambda s=stage: ends[s], i == 0, lambda: hold.thread
                    )
                    hold.arm(False)
                    if record["latency_s"] is not None and record["stage_after_signal_s"] >= 0:
                        break
                print(json.dumps(record), flush=True)
    return 0


MOMENTS = ("random", "start", "checkpoint", "evaluator")


def _watch_evaluators():
    """(reset, wait): ``reset()`` starts counting the evaluators of a new evaluation; ``wait()``,
    a delay function, waits until its second evaluator starts, then returns 0 s. (Wraps
    :func:`ensemble_core.evaluators.get`, which evaluation calls once per evaluator.)"""
    from ensemble_core import evaluators

    calls = {"n": 0}
    second = threading.Event()
    get = evaluators.get

    def counting_get(name: str):
        calls["n"] += 1
        if calls["n"] == 2:
            second.set()
        return get(name)

    def reset() -> None:
        calls["n"] = 0
        second.clear()

    def wait() -> float:
        assert second.wait(timeout=300), "the second evaluator never started"
        return 0.0

    evaluators.get = counting_get
    return reset, wait


class _Hold:
    """``armed``: the next checkpoint saved in this process waits until it is committed and
    then until the stop request is recorded (at most 60 s), and records its thread
    (``thread``, where the sender signals). Without it, on a loaded machine a member group
    of a few milliseconds a step could train to its last epoch between its first checkpoint
    and the sender's signal, and the stop came at the next group's start instead of inside
    training (CI, stop 54). Groups in other processes (Dask workers) are not held: they
    train for longer."""

    def __init__(self) -> None:
        self.armed = threading.Event()
        self.thread: int | None = None

    def arm(self, on: bool) -> None:
        """Hold the next save (``on``), or hold none and forget the last holder."""
        self.thread = None
        if on:
            self.armed.set()
        else:
            self.armed.clear()


def _hold_after_first_save() -> _Hold:
    from ensemble_core import stopping
    from ensemble_core.runs.storage.checkpoint import EnsembleCheckpointer

    hold = _Hold()
    save = EnsembleCheckpointer.save

    def held_save(self, step, state, meta) -> None:
        save(self, step, state, meta)
        if hold.armed.is_set():
            hold.armed.clear()  # the first save only
            hold.thread = threading.get_ident()  # before the commit the sender waits for
            self.wait()
            deadline = time.monotonic() + 60
            while stopping.requested() is None and time.monotonic() < deadline:
                time.sleep(0.01)

    EnsembleCheckpointer.save = held_save
    return hold


def _after_checkpoint(run_dir: Path):
    """A delay function: wait for a committed checkpoint of ``run_dir`` (or of one of its
    member groups), then 0 s."""

    def wait() -> float:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            dirs = [run_dir / "checkpoints", *run_dir.glob("groups/*/checkpoints")]
            if any(p.name.isdigit() for d in dirs if d.is_dir() for p in d.iterdir()):
                break
            time.sleep(0.02)
        return 0.0

    return wait


def _try(run, out: str, name: str, started: threading.Event, delay, stage_end, resume: bool, thread=None) -> dict:
    """One stopped run: SIGTERM ``delay()`` seconds after the stage's start (``delay`` may
    wait for its moment before it returns); never after the run ended."""
    started.clear()
    finished = threading.Event()
    sent: list[float] = []

    def send() -> None:
        if started.wait(timeout=300) and not finished.wait(delay()):
            sent.append(time.monotonic())
            target = thread() if thread is not None else None
            if target is not None:  # to the thread holding its checkpoint (see _Hold)
                signal.pthread_kill(target, signal.SIGTERM)
            else:
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
