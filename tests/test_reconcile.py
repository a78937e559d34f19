"""flows.reconcile against a real (temporary) Prefect server: which runs it marks Crashed
and which it reschedules, read back from the server. The reconciler's clock is moved
forward instead of waiting; heartbeats are real events posted to the server's API."""

import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest

pytestmark = pytest.mark.slow  # a Prefect server

ZOMBIE_AFTER_S = 120.0
LATER = timedelta(seconds=600)  # how far the reconciler's clock is moved forward


@pytest.fixture(scope="module")
def client():
    from prefect.client.orchestration import get_client
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120), get_client(sync_client=True) as c:
        yield c


@pytest.fixture(autouse=True)
def nothing_left_running(request):
    """After each test, every run on the module's server that a reconciler would judge
    or that could start (running, crashed, scheduled, pending) is cancelled, also when the test failed: one test's runs
    are not the next test's zombies or crashes."""
    yield
    if "client" not in request.fixturenames:
        return
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType
    from prefect.states import Cancelled

    client = request.getfixturevalue("client")
    judged = FlowRunFilterStateType(any_=["RUNNING", "CRASHED", "SCHEDULED", "PENDING"])
    for run in client.read_flow_runs(flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=judged))):
        client.set_flow_run_state(run.id, Cancelled(), force=True)


@pytest.fixture()
def deployment_id(client):
    flow_id = client.create_flow_from_name(f"reconcile-{uuid.uuid4().hex[:8]}")
    return client.create_deployment(flow_id=flow_id, name="nightly", entrypoint="x.py:flow_fn")


def _run(client, deployment_id, state, tags=("ensemble",), deployment=True):
    from prefect.states import Completed, Crashed, Pending, Running

    if deployment:
        run = client.create_flow_run_from_deployment(deployment_id, tags=list(tags))
    else:
        from prefect import flow

        run = client.create_flow_run(flow=flow(_adhoc, name="reconcile-adhoc"), tags=list(tags))
    client.set_flow_run_state(run.id, Pending(), force=True)
    client.set_flow_run_state(run.id, Running())
    final = {"RUNNING": None, "COMPLETED": Completed(), "CRASHED": Crashed(message="the process died")}[state]
    if final is not None:
        client.set_flow_run_state(run.id, final)
    return client.read_flow_run(run.id)


def _adhoc():
    pass


def _heartbeat(client, run, occurred: datetime):
    event = {
        "id": str(uuid.uuid4()),
        "occurred": occurred.isoformat(),
        "event": "prefect.flow-run.heartbeat",
        "resource": {"prefect.resource.id": f"prefect.flow-run.{run.id}"},
        "related": [],
        "payload": {},
    }
    client.request("POST", "/events", json=[event])


def _wait_persisted(client, newest: list):
    """Until the server has stored, for each ``(run, occurred)`` of ``newest`` (when the
    run's newest heartbeat occurred), that newest heartbeat. Events are written in batches, so a run's
    earlier heartbeat can be stored while its later one is not yet: judged then, a run that
    is alive looked silent (seen on 2 busy cores)."""
    from flows.reconcile import last_heartbeat

    def stored(run, occurred) -> bool:
        beat = last_heartbeat(client, run)
        return beat is not None and beat >= occurred - timedelta(milliseconds=1)

    deadline = time.monotonic() + 60
    while not all(stored(run, occurred) for run, occurred in newest):
        assert time.monotonic() < deadline, "the server did not store the heartbeat events"
        time.sleep(0.5)


@pytest.fixture()
def later(monkeypatch):
    from flows import reconcile

    real_now = reconcile._now
    monkeypatch.setattr(reconcile, "_now", lambda: real_now() + LATER)


def _state(client, run) -> str:
    return client.read_flow_run(run.id).state.type.value


def test_marks_only_runs_whose_heartbeats_stopped(client, deployment_id, later):
    from flows import reconcile

    silent = _run(client, deployment_id, "RUNNING")  # last heartbeat 600 s before the reconciler's now
    alive = _run(client, deployment_id, "RUNNING")  # last heartbeat 10 s before it
    never = _run(client, deployment_id, "RUNNING")  # heartbeats off: no heartbeat at all
    finished = _run(client, deployment_id, "COMPLETED")  # stopped heartbeating because it finished
    other = _run(client, deployment_id, "RUNNING", tags=("someone-else",))  # not ours
    now = datetime.now(UTC)  # after every run started: a heartbeat of its own
    for run in (silent, alive, finished, other):
        _heartbeat(client, run, now)
    recent = now + LATER - timedelta(seconds=10)
    _heartbeat(client, alive, recent)
    _wait_persisted(client, [(silent, now), (alive, recent), (finished, now), (other, now)])

    actions = reconcile.mark_zombies(client, ZOMBIE_AFTER_S)

    assert [(a.kind, a.flow_run_id) for a in actions] == [("crashed", str(silent.id))]
    assert {r.name: _state(client, r) for r in (silent, alive, never, finished, other)} == {
        silent.name: "CRASHED",
        alive.name: "RUNNING",
        never.name: "RUNNING",
        finished.name: "COMPLETED",
        other.name: "RUNNING",
    }
    crashed = client.read_flow_run(silent.id).state
    assert "reconcile-lost-runs" in crashed.message and "no heartbeat for" in crashed.message


def test_a_new_execution_is_not_judged_by_the_heartbeats_of_the_last(client, deployment_id):
    """A re-run whose first heartbeat has not reached the server yet keeps running; the
    same silence without a new execution is a zombie (real clocks, a 4 s timeout)."""
    from prefect.states import Crashed, Pending, Running

    from flows import reconcile

    rerun = _run(client, deployment_id, "RUNNING")
    lost = _run(client, deployment_id, "RUNNING")
    beats = [(run, datetime.now(UTC)) for run in (rerun, lost)]
    for run, occurred in beats:
        _heartbeat(client, run, occurred)
    _wait_persisted(client, beats)
    time.sleep(5)
    client.set_flow_run_state(rerun.id, Crashed(message="the process died"))
    client.set_flow_run_state(rerun.id, Pending(), force=True)
    client.set_flow_run_state(rerun.id, Running(), force=True)  # the next execution starts

    actions = reconcile.mark_zombies(client, zombie_after_s=4.0)

    assert [(a.kind, a.flow_run_id) for a in actions] == [("crashed", str(lost.id))]
    assert _state(client, rerun) == "RUNNING"


def test_reschedules_crashed_deployment_runs_within_the_attempts(client, deployment_id, later):
    from flows import reconcile

    crashed = _run(client, deployment_id, "CRASHED")  # one execution so far
    adhoc = _run(client, deployment_id, "CRASHED", deployment=False)  # no deployment: nothing can re-run it
    other = _run(client, deployment_id, "CRASHED", tags=("someone-else",))

    assert reconcile.retry_crashed(client, max_attempts=1, retry_within_s=3600) == []  # attempts used up
    assert reconcile.retry_crashed(client, max_attempts=3, retry_within_s=60) == []  # crashed too long ago
    actions = reconcile.retry_crashed(client, max_attempts=3, retry_within_s=3600)

    assert [(a.kind, a.flow_run_id) for a in actions] == [("rescheduled", str(crashed.id))]
    assert {r.name: _state(client, r) for r in (crashed, adhoc, other)} == {
        crashed.name: "SCHEDULED",
        adhoc.name: "CRASHED",
        other.name: "CRASHED",
    }
    assert "resumes from the latest checkpoint" in client.read_flow_run(crashed.id).state.message


def test_command_line_refuses_a_timeout_below_the_heartbeat_interval(capsys):
    from flows.reconcile import main

    assert main(["--zombie-after", "20", "--once"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --zombie-after 20") and "fix:" in err[0]
