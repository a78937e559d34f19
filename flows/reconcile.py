"""The reconciler of ``make serve``: a lost flow-run process is always noticed and re-run.

    python -m flows.reconcile [--pool NAME] [--zombie-after SECONDS] [--every SECONDS]
                              [--max-attempts N] [--retry-within SECONDS] [--once]

A flow run whose process dies with its machine (SIGKILL, the OOM killer, a power cut)
stays ``Running`` on the server: nothing in it is left to report otherwise. Prefect's
answer is a proactive automation trigger on the run's heartbeat events ("detect zombie
flows" guide); under CPU load that trigger was seen never to fire (PrefectHQ/prefect#18838
and #21932, open in 3.9.1; Prefect plans server-side zombie detection). This process asks
the server the same question itself, every ``--every`` seconds, with Prefect's client:

- **Zombies.** A ``Running`` flow run tagged ``ensemble`` of the work pool whose newest
  ``prefect.flow-run.heartbeat`` event, and the start of its current execution, are older
  than ``--zombie-after`` seconds is set ``Crashed``. A run that never sent a heartbeat
  (heartbeats are off for it) is left alone, as is one whose heartbeat arrives while it is
  being checked (checked twice).
  The server's own orchestration refuses ``Crashed`` for a run already in a terminal
  state, so a run that finished in the meantime stays finished.
- **Re-runs.** A deployment run tagged ``ensemble`` that has stayed ``Crashed`` for
  ``RETRY_GRACE_S`` (the ``retry-crashed-runs`` automation of :mod:`flows.automations`
  normally reschedules it within seconds), crashed less than ``--retry-within`` seconds
  ago and has had fewer than ``--max-attempts`` executions, is set back to ``Scheduled``
  with the same message as the automation's: the worker runs the same flow run again and
  it resumes from its latest checkpoint.

Each action is one line on stdout (``make serve`` appends it to ``.serve/reconciler.log``)
and the state message that the Prefect UI shows names the reconciler.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
    FlowRunFilterTags,
    WorkPoolFilter,
    WorkPoolFilterName,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.events.filters import EventFilter, EventNameFilter, EventOccurredFilter, EventResourceFilter
from prefect.flow_engine import MINIMUM_HEARTBEAT_INTERVAL  # Prefect's shortest heartbeat interval
from prefect.states import Crashed, Scheduled

from flows import command_line
from flows.automations import DEFAULT_MAX_ATTEMPTS, RETRY_MESSAGE, TAG

NAME = "reconcile-lost-runs"
HEARTBEAT = "prefect.flow-run.heartbeat"
DEFAULT_EVERY_S = 10.0
DEFAULT_ZOMBIE_AFTER_S = 120.0  # 4 missed heartbeats at 30 s (Prefect's minimum interval)
DEFAULT_RETRY_WITHIN_S = 24 * 3600.0  # a crash older than a day is history, not a run to resume
RETRY_GRACE_S = 30.0  # the retry automation's turn first


@dataclass(frozen=True)
class Action:
    """One state change the reconciler made: ``kind`` is ``crashed`` or ``rescheduled``."""

    kind: str
    flow_run_id: str
    flow_run_name: str
    detail: str


def _now() -> datetime:
    return datetime.now(UTC)


def _runs(client: SyncPrefectClient, state: StateType, pool: str | None) -> list[FlowRun]:
    return client.read_flow_runs(
        flow_run_filter=FlowRunFilter(
            state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[state])),
            tags=FlowRunFilterTags(all_=[TAG]),
        ),
        work_pool_filter=WorkPoolFilter(name=WorkPoolFilterName(any_=[pool])) if pool else None,
    )


def last_heartbeat(client: SyncPrefectClient, run: FlowRun) -> datetime | None:
    """When the newest heartbeat event of ``run`` occurred (the sender's clock), in any of
    its executions, or None if it never sent one."""
    since = run.created or (_now() - timedelta(days=7))
    page = client.read_events(
        EventFilter(
            occurred=EventOccurredFilter(since=since, until=_now() + timedelta(days=1)),
            event=EventNameFilter(name=[HEARTBEAT]),
            resource=EventResourceFilter(id=[f"prefect.flow-run.{run.id}"]),
        ),
        limit=1,
    )
    return page.events[0].occurred if page.events else None


def _silent_for(client: SyncPrefectClient, run: FlowRun, now: datetime) -> float | None:
    """Seconds since the run last showed life: its newest heartbeat, or entering its
    current Running state if that is later (a re-run whose first heartbeat is still on its
    way is not judged by the heartbeats of the execution before it). None if it never sent
    a heartbeat."""
    beat = last_heartbeat(client, run)
    if beat is None:
        return None
    running_since = run.state.timestamp if run.state is not None else beat
    return (now - max(beat, running_since)).total_seconds()


def mark_zombies(client: SyncPrefectClient, zombie_after_s: float, pool: str | None = None) -> list[Action]:
    """Set ``Crashed`` every running run of ours whose heartbeats stopped ``zombie_after_s`` ago."""
    actions = []
    for run in _runs(client, StateType.RUNNING, pool):
        silent = _silent_for(client, run, _now())
        if silent is None or silent < zombie_after_s:
            continue
        # Checked again just before acting, on a fresh read of the run: a heartbeat persisted
        # late, or a new execution started meanwhile, cancels the verdict.
        run = client.read_flow_run(run.id)
        if run.state is None or run.state.type != StateType.RUNNING:
            continue
        silent = _silent_for(client, run, _now())
        if silent is None or silent < zombie_after_s:
            continue
        message = f"no heartbeat for {silent:.0f} s: the flow-run process is gone (marked by {NAME})"
        result: Any = client.set_flow_run_state(run.id, Crashed(message=message))
        if result.state is not None and result.state.type == StateType.CRASHED:
            actions.append(Action("crashed", str(run.id), run.name, message))
    return actions


def retry_crashed(
    client: SyncPrefectClient,
    max_attempts: int,
    retry_within_s: float,
    pool: str | None = None,
    grace_s: float = RETRY_GRACE_S,
) -> list[Action]:
    """Set ``Scheduled`` every crashed deployment run of ours that nothing rescheduled."""
    actions = []
    now = _now()
    for run in _runs(client, StateType.CRASHED, pool):
        crashed_at = run.state.timestamp if run.state else None
        if run.deployment_id is None or crashed_at is None or run.run_count >= max_attempts:
            continue
        if not grace_s <= (now - crashed_at).total_seconds() <= retry_within_s:
            continue
        result: Any = client.set_flow_run_state(run.id, Scheduled(message=f"{RETRY_MESSAGE} ({NAME})"))
        if result.state is not None and result.state.type == StateType.SCHEDULED:
            detail = f"execution {run.run_count + 1} of at most {max_attempts}"
            actions.append(Action("rescheduled", str(run.id), run.name, detail))
    return actions


def reconcile(
    zombie_after_s: float = DEFAULT_ZOMBIE_AFTER_S,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    retry_within_s: float = DEFAULT_RETRY_WITHIN_S,
    pool: str | None = None,
) -> list[Action]:
    """One pass against the server of ``PREFECT_API_URL``: zombies first, then re-runs."""
    with get_client(sync_client=True) as client:
        return mark_zombies(client, zombie_after_s, pool) + retry_crashed(client, max_attempts, retry_within_s, pool)


def _log(line: str) -> None:
    print(f"{_now().isoformat(timespec='seconds')} {line}", flush=True)


def main(argv: list[str] | None = None) -> int:
    command_line.command_started()
    parser = argparse.ArgumentParser(prog="python -m flows.reconcile", description=__doc__.split("\n")[0])
    parser.add_argument("--pool", help="only flow runs of this work pool (default: every pool)")
    parser.add_argument("--zombie-after", type=float, default=DEFAULT_ZOMBIE_AFTER_S, metavar="SECONDS")
    parser.add_argument("--every", type=float, default=DEFAULT_EVERY_S, metavar="SECONDS")
    parser.add_argument("--max-attempts", type=int, default=DEFAULT_MAX_ATTEMPTS, metavar="N")
    parser.add_argument("--retry-within", type=float, default=DEFAULT_RETRY_WITHIN_S, metavar="SECONDS")
    parser.add_argument("--once", action="store_true", help="one pass, then exit")
    args = parser.parse_args(argv)
    if args.zombie_after <= MINIMUM_HEARTBEAT_INTERVAL or args.every <= 0 or args.max_attempts < 1:
        print(
            f"error: --zombie-after {args.zombie_after:g} must exceed Prefect's shortest heartbeat interval "
            f"({MINIMUM_HEARTBEAT_INTERVAL} s), --every be above 0 and --max-attempts at least 1; "
            f"fix: pass such values",
            file=sys.stderr,
        )
        return 2
    _log(f"{NAME}: zombie after {args.zombie_after:g} s, every {args.every:g} s, pool {args.pool or 'any'}")
    while True:
        try:
            for action in reconcile(args.zombie_after, args.max_attempts, args.retry_within, args.pool):
                _log(f"{action.kind} flow run {action.flow_run_name} ({action.flow_run_id}): {action.detail}")
        except Exception as err:  # noqa: BLE001  (server restarting: try again next pass)
            _log(f"pass failed, retrying in {args.every:g} s: {type(err).__name__}: {err}")
            if args.once:
                return 1
        if args.once:
            return 0
        time.sleep(args.every)


if __name__ == "__main__":
    sys.exit(main())
