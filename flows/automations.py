"""The Prefect automation that re-runs crashed runs; ``make serve`` creates it.

    python -m flows.automations [--max-attempts N]

- ``retry-crashed-runs``: a ``Crashed`` flow run of this project (the worker or its
  process died, a preemption, a zombie marked by :mod:`flows.reconcile`, a Prefect service
  that died inside the run) is set back to ``Scheduled``, at most ``--max-attempts``
  executions in all (Prefect's ``prefect.run-count`` label). The worker runs the *same*
  flow run again: same name, parameters and scheduled start, hence the same run
  directory, and training resumes from the latest checkpoint. Flow ``retries`` cannot do
  this: they cover ``Failed``, not ``Crashed``.

It matches only runs tagged ``ensemble`` (every deployment in prefect.yaml). Running the
module again keeps it as it is, or replaces it when its definition changed (and deletes
the ``mark-zombie-runs-crashed`` automation of earlier versions, whose proactive trigger
did not fire under load: :mod:`flows.reconcile` does that job), so it is safe to call on
every start.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import timedelta
from typing import Any

from prefect.automations import Automation
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import StateType
from prefect.events.actions import ChangeFlowRunState
from prefect.events.schemas.automations import EventTrigger, Posture
from prefect.events.schemas.events import ResourceSpecification

RETRY_CRASHED = "retry-crashed-runs"
RETIRED = ("mark-zombie-runs-crashed",)  # automations of earlier versions, deleted by ensure()
TAG = "ensemble"
DEFAULT_MAX_ATTEMPTS = 3
RETRY_MESSAGE = "re-run after a crash; resumes from the latest checkpoint"


def _ours() -> ResourceSpecification:
    return ResourceSpecification({"prefect.resource.role": "tag", "prefect.resource.id": f"prefect.tag.{TAG}"})


def build(max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> list[Automation]:
    """The automations (not yet created on the server): ``retry-crashed-runs``.

    Args:
      max_attempts: executions of one flow run in all, the first included (>= 1).

    Raises:
      ValueError: ``max_attempts`` < 1.
    """
    if max_attempts < 1:
        raise ValueError(f"max_attempts={max_attempts}; fix: pass 1 or more")
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
                message=f"{RETRY_MESSAGE} ({RETRY_CRASHED})",
            )
        ],
    )
    return [retry]


def _definition(automation) -> dict:
    """What an automation does, without server-assigned ids (to compare two of them)."""
    data = json.loads(automation.model_dump_json(include={"description", "enabled", "trigger", "actions"}))
    data["trigger"].pop("id", None)
    return data


def ensure(max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> list[str]:
    """Create the automations on the server of ``PREFECT_API_URL``; keep one that already
    exists as defined, replace one that differs (matched by name), delete retired ones.

    Returns:
      The ids of the automations, kept or created.
    """
    ids = []
    with get_client(sync_client=True) as client:
        for name in RETIRED:
            for existing in client.read_automations_by_name(name):
                client.delete_automation(existing.id)
        for automation in build(max_attempts):
            kept = None
            for existing in client.read_automations_by_name(automation.name):
                if kept is None and _definition(existing) == _definition(automation):
                    kept = existing
                else:
                    client.delete_automation(existing.id)
            created: Any = kept or automation.create()
            ids.append(str(created.id))
    return ids


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.automations", description=__doc__.split("\n")[0])
    parser.add_argument("--max-attempts", type=int, default=DEFAULT_MAX_ATTEMPTS, metavar="N")
    args = parser.parse_args(argv)
    try:
        ids = ensure(args.max_attempts)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"automation {RETRY_CRASHED}: {', '.join(ids)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
