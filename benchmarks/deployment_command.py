"""The fixed cost of ``scripts/deployment-run.sh``, the command a user starts a deployment's
run with: two checkouts side by side.

    git worktree add /tmp/before <commit>
    python -m benchmarks.deployment_command --checkout before=/tmp/before --checkout after=. [--runs 7]

Starts one Prefect server (``prefect server start``, as ``benchmarks.fixed_cost --server``
does; its start is not counted) with a deployment of the training flow, then runs
``scripts/deployment-run.sh train-ensemble/<name>`` from each checkout in turn, A B A B ...
after one warm-up run of each: the server checked, then ``prefect deployment run``, which
creates the flow run and returns (no ``--watch``; no worker runs it). Timed from outside
(wall seconds around ``subprocess.run``) with the CPU seconds of the command's processes
(``RUSAGE_CHILDREN``). Both checkouts use this environment's interpreter
(``ENSEMBLE_VENV``).

Writes ``benchmarks/results/deployment-command-<cpus>core.json`` (or ``--out``): per
checkout each run's wall and CPU seconds and their medians, the pairs' wall ratios (second
checkout over the first) and their median, with ``date``, ``machine`` and ``commit``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from benchmarks.fixed_cost import (
    ENTRYPOINT,
    alternate,
    checkout_commit,
    paired,
    parse_checkouts,
    post_json,
    timed_command,
    warm_server,
)
from benchmarks.provenance import stamp

ROOT = Path(__file__).resolve().parents[1]
#: The deployment each run creates a flow run of.
DEPLOYMENT = "deployment-command"


def one_run(checkout: Path, api_url: str, home: Path) -> dict:
    """``scripts/deployment-run.sh train-ensemble/<DEPLOYMENT>`` from ``checkout``: as
    :func:`benchmarks.fixed_cost.timed_command` (wall and CPU seconds).

    Raises:
      SystemExit: the command failed (its stderr's tail in the message)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_API_URL=api_url, PREFECT_HOME=str(home), ENSEMBLE_VENV=str(Path(sys.executable).parents[1]))
    return timed_command(["scripts/deployment-run.sh", f"train-ensemble/{DEPLOYMENT}"], checkout, env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.deployment_command", description=__doc__.split("\n")[0])
    parser.add_argument("--checkout", action="append", required=True, metavar="LABEL=DIR", help="two, in order")
    parser.add_argument("--runs", type=int, default=7, help="counted runs of each (default 7, after one warm-up)")
    parser.add_argument(
        "--out", default=str(ROOT / "benchmarks" / "results" / f"deployment-command-{os.cpu_count()}core.json")
    )
    args = parser.parse_args(argv)
    try:
        checkouts = parse_checkouts(args.checkout)
    except ValueError as err:
        print(err)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="deployment-command-"))
    with warm_server(tmp / "prefect") as api_url:
        flow_id = post_json(api_url, "/flows/", {"name": "train-ensemble"})["id"]
        body = {"name": DEPLOYMENT, "flow_id": flow_id, "entrypoint": ENTRYPOINT, "path": str(ROOT)}
        post_json(api_url, "/deployments/", body)
        runs = alternate(checkouts, args.runs, lambda _label, checkout, _i: one_run(checkout, api_url, tmp / "prefect"))
    result = {
        "command": "python -m benchmarks.deployment_command "
        + " ".join(f"--checkout {label}=<checkout of {checkout_commit(path)}>" for label, path in checkouts)
        + f" --runs {args.runs}",
        **stamp(),
        "what": "scripts/deployment-run.sh <deployment> (no --watch) on a warm server, start to exit",
        "checkouts": {label: checkout_commit(path) for label, path in checkouts},
        **paired(runs, checkouts[0][0], checkouts[1][0]),
        "runs": runs,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("median_wall_seconds", "median_cpu_seconds", "ratio_median")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
