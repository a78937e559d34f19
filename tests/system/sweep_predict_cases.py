"""Sweep cases of the prediction command line and of ``prefect deployment run``."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import numpy as np

from ensemble_core.processutil import free_port
from tests.system.sweep import Ctx, case_table, garbage, nothing_under

PR, D = "predict CLI", "deployment run"
CASES, case = case_table()
RNG = np.random.default_rng(0)
GOOD = RNG.integers(0, 256, (16, 28, 28, 1), dtype=np.uint8)


def _nan() -> np.ndarray:
    x = GOOD.astype(np.float32) / 255
    x[3, 4, 5, 0] = np.nan
    return x


IMAGES = {
    "images-nan": (_nan, "float images with one NaN pixel"),
    "images-0-255-float": (lambda: GOOD.astype(np.float32), "float images in 0..255 instead of 0..1"),
    "images-rgb": (lambda: np.zeros((4, 28, 28, 3), np.uint8), "3 channels for a grey model"),
    "images-no-batch-axis": (lambda: GOOD[0], "one image [28, 28, 1] without its batch axis"),
    "images-empty": (lambda: np.zeros((0, 28, 28, 1), np.uint8), "an empty array"),
    "images-uint16": (lambda: GOOD.astype(np.uint16) * 150, "uint16 images up to 38250"),
    "images-object-pickle": ("PICKLE", "a pickled object array (allow_pickle would run code)"),
    "images-text-file": ("TEXT", "a text file named .npy"),
    "images-truncated": ("TRUNC", "a .npy cut off half-way"),
    "images-missing": ("MISSING", "a path where no file is"),
}


def _write_images(path: Path, spec) -> None:
    if spec == "PICKLE":
        np.save(path, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    elif spec == "TEXT":
        path.write_text("label,pixels\n3,0 0 0 0\n")
    elif spec == "NPZ":
        with path.open("wb") as f:
            np.savez(f, images=GOOD)
    elif spec == "TRUNC":
        np.save(path, GOOD)
        path.write_bytes(path.read_bytes()[:3000])
    elif spec == "DIR":
        path.mkdir()
    elif spec != "MISSING":
        np.save(path, spec())


def _bad_images(name: str, spec, what: str) -> None:
    @case(PR, name, 2, what)
    def run(ctx: Ctx):
        images = ctx.dir / "x.npy"
        _write_images(images, spec)
        out = ctx.dir / "pred.npz"
        proc = ctx.predict("--images", str(images), "--run-dir", str(ctx.base / "base"), "--output", str(out))
        return proc, not out.exists(), ""


for _name, (_spec, _what) in IMAGES.items():
    _bad_images(_name, _spec, _what)


def good_images(ctx: Ctx, n: int = 16) -> Path:
    path = ctx.dir / "good.npy"
    np.save(path, np.resize(GOOD, (n, 28, 28, 1)))
    return path


@case(PR, "good-images-control", 0, "16 good uint8 digits with the champion (the control case)")
def good(ctx: Ctx):
    out = ctx.dir / "pred.npz"
    proc = ctx.predict("--images", str(good_images(ctx)), "--output-dir", str(ctx.base), "--output", str(out))
    ok = out.exists() and np.load(out)["ensemble_probs"].shape == (16, 10)
    return proc, ok, ""


def _bad_run(name: str, what: str, prepare) -> None:
    @case(PR, name, 2, what)
    def run(ctx: Ctx):
        out = ctx.dir / "pred.npz"
        args = prepare(ctx)
        proc = ctx.predict("--images", str(good_images(ctx)), *args, "--output", str(out))
        return proc, not out.exists(), ""


def _no_checkpoints(ctx: Ctx) -> list[str]:
    runs = ctx.copy_base()
    shutil.rmtree(runs / "base" / "checkpoints")
    return ["--run-dir", str(runs / "base")]


def _champion_damaged(ctx: Ctx) -> list[str]:
    runs = ctx.copy_base()
    garbage(runs / "champion.json", "garbage")
    return ["--output-dir", str(runs)]


def _checkpoint_damaged(ctx: Ctx) -> list[str]:
    runs = ctx.copy_base()
    for step in (runs / "base" / "checkpoints").iterdir():
        for f in step.rglob("*"):
            if f.is_file() and f.stat().st_size > 1000:
                garbage(f, "truncated")
    return ["--run-dir", str(runs / "base")]


_bad_run("no-champion", "an output dir with no champion yet", lambda c: ["--output-dir", str(c.dir / "empty")])
_bad_run("run-dir-without-checkpoints", "a run directory whose checkpoints were deleted", _no_checkpoints)
_bad_run("champion-json-garbage", "champion.json overwritten with bytes", _champion_damaged)
_bad_run("every-checkpoint-truncated", "every checkpoint's large files cut in half", _checkpoint_damaged)


@case(PR, "output-unwritable", 2, "--output on a read-only tmpfs")
def out_ro(ctx: Ctx):
    ro = ctx.mount_tmpfs(ctx.dir / "ro", "ro,size=1m")
    proc = ctx.predict(
        "--images", str(good_images(ctx)), "--run-dir", str(ctx.base / "base"), "--output", str(ro / "p.npz")
    )
    return proc, nothing_under(ro), ""


@case(PR, "output-disk-full", 2, "--output on a full tmpfs")
def out_full(ctx: Ctx):
    full = ctx.mount_tmpfs(ctx.dir / "full", "size=64k")
    (full / "filler").write_bytes(b"\0" * (60 << 10))
    images = good_images(ctx, 2000)
    proc = ctx.predict("--images", str(images), "--run-dir", str(ctx.base / "base"), "--output", str(full / "p.npz"))
    left = [p.name for p in full.iterdir() if p.name != "filler"]
    return proc, not left, f"left {left}" if left else ""


@case(PR, "tfds-name-unknown", 2, "--tfds-name of a dataset that does not exist")
def tfds_unknown(ctx: Ctx):
    out = ctx.dir / "pred.npz"
    proc = ctx.predict("--tfds-name", "no_such_set", "--run-dir", str(ctx.base / "base"), "--output", str(out))
    return proc, not out.exists(), ""


@case(PR, "selection-json-damaged", 0, "the run's selection.json overwritten with a JSON list; predict")
def selection(ctx: Ctx):
    runs = ctx.copy_base()
    garbage(runs / "base" / "selection.json", "list")
    out = ctx.dir / "pred.npz"
    proc = ctx.predict("--images", str(good_images(ctx)), "--run-dir", str(runs / "base"), "--output", str(out))
    return proc, out.exists() and bool(list((runs / "base").glob("corrupt-state/selection.json.*"))), ""


def _stop_predict(sig: int) -> None:
    @case(PR, f"{signal.Signals(sig).name.lower()}-predicting", 75, f"{signal.Signals(sig).name} while predicting")
    def run(ctx: Ctx):
        images, out = good_images(ctx, 200_000), ctx.dir / "pred.npz"
        args = [
            "-m",
            "flows.predict",
            "--images",
            str(images),
            "--run-dir",
            str(ctx.base / "base"),
            "--output",
            str(out),
        ]
        p = ctx.start(args)
        reached = ctx.wait_output(p, r"Beginning flow run|Flow run '", 240)
        time.sleep(ctx.rng.uniform(0.5, 2.5))
        (os.killpg if sig == signal.SIGINT else os.kill)(p.pid, sig)
        first = ctx.finish(p, 120)
        nothing = not out.exists()
        again = ctx.cli(args, timeout=400)
        ok = reached and nothing and again.rc == 0 and out.exists()
        return first, ok, f"reached: {reached}, nothing half-written: {nothing}, rerun rc {again.rc}"


_stop_predict(signal.SIGTERM)


# MARK: deployment run (a private stack of make serve, started once by the runner)


@case(D, "server-unreachable", 2, "scripts/deployment-run.sh with the server down")
def deploy_down(ctx: Ctx):
    env = {"PREFECT_API_URL": f"http://127.0.0.1:{free_port()}/api", "PREFECT_HOME": str(ctx.dir)}
    return ctx.cli(["scripts/deployment-run.sh", "train-ensemble/adhoc"], env=env, timeout=120), True, ""


DEPLOY = {
    "unknown-config-key": ({"train": {"lr": 0.1}}, None, "config with an unknown key"),
    "config-not-mapping": ([1, 2], None, "config given as a JSON list"),
    "unknown-dataset": ({"data": {"name": "no_such_set"}}, None, "a dataset that does not exist"),
    "run-name-slash": ({}, "a/b", "run_name with '/'"),
}


def _deploy(name: str, change, run_name: str | None, what: str) -> None:
    @case(D, name, 1, f"-p config: {what} (rc 1: prefect's failed flow run)", stream="out")
    def run(ctx: Ctx):
        from tests import prefect_stack

        env = ctx.stack_env
        assert env is not None, "the sweep starts the stack for this case (_maybe_stack)"
        params = prefect_stack.small_params(ctx.dir, out="runs")
        params["config"]["data"]["data_dir"] = str(ctx.data)
        if isinstance(change, dict):
            for section, values in change.items():
                params["config"][section] = {**params["config"].get(section, {}), **values}
        else:
            params["config"] = change
        if run_name:
            params["run_name"] = run_name
        cmd = ["scripts/deployment-run.sh", "train-ensemble/adhoc", "--params", json.dumps(params)]
        proc = ctx.cli([*cmd, "--watch", "--watch-timeout", "300"], env={**env, "COLUMNS": "400"}, timeout=360)
        return proc, nothing_under(ctx.dir / "runs"), ""


for _name, (_change, _run, _what) in DEPLOY.items():
    _deploy(_name, _change, _run, _what)
