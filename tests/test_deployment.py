"""Integration: a real Prefect server, work pool, deployments from prefect.yaml and a
worker (scripts/serve.sh), driven by `prefect deployment run --watch`, checked through
the Prefect API, then stopped (scripts/stop.sh)."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stack")
    port = _free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")},
        "PREFECT_HOME": str(tmp / "prefect-home"),
        "PREFECT_PORT": str(port),
        "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_WORKER_QUERY_SECONDS": "2",
        "ENSEMBLE_SERVE_DIR": str(tmp / "serve"),
        "ENSEMBLE_VENV": str(Path(sys.executable).parent.parent),
        "JAX_COMPILATION_CACHE_DIR": str(tmp / "jax-cache"),
    }
    env.pop("XLA_FLAGS", None)  # the flows choose their own device layout
    try:
        subprocess.run(["scripts/serve.sh"], cwd=ROOT, env=env, check=True, timeout=300, capture_output=True)
        yield tmp, env
    finally:
        subprocess.run(["scripts/stop.sh"], cwd=ROOT, env=env, timeout=120)


def _params(tmp, **train):
    return {
        "data": {"data_dir": str(tmp / "tfds"), "max_train_examples": 512, "max_test_examples": 200},
        "model": {"name": "mlp", "hidden_sizes": [64]},
        "ensemble": {"size": 4},
        "train": {"epochs": 2, "batch_size": 64, **train},
        "output_dir": str(tmp / "runs"),
    }


def _run(env, params):
    proc = subprocess.run(
        [
            str(Path(env["ENSEMBLE_VENV"]) / "bin" / "prefect"),
            "deployment",
            "run",
            "train-ensemble/adhoc",
            "--params",
            json.dumps(params),
            "--watch",
            "--watch-timeout",
            "400",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=450,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


def _api(env, method, path, body=None):
    r = httpx.request(method, env["PREFECT_API_URL"] + path, json=body, timeout=30)
    r.raise_for_status()
    return r.json()


@pytest.fixture(scope="module")
def two_runs(stack):
    tmp, env = stack
    _run(env, _params(tmp))
    _run(env, _params(tmp, learning_rate=1e-4, epochs=1))  # clearly worse: must be rejected
    flow_runs = _api(env, "POST", "/flow_runs/filter", {"sort": "START_TIME_ASC"})
    return tmp, env, flow_runs


def test_both_runs_completed_with_every_task(two_runs):
    tmp, env, flow_runs = two_runs
    assert [fr["state_type"] for fr in flow_runs] == ["COMPLETED", "COMPLETED"]
    for fr in flow_runs:
        tasks = _api(env, "POST", "/task_runs/filter", {"flow_runs": {"id": {"any_": [fr["id"]]}}})
        names = {t["name"].rsplit("-", 1)[0] for t in tasks if t["state_type"] == "COMPLETED"}
        assert names >= {
            "prepare_dataset",
            "split_rngs",
            "train_ensemble",
            "evaluate",
            "compare_with_champion",
            "report",
        }


def test_second_run_used_the_cached_dataset(two_runs):
    _, env, flow_runs = two_runs
    states = []
    for fr in flow_runs:
        tasks = _api(env, "POST", "/task_runs/filter", {"flow_runs": {"id": {"any_": [fr["id"]]}}})
        states.append(next(t["state"]["name"] for t in tasks if t["name"].startswith("prepare_dataset")))
    assert states == ["Completed", "Cached"]


def test_artifacts_exist(two_runs):
    _, env, _ = two_runs
    keys = {a["key"] for a in _api(env, "POST", "/artifacts/filter", {}) if a.get("key")}
    assert {"ensemble-report", "ensemble-members", "ensemble-run-history", "training-progress"} <= keys
    history = _api(
        env,
        "POST",
        "/artifacts/filter",
        {"artifacts": {"key": {"any_": ["ensemble-run-history"]}}, "sort": "CREATED_DESC", "limit": 1},
    )[0]
    rows = json.loads(history["data"]) if isinstance(history["data"], str) else history["data"]
    assert [r["promoted"] for r in rows] == [True, False]


def test_nightly_deployment_schedule_and_limit(two_runs):
    _, env, _ = two_runs
    deps = {d["name"] + "@" + d["entrypoint"]: d for d in _api(env, "POST", "/deployments/filter", {})}
    nightly = deps["nightly@flows/train_ensemble.py:train_ensemble"]
    (schedule,) = nightly["schedules"]
    assert schedule["schedule"]["cron"] == "0 2 * * *" and schedule["schedule"]["timezone"] == "UTC"
    assert nightly["global_concurrency_limit"]["limit"] == 1
    assert "adhoc@flows/predict.py:predict" in deps
    assert deps["adhoc@flows/train_ensemble.py:train_ensemble"]["schedules"] == []
    props = nightly["parameter_openapi_schema"]["properties"]
    assert {"seed", "data", "model", "ensemble", "train", "mesh", "checkpoint", "eval", "promotion"} <= set(props)


def test_promotion_kept_the_better_champion(two_runs):
    tmp, env, flow_runs = two_runs
    runs = tmp / "runs"
    champion = json.loads((runs / "champion.json").read_text())
    first, second = (next(d for d in runs.iterdir() if d.is_dir() and d.name.endswith(fr["name"])) for fr in flow_runs)
    assert champion["run_name"] == first.name
    rep1 = json.loads((first / "report.json").read_text())
    rep2 = json.loads((second / "report.json").read_text())
    assert rep1["promotion"]["promoted"] is True and rep1["promotion"]["champion"] is None
    assert rep2["promotion"]["promoted"] is False
    assert rep2["promotion"]["champion"] == pytest.approx(rep1["ensemble"])
    assert rep2["ensemble"]["nll"] > rep1["ensemble"]["nll"]
    events = _api(env, "POST", "/events/filter", {"filter": {"event": {"prefix": ["ensemble."]}}})["events"]
    assert sorted(e["event"] for e in events) == ["ensemble.promoted", "ensemble.rejected"]
