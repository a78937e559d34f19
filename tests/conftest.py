"""Tests run on 8 simulated CPU devices (set before JAX is imported)."""

import atexit
import os
import shutil
import tempfile
from pathlib import Path

from tests.xla_flags import xla_flags  # 8 devices, LLVM at -O1 (why: tests/xla_flags.py)

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + xla_flags(8)).strip()
# JAX's persistent compilation cache, one per test session (unless JAX_COMPILATION_CACHE_DIR
# names one): set here, in pytest's controlling process before it starts its pytest-xdist
# workers, so the workers and every process the tests start with this environment share
# it. Most of the suite's CPU time is XLA compiling the same small programs again in new
# jit objects and new processes; the cache (every program, however quick to compile) took
# test_train.py and test_stateful_members.py from 204 to 135 CPU s, cold at the start.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="ensemble-tests-jax-cache-")
    atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest

from ensemble_core import startup_gc

pytest_plugins = ["tests.suite_report"]  # ENSEMBLE_SUITE_REPORT: each test's wall and CPU seconds


@pytest.fixture(scope="session")
def tfds_dir(tmp_path_factory):
    """A TFDS data dir with the embedded mnist5k prepared once for the session."""
    from ensemble_core import data

    d = tmp_path_factory.mktemp("tfds")
    data.prepare(data.EMBEDDED, str(d))
    return str(d)


@pytest.fixture(scope="session")
def embedded_dir(tfds_dir):
    """The TFDS data dir of the embedded dataset's snapshot in ``tfds_dir`` (what
    ``data.load_split`` takes)."""
    from ensemble_core import data

    return data.prepare(data.EMBEDDED, tfds_dir).tfds_data_dir


@pytest.fixture(scope="session")
def mnist_train(embedded_dir):
    from ensemble_core import data

    return data.load_split(data.EMBEDDED, "train", embedded_dir)


@pytest.fixture(scope="session")
def mnist_test(embedded_dir):
    from ensemble_core import data

    return data.load_split(data.EMBEDDED, "test", embedded_dir)


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory):
    """The API URL of one Prefect server for the command lines the tests start in
    subprocesses (``tests/prefect_api.py``; pass ``cli_env(prefect_api)``): the one the
    controlling process started for every pytest-xdist worker, else this process's own."""
    from tests.prefect_api import SHARED_API_ENV, api_server, wait_healthy

    if os.environ.get(SHARED_API_ENV):
        wait_healthy(os.environ[SHARED_API_ENV])
        yield os.environ[SHARED_API_ENV]
        return
    with api_server(tmp_path_factory.mktemp("prefect-api")) as url:
        yield url


def pytest_configure(config):
    """In the controlling process of a pytest-xdist run that includes slow tests: start the
    Prefect API server the workers' ``prefect_api`` share (its URL in the environment the
    workers inherit), without waiting for it; it starts while the workers collect."""
    from tests.prefect_api import SHARED_API_ENV, start_server

    if os.environ.get("PYTEST_XDIST_WORKER") or os.environ.get(SHARED_API_ENV):
        return
    if not getattr(config.option, "numprocesses", None) or "not slow" in (config.option.markexpr or ""):
        return  # one process (its fixture starts a server when a test needs one), or make test-fast
    home = tempfile.mkdtemp(prefix="ensemble-tests-prefect-api-")
    server, url = start_server(Path(home))
    os.environ[SHARED_API_ENV] = url
    config.stash[_SHARED_API] = (server, home)


_SHARED_API = pytest.StashKey[tuple]()


def pytest_unconfigure(config):
    from tests.prefect_api import SHARED_API_ENV, stop_server

    shared = config.stash.get(_SHARED_API, None)
    if shared is not None:
        stop_server(shared[0])
        shutil.rmtree(shared[1], ignore_errors=True)
        os.environ.pop(SHARED_API_ENV, None)


# Longest first (make test's pytest-xdist workers take a whole module at a time, in this
# order, with --no-loadscope-reorder): the modules that mostly wait on real processes start
# at once, beside the CPU-bound ones, and the last module to start is a short one, so no
# worker is left running a long module after the others have finished. Seconds of wall
# time measured by benchmarks.suite (2 cores, one held busy, 2026-11-26, at the NNX
# members' change); the rest follow
# in file order.
_LONGEST_FIRST = (
    "test_deployment.py",  # 460 s: a Prefect stack on PostgreSQL, scheduled runs
    "test_multihost.py",  # 350 s: simulated hosts, a host cut off
    "test_reliability.py",  # 270 s: training processes killed and resumed
    "test_deployment_faults.py",  # 250 s: a Prefect stack on PostgreSQL, faults
    "test_flow.py",  # 250 s
    "test_processes.py",  # 175 s
    "test_cli_process.py",  # 160 s
    "test_stateful_members.py",  # 155 s
    "test_groups.py",  # 130 s
    "test_own_data.py",  # 115 s (2026-11-27, at the image folders' change)
    "test_stop_signals.py",  # 105 s
    "test_full_disk.py",  # 105 s
    "test_checkpoint.py",  # 70 s
    "test_conv_patches.py",  # 55 s
    "test_nnx_members.py",  # 45 s
)


def pytest_collection_modifyitems(items):
    def rank(item) -> int:
        name = item.path.name
        return _LONGEST_FIRST.index(name) if name in _LONGEST_FIRST else len(_LONGEST_FIRST)

    items.sort(key=rank)  # stable: within a rank, file and test order stay as collected


@pytest.hookimpl(wrapper=True)
def pytest_collection(session):
    """The garbage collector off while collection imports the test modules (JAX, Flax,
    Prefect, TFDS), as the commands do (:mod:`ensemble_core.startup_gc`); on again after,
    the imports not frozen (why: :func:`ensemble_core.startup_gc.resume`)."""
    startup_gc.pause()
    try:
        return (yield)
    finally:
        startup_gc.resume(freeze=False)


def pytest_collection_finish(session):
    """Prefect's logging set up now, where collection imported absl (TFDS) and not yet
    Prefect's logging. Prefect sets up its logging once per process with
    ``logging.config.dictConfig``, which closes every handler already there, and absl's
    handler closes its stream on close unless that stream is the current ``sys.stderr``
    (``absl.logging.PythonHandler.close``). absl's stream is pytest's session-wide capture
    it found at import; a first Prefect logging setup inside a ``capfd`` test closed that
    capture and ended the worker ("I/O operation on closed file", "lost sys.stderr").
    Here absl's stream stands in as ``sys.stderr`` for the setup, so it stays open. A
    collection of every test module sets Prefect's logging up anyway; a subset of them
    (``pytest tests/a.py tests/b.py``) did not always."""
    import sys

    if "absl.logging" not in sys.modules:
        return
    from absl import logging as absl_logging
    from prefect.logging.configuration import ensure_logging_setup

    saved, sys.stderr = sys.stderr, absl_logging.get_absl_handler().python_handler.stream
    try:
        ensure_logging_setup()
    finally:
        sys.stderr = saved
