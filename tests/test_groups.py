"""Member groups (``distributed.member_groups``): each group trained on its own, locally or
on a Dask cluster, gives the members of one program training them all."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from ensemble_core import rngs, runs
from ensemble_core.config import load_config
from ensemble_core.ensemble_setup import build
from ensemble_core.errors import ConfigError, IncompatibleRunError
from ensemble_core.processutil import free_port
from ensemble_core.runs.ensemble.load import restore
from ensemble_core.runs.storage.checkpoint import EnsembleCheckpointer
from tests.ensembles import predictions, tiny_config

ROOT = Path(__file__).resolve().parents[1]
# 4 members, 2 epochs with a validation split (best-epoch tracking gathered too).
COMMON = (
    "ensemble.size=4",
    "data.validation_fraction=0.2",
    "data.calibration_fraction=0",  # as tiny_config: the command-line runs train on what its runs train on
    "data.max_train_examples=320",
    "train.epochs=2",
)


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (
            ["ensemble.size=6", "distributed.member_groups=4"],
            "does not divide ensemble.size=6; fix: use one of [1, 2, 3, 6]",
        ),
        (["distributed.address=tcp://127.0.0.1:1"], "task_runner=local; fix: set distributed.task_runner=dask"),
        (
            ["distributed.task_runner=dask", "distributed.address=http://x:1"],
            "not a tcp:// or tls:// Dask scheduler address",
        ),
        (["distributed.task_runner=dask", "distributed.address=tls://x:1"], "tls_ca_file, tls_cert and tls_key"),
        (["distributed.task_runner=dask", "distributed.tls_cert=c.pem"], "distributed.address is not set"),
        (
            ["distributed.task_runner=dask", "distributed.address=tcp://x:1", "distributed.workers=2"],
            "fix: drop one of them",
        ),
    ],
)
def test_bad_group_settings_are_one_line_errors(overrides, fragment):
    with pytest.raises(ConfigError, match="fix: ") as err:
        load_config(None, overrides)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_a_scheduler_that_does_not_answer_is_refused_before_any_compute(tmp_path, tfds_dir):
    port = free_port()  # nothing listens on it
    cfg = tiny_config(tfds_dir, "distributed.task_runner=dask", f"distributed.address=tcp://127.0.0.1:{port}")
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=f"scheduler at distributed.address=tcp://127.0.0.1:{port} does not answer"):
        runs.preflight(cfg, tmp_path / "out", "r")
    assert time.monotonic() - t0 < 10 and not (tmp_path / "out").exists()


def test_a_groups_keys_and_hyperparameters_are_its_members_in_the_whole_ensemble(tfds_dir):
    search = "ensemble.search={learning_rate: {distribution: log_uniform, low: 0.01, high: 0.3}}"
    cfg = tiny_config(tfds_dir, "ensemble.size=6", "distributed.member_groups=3", search)
    whole = build(cfg, 10)
    keys = rngs.member_keys(cfg.seed, 6)  # member i from (seed, i), whatever the groups
    for g in range(3):
        part = build(cfg, 10, group=g)
        assert part.first_member == 2 * g
        assert part.hyperparameters() == whole.hyperparameters()[2 * g : 2 * g + 2]
        for purpose, k in part.member_keys().items():
            want = np.asarray(jax.random.key_data(keys[purpose]))[2 * g : 2 * g + 2]
            np.testing.assert_array_equal(np.asarray(jax.random.key_data(k)), want)
    with pytest.raises(ConfigError, match=r"member group 3 of distributed.member_groups=3"):
        build(cfg, 10, group=3)


def test_a_stratified_pools_groups_key_each_member_by_its_setting_and_initialisation(tfds_dir):
    """A stratified pool's member m is (setting, initialisation) of its plan, keyed by
    (seed, setting, j) whichever member group trains it; padding past the pool gets
    settings of its own (none of the pool's)."""
    from ensemble_core.stratification import PADDING_SETTING, StratificationPlan

    if len(jax.devices()) < 4:  # a GPU machine's one device (scripts/gpu_check.sh); CPU tests have 8
        pytest.skip(f"needs 4 devices; {jax.default_backend()} has {len(jax.devices())}")
    plan = StratificationPlan(settings=[5, 2, 7], inits=2, first_selection={})
    cfg = tiny_config(
        tfds_dir, "ensemble.size=6", "distributed.member_groups=2", "mesh.ensemble=4", "ensemble.pad=true"
    )
    for g in range(2):
        part = build(cfg, 10, group=g)
        got = part.member_keys(plan)
        padded = part.plan.padded_members
        members = range(3 * g, 3 * g + padded)
        pairs = [plan.member(m) if m < 6 else (PADDING_SETTING, m - 6) for m in members]
        assert pairs[:3] == [(5, 0), (5, 1), (2, 0)] if g == 0 else pairs[:3] == [(2, 1), (7, 0), (7, 1)]
        want = rngs.stratified_member_keys(cfg.seed, pairs)
        for purpose in want:
            np.testing.assert_array_equal(jax.random.key_data(got[purpose]), jax.random.key_data(want[purpose]))


def _members(run_dir: Path, cfg) -> dict:
    state, _ = restore(cfg, run_dir, 10, (28, 28, 1))
    return {
        "params": [np.asarray(x) for x in jax.tree.leaves(state.params)],
        "best": [np.asarray(x) for x in jax.tree.leaves(state.best)],
    }


@pytest.fixture(scope="module")
def one_program(tmp_path_factory, tfds_dir):
    """The reference: every member trained by one program (G = 1)."""
    out = tmp_path_factory.mktemp("g1")
    cfg = tiny_config(tfds_dir, *COMMON)
    result = runs.run(cfg, out, "g1")
    return cfg, result


@pytest.mark.slow
def test_two_groups_in_one_process_equal_one_program_bitwise(one_program, tfds_dir, tmp_path):
    """Same per-device layout (one member per device in both): bitwise equal members,
    predictions and report figures; the run's checkpoint is the gathered one."""
    cfg1, ref = one_program
    cfg = tiny_config(tfds_dir, *COMMON, "distributed.member_groups=2")
    result = runs.run(cfg, tmp_path, "g2")
    got, want = _members(result.run_dir.path, cfg), _members(ref.run_dir.path, cfg1)
    for a, b in zip(got["params"] + got["best"], want["params"] + want["best"], strict=True):
        np.testing.assert_array_equal(a, b)
    for k, v in predictions(ref.run_dir.path).items():
        np.testing.assert_array_equal(predictions(result.run_dir.path)[k], v)
    assert result.evaluation.ensemble == ref.evaluation.ensemble
    assert result.training.history == [
        {**rec, "train_loss": rec["train_loss"], "train_accuracy": rec["train_accuracy"]}
        for rec in ref.training.history
    ]
    assert [row["member"] for row in result.training.members] == [0, 1, 2, 3]
    assert [t["members"] for t in result.training.topology] == [[0, 1], [2, 3]]
    assert (result.run_dir.path / "groups" / "0" / "checkpoints").is_dir()
    with EnsembleCheckpointer(result.run_dir.checkpoints) as ckpt:
        meta = ckpt.read_meta()
    assert meta["members_trained"] == 4 and len(meta["gathered_from"]) == 2
    report = json.loads((result.run_dir.path / "report.json").read_text())
    assert [t["members"] for t in report["topology"]] == [[0, 1], [2, 3]]
    markdown = (result.run_dir.path / "report.md").read_text()
    assert "**Topology**: 2 member groups" in markdown
    assert f"| 1 | 2..3 | {report['topology'][1]['host']} | {os.getpid()} | - | 1 | 8 | 2 x 1 |" in markdown


@pytest.mark.soak  # make test: the two groups in one process above (bitwise) and on a Dask cluster below
def test_groups_with_another_per_device_layout_agree_within_1e5(tfds_dir, tmp_path):
    """All members vmapped on one device: 4 members in one batched kernel vs 2 + 2. XLA
    does not promise the same summation order for another batch of members, so equality
    is asserted within 1e-5 (on the CPU measured here it was bitwise as well)."""
    common = (*COMMON, "mesh.ensemble=1", "mesh.member_strategy=vmap")
    one = runs.run(tiny_config(tfds_dir, *common), tmp_path, "one")
    two = runs.run(tiny_config(tfds_dir, *common, "distributed.member_groups=2"), tmp_path, "two")
    a, b = predictions(one.run_dir.path), predictions(two.run_dir.path)
    np.testing.assert_allclose(b["member_probs"], a["member_probs"], atol=1e-5)
    np.testing.assert_array_equal(b["labels"], a["labels"])


@pytest.mark.slow
def test_a_changed_group_count_is_refused_on_resume(one_program, tmp_path, tfds_dir):
    cfg = tiny_config(tfds_dir, *COMMON, "distributed.member_groups=2")
    runs.run(cfg, tmp_path, "r")
    again = tiny_config(tfds_dir, *COMMON, "distributed.member_groups=4")
    with pytest.raises(IncompatibleRunError, match=r"distributed.member_groups: 2 -> 4"):
        runs.preflight(again, tmp_path, "r")


# MARK: on a Dask cluster, through the Prefect flow


def _args(tfds_dir, out: Path, name: str, *overrides: str) -> list[str]:
    args = ["--set", f"data.data_dir={tfds_dir}"]
    base = ("data.max_test_examples=100", "model.name=mlp", "model.hidden_sizes=[16]", "train.batch_size=32")
    for o in (*base, "eval.evaluators=[test]", *COMMON, "distributed.member_groups=2", "distributed.task_runner=dask"):
        args += ["--set", o]
    for o in overrides:
        args += ["--set", o]
    return [*args, "--output-dir", str(out), "--run-name", name]


def _cli(tfds_dir, out: Path, name: str, *overrides: str, env: dict | None = None) -> subprocess.Popen:
    env = env or {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    cmd = [sys.executable, "-m", "flows.train_ensemble", *_args(tfds_dir, out, name, *overrides)]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _reference(tfds_dir, tmp_path, *overrides):
    cfg = tiny_config(tfds_dir, *COMMON, "data.max_test_examples=100", *overrides)
    return runs.run(cfg, tmp_path / "ref", "ref")


@pytest.mark.slow
def test_groups_on_a_local_dask_cluster_equal_one_program(tfds_dir, tmp_path, prefect_api):
    """The command with task_runner=dask against a Prefect server: two worker processes
    train a group each (distinct processes, pinned to distinct cores), the members equal
    one program's, and the server holds a task run per group with its own logs and
    progress artifact, under the train-member-groups subflow of the run.

    Why not shorter (about a minute under load): a local Dask cluster of two worker
    processes, and the one-program reference run."""
    import asyncio
    import contextlib
    import io

    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, LogFilter, LogFilterTaskRunId

    from flows.train_ensemble import main
    from tests.prefect_api import own_flow_run_filter, own_runs, this_process_on

    async def records(tag):
        async with get_client() as client:
            own = own_flow_run_filter(tag)  # the session's server: this run's records only
            task_runs = await client.read_task_runs(flow_run_filter=own)
            flow_runs = await client.read_flow_runs(flow_run_filter=own)
            keys = ["training-progress-group-0", "training-progress-group-1"]
            artifacts = await client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=keys)), flow_run_filter=own
            )
            logs = {}
            for tr in task_runs:
                if tr.name.startswith("train_member_group-"):
                    found = await client.read_logs(log_filter=LogFilter(task_run_id=LogFilterTaskRunId(any_=[tr.id])))
                    logs[tr.name] = [entry.message for entry in found]
            return task_runs, flow_runs, artifacts, logs

    with this_process_on(prefect_api):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), own_runs() as tag:
            rc = main(_args(tfds_dir, tmp_path / "runs", "dask"))
        assert rc == 0, buf.getvalue()[-2000:]
        task_runs, flow_runs, artifacts, logs = asyncio.run(records(tag))

    run = tmp_path / "runs" / "dask"
    ref = _reference(tfds_dir, tmp_path)
    for k, v in predictions(ref.run_dir.path).items():
        np.testing.assert_array_equal(predictions(run)[k], v)
    report = json.loads((run / "report.json").read_text())
    topology = report["topology"]
    assert [t["members"] for t in topology] == [[0, 1], [2, 3]]
    assert len({t["pid"] for t in topology}) == 2 and all(t["worker"].startswith("tls://127.0.0.1") for t in topology)
    assert os.getpid() not in {t["pid"] for t in topology}
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= 2:  # distributed.pin_cores: worker k on core k, one core each
        assert [t["cpu_cores"] for t in topology] in ([[cores[0]], [cores[1]]], [[cores[1]], [cores[0]]])

    by_name = {tr.name: tr for tr in task_runs}
    (groups_flow,) = [fr for fr in flow_runs if fr.parent_task_run_id is not None]  # the subflow
    assert groups_flow.state.is_completed()
    for t in topology:  # each group: its own completed task run, its own log lines, from its worker
        tr = by_name[f"train_member_group-{t['group']}"]
        assert tr.state.is_completed() and tr.flow_run_id == groups_flow.id
        first, last = t["members"]
        assert any(f"trained members {first}..{last}" in m and f"in process {t['pid']}" in m for m in logs[tr.name])
    assert any(name.startswith("gather_members") and tr.state.is_completed() for name, tr in by_name.items())
    assert sorted(a.key for a in artifacts) == ["training-progress-group-0", "training-progress-group-1"]
    assert all(a.data == 100.0 for a in artifacts)


@pytest.mark.slow
@pytest.mark.soak  # make test: test_multihost.py's worker host killed, whose group resumes on the other host
def test_a_killed_dask_worker_is_replaced_and_its_group_resumes(tfds_dir, tmp_path):
    """SIGKILL the worker process training group 0 once it has saved a checkpoint: the
    nanny starts a new worker, the scheduler runs the group's task again (its task run
    goes Running -> Pending -> Running on the server), the group resumes from its own
    checkpoint, group 1's work is kept (one Running, one training session) and the
    members equal an uninterrupted run's."""
    import asyncio

    from prefect import get_client
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    async def state_histories() -> dict[str, list[str]]:
        async with get_client() as client:
            out = {}
            for tr in await client.read_task_runs():
                if tr.name.startswith("train_member_group-"):
                    out[tr.name] = [st.type.value for st in await client.read_task_run_states(tr.id)]
            return out

    slow = ("train.epochs=6", "data.max_train_examples=1280")
    with prefect_test_harness(server_startup_timeout=120):
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}}
        env["PREFECT_API_URL"] = PREFECT_API_URL.value()  # the ordinary command, on the test's server
        proc = _cli(tfds_dir, tmp_path / "runs", "kill", *slow, env=env)
        group0 = tmp_path / "runs" / "kill" / "groups" / "0"
        deadline = time.monotonic() + 300
        while not any(p.name.isdigit() for p in (group0 / "checkpoints").glob("*")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.1)
        pid = int((group0 / ".lock").read_text())
        assert pid != proc.pid
        os.kill(pid, signal.SIGKILL)
        _out, err = proc.communicate(timeout=420)
        assert proc.returncode == 0, err[-3000:]
        histories = asyncio.run(state_histories())
    assert histories["train_member_group-0"] == ["PENDING", "RUNNING", "PENDING", "RUNNING", "COMPLETED"]
    assert histories["train_member_group-1"] == ["PENDING", "RUNNING", "COMPLETED"]
    run = tmp_path / "runs" / "kill"
    report = json.loads((run / "report.json").read_text())
    restarted = next(t for t in report["topology"] if t["group"] == 0)
    assert restarted["pid"] != pid
    sessions = [s for s in report["training_sessions"] if s.get("group") == 0]
    assert len(sessions) == 2 and sessions[1]["start_epoch"] >= 1  # resumed, not restarted
    assert len([s for s in report["training_sessions"] if s.get("group") == 1]) == 1
    ref = _reference(tfds_dir, tmp_path, *slow)
    for k, v in predictions(ref.run_dir.path).items():
        np.testing.assert_array_equal(predictions(run)[k], v)


@pytest.mark.slow
def test_a_stopped_grouped_run_is_not_restarted_under_another_layout(one_program, tmp_path, tfds_dir):
    """Regression: a grouped run stopped by SIGTERM (its checkpoints only under groups/<g>/)
    and rerun with member_groups=1 trained from epoch 0 beside the orphaned group
    checkpoints. Now that rerun is refused before any compute, naming the old count, and
    the original layout resumes it to the same members as one uninterrupted program."""
    import functools

    from ensemble_core.errors import PreemptedError
    from ensemble_core.runs.training.groups import train_groups

    cfg1, ref = one_program
    grouped = tiny_config(tfds_dir, *COMMON, "distributed.member_groups=2")
    sent = []

    def stop_once(record):  # a real SIGTERM to this process after the first group's first epoch
        if not sent:
            sent.append(record["epoch"])
            os.kill(os.getpid(), signal.SIGTERM)

    stages = runs.Stages(train=functools.partial(train_groups, on_epoch=stop_once))
    with pytest.raises(PreemptedError):
        runs.run(grouped, tmp_path, "r", stages)
    run = runs.RunDir(tmp_path / "r")
    assert (run.path / "groups" / "0" / "checkpoints").is_dir() and not run.has_checkpoint()
    with pytest.raises(IncompatibleRunError, match=r"distributed.member_groups: 2 -> 1") as err:
        runs.preflight(cfg1, tmp_path, "r")
    assert "\n" not in str(err.value) and "fix:" in str(err.value)
    assert not run.has_checkpoint()  # nothing started over
    result = runs.run(grouped, tmp_path, "r")  # the original layout resumes
    got, want = _members(result.run_dir.path, grouped), _members(ref.run_dir.path, cfg1)
    for a, b in zip(got["params"] + got["best"], want["params"] + want["best"], strict=True):
        np.testing.assert_array_equal(a, b)
