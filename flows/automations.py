"""The Prefect automations of the project; ``make serve`` creates them.

    python -m flows.automations [--max-attempts N] [--retrain-deployment FLOW/DEPLOYMENT]

- ``retry-crashed-runs``: a ``Crashed`` flow run of this project (the worker or its
  process died, a preemption, a zombie marked by :mod:`flows.reconcile`, a Prefect service
  that died inside the run) is set back to ``Scheduled``, at most ``--max-attempts``
  executions in all (Prefect's ``prefect.run-count`` label). The worker runs the *same*
  flow run again: same name, parameters and scheduled start, hence the same run
  directory, and training resumes from the latest checkpoint. Flow ``retries`` cannot do
  this: they cover ``Failed``, not ``Crashed``.

- ``retrain-on-drift``: the monitor flow's ``data.drift`` event (:mod:`flows.monitor`: a
  drift test rejected on an unlabelled drop) starts a run of ``--retrain-deployment``
  (``train-ensemble/nightly``, whose concurrency limit keeps retrainings from overlapping)
  with the event's ``output_dir`` and ``retrain_config`` (the monitored run's own config),
  so the ensemble is retrained where the drifted champion lives, as it was trained. It
  matches only events labelled ``ensemble-pipeline.source: monitor``: the ``data.drift``
  a training run emits before it trains never starts another training (no loop). Without
  that deployment on the server it is not created, and one line says so.

``retry-crashed-runs`` matches only runs tagged ``ensemble`` (every deployment in prefect.yaml). Running the
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
from uuid import UUID

from prefect.automations import Automation
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import StateType
from prefect.events.actions import ChangeFlowRunState, RunDeployment
from prefect.events.schemas.automations import EventTrigger, Posture
from prefect.events.schemas.events import ResourceSpecification
from prefect.exceptions import ObjectNotFound

from flows import command_line

RETRY_CRASHED = "retry-crashed-runs"
RETRAIN_ON_DRIFT = "retrain-on-drift"
DEFAULT_RETRAIN_DEPLOYMENT = "train-ensemble/nightly"
#: The monitor's events carry this resource label (tasks/monitor.py); training's do not.
MONITOR_SOURCE = {"ensemble-pipeline.source": "monitor"}
RETIRED = ("mark-zombie-runs-crashed",)  # automations of earlier versions, deleted by ensure()
TAG = "ensemble"
DEFAULT_MAX_ATTEMPTS = 3
RETRY_MESSAGE = "re-run after a crash; resumes from the latest checkpoint"


def _ours() -> ResourceSpecification:
    return ResourceSpecification({"prefect.resource.role": "tag", "prefect.resource.id": f"prefect.tag.{TAG}"})


def retrain_on_drift(deployment_id: UUID) -> Automation:
    """``retrain-on-drift`` (not yet created): the monitor's ``data.drift`` runs deployment
    ``deployment_id`` with the event's ``output_dir`` and ``retrain_config``.

    The parameters are Prefect templates rendered from the event when it fires
    (https://docs.prefect.io/v3/how-to-guides/automations/passing-event-payloads-to-flows):
    ``output_dir`` a Jinja string, ``config`` the payload's dict passed through ``tojson``
    and parsed back as JSON (``__prefect_kind: json``), so the flow gets a dict.
    """
    payload_json = {"__prefect_kind": "jinja", "template": "{{ event.payload.retrain_config | tojson }}"}
    return Automation(
        name=RETRAIN_ON_DRIFT,
        description="The monitor flow's data.drift (a drift test rejected on unlabelled data) retrains the ensemble.",
        trigger=EventTrigger(
            expect={"data.drift"},
            match=ResourceSpecification({"prefect.resource.id": "ensemble-pipeline.data.*", **MONITOR_SOURCE}),
            posture=Posture.Reactive,
            threshold=1,
            within=timedelta(0),
        ),
        actions=[
            RunDeployment(
                source="selected",
                deployment_id=deployment_id,
                parameters={
                    "output_dir": {"__prefect_kind": "jinja", "template": "{{ event.payload.output_dir }}"},
                    "config": {"__prefect_kind": "json", "value": payload_json},
                },
            )
        ],
    )


def build(max_attempts: int = DEFAULT_MAX_ATTEMPTS, retrain_deployment_id: UUID | None = None) -> list[Automation]:
    """The automations (not yet created on the server): ``retry-crashed-runs``, and
    ``retrain-on-drift`` when ``retrain_deployment_id`` is given.

    Args:
      max_attempts: executions of one flow run in all, the first included (>= 1).
      retrain_deployment_id: the deployment ``retrain-on-drift`` runs (None: not built).

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
    return [retry] if retrain_deployment_id is None else [retry, retrain_on_drift(retrain_deployment_id)]


def _definition(automation) -> dict:
    """What an automation does, without server-assigned ids (to compare two of them)."""
    data = json.loads(automation.model_dump_json(include={"description", "enabled", "trigger", "actions"}))
    data["trigger"].pop("id", None)
    return data


def ensure(
    max_attempts: int = DEFAULT_MAX_ATTEMPTS, retrain_deployment: str | None = DEFAULT_RETRAIN_DEPLOYMENT
) -> dict[str, str]:
    """Create the automations on the server of ``PREFECT_API_URL``; keep one that already
    exists as defined, replace one that differs (matched by name), delete retired ones.
    ``retrain-on-drift`` is created only when ``retrain_deployment`` (``flow/deployment``)
    exists on the server.

    Returns:
      ``{name: id}`` of the automations, kept or created.
    """
    ids = {}
    with get_client(sync_client=True) as client:
        for name in RETIRED:
            for existing in client.read_automations_by_name(name):
                client.delete_automation(existing.id)
        deployment_id = None
        if retrain_deployment:
            try:
                deployment_id = client.read_deployment_by_name(retrain_deployment).id
            except ObjectNotFound:
                print(f"note: no deployment {retrain_deployment} on the server: {RETRAIN_ON_DRIFT} not created")
        for automation in build(max_attempts, deployment_id):
            kept = None
            for existing in client.read_automations_by_name(automation.name):
                if kept is None and _definition(existing) == _definition(automation):
                    kept = existing
                else:
                    client.delete_automation(existing.id)
            created: Any = kept or automation.create()
            ids[automation.name] = str(created.id)
    return ids


def main(argv: list[str] | None = None) -> int:
    command_line.command_started()
    parser = argparse.ArgumentParser(prog="python -m flows.automations", description=__doc__.split("\n")[0])
    parser.add_argument("--max-attempts", type=int, default=DEFAULT_MAX_ATTEMPTS, metavar="N")
    parser.add_argument(
        "--retrain-deployment",
        default=DEFAULT_RETRAIN_DEPLOYMENT,
        metavar="FLOW/DEPLOYMENT",
        help=f"what {RETRAIN_ON_DRIFT} runs on the monitor's data.drift ('' for no such automation)",
    )
    args = parser.parse_args(argv)
    try:
        ids = ensure(args.max_attempts, args.retrain_deployment or None)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for name, automation_id in ids.items():
        print(f"automation {name}: {automation_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
