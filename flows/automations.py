"""The Prefect automations that keep unattended runs going; ``make serve`` creates them.

    python -m flows.automations [--zombie-after SECONDS] [--max-attempts N]

- ``mark-zombie-runs-crashed``: a flow run of this project whose heartbeats stop (its
  process was SIGKILLed, the machine was lost, the OOM killer struck) is marked
  ``Crashed`` after ``--zombie-after`` seconds instead of showing RUNNING forever. The
  flow-run process sends a ``prefect.flow-run.heartbeat`` event every
  ``PREFECT_FLOWS_HEARTBEAT_FREQUENCY`` seconds (``make serve`` sets 30, Prefect's
  minimum); this is the proactive trigger of Prefect's "detect zombie flows" guide.
- ``retry-crashed-runs``: a ``Crashed`` flow run of this project (the worker or its
  process died, a preemption, a zombie marked above, a Prefect service that died inside
  the run) is set back to ``Scheduled``, at most ``--max-attempts`` executions in all
  (Prefect's ``prefect.run-count`` label). The worker runs the *same* flow run again:
  same name, parameters and scheduled start, hence the same run directory, and training
  resumes from the latest checkpoint. Flow ``retries`` cannot do this: they cover
  ``Failed``, not ``Crashed``.

Both match only runs tagged ``ensemble`` (every deployment in prefect.yaml). Running the
module again keeps them as they are, or replaces one whose definition changed, so it is
safe to call on every start.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import timedelta

from prefect.automations import Automation
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import StateType
from prefect.events.actions import ChangeFlowRunState
from prefect.events.schemas.automations import EventTrigger, Posture
from prefect.events.schemas.events import ResourceSpecification

ZOMBIE = "mark-zombie-runs-crashed"
RETRY_CRASHED = "retry-crashed-runs"
TAG = "ensemble"
DEFAULT_ZOMBIE_AFTER_S = 120  # 4 missed heartbeats at 30 s
DEFAULT_MAX_ATTEMPTS = 3
_TERMINAL = ("Completed", "Failed", "Cancelled", "Crashed")


def _ours() -> ResourceSpecification:
    return ResourceSpecification({"prefect.resource.role": "tag", "prefect.resource.id": f"prefect.tag.{TAG}"})


def build(zombie_after_s: float = DEFAULT_ZOMBIE_AFTER_S, max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> list[Automation]:
    """The two automations (not yet created on the server).

    Args:
      zombie_after_s: seconds without a heartbeat before a run is marked crashed; more
        than the heartbeat interval (30 s), at least 10 (Prefect's minimum ``within``).
      max_attempts: executions of one flow run in all, the first included (>= 1).

    Raises:
      ValueError: ``zombie_after_s`` < 10 or ``max_attempts`` < 1.
    """
    if zombie_after_s < 10:
        raise ValueError(f"zombie_after_s={zombie_after_s} is below Prefect's minimum of 10 s; fix: pass >= 10")
    if max_attempts < 1:
        raise ValueError(f"max_attempts={max_attempts}; fix: pass 1 or more")
    zombie = Automation(
        name=ZOMBIE,
        description=f"Mark a flow run tagged '{TAG}' Crashed when it sends no heartbeat for {zombie_after_s:g} s.",
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat", *(f"prefect.flow-run.{s}" for s in _TERMINAL)},
            match=ResourceSpecification({"prefect.resource.id": "prefect.flow-run.*"}),
            match_related=_ours(),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=zombie_after_s),
        ),
        actions=[
            ChangeFlowRunState(
                state=StateType.CRASHED,
                message=f"no heartbeat for {zombie_after_s:g} s: the flow-run process is gone (marked by {ZOMBIE})",
            )
        ],
    )
    retry = Automation(
        name=RETRY_CRASHED,
        description=f"Run a crashed flow run tagged '{TAG}' again (at most {max_attempts} executions in all).",
        trigger=EventTrigger(
            expect={"prefect.flow-run.Crashed"},
            match=ResourceSpecification(
                {
                    "prefect.resource.id": "prefect.flow-run.*",
                    "prefect.run-count": [str(n) for n in range(max_attempts)],  # executions so far
                }
            ),
            match_related=_ours(),
            posture=Posture.Reactive,
            threshold=1,
            within=timedelta(0),
        ),
        # force=False: the server's own rule allows Crashed -> Scheduled for deployment runs
        # and marks the run for a worker to pick up again.
        actions=[
            ChangeFlowRunState(
                state=StateType.SCHEDULED,
                message=f"re-run after a crash; resumes from the latest checkpoint ({RETRY_CRASHED})",
            )
        ],
    )
    return [zombie, retry]


def _definition(automation) -> dict:
    """What an automation does, without server-assigned ids (to compare two of them)."""
    data = json.loads(automation.model_dump_json(include={"description", "enabled", "trigger", "actions"}))
    data["trigger"].pop("id", None)
    return data


def ensure(zombie_after_s: float = DEFAULT_ZOMBIE_AFTER_S, max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> list[str]:
    """Create both automations on the server of ``PREFECT_API_URL``; keep one that already
    exists as defined, replace one that differs (matched by name).

    An existing one is kept rather than re-created because a proactive trigger's state
    lives in it: re-creating ``mark-zombie-runs-crashed`` when ``make serve`` restarts a
    dead worker would forget the heartbeats of the very run that died with it, which
    would then show RUNNING forever.

    Returns:
      The ids of the automations, kept or created.
    """
    ids = []
    with get_client(sync_client=True) as client:
        for automation in build(zombie_after_s, max_attempts):
            kept = None
            for existing in client.read_automations_by_name(automation.name):
                if kept is None and _definition(existing) == _definition(automation):
                    kept = existing
                else:
                    client.delete_automation(existing.id)
            ids.append(str(kept.id if kept else automation.create().id))
    return ids


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.automations", description=__doc__.split("\n")[0])
    parser.add_argument("--zombie-after", type=float, default=DEFAULT_ZOMBIE_AFTER_S, metavar="SECONDS")
    parser.add_argument("--max-attempts", type=int, default=DEFAULT_MAX_ATTEMPTS, metavar="N")
    args = parser.parse_args(argv)
    try:
        ids = ensure(args.zombie_after, args.max_attempts)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"automations {ZOMBIE}, {RETRY_CRASHED}: {', '.join(ids)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
