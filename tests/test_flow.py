"""The Prefect flow end to end on a tiny config, on the session's Prefect server (each test
reads back only its own runs: tests/prefect_api.py)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.stats
from sklearn.metrics import accuracy_score, log_loss

pytestmark = pytest.mark.slow  # the flow under Prefect, CLIs in subprocesses

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def prefect_server(prefect_api):
    from tests.prefect_api import this_process_on

    with this_process_on(prefect_api):
        yield


@pytest.fixture(scope="module")
def finished_tag():
    """The tag of ``finished_run``'s flow and task runs on the shared server."""
    from tests.prefect_api import new_tag

    return new_tag()


_means = "promotion.metric=rotation.means.ensemble.nll"  # 'mean', not 'means'
_swapped = "promotion.metric=letters.ensemble.entropy.auroc"  # the figure before the score


def _tiny(tfds_dir):
    return ["--config", str(ROOT / "configs" / "tiny.yaml"), "--set", f"data.data_dir={tfds_dir}"]


@pytest.fixture(scope="module")
def finished_run(prefect_server, finished_tag, tfds_dir, tmp_path_factory):
    from flows.train_ensemble import main
    from tests.prefect_api import own_runs

    out = tmp_path_factory.mktemp("runs")
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), own_runs(finished_tag):
        # with its figures (tiny.yaml draws none): the one flow run that proves they are drawn
        rc = main([*_tiny(tfds_dir), "--set", "eval.plots=true", "--output-dir", str(out), "--run-name", "tiny"])
    return rc, buf.getvalue(), out / "tiny"


def test_cli_prints_run_dir_last(finished_run):
    """The command prints the run directory as its last line.

    Why not shorter (its fixture, 1-1.5 min the first time: a Prefect test server, the
    tiny run with every default evaluator, building the shifted and OOD sets once for the
    module)."""
    rc, stdout, run_dir = finished_run
    assert rc == 0
    assert stdout.strip().splitlines()[-1] == str(run_dir)
    for name in (
        "report.json",
        "report.md",
        "predictions.npz",
        "plots/reliability.png",
        "plots/members.png",
        "plots/training_curves.png",
    ):
        assert (run_dir / name).is_file(), name
    assert (run_dir / "checkpoints" / "12").is_dir()  # 2 epochs x 6 steps (410 // 64: 512 less 51 + 51 held out)


def test_report_matches_predictions_recomputed_independently(finished_run):
    """report.json metrics vs. scikit-learn (accuracy, log loss), SciPy (entropy) and
    plain loops (Brier, ECE, disagreement) on predictions.npz."""
    _, _, run_dir = finished_run
    report = json.loads((run_dir / "report.json").read_text())
    with np.load(run_dir / "predictions.npz") as f:
        member_probs, labels = f["member_probs"], f["labels"]
    assert member_probs.dtype == np.float32 and member_probs.shape == (4, 200, 10)
    assert np.issubdtype(labels.dtype, np.integer) and labels.shape == (200,)
    ens = member_probs.astype(np.float64).mean(0)

    def brier(p):
        return np.mean([sum((p[i, c] - (c == labels[i])) ** 2 for c in range(10)) for i in range(len(labels))])

    def ece(p, bins=15):
        conf, pred = p.max(1), p.argmax(1)
        total = 0.0
        for b in range(bins):
            sel = [i for i in range(len(labels)) if b / bins < conf[i] <= (b + 1) / bins]
            if sel:
                total += len(sel) / len(labels) * abs(np.mean(pred[sel] == labels[sel]) - np.mean(conf[sel]))
        return total

    members = list(zip(report["members"], member_probs.astype(np.float64), strict=True))
    for got, p in [(report["ensemble"], ens), *members]:
        assert got["accuracy"] == pytest.approx(accuracy_score(labels, p.argmax(1)))
        assert got["nll"] == pytest.approx(log_loss(labels, p, labels=range(10)), rel=1e-6)
        assert got["brier"] == pytest.approx(brier(p))
        assert got["ece"] == pytest.approx(ece(p))
    h = scipy.stats.entropy(ens, axis=1)
    assert report["diversity"]["predictive_entropy"] == pytest.approx(h.mean())
    member_h = np.mean([scipy.stats.entropy(p, axis=1) for p in member_probs.astype(np.float64)], axis=0)
    assert report["diversity"]["mutual_information"] == pytest.approx((h - member_h).mean(), abs=1e-9)
    preds = member_probs.argmax(2)
    pairs = [np.mean(preds[i] != preds[j]) for i in range(4) for j in range(i + 1, 4)]
    assert report["diversity"]["disagreement"] == pytest.approx(np.mean(pairs))


def test_report_keys(finished_run):
    _, _, run_dir = finished_run
    r = json.loads((run_dir / "report.json").read_text())
    for key in (
        "run_name",
        "config",
        "backend",
        "devices",
        "mesh",
        "ensemble",
        "members",
        "diversity",
        "timing",
        "checkpoint",
        "data_snapshot",
        "drift",
    ):
        assert key in r
    assert r["data_snapshot"]["splits"] == {"train": 4000, "test": 1000} and r["data_snapshot"]["kind"] == "embedded"
    assert sum(r["data_snapshot"]["class_counts"]["test"]) == 1000
    assert r["run_name"] == "tiny" and r["backend"] == "cpu" and r["devices"] == 8
    assert r["mesh"] == {"ensemble": 4, "data": 1}
    assert r["config"]["ensemble"]["size"] == 4 and len(r["members"]) == 4
    assert set(r["timing"]) >= {
        "compile_seconds",
        "train_seconds",
        "train_member_images_per_s",
        "eval_member_images_per_s",
    }
    assert r["timing"]["train_member_images_per_s"] > 0 and r["checkpoint"]["step"] == 12  # 410 // 64 per epoch
    assert len(r["history"]) == 2 and len(r["history"][0]["train_loss"]) == 4
    assert "| ensemble |" in (run_dir / "report.md").read_text()


def test_artifacts_and_task_runs(finished_run, finished_tag):
    import asyncio

    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, LogFilter, LogFilterFlowRunId

    from tests.prefect_api import own_flow_run_filter

    async def read():
        async with get_client() as client:
            own = own_flow_run_filter(finished_tag)
            arts = await client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[*KEYS, "ensemble-eval-rotation"])),
                flow_run_filter=own,
            )
            runs = await client.read_task_runs(flow_run_filter=own)
            ids = [fr.id for fr in await client.read_flow_runs(flow_run_filter=own)]
            logs = await client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=ids)))
            return arts, runs, logs

    KEYS = ["ensemble-report", "ensemble-members", "ensemble-eval-letters", "ensemble-pool"]  # noqa: N806
    arts, runs, logs = asyncio.run(read())
    # the run's log names the member network and how it is called in each mode
    convention = "member network mlp, flax.linen module MLP: training mode {'train': True}"
    assert any(convention in log.message for log in logs)
    assert {a.key for a in arts} == {*KEYS, "ensemble-eval-rotation"}
    report_md = next(a for a in arts if a.key == "ensemble-report").data
    assert "Ensemble report: tiny" in report_md and "**Rotation**" in report_md and "**OOD: letters**" in report_md
    rotation = json.loads(next(a for a in arts if a.key == "ensemble-eval-rotation").data)
    assert [row["level"] for row in rotation] == list(range(0, 181, 15))
    pool = json.loads(next(a for a in arts if a.key == "ensemble-pool").data)
    assert [row["member"] for row in pool] == [0, 1, 2, 3] and all(row["selected"] == 1 for row in pool)
    assert all(row["learning_rate"] == 0.1 for row in pool)  # no search: the train section's value
    names = {r.name.rsplit("-", 1)[0] for r in runs if r.state and r.state.is_completed()}
    assert {
        "prepare_dataset",
        "train_members",
        "select_members",
        "evaluate_members",
        "publish_report",
    } <= names


def test_stage_times_agree_with_the_task_runs_and_close_the_cli_output(finished_run, finished_tag):
    """``report.json -> timing.stages`` against Prefect's own record of each task run
    (``total_run_time``, read back from the server): each stage timed by the run includes
    its task run, and exceeds it by the task's orchestration only (at most 1.5 s or 10%).
    The CLI's closing lines and the report artifact give the same stages."""
    import asyncio

    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from tests.prefect_api import own_flow_run_filter

    _, stdout, run_dir = finished_run
    t = json.loads((run_dir / "report.json").read_text())["timing"]

    async def read():
        async with get_client() as client:
            own = own_flow_run_filter(finished_tag)
            tasks = await client.read_task_runs(flow_run_filter=own)
            arts = await client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[REPORT])), flow_run_filter=own
            )
            return tasks, arts

    REPORT = "ensemble-report"  # noqa: N806
    tasks, arts = asyncio.run(read())
    flow_run = next(r.flow_run_id for r in tasks if r.name.startswith("train_members"))
    seconds = {
        r.name.rsplit("-", 1)[0]: r.total_run_time.total_seconds()
        for r in tasks
        if r.flow_run_id == flow_run and r.state and r.state.is_completed()
    }
    task_of = {
        "prepare": "prepare_dataset",
        "unchanged_check": "check_unchanged",
        "drift_check": "detect_drift",
        "train": "train_members",
        "select": "select_members",
        "evaluate": "evaluate_members",
        "promote": "compare_with_champion",
    }
    for stage, task in task_of.items():
        outer = t["stages"][stage]["seconds"]
        assert seconds[task] <= outer + 0.05, (stage, seconds[task], outer)
        # the stage's clock also holds Prefect's task-run start and end: a second or two,
        # many more when the machine is loaded (the suite measured 1.5 s exceeded); a
        # stage timed around something else would differ by far more
        assert outer - seconds[task] <= max(10.0, 0.5 * outer), (stage, seconds[task], outer)
    # the report stage stops its clock when report.json is written, inside its task run
    assert t["stages"]["report"]["seconds"] <= seconds["publish_report"] + 0.05
    lines = stdout.strip().splitlines()
    closing = lines[lines.index("time per stage:") + 1 : -1]
    assert [line.split(":")[0] for line in closing[: len(t["stages"])]] == list(t["stages"])
    assert f"train: {t['stages']['train']['seconds']:.1f} s" in closing[list(t["stages"]).index("train")]
    assert "not training steps" in closing[-1] and lines[-1] == str(run_dir)
    report_md = next(a for a in arts if a.key == REPORT and str(run_dir) in (a.data or "")).data
    assert f"- evaluate: {t['stages']['evaluate']['seconds']:.1f} s" in report_md


def test_rerun_same_name_resumes_without_training(finished_run, tfds_dir):
    from flows.train_ensemble import main

    _, _, run_dir = finished_run
    before = (run_dir / "predictions.npz").read_bytes()
    assert main([*_tiny(tfds_dir), "--output-dir", str(run_dir.parent), "--run-name", "tiny"]) == 0
    r = json.loads((run_dir / "report.json").read_text())
    assert r["resumed_from_epoch"] == 2 and r["timing"]["train_seconds"] == 0
    with np.load(run_dir / "predictions.npz") as a:
        import io

        with np.load(io.BytesIO(before)) as b:
            np.testing.assert_array_equal(a["member_probs"], b["member_probs"])


def _bad_yaml(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("train: [1, 2\n")
    return ["--config", str(p)]


def _config_file(tmp_path, content: bytes, name: str):
    p = tmp_path / name
    p.write_bytes(content)
    return ["--config", str(p)]


def _locked(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys,time; from ensemble_core.runs.storage.lock import run_lock\n"
            f"with run_lock({str(tmp_path / 'runs' / 'busy')!r}):\n print('locked', flush=True); time.sleep(60)",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "locked"
    return holder


@pytest.mark.parametrize(
    "case, fragment",
    [
        ("batch_larger_than_split", "train.batch_size=5000 is larger than the 3200 training examples"),
        ("unknown_dataset", "unknown dataset 'no_such_set'"),
        ("catalog_offline", "needs TensorFlow"),
        ("output_not_writable", "cannot create output directory"),
        ("run_name_path", "is not a single directory name"),
        ("non_yaml", "not valid YAML"),
        ("wrong_type", "config key 'ensemble.size'"),
        ("mesh_too_big", "needs 16 devices"),
        ("batch_not_divisible", "does not split over mesh.data=2"),
        ("locked", "is in use by another run"),
        ("incompatible_resume", "was trained with another config (ensemble.size: 4 -> 2)"),
        ("bad_override", "has no '='"),
        ("run_name_too_long", "longer than the 255"),
        ("run_name_newline", "is not a single directory name"),
        ("run_name_space", "is not a single directory name"),
        ("seed_too_big", "config key 'seed'"),
        ("seed_negative", "config key 'seed'"),
        ("learning_rate_inf", "config key 'train.learning_rate'"),
        ("duplicate_section", "twice"),
        ("binary_config", "fix:"),
        ("promotion_path_nowhere", "produces no figure at 'means.ensemble.nll'"),
        ("promotion_path_order", "e.g. letters.ensemble.auroc.entropy"),
    ],
)
def test_cli_refuses_bad_input_before_any_compute(tmp_path, tfds_dir, capsys, finished_run, case, fragment):
    from flows.train_ensemble import main

    base = [*_tiny(tfds_dir), "--output-dir", str(tmp_path / "runs")]
    holder = None
    args = {
        "batch_larger_than_split": ["--set", "train.batch_size=5000", "--set", "data.max_train_examples=null"],
        "unknown_dataset": ["--set", "data.name=no_such_set"],
        "catalog_offline": ["--set", "data.name=cifar10", "--set", f"data.data_dir={tmp_path / 'tfds'}"],
        "output_not_writable": ["--output-dir", str(ROOT / "README.md" / "runs")],
        "run_name_path": ["--run-name", "../escape"],
        "non_yaml": _bad_yaml(tmp_path),
        "wrong_type": ["--set", "ensemble.size=four"],
        "mesh_too_big": ["--set", "mesh.ensemble=16"],
        "batch_not_divisible": ["--set", "mesh.data=2", "--set", "train.batch_size=63"],
        "locked": ["--run-name", "busy"],
        "incompatible_resume": [
            "--output-dir",
            str(finished_run[2].parent),
            "--run-name",
            "tiny",
            "--set",
            "ensemble.size=2",
        ],
        "bad_override": ["--set", "trainepochs"],
        "run_name_too_long": ["--run-name", "r" * 300],
        "run_name_newline": ["--run-name", "a\nb"],
        "run_name_space": ["--run-name", "nightly run"],
        "seed_too_big": ["--set", f"seed={2**32}"],
        "seed_negative": ["--set", "seed=-1"],
        "learning_rate_inf": ["--set", "train.learning_rate=.inf"],
        "duplicate_section": _config_file(tmp_path, b"train:\n  epochs: 1\ntrain:\n  batch_size: 8\n", "dup.yaml"),
        "binary_config": _config_file(tmp_path, bytes(range(256)), "binary.yaml"),
        "promotion_path_nowhere": ["--set", "eval.evaluators=[test,rotation]", "--set", _means],
        "promotion_path_order": ["--set", "eval.evaluators=[test,letters]", "--set", _swapped],
    }[case]
    if case == "catalog_offline":
        import importlib.util

        if importlib.util.find_spec("tensorflow") is not None:
            pytest.skip("TensorFlow installed: this checks the error when it is missing")
    if case == "locked":
        holder = _locked(tmp_path)
    try:
        rc = main([*base, *args])
    finally:
        if holder:
            holder.kill()
            holder.wait()
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err[-1].startswith("error: ") and fragment in err[-1] and "fix" in err[-1]
    assert len(err[-1]) == len(err[-1].strip()) and "Traceback" not in "\n".join(err)
    if case not in ("locked", "incompatible_resume"):
        assert not (tmp_path / "runs").exists()  # not even the output directory was created


def test_dead_prefect_service_crashes_the_run_instead_of_completing(prefect_server):
    """If Prefect's events worker thread dies inside a flow run (its records are lost),
    the run ends Crashed (re-run by the retry-crashed-runs automation), not Completed.
    The worker is killed for real: its client fails to connect, which ends its thread."""
    import time

    from prefect import flow
    from prefect.events.clients import EventsClient
    from prefect.events.worker import EventsWorker

    from flows import prefect_services, run_outcome

    class Unreachable(EventsClient):
        async def __aenter__(self):
            raise RuntimeError("cannot connect")

        async def _emit(self, event):
            pass

    @flow
    def watched() -> str:
        services = prefect_services.PrefectServices()
        time.sleep(1.0)  # the service's thread dies meanwhile
        return services.outcome("done")

    assert watched(return_state=True).result() == "done"  # healthy services: completed
    EventsWorker.drain_all(timeout=10)
    EventsWorker.set_client_override(Unreachable)
    try:
        state = watched(return_state=True)
    finally:
        EventsWorker._client_override = None
        EventsWorker.drain_all(timeout=10)
    assert state.is_crashed(), state
    assert "events worker stopped" in state.message
    assert run_outcome.exit_code(state) == (2, f"error: {state.message}")


def test_predict_cli_with_the_champion_and_a_refusal(finished_run, tfds_dir, tmp_path, capsys):
    """The predict flow's CLI: the champion's ensemble probabilities on an .npy of images
    equal report-time predictions recomputed from predictions.npz; a missing file is one
    line and exit 2."""
    from flows.predict import main

    _, _, run_dir = finished_run
    with np.load(run_dir / "predictions.npz") as f:
        member_probs = f["member_probs"]
    from ensemble_core import data

    images, _ = data.load_split(
        data.EMBEDDED, "test", data.prepare(data.EMBEDDED, tfds_dir).tfds_data_dir, limit=member_probs.shape[1]
    )
    np.save(tmp_path / "images.npy", images)
    out = tmp_path / "pred.npz"
    rc = main(["--images", str(tmp_path / "images.npy"), "--output-dir", str(run_dir.parent), "--output", str(out)])
    assert rc == 0 and capsys.readouterr().out.strip().splitlines()[-1] == str(out)
    with np.load(out) as f:
        np.testing.assert_allclose(f["ensemble_probs"], member_probs.astype(np.float64).mean(0), atol=1e-5)

    rc = main(["--images", str(tmp_path / "missing.npy"), "--output-dir", str(run_dir.parent)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err[-1].startswith("error: images file") and "fix:" in err[-1]

    # Images the model would misread, through the command line: refused, one line each.
    for name, images, fragment in [
        ("empty", np.zeros((0, 28, 28, 1), np.uint8), "the image array is empty"),
        ("scale", np.full((2, 28, 28, 1), 255.0, np.float32), "fix: divide by 255"),
        ("deep", np.full((2, 28, 28, 1), 65535, np.uint16), "images are uint16"),
    ]:
        np.save(tmp_path / f"{name}.npy", images)
        rc = main(["--images", str(tmp_path / f"{name}.npy"), "--output-dir", str(run_dir.parent)])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and err[-1].startswith("error: ") and fragment in err[-1] and "fix:" in err[-1], err[-3:]
        assert not list(run_dir.glob(f"predictions-{name}*"))


def test_flow_parameters_outside_the_config_ranges_fail_with_one_line(prefect_server, tmp_path):
    """A deployment parameter the flow's schema lets through (a seed past 2**32 - 1) fails
    the run at once with the one-line message, as from the command line."""
    from flows.train_ensemble import train_ensemble

    state = train_ensemble(config={"seed": 2**32}, output_dir=str(tmp_path / "runs"), run_name="x", return_state=True)
    assert state.is_failed() and state.message.startswith("error: config key 'seed'") and "fix:" in state.message
    assert not (tmp_path / "runs").exists()


def test_a_deprecated_section_parameter_still_reaches_the_run(prefect_server, tmp_path):
    """The last release's per-section parameter (``data=...``) is still honoured: its
    unknown dataset is refused by the preflight, as inside ``config``."""
    from flows.train_ensemble import train_ensemble

    out = tmp_path / "runs"
    state = train_ensemble(data={"name": "no_such"}, output_dir=str(out), run_name="x", return_state=True)
    assert state.is_failed() and "unknown dataset 'no_such'" in state.message, state.message
    assert not out.exists()


def test_stage_tasks_retry_only_transient_failures(prefect_server):
    """A task with the stages' retry policy, run for real: a deterministic error (a bug, a
    damaged input, XLA out of memory, the project's own errors) runs once; a lost
    connection runs three times (two retries)."""
    import errno

    from prefect import flow, task

    from ensemble_core.errors import DataError
    from tasks import TRANSIENT_RETRIES

    calls = []

    @task(**{**TRANSIENT_RETRIES, "retry_delay_seconds": 0})
    def stage(exc):
        calls.append(type(exc).__name__)
        raise exc

    @flow
    def one(exc):
        return stage(exc, return_state=True)

    cases = [
        (ValueError("bad"), 1),
        (RuntimeError("RESOURCE_EXHAUSTED: out of memory"), 1),
        (DataError("damaged; fix: x"), 1),
        (FileNotFoundError(errno.ENOENT, "missing"), 1),
        (OSError(errno.ENOSPC, "No space left on device"), 1),
        (ConnectionResetError(errno.ECONNRESET, "reset"), 3),
        (TimeoutError("timed out"), 3),
    ]
    for exc, runs in cases:
        calls.clear()
        state = one(exc, return_state=True)
        assert state.is_failed() and len(calls) == runs, (exc, calls)


def _readme_network() -> str:
    """The user's file of the README's "Train your own network" (its first python block):
    an NNX ``Net`` and a Linen ``LinenNet``."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Train your own network") :]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.parametrize(
    "name",
    [
        "Net",  # flax.nnx
        pytest.param("LinenNet", marks=pytest.mark.soak),  # make soak: the Linen class of the same file
    ],
)
def test_a_network_outside_the_repository_through_the_cli_and_predict(
    prefect_server, tfds_dir, tmp_path, monkeypatch, name
):
    """The README's user file in the user's own directory, a class named with its options
    as the README shows (no glue function): trained by the command line, its members'
    probabilities served by flows.predict, equal to the run's predictions."""
    from flows.predict import main as predict_main
    from flows.train_ensemble import main as train_main

    home = tmp_path / "home"
    (home / "my_nets").mkdir(parents=True)
    (home / "my_nets" / "__init__.py").write_text("")
    (home / "my_nets" / "small.py").write_text(_readme_network())
    monkeypatch.chdir(home)  # as a user runs it: from the directory that holds their package
    out = tmp_path / "runs"
    args = ["--config", str(ROOT / "configs" / "tiny.yaml"), "--set", f"data.data_dir={tfds_dir}"]
    args += ["--set", f"model.name=my_nets.small:{name}", "--set", "model.options={width: 6}"]
    assert train_main([*args, "--output-dir", str(out), "--run-name", "mine"]) == 0
    run_dir = out / "mine"
    report = json.loads((run_dir / "report.json").read_text())
    model = {"name": f"my_nets.small:{name}", "options": {"width": 6}, "hidden_sizes": [64]}
    assert report["config"]["model"] == model
    with np.load(run_dir / "predictions.npz") as f:
        want = f["member_probs"]
    from ensemble_core import data

    images, _ = data.load_split(
        data.EMBEDDED, "test", data.prepare(data.EMBEDDED, tfds_dir).tfds_data_dir, limit=want.shape[1]
    )
    np.save(tmp_path / "images.npy", images)
    rc = predict_main(
        ["--images", str(tmp_path / "images.npy"), "--run-dir", str(run_dir), "--output", str(tmp_path / "p.npz")]
    )
    assert rc == 0
    with np.load(tmp_path / "p.npz") as f:
        np.testing.assert_allclose(f["member_probs"], want, atol=1e-5)


def test_a_label_shifted_snapshot_raises_data_drift(prefect_server, tmp_path):
    """Two flow runs on an export in data.manual_dir: the champion's, then a new export
    whose training labels are shifted on purpose (digits 0-4 only): the second run's
    detect_drift task emits data.drift (read back from the server), with the total
    variation recomputed from the files; an unshifted night raises nothing."""
    import time

    import httpx
    from prefect.settings import PREFECT_API_URL

    from ensemble_core import data
    from flows.train_ensemble import train_ensemble
    from tests._idx_export import write_export

    images, labels = data.read_mnist5k_csv()
    train_idx, test_idx = data.mnist5k_split_indices(labels)
    export, out = tmp_path / "export", tmp_path / "runs"
    config = {
        "data": {"name": "mnist", "manual_dir": str(export), "data_dir": str(tmp_path / "tfds")},
        "model": {"name": "mlp", "hidden_sizes": [32]},
        "ensemble": {"size": 2},
        "train": {"epochs": 1, "batch_size": 64},
        "eval": {"evaluators": ["test"]},
        "nightly": {"drift": {"max_examples": 200}},
    }
    nights = {
        "normal": train_idx[:600],
        "shifted": train_idx[600:][labels[train_idx[600:]] < 5][:600],
    }
    run_ids = {}
    for night, idx in nights.items():
        write_export(export, images[idx], labels[idx], images[test_idx[:200]], labels[test_idx[:200]])
        state = train_ensemble(config=config, output_dir=str(out), run_name=night, return_state=True)
        assert state.is_completed(), state.message
        run_ids[night] = f"prefect.flow-run.{state.state_details.flow_run_id}"
    report = json.loads((out / "shifted" / "report.json").read_text())
    p = np.bincount(labels[nights["shifted"]], minlength=10) / 600
    q = np.bincount(labels[nights["normal"]], minlength=10) / 600
    assert report["drift"]["label_shift"]["total_variation"] == pytest.approx(0.5 * np.abs(p - q).sum(), abs=1e-12)
    assert report["drift"]["drifted"] is True

    api = PREFECT_API_URL.value()
    body = {
        "filter": {
            "event": {"name": ["data.drift"]},
            "resource": {"id": ["ensemble-pipeline.data.mnist"]},
            "related": {"id": list(run_ids.values())},  # these two nights' (the server is the session's)
        }
    }
    found = []
    for _ in range(60):  # events are persisted asynchronously
        found = httpx.post(f"{api}/events/filter", json=body, timeout=30).json()["events"]
        if found:
            break
        time.sleep(1)
    assert len(found) == 1, found  # the shifted night only
    assert run_ids["shifted"] in {r["prefect.resource.id"] for r in found[0]["related"]}
    payload = found[0]["payload"]
    assert payload["label_shift"]["total_variation"] == pytest.approx(report["drift"]["label_shift"]["total_variation"])
    assert any("label_shift_threshold" in line for line in payload["exceeded"])


def test_prepare_dataset_cache_follows_the_source_files(prefect_server, tmp_path):
    """The task's cache key holds the snapshot's fingerprint: the same files are Cached,
    replaced files (same config) are prepared again and give the new counts."""
    from ensemble_core.config import DataConfig
    from tasks.prepare_dataset import prepare_dataset
    from tests._idx_export import write_mnist_export

    export = tmp_path / "export"
    cfg = DataConfig(name="mnist", manual_dir=str(export), data_dir=str(tmp_path / "tfds"))
    write_mnist_export(export, 200, 50)
    first = prepare_dataset(cfg, return_state=True)
    again = prepare_dataset(cfg, return_state=True)
    write_mnist_export(export, 300, 50)
    replaced = prepare_dataset(cfg, return_state=True)
    assert (first.name, again.name, replaced.name) == ("Completed", "Cached", "Completed")
    assert (first.result().num_train, again.result().num_train, replaced.result().num_train) == (200, 200, 300)
    assert replaced.result().snapshot.fingerprint != first.result().snapshot.fingerprint
    # a cached snapshot removed since (retention) is prepared again, not handed on
    import shutil

    from tasks.prepare_dataset import prepare_stage

    shutil.rmtree(replaced.result().tfds_data_dir)
    again = prepare_stage(cfg)
    assert again.num_train == 300 and Path(again.data_dir).is_dir()


def _predict_inputs(tmp_path: Path, run_dir: Path) -> dict:
    """Bad inputs of the prediction command line, each a list of its flags."""
    images = tmp_path / "images"
    images.mkdir(exist_ok=True)

    def npy(name, array):
        path = images / f"{name}.npy"
        np.save(path, array, allow_pickle=True)
        return str(path)

    text = images / "notes.npy"
    text.write_text("these are not images\n")
    empty_run = tmp_path / "empty-run"
    empty_run.mkdir(exist_ok=True)
    (tmp_path / "damaged").mkdir(exist_ok=True)
    (tmp_path / "damaged" / "champion.json").write_bytes(b"\x00garbage")
    ok = npy("ok", np.zeros((2, 28, 28, 1), np.uint8))
    run = ["--run-dir", str(run_dir)]
    return {
        "nan-images": ([*run, "--images", npy("nan", np.full((2, 28, 28, 1), np.nan, np.float32))], "NaN"),
        "one-image-no-batch-axis": ([*run, "--images", npy("one", np.zeros((28, 28, 1), np.uint8))], "batch axis"),
        "three-channels": ([*run, "--images", npy("rgb", np.zeros((2, 28, 28, 3), np.uint8))], "[N, 28, 28, 1]"),
        "wrong-size": ([*run, "--images", npy("big", np.zeros((2, 32, 32, 1), np.uint8))], "[N, 28, 28, 1]"),
        "pickled-objects": ([*run, "--images", npy("obj", np.array([{"a": 1}], dtype=object))], "Python objects"),
        "text-renamed-npy": ([*run, "--images", str(text)], "not a .npy file"),
        "missing-file": ([*run, "--images", str(images / "nope.npy")], "does not exist"),
        "run-without-checkpoints": (["--run-dir", str(empty_run), "--images", ok], "has no checkpoint"),
        "output-not-writable": ([*run, "--images", ok, "--output", str(ROOT / "README.md" / "p.npz")], "--output"),
        "damaged-champion": (
            ["--output-dir", str(tmp_path / "damaged"), "--images", ok],
            "champion pointer champion.json in",
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "nan-images",
        "one-image-no-batch-axis",
        "three-channels",
        "wrong-size",
        "pickled-objects",
        "text-renamed-npy",
        "missing-file",
        "run-without-checkpoints",
        "output-not-writable",
        "damaged-champion",
    ],
)
def test_predict_refusals_are_one_line_before_prefect_starts(finished_run, tmp_path, capsys, case):
    """Every refusal of the prediction command line: exit 2, one `error: ...; fix: ...` line
    on stderr, no traceback anywhere, nothing written."""
    from flows.predict import main

    args, fragment = _predict_inputs(tmp_path, finished_run[2])[case]
    before = sorted(p.name for p in finished_run[2].iterdir())
    rc = main(args)
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    assert rc == 2 and len(errors) == 1 and fragment in errors[0] and "fix:" in errors[0], (rc, err)
    assert "Traceback" not in out + err
    assert all(line.startswith(("error: ", "warning")) or "set aside" in line for line in lines), lines
    assert sorted(p.name for p in finished_run[2].iterdir()) == before


def test_a_refusal_inside_a_task_is_logged_without_its_traceback(prefect_server, finished_run, tmp_path, caplog):
    """Under Prefect (a deployment's run), a task that refuses its input logs one line, not
    Prefect's task-run traceback; the flow ends Failed with the one-line message."""
    import logging

    from flows.predict import predict

    text = tmp_path / "notes.npy"
    text.write_text("these are not images\n")
    with caplog.at_level(logging.INFO):
        state = predict(images_npy=str(text), run_dir=str(finished_run[2]), return_state=True)
    assert state.is_failed() and state.message.startswith("error: ") and "not a .npy file" in state.message
    refused = [r for r in caplog.records if r.name == "prefect.task_runs" and r.levelno >= logging.ERROR]
    assert refused and all(r.exc_info is None for r in refused)
    assert "Traceback" not in caplog.text


HYPER_DEEP = [
    "data.validation_fraction=0.25",
    "ensemble.search={learning_rate: {distribution: log_uniform, low: 0.02, high: 0.3}}",
    "ensemble.select_size=2",
    "ensemble.first_selection={replacement: false}",
    "ensemble.stratify=2",
    "eval.evaluators=[test]",
]


# make soak: two member groups (make test: one; groups' own task runs in test_groups.py)
@pytest.mark.parametrize("groups", [1, pytest.param(2, marks=pytest.mark.soak)])
def test_a_hyper_deep_ensemble_through_the_cli_stratifies_in_task_runs_and_predicts(
    prefect_server, tfds_dir, tmp_path, groups
):
    """The stratification stage as Prefect shows it: the first selection and the stratified
    pool in task runs of their own (one per member group with groups), the stratified
    pool's artifact, and flows.predict serving the final selection's rows."""
    import asyncio

    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.predict import main as predict_main
    from flows.train_ensemble import main as train_main
    from tests.prefect_api import own_flow_run_filter, own_runs

    out = tmp_path / "runs"
    sets = [x for s in [*HYPER_DEEP, f"distributed.member_groups={groups}"] for x in ("--set", s)]
    with own_runs() as tag:
        assert train_main([*_tiny(tfds_dir), *sets, "--output-dir", str(out), "--run-name", "hd"]) == 0
    run_dir = out / "hd"
    report = json.loads((run_dir / "report.json").read_text())
    strat = report["stratification"]
    assert len(strat["settings"]) == 2 and len(strat["pool"]) == 4

    async def read():
        async with get_client() as client:
            own = own_flow_run_filter(tag)
            tasks = await client.read_task_runs(flow_run_filter=own)
            arts = await client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["ensemble-stratified-pool"])),
                flow_run_filter=own,
            )
            return tasks, arts

    tasks, arts = asyncio.run(read())
    done = [r.name.rsplit("-", 1)[0] for r in tasks if r.state and r.state.is_completed()]
    assert "select_settings" in done
    if groups == 1:
        assert "stratify_members" in done
    else:  # the search pool's groups and the stratified pool's, each a task run
        assert sum(1 for r in tasks if r.name.startswith("train_member_group") and r.state.is_completed()) >= 4
    table = json.loads(max(arts, key=lambda a: a.created).data)
    assert [(row["setting"], row["init"]) for row in table] == [(s, j) for s in strat["settings"] for j in (0, 1)]
    selection = json.loads((run_dir / "selection.json").read_text())
    with np.load(run_dir / "predictions.npz") as f:
        want = f["member_probs"]
    from ensemble_core import data

    images, _ = data.load_split(
        data.EMBEDDED, "test", data.prepare(data.EMBEDDED, tfds_dir).tfds_data_dir, limit=want.shape[1]
    )
    np.save(tmp_path / "images.npy", images)
    args = ["--images", str(tmp_path / "images.npy"), "--run-dir", str(run_dir), "--output", str(tmp_path / "p.npz")]
    assert predict_main(args) == 0
    with np.load(tmp_path / "p.npz") as f:
        assert f["members"].tolist() == selection["members"]
        np.testing.assert_allclose(f["member_probs"], want, atol=1e-5)
