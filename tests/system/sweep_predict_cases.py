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
    # name: (the images, what is wrong, the cause its line must name)
    "images-nan": (
        _nan,
        "float images with one NaN pixel",
        r"contains? NaN|NaN (or|value|pixel)|not finite|non-finite",
    ),
    "images-0-255-float": (
        lambda: GOOD.astype(np.float32),
        "float images in 0..255 instead of 0..1",
        r"range.*255|outside \[0, ?1\]|(above|greater than|exceeds?) 1\b",
    ),
    "images-rgb": (
        lambda: np.zeros((4, 28, 28, 3), np.uint8),
        "3 channels for a grey model",
        r"channel|\(4, 28, 28, 3\)",
    ),
    "images-no-batch-axis": (
        lambda: GOOD[0],
        "one image [28, 28, 1] without its batch axis",
        r"batch axis|shape \(28, 28, 1\)|dimensions",
    ),
    "images-empty": (lambda: np.zeros((0, 28, 28, 1), np.uint8), "an empty array", r"(is|are) empty|no images|\(0, 28"),
    "images-uint16": (
        lambda: GOOD.astype(np.uint16) * 150,
        "uint16 images up to 38250",
        r"(is|are|of|as) uint16|uint16 (\(|images|values|data|array)",
    ),
    "images-object-pickle": (
        "PICKLE",
        "a pickled object array (allow_pickle would run code)",
        r"Python objects|object array|pickled",
    ),
    "images-text-file": ("TEXT", "a text file named .npy", r"not a \.npy|NumPy header|not a NumPy"),
    "images-truncated": (
        "TRUNC",
        "a .npy cut off half-way",
        r"is truncated|truncated (file|array)|cut off|incomplete|not fully written|could only read|shorter than",
    ),
    "images-missing": ("MISSING", "a path where no file is", r"does not exist|no such file|not found"),
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


def _bad_images(name: str, spec, what: str, cause: str) -> None:
    @case(PR, name, 2, what, cause=cause)
    def run(ctx: Ctx):
        images = ctx.dir / "x.npy"
        _write_images(images, spec)
        out = ctx.dir / "pred.npz"
        proc = ctx.predict("--images", str(images), "--run-dir", str(ctx.base / "base"), "--output", str(out))
        return proc, not out.exists(), ""


for _name, (_spec, _what, _cause) in IMAGES.items():
    _bad_images(_name, _spec, _what, _cause)


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


def _bad_run(name: str, what: str, prepare, cause: str) -> None:
    @case(PR, name, 2, what, cause=cause)
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


_bad_run(
    "no-champion",
    "an output dir with no champion yet",
    lambda c: ["--output-dir", str(c.dir / "empty")],
    r"no champion",
)
_bad_run(
    "run-dir-without-checkpoints",
    "a run directory whose checkpoints were deleted",
    _no_checkpoints,
    r"no checkpoint|checkpoints? (missing|deleted|not found)",
)
_bad_run(  # a champion there is, its pointer damaged: not "no champion yet"
    "champion-json-garbage",
    "champion.json overwritten with bytes",
    _champion_damaged,
    r"champion.*((is|was) (damaged|corrupt\b)|corrupted|not (valid )?JSON|unreadable|cannot be read|set aside)"
    r"|damaged champion",
)
_bad_run(
    "every-checkpoint-truncated",
    "every checkpoint's large files cut in half",
    _checkpoint_damaged,
    r"checkpoint.*((is|was|are) (damaged|corrupt|truncated)|corrupted|cannot be read|unreadable|incomplete)",
)


@case(
    PR,
    "output-unwritable",
    2,
    "--output on a read-only tmpfs",
    cause=r"is read-only|read-only file system|not writable|permission denied",
)
def out_ro(ctx: Ctx):
    ro = ctx.mount_tmpfs(ctx.dir / "ro", "ro,size=1m")
    proc = ctx.predict(
        "--images", str(good_images(ctx)), "--run-dir", str(ctx.base / "base"), "--output", str(ro / "p.npz")
    )
    return proc, nothing_under(ro), ""


@case(PR, "output-disk-full", 2, "--output on a full tmpfs", cause=r"no space left|disk (is )?full")
def out_full(ctx: Ctx):
    full = ctx.mount_tmpfs(ctx.dir / "full", "size=64k")
    (full / "filler").write_bytes(b"\0" * (60 << 10))
    images = good_images(ctx, 2000)
    proc = ctx.predict("--images", str(images), "--run-dir", str(ctx.base / "base"), "--output", str(full / "p.npz"))
    left = [p.name for p in full.iterdir() if p.name != "filler"]
    return proc, not left, f"left {left}" if left else ""


@case(
    PR,
    "tfds-name-unknown",
    2,
    "--tfds-name of a dataset that does not exist",
    cause=r"unknown dataset|no_such_set.*(not found|does not exist)",
)
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


def _stop_predict(sig: int, cause: str) -> None:
    name = signal.Signals(sig).name

    @case(PR, f"{name.lower()}-predicting", 75, f"{name} while predicting", cause=cause)
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


_stop_predict(signal.SIGTERM, r"stopped|by SIGTERM|received SIGTERM|signal")


# MARK: deployment run (a private stack of make serve, started once by the runner)


@case(
    D,
    "server-unreachable",
    2,
    "scripts/deployment-run.sh with the server down",
    cause=r"does not answer|is unreachable|not reachable|connection refused|cannot connect",
)
def deploy_down(ctx: Ctx):
    env = {"PREFECT_API_URL": f"http://127.0.0.1:{free_port()}/api", "PREFECT_HOME": str(ctx.dir)}
    return ctx.cli(["scripts/deployment-run.sh", "train-ensemble/adhoc"], env=env, timeout=120), True, ""


DEPLOY = {
    # name: (the config's change, the run name, what is wrong, the cause its line must name)
    "unknown-config-key": (
        {"train": {"lr": 0.1}},
        None,
        "config with an unknown key",
        r"unknown config key 'train\.lr'",
    ),
    "config-not-mapping": ([1, 2], None, "config given as a JSON list", r"is a list|not a mapping"),
    "unknown-dataset": (
        {"data": {"name": "no_such_set"}},
        None,
        "a dataset that does not exist",
        r"unknown dataset|no_such_set.*(not found|does not exist)",
    ),
    "run-name-slash": ({}, "a/b", "run_name with '/'", r"not a single directory name|a '/'|a slash|path separator"),
}


def _deploy(name: str, change, run_name: str | None, what: str, cause: str) -> None:
    @case(D, name, 1, f"-p config: {what} (rc 1: prefect's failed flow run)", stream="out", cause=cause)
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


for _name, (_change, _run, _what, _cause) in DEPLOY.items():
    _deploy(_name, _change, _run, _what, _cause)
