"""The reliability sweep: bad input and faults through every entry point, one real
command line (or several) per case, each judged by :func:`tests.system.sweep.assert_clean`.

The cases are the tables of ``sweep_train_cases.py`` (the training command line's config,
run names, output directories and state), ``sweep_fault_cases.py`` (damaged files, stop
signals at random moments then a rerun, member groups, JAX processes, ``python -m
ensemble_core.runs.training.processes``) and ``sweep_predict_cases.py`` (the prediction
command line, ``prefect deployment run`` against a private ``make serve`` stack), and
issue 43's round four: ``sweep_round4_inputs.py`` (special files, YAML that expands or
recurses, a user's module that exits, configs at the size limits, reserved run names and
output directories that are not one line) and ``sweep_round4_cases.py`` (readers of a run,
a champion or a data dir beside the process writing it, messages that name the right
cause and run, overrides, members placed across JAX processes). A case
is clean only if its exit code is the expected one (0 done, 2 refused or failed, 75
stopped; 1 for ``prefect deployment run`` of a failed flow run), a failure printed exactly
one line starting ``error: `` that holds ``fix:`` and names the case's cause (its
``cause`` pattern matches the line before ``fix:``: a refusal for the wrong reason is
``wrong-cause``), no command printed ``Traceback`` or
``Exception ignored``, and the case's own check of what was lost or left behind holds.
Every command has a timeout: a hung one is ``hang``.

Marked ``soak`` and ``sweep``: ``make soak`` runs it (``benchmarks.reliability_sweep``,
which also writes its table); as root (it mounts tmpfs file systems). With
``ENSEMBLE_SWEEP_ROWS=FILE`` each case appends its row (JSON, one line) to FILE.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import pytest

from tests.system import (
    sweep_fault_cases,
    sweep_predict_cases,
    sweep_round4_cases,
    sweep_round4_inputs,
    sweep_round5_inputs,
    sweep_round5_user_code,
    sweep_train_cases,
)
from tests.system.sweep import Case, Ctx, assert_clean, base_env, prepare_base, row

pytestmark = [
    pytest.mark.soak,
    pytest.mark.sweep,
    pytest.mark.skipif(os.geteuid() != 0, reason="the sweep mounts tmpfs file systems: run it as root"),
]

CASES: list[Case] = [
    *sweep_train_cases.CASES,
    *sweep_fault_cases.CASES,
    *sweep_predict_cases.CASES,
    *sweep_round4_inputs.CASES,
    *sweep_round4_cases.CASES,
    *sweep_round5_inputs.CASES,
    *sweep_round5_user_code.CASES,
]


def case_id(c: Case) -> str:
    """``<entry point>/<case>``, e.g. ``train-CLI/set-unknown-key``."""
    return f"{c.entry.replace(' ', '-')}/{c.name}"


@pytest.fixture(scope="session")
def sweep_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("sweep")


@pytest.fixture(scope="session")
def sweep_base(sweep_dir) -> tuple[Path, Path]:
    """The data dir and the output dir of the finished run 'base', once per test process."""
    return prepare_base(sweep_dir)


@pytest.fixture(scope="session")
def deployment_stack(sweep_dir):
    """A private ``make serve`` stack (``tests/prefect_stack.py``) for the deployment cases,
    which share one test process (``xdist_group``)."""
    from tests import prefect_stack

    (sweep_dir / "stack").mkdir()
    with prefect_stack.stack(sweep_dir / "stack") as env:
        yield env


@pytest.mark.parametrize(
    "c",
    [
        pytest.param(c, id=case_id(c), marks=[pytest.mark.xdist_group("deployment")] if c.stream == "out" else [])
        for c in CASES
    ],
)
def test_case(c: Case, sweep_dir, sweep_base, request, worker_id):
    data, base = sweep_base
    where = sweep_dir / "cases" / f"{c.entry.split()[0]}-{c.name}"
    where.mkdir(parents=True)
    env = {**base_env(sweep_dir), "PREFECT_HOME": str(sweep_dir / f"prefect-home-{worker_id}")}
    ctx = Ctx(where, data, base, env, rng=random.Random(f"{c.entry}/{c.name}"))
    if c.stream == "out":
        ctx.stack_env = request.getfixturevalue("deployment_stack")
    started = time.monotonic()
    try:
        proc, ok, note = c.fn(ctx)
    finally:
        ctx.cleanup()
    line = row(c, ctx, proc, ok, note, time.monotonic() - started)
    if os.environ.get("ENSEMBLE_SWEEP_ROWS"):
        with open(os.environ["ENSEMBLE_SWEEP_ROWS"], "a") as f:
            f.write(json.dumps(line) + "\n")
    assert_clean(line)
