"""The garbage collector is off while a command imports its modules, and on again, with
the imports frozen out of its reach, once the command's main starts (ensemble_core.startup_gc)."""

from __future__ import annotations

import gc as gc_module
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest

from tests.prefect_api import cli_env

ROOT = Path(__file__).resolve().parents[1]

# Loaded by the interpreter at its start (a sitecustomize on PYTHONPATH): at exit, prints
# what the collector did from then on (the interpreter's own start collects before it).
_SITECUSTOMIZE = """
import atexit, gc, json, os, sys

_collections = []  # one entry per collection from here on: whether it came while the heavy
# packages imported (JAX or Prefect begun, no gc.freeze yet)
_jax = []  # the same, while JAX imported (begun, no gc.freeze yet)
def _on_collection(phase, info):
    if phase == "start":
        unfrozen = gc.get_freeze_count() == 0
        _collections.append(unfrozen and ("jax" in sys.modules or "prefect" in sys.modules))
        _jax.append(unfrozen and "jax" in sys.modules)

gc.callbacks.append(_on_collection)

def _report():
    os.write(1, ("\\nGC " + json.dumps({
        "enabled": gc.isenabled(),
        "frozen": gc.get_freeze_count(),
        "collections": len(_collections),
        "collections_while_importing": sum(_collections),
        "collections_while_importing_jax": sum(_jax),
        "imported": sorted(name for name in ("flows", "jax") if name in sys.modules),
    }) + "\\n").encode())

atexit.register(_report)
"""


def _gc_report(tmp_path: Path, *args: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> dict:
    (tmp_path / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    path = os.pathsep.join([str(tmp_path), str(ROOT)])
    env = {**os.environ, "PREFECT_API_URL": "", **(env or {}), "PYTHONPATH": path}
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("GC ")]
    assert lines, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    return {**json.loads(lines[-1][3:]), "returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr}


@pytest.mark.slow  # each command imports Prefect, JAX and Flax
@pytest.mark.parametrize("module", ["flows.train_ensemble", "ensemble_core.runs.training.processes"])
def test_a_command_imports_without_collections_then_collects_again(tmp_path, module):
    """``python -m <command> --help`` (a flow's command line; a JAX process of one program):
    no collection ran while JAX, Prefect and the rest imported (before the freeze at
    main's start; dozens ran there before), and main() turned the collector back on with
    what the imports made frozen (never walked by a collection)."""
    gc = _gc_report(tmp_path, "-m", module, "--help")
    assert gc["enabled"] is True
    assert gc["collections_while_importing"] == 0
    assert gc["frozen"] > 100_000


# Every other flow command's main in one process (their imports paid once): paused as
# flows/__init__.py pauses a `python -m flows.<command>`, then the command's main with
# --help; its first statement must turn the collector back on.
_EVERY_MAIN = """
import gc, runpy, sys
from ensemble_core import startup_gc
resumed = {}
for module in sys.argv[1:]:
    startup_gc.pause()
    sys.argv = [module, "--help"]
    try:
        runpy.run_module(module, run_name="__main__")
    except SystemExit:
        pass
    resumed[module] = gc.isenabled() and not startup_gc.paused()
print("RESUMED", resumed)
assert all(resumed.values()), resumed
"""


@pytest.mark.slow  # imports Prefect, JAX and Flax
def test_every_flow_commands_main_turns_the_collector_back_on(tmp_path):
    modules = ["flows.predict", "flows.monitor", "flows.reconcile", "flows.automations"]
    gc = _gc_report(tmp_path, "-c", _EVERY_MAIN, *modules)
    assert gc["returncode"] == 0, (gc["stdout"][-2000:], gc["stderr"][-2000:])
    assert "RESUMED {" in gc["stdout"] and gc["enabled"] is True


@pytest.mark.slow  # imports Prefect, JAX and Flax
def test_a_library_import_leaves_the_collector_alone(tmp_path):
    """Imported by a user's program (not ``python -m``), the flows pause nothing."""
    gc = _gc_report(tmp_path, "-c", "import flows.train_ensemble")
    assert gc["enabled"] is True and gc["frozen"] == 0 and gc["collections"] > 0


@pytest.mark.slow  # imports Prefect's server
def test_the_temporary_server_imports_and_builds_its_app_without_collections(tmp_path):
    """The temporary Prefect server's process (what flows.ephemeral starts: its parent's pid
    in the environment, uvicorn importing the app factory) imports Prefect and builds
    Prefect's app with the collector off, and turns it back on, the imports frozen."""
    from flows.ephemeral import PARENT_ENV

    code = "from flows.ephemeral import create_app; create_app()"
    gc = _gc_report(tmp_path, "-c", code, env={PARENT_ENV: str(os.getpid())})
    assert gc["collections_while_importing"] == 0
    assert gc["enabled"] is True and gc["frozen"] > 100_000


def _deployment_flow_run(api: httpx.Client, flow: str, entrypoint: str, path: Path, parameters: dict) -> str:
    """A new deployment of ``entrypoint`` (code at ``path``) on the server ``api`` talks to,
    and a flow run of it with ``parameters``, created through Prefect's REST API as
    ``prefect deployment run`` creates one: returns the flow run's id (what ``python -m
    prefect.engine`` is given)."""
    flow_id = api.post("/flows/", json={"name": flow}).raise_for_status().json()["id"]
    name = f"gc-probe-{uuid.uuid4().hex[:8]}"
    deployment = {"name": name, "flow_id": flow_id, "entrypoint": entrypoint, "path": str(path)}
    deployment_id = api.post("/deployments/", json=deployment).raise_for_status().json()["id"]
    run = api.post(f"/deployments/{deployment_id}/create_flow_run", json={"parameters": parameters})
    return run.raise_for_status().json()["id"]


@pytest.mark.slow  # a flow-run process imports Prefect, JAX and Flax
def test_a_deployments_flow_run_process_loads_its_flow_without_collections(tmp_path, prefect_api):
    """A deployment's flow-run process (``python -m prefect.engine <flow run id>``, as
    Prefect's process worker starts one): Prefect imports first, as the engine does; from
    the moment it loads the flow from the deployment's entrypoint, no collection ran while
    JAX, Flax and the rest imported (without the pause: dozens, about 1.5 of the process's
    4 CPU s), and the flow's first statement turned the collector back on with the imports
    frozen. The flow ran: a predict run with no run to predict with, refused at once."""
    api = httpx.Client(base_url=prefect_api, timeout=60)
    parameters = {"run_dir": str(tmp_path / "no-such-run"), "images": str(tmp_path)}
    run_id = _deployment_flow_run(api, "predict", "flows/predict.py:predict", ROOT, parameters)

    gc = _gc_report(tmp_path, "-m", "prefect.engine", run_id, env=cli_env(prefect_api))
    state = api.get(f"/flow_runs/{run_id}").raise_for_status().json()["state"]
    assert state["type"] == "FAILED" and state["message"].startswith("error: "), (state, gc["stderr"][-2000:])
    assert gc["collections_while_importing_jax"] == 0, gc
    assert gc["enabled"] is True and gc["frozen"] > 100_000, gc


_USER_FLOW = """
from prefect import flow

import flows  # this project's package, imported by a user's own flow module


@flow
def mine() -> str:
    return "ran"
"""


@pytest.mark.slow  # a flow-run process imports Prefect
def test_a_users_own_deployed_flow_importing_the_package_keeps_its_collector(tmp_path, prefect_api):
    """A user's own deployment whose flow module imports this project's ``flows`` package
    but runs none of its flows: its flow-run process (``python -m prefect.engine``) keeps
    the collector on. Only a flow module of this package, loaded as the deployment's
    entrypoint, pauses it, and its flow's first statement turns it back on (before: paused
    by the import and never resumed, the collector off until the process exited)."""
    (tmp_path / "user_flow.py").write_text(_USER_FLOW)
    api = httpx.Client(base_url=prefect_api, timeout=60)
    run_id = _deployment_flow_run(api, "mine", "user_flow.py:mine", tmp_path, {})

    # run where the entrypoint is (elsewhere the engine copies the deployment's path there)
    gc = _gc_report(tmp_path, "-m", "prefect.engine", run_id, env=cli_env(prefect_api), cwd=tmp_path)
    state = api.get(f"/flow_runs/{run_id}").raise_for_status().json()["state"]
    assert state["type"] == "COMPLETED", (state, gc["stderr"][-2000:])
    assert "flows" in gc["imported"], gc
    assert gc["enabled"] is True and gc["frozen"] == 0, gc


# Loaded at the interpreter's start: the freeze count after each gc.freeze (the first: the
# imports, as main starts) and, at each full collection after it, the objects it walked (those
# tracked in generation 2), reported when the command ends (it exits with os._exit, past
# atexit). gc.get_freeze_count() walks the frozen objects: asked at every collection, it made
# this command 7 times slower.
_SITECUSTOMIZE_FULL = """
import gc, json, os

_seen = {"freezes": [], "full": []}
_freeze = gc.freeze

def _recording_freeze():
    _freeze()
    _seen["freezes"].append(gc.get_freeze_count())

gc.freeze = _recording_freeze

def _on_collection(phase, info):
    if phase == "start" and info["generation"] == 2 and _seen["freezes"]:
        _seen["full"].append(len(gc.get_objects(generation=2)))

gc.callbacks.append(_on_collection)
_exit = os._exit

def _reporting_exit(code):
    if not os.environ.get("ENSEMBLE_EPHEMERAL_PARENT_PID"):  # the command, not its server
        os.write(1, ("\\nGC " + json.dumps({**_seen, "frozen": gc.get_freeze_count()}) + "\\n").encode())
    _exit(code)

os._exit = _reporting_exit
"""


@pytest.mark.slow  # the tiny config through the command line: 6-10 s
def test_a_commands_full_collections_do_not_walk_what_its_earlier_stages_left(tmp_path, tfds_dir, prefect_api):
    """Between a run's stages the command freezes what the stages before left (it lives
    until the command exits): every full collection during the tiny config's run walked
    fewer objects than the stages' freezes took out of its reach (without them, the four
    full collections of this run walked 49,000 to 187,000 objects, and the freeze count
    stayed at the imports')."""
    (tmp_path / "sitecustomize.py").write_text(_SITECUSTOMIZE_FULL)
    env = cli_env(prefect_api, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    cmd = [sys.executable, "-m", "flows.train_ensemble", "--config", str(ROOT / "configs" / "tiny.yaml")]
    cmd += ["--set", f"data.data_dir={tfds_dir}", "--output-dir", str(tmp_path / "runs")]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("GC ")]
    assert len(lines) == 1, done.stdout[-2000:]
    gc = json.loads(lines[0][3:])
    imports = gc["freezes"][0]  # frozen as main started
    frozen_by_stages = gc["frozen"] - imports
    assert imports > 100_000 and len(gc["freezes"]) > 1, gc
    assert frozen_by_stages > 20_000, gc
    assert all(walked < frozen_by_stages for walked in gc["full"]), gc


def test_a_library_process_freezes_nothing_between_stages():
    """Where the imports were not frozen (this test session, a notebook, a Dask worker),
    :func:`ensemble_core.startup_gc.freeze_survivors` leaves the collector as it is."""
    from ensemble_core import startup_gc

    frozen = gc_module.get_freeze_count()
    assert startup_gc.freeze_survivors() is False
    assert gc_module.get_freeze_count() == frozen
