"""A worker host that loses the cluster: its trainer stops and lets go of the member
group, whose task, run again elsewhere, waits for that. The pieces on one machine; the
whole of it on simulated hosts is tests/test_multihost.py."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from ensemble_core.errors import RunLockedError
from ensemble_core.runs.storage.lock import run_lock


def _hold(run, release: threading.Event, held: threading.Event) -> threading.Thread:
    """Hold ``run``'s lock in another thread (flock locks of two opens conflict within a
    process as between processes) until ``release`` is set."""

    def holder():
        with run_lock(run):
            held.set()
            release.wait(30)

    thread = threading.Thread(target=holder, daemon=True)
    thread.start()
    assert held.wait(10)
    return thread


def test_a_group_lock_wait_takes_the_lock_once_its_holder_lets_go(tmp_path):
    release, held = threading.Event(), threading.Event()
    holder = _hold(tmp_path / "run", release, held)
    with pytest.raises(RunLockedError, match="in use by another run"), run_lock(tmp_path / "run"):
        pass  # no wait: refused at once, as a whole run is
    threading.Timer(1.0, release.set).start()
    started = time.monotonic()
    with run_lock(tmp_path / "run", wait_s=20):
        waited = time.monotonic() - started
    holder.join(10)
    assert 0.8 < waited < 10


def test_a_group_lock_wait_is_bounded(tmp_path):
    release, held = threading.Event(), threading.Event()
    _hold(tmp_path / "run", release, held)
    started = time.monotonic()
    try:
        with pytest.raises(RunLockedError, match=r"still after 1 s.*fix:"), run_lock(tmp_path / "run", wait_s=1.0):
            pass
    finally:
        release.set()
    assert 0.9 < time.monotonic() - started < 10


_SEEN: dict[str, object] = {}  # what the task below saw (a thread worker: this process)
_STARTED = threading.Event()


def _watch_for_lost_scheduler() -> None:
    from tasks.runners import scheduler_lost

    lost = scheduler_lost()
    _SEEN["at_start"] = lost()
    _STARTED.set()
    deadline = time.monotonic() + 60
    while not lost() and time.monotonic() < deadline:
        time.sleep(0.05)
    _SEEN["lost"] = lost()


def test_a_task_sees_its_worker_lose_the_scheduler():
    """A Dask worker whose connection to the scheduler breaks closes itself; a task
    running on it sees that through ``scheduler_lost`` (which is False until then)."""
    from distributed import Client, LocalCluster

    from tasks.runners import scheduler_lost

    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        future = client.submit(_watch_for_lost_scheduler, pure=False)
        assert _STARTED.wait(60)
        worker = next(iter(cluster.workers.values()))
        worker.loop.add_callback(worker.batched_stream.comm.abort)  # its connection to the scheduler breaks
        deadline = time.monotonic() + 60
        while "lost" not in _SEEN and time.monotonic() < deadline:
            time.sleep(0.05)
        del future
    assert _SEEN == {"at_start": False, "lost": True}
    assert scheduler_lost()() is False  # outside a worker


def test_training_never_waits_for_a_hung_progress_update(monkeypatch):
    """The progress artifact's update blocks (an unreachable Prefect server): training
    steps on, one update in flight and the later ones skipped, and a failing update is
    only logged."""
    from ensemble_core.config import load_config
    from tasks import progress

    gate, calls = threading.Event(), []

    def hung_update(artifact_id, progress):
        calls.append(progress)
        if len(calls) == 1:
            gate.wait(60)
        else:
            raise OSError("the server went away")

    monkeypatch.setattr(progress, "create_progress_artifact", lambda **_: "artifact")
    monkeypatch.setattr(progress, "update_progress_artifact", hung_update)
    monkeypatch.setattr(progress, "get_run_logger", lambda: logging.getLogger("progress-test"))
    monkeypatch.setattr(progress, "PROGRESS_INTERVAL_S", 0.0)
    monkeypatch.setattr(progress, "_log_summary", lambda *a: None)
    config = load_config(Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml", [])
    steps_done = []

    def until(check) -> None:
        deadline = time.monotonic() + 30
        while not check() and time.monotonic() < deadline:
            time.sleep(0.01)

    def train(on_step, on_epoch):
        on_step(0, 0, 200)
        until(lambda: calls)  # the first update is in flight, and hangs
        for step in range(1, 200):
            on_step(0, step, 200)
            steps_done.append(step)
        assert calls == [pytest.approx(100 / config.train.epochs / 200)]  # the rest skipped meanwhile
        gate.set()
        until(lambda: on_step(0, 199, 200) or len(calls) > 1)  # the next update fails, and is only logged
        return "summary"

    started = time.monotonic()
    assert progress.train_with_progress(config, None, train) == "summary"
    assert len(steps_done) == 199 and time.monotonic() - started < 30
    assert len(calls) >= 3  # after the failed one, updates went on (the final 100 % among them)
    assert calls[-1] == 100.0
