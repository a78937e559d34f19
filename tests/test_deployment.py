"""Integration: a real Prefect server, work pool, deployments from prefect.yaml, the
retry automation, the reconciler and a worker (scripts/serve.sh), driven by `prefect
deployment run --watch` and by the scheduler, checked through the Prefect API, then stopped
(scripts/stop.sh). The infrastructure faults are in tests/test_deployment_faults.py.

Every flow-run process of the stack carries tests/lazy_import_probe (it records the
threads alive whenever TFDS swaps ``builtins.__import__``, and widens that window); a
busy-loop process keeps a CPU core busy during the first two runs where the machine is not
busy already, as on a shared machine.
"""

import json
import os
import subprocess
import sys
import time

import pytest

from ensemble_core.processutil import free_port
from tests.deployment_records import assert_complete_records, events, flow_run, run_name, task_runs, wait_final
from tests.prefect_stack import (
    ROOT,
    api,
    deployment_run,
    engine_pids,
    run_id_of,
    small_params,
    wait_until,
)

pytestmark = pytest.mark.slow  # a real Prefect stack: server, worker, scheduler


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    from tests.prefect_stack import stack

    tmp = tmp_path_factory.mktemp("stack")
    probe = {
        "PYTHONPATH": str(ROOT / "tests" / "lazy_import_probe"),
        "ENSEMBLE_LAZY_IMPORT_PROBE": str(tmp / "lazy-imports.jsonl"),
        "ENSEMBLE_LAZY_IMPORT_WIDEN": "1",
    }
    with stack(tmp, **probe) as env:
        yield tmp, env


# MARK: two runs by `prefect deployment run`, under CPU load


@pytest.fixture(scope="module")
def two_runs(stack):
    """Two runs on a machine whose cores are all busy (the events worker died under such
    contention). Under ``make test`` the other pytest-xdist workers keep them so (and
    ``benchmarks.suite`` holds a core busy besides): a busy-loop process is started only
    where the machine is idler than that (a load average below its core count, as when
    this module runs alone); two more would only take CPU from the rest of the suite."""
    tmp, env = stack
    idle = os.getloadavg()[0] < (os.cpu_count() or 1)
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if idle else None
    try:
        first = deployment_run(env, small_params(tmp))
        assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
        second = deployment_run(env, small_params(tmp, learning_rate=1e-4, epochs=1))  # clearly worse: rejected
        assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    finally:
        if burner is not None:
            burner.kill()
    runs = [flow_run(env, run_id_of(p)) for p in (first, second)]
    return tmp, env, runs


def test_both_runs_completed_with_every_record(two_runs):
    """Both deployment runs end COMPLETED with every record (task runs, artifacts, logs).

    Why not shorter (its fixture, 2-3 min under load: the stack on PostgreSQL and two
    runs by `prefect deployment run`, each a new flow-run process under a busy core)."""
    _, env, flow_runs = two_runs
    for fr in flow_runs:
        assert_complete_records(env, fr)


def test_flow_run_processes_exit(two_runs):
    """No flow-run process of the stack is left once the runs are final.

    Why not shorter (its fixture, 2-3 min under load: the stack on PostgreSQL and two
    runs by `prefect deployment run`, each a new flow-run process under a busy core)."""
    _, env, _ = two_runs
    wait_until(lambda: not engine_pids(env), 30, "flow-run processes to exit")


def test_tfds_imported_before_prefect_threads(two_runs):
    """Regression: TFDS's import-machinery swap happened inside a task run, with Prefect's
    events worker alive, which killed it. In every flow-run process it must happen before
    any other Python thread exists (the probe widens each window by 1 s)."""
    tmp, _, _ = two_runs
    windows = [json.loads(line) for line in (tmp / "lazy-imports.jsonl").read_text().splitlines()]
    assert len({w["pid"] for w in windows}) >= 2  # the probe saw the flow-run processes
    assert [w for w in windows if w["other_threads"]] == []


def test_second_run_used_the_cached_dataset(two_runs):
    _, env, flow_runs = two_runs
    states = []
    for fr in flow_runs:
        tasks = task_runs(env, fr["id"])
        states.append(next(t["state"]["name"] for t in tasks if t["name"].startswith("prepare_dataset")))
    assert states == ["Completed", "Cached"]


def test_promotion_kept_the_better_champion(two_runs):
    tmp, env, flow_runs = two_runs
    runs = tmp / "runs"
    champion = json.loads((runs / "champion.json").read_text())
    first, second = (runs / run_name(fr) for fr in flow_runs)
    assert champion["run_name"] == first.name
    rep1 = json.loads((first / "report.json").read_text())
    rep2 = json.loads((second / "report.json").read_text())
    assert rep1["promotion"]["promoted"] is True and rep1["promotion"]["champion"] is None
    assert rep2["promotion"]["promoted"] is False
    assert rep2["promotion"]["champion"] == pytest.approx(rep1["ensemble"])
    assert rep2["ensemble"]["nll"] > rep1["ensemble"]["nll"]
    assert [e["event"] for e in events(env, "ensemble.", second.name)] == ["ensemble.rejected"]


def test_deployments_and_automations(two_runs):
    _, env, _ = two_runs
    deps = {d["name"] + "@" + d["entrypoint"]: d for d in api(env, "POST", "/deployments/filter", {})}
    nightly = deps["nightly@flows/train_ensemble.py:train_ensemble"]
    (schedule,) = nightly["schedules"]
    assert schedule["schedule"]["cron"] == "0 2 * * *" and schedule["schedule"]["timezone"] == "UTC"
    assert nightly["global_concurrency_limit"]["limit"] == 1
    assert "adhoc@flows/predict.py:predict" in deps
    assert deps["folder@flows/predict.py:predict"]["parameters"]["output_dir"] == "runs"  # batch inference
    assert deps["drop@flows/monitor.py:monitor"]["parameters"]["estimator"] == "auto"  # monitoring
    props = nightly["parameter_openapi_schema"]["properties"]
    assert {"seed", "data", "model", "ensemble", "train", "mesh", "checkpoint", "eval", "promotion"} <= set(props)
    names = sorted(a["name"] for a in api(env, "POST", "/automations/filter", {}))
    assert names == ["retrain-on-drift", "retry-crashed-runs"]


# MARK: the scheduler


def _scheduled_night(env, dep_id: str, params: dict) -> dict:
    """One night: a schedule whose first run is due in seconds (the next an hour later) is
    given to the deployment; the scheduler creates the run and the worker executes it;
    the schedule is deleted once the run has ended (and with it the runs not started)."""
    import datetime as dt

    anchor = (dt.datetime.now(dt.UTC) - dt.timedelta(seconds=3590)).isoformat()
    schedule = {"interval": 3600, "anchor_date": anchor, "timezone": "UTC"}
    api(env, "POST", f"/deployments/{dep_id}/schedules", [{"schedule": schedule, "active": True, "parameters": params}])

    def started():
        runs = api(env, "POST", "/flow_runs/filter", {"deployments": {"id": {"any_": [dep_id]}}})
        running = [r for r in runs if r["state_type"] not in ("SCHEDULED", "PENDING")]
        return [r for r in running if r["id"] not in _scheduled_night.seen]

    try:
        (fr,) = wait_until(started, 240, "the scheduled night's run to start", every=1)
        _scheduled_night.seen.add(fr["id"])
        fr = wait_final(env, fr["id"])
    finally:  # deleting the schedule also deletes its runs that have not started
        for s in api(env, "GET", f"/deployments/{dep_id}")["schedules"]:
            api(env, "DELETE", f"/deployments/{dep_id}/schedules/{s['id']}")
    assert fr["auto_scheduled"], fr  # created by the scheduler, not by hand
    return fr


_scheduled_night.seen = set()  # type: ignore[attr-defined]


def test_batch_inference_deployment_predicts_a_folder_with_the_champion(two_runs):
    """`prefect deployment run 'predict/folder'` on a folder of PNGs: the champion predicts
    every image, and the server holds the table artifact (one row per image, up to 20) and
    the summary, read back through the API; the table file on disk has every image."""
    import numpy as np
    import pandas as pd

    from tests._image_export import write_digit_folder

    tmp, env, _ = two_runs
    folder = tmp / "incoming"
    count = write_digit_folder(folder, n_train=0, n_test=25)
    out = tmp / "incoming-predictions.npz"
    params = {"images": str(folder), "output_dir": str(tmp / "runs"), "output": str(out)}
    proc = deployment_run(env, params, deployment="predict/folder")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    fr = flow_run(env, run_id_of(proc))
    assert fr["state"]["type"] == "COMPLETED"
    arts = {a["key"]: a for a in api(env, "POST", "/artifacts/filter", {"flow_runs": {"id": {"any_": [fr["id"]]}}})}
    assert {"predictions", "predictions-summary"} <= set(arts)
    rows = arts["predictions"]["data"]
    rows = json.loads(rows) if isinstance(rows, str) else rows
    assert len(rows) == min(20, count) and all(r["input"].endswith(".png") for r in rows)
    table = pd.read_csv(out.with_suffix(".csv"))
    assert len(table) == count
    with np.load(out) as f:
        names = f["predicted_name"]
    assert list(table["predicted_name"].astype(str)) == [str(n) for n in names]
    assert {r["predicted_name"] for r in rows} <= set(np.asarray(names).tolist())


def _noisy_copy(src, dst, sigma: float, seed: int = 0) -> None:
    """Every PNG under ``src`` with Gaussian pixel noise (``sigma`` grey levels), same names, under ``dst``."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    for path in sorted(src.rglob("*.png")):
        pixels = np.asarray(Image.open(path), np.float32)
        noisy = np.clip(pixels + rng.normal(0, sigma, pixels.shape), 0, 255).astype(np.uint8)
        out = dst / path.relative_to(src)
        out.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(noisy).save(out)


def test_monitor_deployment_quiet_on_clean_data_and_drift_retrains(two_runs):
    """`prefect deployment run 'monitor/drop'` twice on unlabelled folders, with the
    champion of the first two runs: 200 of the embedded test digits (class folders, not
    read as labels), then the same digits under heavy noise. The clean night is quiet; the
    noisy one rejects, its ``data.drift`` event (labelled as the monitor's) reaches the
    ``retrain-on-drift`` automation, which starts a ``train-ensemble/nightly`` run in the
    champion's output directory with the champion's config, and that run completes. Both
    nights are in the ``monitoring-history`` artifact read back from the server."""
    from tests._image_export import write_digit_folder

    tmp, env, _ = two_runs
    out = tmp / "runs"
    clean, noisy = tmp / "drop-clean", tmp / "drop-noisy"
    write_digit_folder(clean, n_train=0, n_test=200)
    _noisy_copy(clean, noisy, sigma=110.0)
    nightly = api(env, "GET", "/deployments/name/train-ensemble/nightly")
    of_nightly = {"deployments": {"id": {"any_": [nightly["id"]]}}}
    before = {r["id"] for r in api(env, "POST", "/flow_runs/filter", of_nightly)}
    records = {}
    for name, folder in (("clean", clean), ("noisy", noisy)):
        params = {"images": str(folder), "output_dir": str(out), "night": f"night-{name}"}
        proc = deployment_run(env, params, deployment="monitor/drop")
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        fr = flow_run(env, run_id_of(proc))
        assert fr["state"]["type"] == "COMPLETED", fr["state"]
        records[name] = (fr, json.loads((out / "monitoring" / f"night-{name}.json").read_text()))
    clean_record, noisy_record = records["clean"][1], records["noisy"][1]
    assert clean_record["n_images"] == noisy_record["n_images"] == 200
    assert not clean_record["drifted"] and noisy_record["drifted"], (clean_record["drift"], noisy_record["drift"])
    assert noisy_record["accuracy"]["estimate"] < clean_record["accuracy"]["estimate"]
    arts = {
        a["key"]: a
        for a in api(env, "POST", "/artifacts/filter", {"flow_runs": {"id": {"any_": [records["noisy"][0]["id"]]}}})
    }
    assert {"monitoring-night", "monitoring-history"} <= set(arts)
    rows = arts["monitoring-history"]["data"]
    rows = json.loads(rows) if isinstance(rows, str) else rows
    assert [(r["night"], r["drifted"]) for r in rows] == [("night-clean", False), ("night-noisy", True)]
    drift_events = api(env, "POST", "/events/filter", {"filter": {"event": {"name": ["data.drift"]}, "related": None}})[
        "events"
    ]
    mine = [e for e in drift_events if e["resource"].get("ensemble-pipeline.source") == "monitor"]
    assert [e["payload"]["night"] for e in mine] == ["night-noisy"]

    def retraining():
        return [r for r in api(env, "POST", "/flow_runs/filter", of_nightly) if r["id"] not in before]

    (retrain,) = wait_until(retraining, 120, "the automation's train-ensemble run", every=2)
    _scheduled_night.seen.add(retrain["id"])  # a run of the nightly deployment, not one of the scheduler's nights
    retrain = wait_final(env, retrain["id"])
    assert retrain["state_type"] == "COMPLETED", retrain["state"]
    assert retrain["parameters"]["output_dir"] == str(out)
    champion_config = json.loads((out / "champion.json").read_text())["config"]
    assert retrain["parameters"]["config"]["model"] == champion_config["model"]


def test_three_nights_replayed_by_the_scheduler(two_runs):
    """The nightly deployment replayed by the real scheduler over three nights of a user's
    image folder (data.source=image_folder: <path>/train/<digit>/<index>.png, 300 test
    PNGs in <path>/test): night 1 on 1,500 training PNGs, night 2 on all 3,000 (files
    added to the same folder: a new snapshot, trained, the champion compared on the new
    test split), night 3 on the unchanged folder (skipped with nightly.when_unchanged=skip;
    trained with train).

    Why not shorter (2-3 min): four runs created by the real scheduler (its loop is 5 s
    here), each a new flow-run process; the nights are the behaviour."""
    from tests._image_export import write_digit_folder

    tmp, env, _ = two_runs
    dep = api(env, "GET", "/deployments/name/train-ensemble/nightly")
    assert dep["parameters"]["config"]["nightly"]["when_unchanged"] == "skip"  # what prefect.yaml ships
    for s in dep["schedules"]:
        api(env, "DELETE", f"/deployments/{dep['id']}/schedules/{s['id']}")
    folder, out = tmp / "digits", tmp / "nightly-runs"  # data.name: the folder's name, 'digits'
    params = small_params(tmp, out=out.name)
    params["config"]["data"] = {"source": "image_folder", "path": str(folder), "data_dir": str(tmp / "tfds")}
    params["config"]["nightly"] = {"when_unchanged": "skip"}

    files1 = write_digit_folder(folder, 1500, 300)
    night1 = _scheduled_night(env, dep["id"], params)
    files2 = write_digit_folder(folder, 3000, 300)  # 1,500 PNGs added beside the first
    night2 = _scheduled_night(env, dep["id"], params)
    dirs = [assert_complete_records(env, fr) for fr in (night1, night2)]
    night3 = _scheduled_night(env, dep["id"], params)
    rep1, rep2 = (json.loads((d / "report.json").read_text()) for d in dirs)
    snap1, snap2 = rep1["data_snapshot"], rep2["data_snapshot"]
    assert (snap1["splits"]["train"], snap2["splits"]["train"]) == (1500, 3000)
    assert snap1["splits"]["test"] == snap2["splits"]["test"] == 300  # the folder's own test/: nothing carved
    assert sum(snap2["class_counts"]["train"]) == 3000 and snap1["fingerprint"] != snap2["fingerprint"]
    for snap, files in ((snap1, files1), (snap2, files2)):
        assert snap["kind"] == "image_folder" and snap["name"] == "digits"
        assert snap["class_names"] == [str(d) for d in range(10)]
        assert snap["file_count"] == files and snap["source_path"] == str(folder)
    promo = rep2["promotion"]
    assert (promo["champion_snapshot"], promo["challenger_snapshot"]) == (snap1["fingerprint"], snap2["fingerprint"])
    assert "different data snapshots" in promo["reason"]
    assert rep2["drift"]["champion_run"] == dirs[0].name and rep2["drift"]["label_shift"] is not None

    # night 3: nothing new, nothing trained; one line, an event and an artifact say so
    assert night3["state_type"] == "COMPLETED"
    assert sorted(d.name for d in out.iterdir() if d.is_dir()) == sorted(d.name for d in dirs)
    assert not any(d.name.endswith(night3["name"]) for d in out.iterdir())
    champion = json.loads((out / "champion.json").read_text())
    body = {"filter": {"event": {"name": ["ensemble.skipped"]}, "resource": {"id": ["ensemble-pipeline.data.digits"]}}}
    skipped = wait_until(lambda: api(env, "POST", "/events/filter", body)["events"], 90, "ensemble.skipped")
    assert len(skipped) == 1 and skipped[0]["payload"]["fingerprint"] == snap2["fingerprint"]
    assert skipped[0]["payload"]["champion_run"] == champion["run_name"] == dirs[1].name
    keys = {a["key"] for a in api(env, "POST", "/artifacts/filter", {"flow_runs": {"id": {"any_": [night3["id"]]}}})}
    assert "ensemble-skipped" in keys
    trained = {t["name"].rsplit("-", 1)[0] for t in task_runs(env, night3["id"])}
    assert "train_members" not in trained and "check_unchanged" in trained

    # the same night with when_unchanged=train trains again, on the same snapshot
    params["config"]["nightly"] = {"when_unchanged": "train"}
    night3_train = _scheduled_night(env, dep["id"], params)
    rep3 = json.loads((assert_complete_records(env, night3_train) / "report.json").read_text())
    assert rep3["data_snapshot"]["fingerprint"] == snap2["fingerprint"]
    assert rep3["data_snapshot"]["path"] == snap2["path"]  # the prepared snapshot reused, not prepared again


# MARK: bad parameters

BAD = {
    "unknown-dataset": ({"data": {"name": "no_such"}}, "unknown dataset 'no_such'"),
    "batch-larger-than-split": ({"train": {"epochs": 1, "batch_size": 100000}}, "batch_size"),
    "mesh-does-not-fit": ({"mesh": {"data": 16}}, "devices"),
    "run-dir-in-use": ("locked", "in use"),
    # Refused by Prefect's parameter-schema check before the run, with no fix, until the
    # deployments left validation to the flow (prefect.yaml: enforce_parameter_schema: false).
    "unknown-key": ({"train": {"lr": 0.1}}, "unknown config key 'train.lr'"),
}


@pytest.fixture(scope="module")
def bad_runs(two_runs):
    """Every BAD case submitted at once through `deployment-run.sh --watch` (the worker runs
    them side by side); per case: the completed process, its output dir and its contents
    before the run (the locked case holds the run directory's lock from this process)."""
    from concurrent.futures import ThreadPoolExecutor

    from ensemble_core.runs.storage.lock import run_lock

    tmp, env, _ = two_runs
    cases = {}
    for case, (change, _) in BAD.items():
        out = tmp / f"bad-{case}"
        out.mkdir()
        params = small_params(tmp, out=out.name)
        extra = []
        if change == "locked":
            (out / "busy").mkdir()
            extra = ["--param", "run_name=busy"]
        else:
            for section, values in change.items():
                params["config"][section] = {**params["config"].get(section, {}), **values}
        cases[case] = (out, params, extra)
    with run_lock(tmp / "bad-run-dir-in-use" / "busy"), ThreadPoolExecutor(len(cases)) as pool:
        before = {case: sorted(p.relative_to(out) for p in out.rglob("*")) for case, (out, _, _) in cases.items()}
        started = time.monotonic()
        futures = {case: pool.submit(deployment_run, env, params, *extra) for case, (_, params, extra) in cases.items()}
        results = {case: (f.result(), time.monotonic() - started) for case, f in futures.items()}
    return env, {case: (*results[case], cases[case][0], before[case]) for case in cases}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_parameters_fail_at_once_with_one_line(bad_runs, case):
    """Bad parameters (what the schema cannot refuse, and an unknown key) fail on the first attempt (no retry), with the
    CLI's `error: ...; fix: ...` line in --watch's output and as the state message, and
    nothing written under the output dir.

    Why not shorter (its fixture, about a minute under load for the first case: the four
    runs start side by side, each a flow-run process importing JAX before it refuses)."""
    env, results = bad_runs
    proc, elapsed, out, before = results[case]
    expected = BAD[case][1]
    assert proc.returncode == 1, proc.stdout[-3000:]
    lines = [line for line in proc.stdout.splitlines() if "error: " in line and "fix:" in line]
    assert lines and expected in lines[0], proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout
    fr = flow_run(env, run_id_of(proc))
    assert fr["state_type"] == "FAILED" and fr["run_count"] == 1
    assert fr["state"]["message"].startswith("error: ") and expected in fr["state"]["message"]
    assert elapsed < 150  # no retry delay: all four ran side by side, each failing at once
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before


def test_server_unreachable_is_one_line(tmp_path):
    """The deployment-run wrapper and the CLI refuse at once when the server is down."""
    env = {**os.environ, "PREFECT_API_URL": f"http://127.0.0.1:{free_port()}/api", "PREFECT_HOME": str(tmp_path)}
    for cmd in (
        ["scripts/deployment-run.sh", "train-ensemble/adhoc"],
        [sys.executable, "-m", "flows.train_ensemble", "--output-dir", str(tmp_path / "runs")],
    ):
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: the Prefect server at ") and "fix:" in lines[0]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
