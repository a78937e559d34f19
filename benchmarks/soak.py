"""Soak test of the orchestration layer: N consecutive deployment runs on one worker,
under CPU contention, then count what reached the server and what was left behind.

    python -m benchmarks.soak [--runs 10] [--out benchmarks/results/soak-cpu-2core.json]

Starts its own stack (:mod:`tests.prefect_stack`: server on PostgreSQL, work pool,
deployments, automation, reconciler, worker) on a free port with a fresh PREFECT_HOME,
and a second process that keeps one CPU core busy for the whole soak. Each run is
``scripts/deployment-run.sh train-ensemble/adhoc --watch`` with a small config (4 MLP
members, 2 epochs on 512 digits). For each flow run it reads back from the server: the
final state, task runs, ``ensemble.*`` events, artifacts and log lines; after each run it
counts live ``prefect.engine`` processes of this stack and how long the run's process took
to exit after its final state. The worker's resident memory (its whole process group) is
read before the first and after the last run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.provenance import stamp
from tests import prefect_stack

ROOT = Path(__file__).resolve().parents[1]
STAGES = prefect_stack.TASK_NAMES


def _group_rss_mib(pgid: int) -> float:
    total = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.getpgid(int(proc.name)) != pgid:
                continue
            for line in (proc / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except (OSError, ProcessLookupError):
            continue
    return total / 1024


def exit_after_final(flow_run: dict, last_alive: dt.datetime | None) -> float | None:
    """Seconds from the flow run's final state to the last time its process was seen (0.2 s
    polling; negative: it was gone before the state was written, e.g. by the worker)."""
    if last_alive is None:
        return None
    final = dt.datetime.fromisoformat(flow_run["state"]["timestamp"].replace("Z", "+00:00"))
    return round((last_alive - final).total_seconds(), 1)


def _wait_for_worker(api: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        workers = httpx.post(f"{api}/work_pools/ensemble-pool/workers/filter", json={}, timeout=30).json()
        if any(w["status"] == "ONLINE" for w in workers):
            return
        time.sleep(1)
    raise RuntimeError("no worker came online")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "soak-cpu-2core.json"))
    args = parser.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="ensemble-soak-"))
    params = prefect_stack.small_params(tmp)
    del params["config"]["eval"]  # every evaluator of the default config, as a nightly run
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    rows = []
    try:
        with prefect_stack.stack(tmp) as env:
            api = env["PREFECT_API_URL"]
            _wait_for_worker(api)
            worker_pgid = int((tmp / "serve" / "worker.pid").read_text())
            rss_before = _group_rss_mib(worker_pgid)
            started = time.monotonic()
            for i in range(args.runs):
                t0 = time.monotonic()
                log = tmp / f"watch-{i + 1}.log"
                with log.open("w") as out:
                    watch = subprocess.Popen(
                        [
                            "scripts/deployment-run.sh",
                            "train-ensemble/adhoc",
                            "--params",
                            json.dumps(params),
                            "--watch",
                        ],
                        cwd=ROOT,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                seen: set[int] = set()
                last_alive = None
                give_up = None  # 120 s after --watch returned, stop waiting for the process to exit
                while True:
                    alive = set(prefect_stack.engine_pids(env))
                    seen |= alive
                    if alive:
                        last_alive = dt.datetime.now(dt.UTC)
                    if watch.poll() is not None:
                        give_up = give_up or time.monotonic() + 120
                        if not alive or time.monotonic() > give_up:
                            break
                    time.sleep(0.2)
                stdout = log.read_text()
                wall = time.monotonic() - t0
                run_id = next(ln.split("UUID:")[1].strip() for ln in stdout.splitlines() if "UUID:" in ln)
                fr = httpx.get(f"{api}/flow_runs/{run_id}", timeout=30).json()
                flt = {"flow_runs": {"id": {"any_": [run_id]}}}
                tasks = httpx.post(f"{api}/task_runs/filter", json=flt, timeout=30).json()
                artifacts = httpx.post(f"{api}/artifacts/filter", json=flt, timeout=30).json()
                logs = httpx.post(f"{api}/logs/filter", json={"logs": {"flow_run_id": {"any_": [run_id]}}}, timeout=30)
                run_name = next(d.name for d in (tmp / "runs").iterdir() if d.name.endswith("-" + fr["name"]))
                resource = {"id": [f"ensemble-pipeline.run.{run_name}"]}
                events = httpx.post(
                    f"{api}/events/filter",
                    json={"filter": {"event": {"prefix": ["ensemble."]}, "resource": resource}},
                    timeout=30,
                ).json()["events"]
                rows.append(
                    {
                        "run": i + 1,
                        "state": fr["state_type"],
                        "rc": watch.returncode,
                        "wall_s": round(wall, 1),
                        "task_runs_completed": sum(
                            t["state_type"] == "COMPLETED" and t["name"].rsplit("-", 1)[0] in STAGES for t in tasks
                        ),
                        "ensemble_events": len(events),
                        "artifacts": len(artifacts),
                        "log_lines": len(logs.json()),
                        # the flow-run process was last seen alive this long after the final state
                        "process_exit_after_final_s": exit_after_final(fr, last_alive),
                        "engines_left": len(prefect_stack.engine_pids(env)),
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
            rss_after = _group_rss_mib(worker_pgid)
            total = time.monotonic() - started
    finally:
        burner.kill()
    result = {
        **stamp(),
        "command": f"python -m benchmarks.soak --runs {args.runs}",
        "runs": rows,
        "all_completed": all(r["state"] == "COMPLETED" for r in rows),
        "task_runs_per_run": sorted({r["task_runs_completed"] for r in rows}),
        "ensemble_events_per_run": sorted({r["ensemble_events"] for r in rows}),
        "artifacts_per_run": sorted({r["artifacts"] for r in rows}),
        "engines_left_after_soak": rows[-1]["engines_left"] if rows else None,
        "max_process_exit_after_final_s": max(
            (r["process_exit_after_final_s"] for r in rows if r["process_exit_after_final_s"] is not None), default=None
        ),
        "worker_rss_mib_before": round(rss_before, 1),
        "worker_rss_mib_after": round(rss_after, 1),
        "soak_seconds": round(total, 1),
        "cpu_load": "one busy-loop process beside the stack (2-core machine)",
        "database": "PostgreSQL (scripts/postgres.sh)",
        "prefect": importlib.metadata.version("prefect"),
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))
    return 0 if result["all_completed"] and result["engines_left_after_soak"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
