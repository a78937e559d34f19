"""Sweep cases of issue 43 (round four) that run real work: readers beside a writer that
must lose nothing (class 1), messages that name the right cause and run (class 6),
overrides that change what they say (class 7) and members placed across JAX processes
(class 8). Each reader case runs the real commands at once (``Ctx.start``) and checks
the writer's checkpoints, report, snapshot and champion afterwards."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import time
from pathlib import Path

import numpy as np

from tests.system.sweep import (
    ROOT,
    TINY,
    Ctx,
    Proc,
    case_table,
    check_json,
    error_lines,
    listing,
    nothing_under,
    refused,
)
from tests.system.sweep_predict_cases import GOOD, good_images

T, PR, J = "train CLI", "predict CLI", "JAX processes"
CASES, case = case_table()
# A writer whose saves stay in flight a while: 4 members of 1024 x 1024 units, about 77 MB
# a checkpoint, one a second (each epoch), for about a minute; the tiny config's other values.
HEAVY = ("--set", "model.hidden_sizes=[1024,1024]", "--set", "train.epochs=60")
# A hyper-deep run small enough for the sweep: a search of 4 MLPs, 2 kept, 2 inits each.
HYPER = str(ROOT / "configs" / "hyper.yaml")
HYPER_SETS = tuple(
    a
    for kv in (
        "data.max_train_examples=512",
        "data.max_test_examples=200",
        "ensemble.size=4",
        "ensemble.select_size=2",
        "ensemble.stratify=2",
        "train.epochs=12",
        "train.patience=null",
        "model.name=mlp",
        "model.hidden_sizes=[64]",
    )
    for a in ("--set", kv)
)


def _temporaries(root: Path) -> list[str]:
    return [p for p in listing(root) if "orbax-checkpoint-tmp" in p]


def _steps(run: Path) -> list[str]:
    ckpts = run / "checkpoints"
    return sorted((p.name for p in ckpts.iterdir() if p.name.isdigit()), key=int) if ckpts.is_dir() else []


def _reader_clean(p: Proc) -> bool:
    """A reader beside a writer may succeed, or fail in one line with a fix; nothing else."""
    lines = error_lines(p.err, "err")
    return p.rc == 0 or (p.rc == 2 and len(lines) == 1 and "fix:" in lines[0])


def _predict_while(ctx: Ctx, writer, *source: str, limit: int = 6) -> list[Proc]:
    """``flows.predict`` of ``source`` again and again while ``writer`` lives (at most ``limit``)."""
    images = good_images(ctx)
    readers: list[Proc] = []
    while writer.poll() is None and len(readers) < limit:
        out = ctx.dir / f"pred{len(readers)}.npz"
        readers.append(ctx.predict("--images", str(images), *source, "--output", str(out), timeout=150))
        time.sleep(ctx.rng.uniform(0, 1.0))
    return readers


def _readers_note(readers: list[Proc]) -> str:
    return f"{len(readers)} reader(s), exits {[r.rc for r in readers]}"


def _report(run: Path) -> dict:
    return json.loads((run / "report.json").read_text()) if check_json(run / "report.json") else {}


# MARK: class 1: readers beside a writer


@case(T, "predict-during-training", 0, "flows.predict of a run again and again while it trains (77 MB saves)")
def predict_during_training(ctx: Ctx):
    out = ctx.dir / "runs"
    writer = ctx.start(ctx.train_args(*HEAVY, out=out))
    reached = ctx.wait_path(writer, "r/checkpoints/[0-9]*", out, 300)
    readers = _predict_while(ctx, writer, "--run-dir", str(out / "r"))
    proc = ctx.finish(writer, 600)
    tmp = _temporaries(out)
    ok = reached and bool(readers) and all(map(_reader_clean, readers)) and check_json(out / "r" / "report.json")
    ok = ok and not tmp and len(_steps(out / "r")) == 3
    return proc, ok, f"{_readers_note(readers)}, steps {_steps(out / 'r')}, temporaries {tmp[:2]}"


@case(T, "predict-champion-during-its-rerun", 0, "flows.predict of the champion while its run resumes to 150 epochs")
def predict_champion_during_rerun(ctx: Ctx):
    out = ctx.copy_base()
    writer = ctx.start(ctx.train_args("--set", "train.epochs=150", out=out, run="base"))
    reached = ctx.wait_output(writer, r"epoch \d+/150", 300)
    readers = _predict_while(ctx, writer, "--output-dir", str(out))
    proc = ctx.finish(writer, 600)
    champion = json.loads((out / "champion.json").read_text()) if check_json(out / "champion.json") else {}
    ok = reached and bool(readers) and all(map(_reader_clean, readers)) and champion.get("run_name") == "base"
    ok = ok and _report(out / "base").get("config", {}).get("train", {}).get("epochs") == 150
    ok = ok and not _temporaries(out) and not (out / "corrupt-state").exists()
    return proc, ok, _readers_note(readers) + f", champion {champion.get('run_name')}"


@case(T, "drift-during-champion-rerun", 0, "a new run (drift check, champion compared) while the champion resumes")
def drift_during_rerun(ctx: Ctx):
    out = ctx.copy_base()
    writer = ctx.start(ctx.train_args("--set", "train.epochs=150", out=out, run="base"))
    reached = ctx.wait_output(writer, r"epoch \d+/150", 300)
    reader = ctx.train(out=out, run="r2", timeout=400)
    alive = writer.poll() is None  # the reader ran while the writer trained
    proc = ctx.finish(writer, 600)
    runs = {json.loads(line).get("run_name") for line in (out / "history.jsonl").read_text().splitlines() if line}
    ok = reached and alive and reader.rc == 0 and check_json(out / "r2" / "report.json")
    ok = ok and check_json(out / "champion.json") and not (out / "corrupt-state").exists() and not _temporaries(out)
    ok = ok and {"base", "r2"} <= runs and _report(out / "base").get("config", {}).get("train", {}).get("epochs") == 150
    return proc, ok, f"reader rc {reader.rc}, writer still training then: {alive}, history {sorted(map(str, runs))}"


@case(T, "two-output-dirs-one-data-dir", 0, "two trainings into two output dirs on one prepared data dir at once")
def two_output_dirs(ctx: Ctx):
    snap = ctx.data / "snapshots" / "mnist5k"
    before = [p for p in listing(snap) if ".last-used" not in p]
    first = ctx.start(ctx.train_args("--set", "train.epochs=6", out=ctx.dir / "a"))
    second = ctx.train("--set", "train.epochs=6", out=ctx.dir / "b", timeout=400)
    proc = ctx.finish(first, 400)
    after = [p for p in listing(snap) if ".last-used" not in p]
    ok = second.rc == 0 and all(check_json(ctx.dir / d / "r" / "report.json") for d in "ab") and after == before
    return proc, ok, f"second rc {second.rc}, snapshot files unchanged: {after == before}"


@case(T, "two-output-dirs-fresh-data-dir", 0, "two trainings into two output dirs that both prepare a new data dir")
def two_preparing(ctx: Ctx):
    data = ctx.dir / "data"
    sets = ("--set", f"data.data_dir={data}")
    first = ctx.start(ctx.train_args(*sets, out=ctx.dir / "a"))
    second = ctx.train(*sets, out=ctx.dir / "b", timeout=400)
    proc = ctx.finish(first, 400)
    snapshots = [p.name for p in (data / "snapshots" / "mnist5k").iterdir() if p.is_dir()]
    stray = [p for p in listing(data) if re.search(r"incomplete|\.tmp|tmp-", p)]
    reports = [_report(ctx.dir / d / "r").get("data_snapshot", {}) for d in "ab"]
    same = len({json.dumps(r, sort_keys=True) for r in reports}) == 1 and bool(reports[0])
    ok = second.rc == 0 and len(snapshots) == 1 and not stray and same
    return proc, ok, f"second rc {second.rc}, snapshots {snapshots}, stray {stray[:2]}, same snapshot: {same}"


def _arrays(root: Path, n: int = 600) -> Path:
    """An arrays source (``train.npz``): random digits, every class present."""
    root.mkdir(parents=True)
    rng = np.random.default_rng(1)
    np.savez(root / "train.npz", image=rng.integers(0, 256, (n, 28, 28, 1), np.uint8), label=np.arange(n) % 10)
    return root


@case(T, "retention-of-another-output-dir", 0, "run B (snapshot_max_age_days=0) on A's data dir while A trains")
def retention_elsewhere(ctx: Ctx):
    data = ctx.dir / "data"
    shutil.copytree(ctx.data, data, symlinks=True)
    a_sets = (
        "--set",
        f"data.data_dir={data}",
        "--set",
        "data.source=arrays",
        "--set",
        f"data.path={_arrays(ctx.dir / 'parts')}",
    )
    writer = ctx.start(ctx.train_args(*a_sets, *HEAVY, out=ctx.dir / "a"))
    reached = ctx.wait_path(writer, "r/checkpoints/[0-9]*", ctx.dir / "a", 300)
    snaps = [p for p in (data / "snapshots" / "parts").glob("*") if p.is_dir()]
    before = listing(snaps[0]) if snaps else []
    other = ctx.train(
        "--set", f"data.data_dir={data}", "--set", "retention.snapshot_max_age_days=0", out=ctx.dir / "b", timeout=400
    )
    alive = writer.poll() is None
    kept = bool(snaps) and snaps[0].is_dir() and listing(snaps[0]) == before
    proc = ctx.finish(writer, 600)
    ok = reached and alive and kept and other.rc == 0 and check_json(ctx.dir / "a" / "r" / "report.json")
    ok = ok and bool(snaps) and snaps[0].is_dir()
    return proc, ok, f"B rc {other.rc}, A still training then: {alive}, A's snapshot kept: {kept}"


@case(T, "retention-keep-one-during-rerun", 0, "run B (keep_last_runs=1) while a finished run of its dir resumes")
def retention_keep_one(ctx: Ctx):
    out = ctx.copy_base()
    first = ctx.train(out=out, run="old")
    writer = ctx.start(ctx.train_args("--set", "train.epochs=150", out=out, run="old"))
    reached = ctx.wait_output(writer, r"epoch \d+/150", 300)
    other = ctx.train("--set", "retention.keep_last_runs=1", out=out, run="b", timeout=400)
    alive = writer.poll() is None
    proc = ctx.finish(writer, 600)
    ok = first.rc == 0 and reached and alive and other.rc == 0 and len(_steps(out / "old")) == 3
    ok = ok and _report(out / "old").get("config", {}).get("train", {}).get("epochs") == 150 and not _temporaries(out)
    return proc, ok, f"B rc {other.rc}, the rerun still training then: {alive}, its steps {_steps(out / 'old')}"


# MARK: class 6: the right cause, the right run


def _stop_in_stratification(ctx: Ctx, out: Path) -> tuple[Proc, bool]:
    """Start the small hyper-deep run 'h', SIGTERM it while its stratified pool trains."""
    p = ctx.start(ctx.train_args(*HYPER_SETS, out=out, run="h", config=HYPER))
    reached = ctx.wait_output(p, r"stratify_members-\w+' - epoch 1/", 400)
    time.sleep(ctx.rng.uniform(0, 1.0))
    ctx.notes.append(f"SIGTERM {time.monotonic() - p.t0:.1f} s in (stratifying: {reached})")
    os.kill(p.pid, signal.SIGTERM)
    return ctx.finish(p, 180), reached


@case(
    T,
    "stratify-sigterm-names-the-run",
    75,
    "SIGTERM while a hyper-deep run stratifies; the fix names 'h'; rerun",
    cause=r"stopped|by SIGTERM|received SIGTERM|signal",
)
def stratify_stop(ctx: Ctx):
    out = ctx.dir / "runs"
    first, reached = _stop_in_stratification(ctx, out)
    lines = error_lines(first.err, "err")
    fix = lines[0].partition("fix:")[2] if lines else ""
    names = bool(re.search(r"--run-name h\b", fix)) and "stratified" not in fix
    plan = (
        (out / "h" / "stratified" / "plan.json").read_bytes()
        if (out / "h" / "stratified" / "plan.json").exists()
        else b""
    )
    search = listing(out / "h" / "checkpoints")
    rerun = ctx.cli(ctx.train_args(*HYPER_SETS, out=out, run="h", config=HYPER), timeout=400)
    resumed = (out / "h" / "stratified" / "plan.json").read_bytes() == plan and listing(
        out / "h" / "checkpoints"
    ) == search
    ok = reached and names and rerun.rc == 0 and check_json(out / "h" / "report.json") and bool(plan) and resumed
    return first, ok, f"fix names the run: {names}, rerun rc {rerun.rc}, plan and search reused: {resumed}"


def _home_read_only(ctx: Ctx, args: list[str]) -> tuple[Proc, Path]:
    home = ctx.mount_tmpfs(ctx.dir / "home", "ro,size=1m")
    ctx.env.pop("PREFECT_HOME", None)  # Prefect's default, under the home directory
    return ctx.cli(args, env={"HOME": str(home)}, timeout=180), home


def _names_home(proc: Proc, home: Path) -> tuple[bool, str]:
    """The line's cause (before ``fix:``) names the home directory itself (not only a path
    under it, such as Prefect's database) and says it is read-only."""
    cause = (error_lines(proc.err, "err") or [""])[0].partition("fix:")[0]
    ok = bool(re.search(re.escape(str(home)) + r"(?![\w/.-])", cause)) and "read-only" in cause.lower()
    return ok, "" if ok else "the line's cause does not name the read-only home directory"


# the home directory is read-only (_names_home checks that the line names the home itself)
READ_ONLY = r"is read-only|read-only file system|not writable|permission denied"


@case(
    T,
    "home-read-only",
    2,
    "HOME on a read-only tmpfs, no PREFECT_HOME: one line naming the home directory",
    cause=READ_ONLY,
)
def home_ro(ctx: Ctx):
    out = ctx.dir / "runs"
    proc, home = _home_read_only(ctx, ctx.train_args(out=out))
    named, note = _names_home(proc, home)
    return proc, named and nothing_under(out), note


@case(PR, "home-read-only", 2, "flows.predict with HOME on a read-only tmpfs, no PREFECT_HOME", cause=READ_ONLY)
def home_ro_predict(ctx: Ctx):
    out = ctx.dir / "pred.npz"
    args = ["-m", "flows.predict", "--images", str(good_images(ctx)), "--run-dir", str(ctx.base / "base")]
    proc, home = _home_read_only(ctx, [*args, "--output", str(out)])
    named, note = _names_home(proc, home)
    return proc, named and not out.exists(), note


def _snapshot_taken(how: str) -> None:
    @case(
        T, f"snapshot-dir-is-{how}", 0, f"a data snapshot's directory replaced by a {how.replace('-', ' ')}; a new run"
    )
    def run(ctx: Ctx):
        data = ctx.dir / "data"
        shutil.copytree(ctx.data, data, symlinks=True)
        snap = next(p for p in (data / "snapshots" / "mnist5k").iterdir() if p.is_dir() and not p.name.startswith("."))
        shutil.rmtree(snap)
        target = ctx.dir / "elsewhere.txt"
        target.write_text("someone's file\n")
        if how == "file":
            snap.write_text("not a snapshot\n")
        elif how == "link-to-a-file":
            snap.symlink_to(target)
        else:
            os.mkfifo(snap)
        proc = ctx.train("--set", f"data.data_dir={data}", out=ctx.dir / "runs")
        aside = list(snap.parent.glob(f".aside-{snap.name}-*"))
        if how == "file":
            kept = len(aside) == 1 and aside[0].read_text() == "not a snapshot\n"
        elif how == "link-to-a-file":
            kept = len(aside) == 1 and aside[0].is_symlink() and aside[0].resolve() == target
        else:
            kept = len(aside) == 1 and stat.S_ISFIFO(aside[0].lstat().st_mode)
        kept = kept and target.read_text() == "someone's file\n"
        ok = kept and snap.is_dir() and check_json(ctx.dir / "runs" / "r" / "report.json")
        return proc, ok, f"set aside and kept: {kept}, snapshot prepared again: {snap.is_dir()}"


for _how in ("file", "link-to-a-file", "fifo"):
    _snapshot_taken(_how)


def _predict_like_native(name: str, what: str, convert) -> None:
    @case(PR, name, 0, what)
    def run(ctx: Ctx):
        native = GOOD.astype(np.float32) / 255
        np.save(ctx.dir / "native.npy", native)
        np.save(ctx.dir / "other.npy", convert(native))
        base = ["--run-dir", str(ctx.base / "base")]
        want = ctx.predict("--images", str(ctx.dir / "native.npy"), *base, "--output", str(ctx.dir / "native.npz"))
        proc = ctx.predict("--images", str(ctx.dir / "other.npy"), *base, "--output", str(ctx.dir / "other.npz"))
        same = want.rc == proc.rc == 0 and all(
            np.array_equal(np.load(ctx.dir / "native.npz")[k], np.load(ctx.dir / "other.npz")[k])
            for k in ("ensemble_probs", "member_probs", "predicted_class")
        )
        return proc, same, "" if same else f"native rc {want.rc}: predictions differ or missing"


_predict_like_native(
    "images-big-endian", "valid big-endian float32 images, as the same images", lambda x: x.astype(">f4")
)
_predict_like_native("images-fortran-order", "valid float32 images in Fortran order", np.asfortranarray)


# MARK: class 7: overrides change what they say


def _expected(*overrides: str) -> dict:
    """The tiny config's validated sections with ``overrides``, as JSON (what report.json records)."""
    from ensemble_core.config import load_config

    return json.loads(load_config(TINY, list(overrides)).model_dump_json())


def _override(name: str, assignment: str, section: str, expected: tuple[str, ...], what: str) -> None:
    @case(T, name, 0, f"--set {assignment}: {what}")
    def run(ctx: Ctx):
        proc = ctx.train("--set", assignment, out=ctx.dir / "runs")
        got = _report(ctx.dir / "runs" / "r").get("config", {}).get(section)
        want = _expected(*expected)[section]
        return proc, got == want, "" if got == want else f"{section} is {got}, expected {want}"


_override(
    "set-selection-one-key",
    "ensemble.selection.sorted_init=2",
    "ensemble",
    ("ensemble.selection.sorted_init=2",),
    "one key; bags 20 and replacement false stay",
)
_override("set-train-mapping-merges", "train={epochs: 1}", "train", ("train.epochs=1",), "merges (batch_size 64 stays)")
_override(
    "set-nested-mapping-merges",
    "ensemble={selection: {bags: 5}}",
    "ensemble",
    ("ensemble.selection.bags=5",),
    "merges at every level (size 4 stays)",
)


@case(
    T,
    "set-mapping-unknown-key",
    2,
    "--set 'train={epochs: 1, lr: 0.5}': a mapping with an unknown key",
    cause=r"unknown config key 'train\.lr'",
)
def mapping_unknown(ctx: Ctx):
    return refused(ctx, "--set", "train={epochs: 1, lr: 0.5}")


@case(
    T,
    "first-selection-changed-after-stop",
    2,
    "rerun a stopped hyper-deep run with first_selection.bags=5",
    cause=r"(changes|changed|->|differs).*first_selection\.bags|first_selection\.bags.*(changes|changed|->|differs)",
)
def first_selection_changed(ctx: Ctx):
    out = ctx.dir / "runs"
    first, reached = _stop_in_stratification(ctx, out)
    before = listing(out)
    plan = out / "h" / "stratified" / "plan.json"
    changed = ("--set", "ensemble.first_selection.bags=5")
    proc = ctx.cli(ctx.train_args(*HYPER_SETS, *changed, out=out, run="h", config=HYPER), timeout=240)
    ok = reached and first.rc == 75 and plan.exists() and listing(out) == before
    return proc, ok, f"stopped rc {first.rc}, run dir unchanged: {listing(out) == before}"


# MARK: class 8: members placed across JAX processes


def _processes(name: str, sets: tuple[str, ...], processes: int, what: str) -> None:
    @case(J, name, 0, what)
    def run(ctx: Ctx):
        out = ctx.dir / "runs"
        proc = ctx.train(*(a for kv in sets for a in ("--set", kv)), out=out, timeout=400)
        topology = _report(out / "r").get("topology") or [{}]
        logs = sorted(p.name for p in (out / "r" / "processes").glob("process-*.log"))
        ok = topology[0].get("processes") == processes and len(logs) == processes
        return proc, ok, f"processes {topology[0].get('processes')}, logs {logs}"


_processes("processes-2-natural", ("distributed.num_processes=2",), 2, "4 members, 2 JAX processes, no mesh setting")
_processes(
    "processes-4-for-2-members",
    ("distributed.num_processes=4", "ensemble.size=2"),
    4,
    "2 members over 4 JAX processes (the data axis widens)",
)


@case(
    J,
    "processes-3-not-dividing",
    2,
    "3 JAX processes for 8 devices: no placement serves it",
    cause=r"does not divide|not divisible|evenly|no placement",
)
def processes_three(ctx: Ctx):
    return refused(ctx, "--set", "distributed.num_processes=3")
