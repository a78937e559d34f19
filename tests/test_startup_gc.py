"""The garbage collector is off while a command imports its modules, and on again, with
the imports frozen out of its reach, once the command's main starts (ensemble_core.startup_gc)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Loaded by the interpreter at its start (a sitecustomize on PYTHONPATH): at exit, prints
# what the collector did from then on (the interpreter's own start collects before it).
_SITECUSTOMIZE = """
import atexit, gc, json, os, sys

_collections = []  # one entry per collection from here on: whether it came while the heavy
# packages imported (JAX or Prefect begun, no gc.freeze yet)
def _on_collection(phase, info):
    if phase == "start":
        importing = gc.get_freeze_count() == 0 and ("jax" in sys.modules or "prefect" in sys.modules)
        _collections.append(importing)

gc.callbacks.append(_on_collection)

def _report():
    os.write(1, ("\\nGC " + json.dumps({
        "enabled": gc.isenabled(),
        "frozen": gc.get_freeze_count(),
        "collections": len(_collections),
        "collections_while_importing": sum(_collections),
    }) + "\\n").encode())

atexit.register(_report)
"""


def _gc_report(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> dict:
    (tmp_path / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    path = os.pathsep.join([str(tmp_path), str(ROOT)])
    env = {**os.environ, **(env or {}), "PYTHONPATH": path, "PREFECT_API_URL": ""}
    done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
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
