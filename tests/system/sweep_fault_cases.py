"""Sweep cases of faults while the pipeline runs: damaged state files, stop signals and
kills at random moments, member groups (local and Dask) and JAX processes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

from ensemble_core.processutil import free_port
from tests.system.sweep import Ctx, case_table, check_json, garbage, listing, nothing_under, refused, rerun_base

T, G, J, P = "train CLI", "member groups", "JAX processes", "processes module"
CASES, case = case_table()
LONG = ("--set", "train.epochs=30", "--set", "data.max_train_examples=2048")
# Two JAX processes of 4 simulated devices each: the 4 members of configs/tiny.yaml need
# mesh.data=2 to span both (preflight refuses a mesh that leaves a process without devices).
PROCS = ("--set", "distributed.num_processes=2", "--set", "mesh.data=2")


def resumed_ok(ctx: Ctx, out: Path, run: str, *args: str, timeout: float = 400):
    """Rerun ``run``: it must complete with a report and leave no orbax temporary."""
    rerun = ctx.train(*args, out=out, run=run, timeout=timeout)
    report = out / run / "report.json"
    tmp = [p for p in listing(out) if "orbax-checkpoint-tmp" in p]
    ok = rerun.rc == 0 and check_json(report) and not tmp
    return ok, f"rerun rc {rerun.rc}" + (f", temporaries {tmp[:1]}" if tmp else "")


# MARK: damaged state


def _damaged_champion(how: str) -> None:
    @case(T, f"champion-json-{how}", 0, f"champion.json {how}, then a new run")
    def run(ctx: Ctx):
        out = ctx.copy_base()
        garbage(out / "champion.json", how)
        proc = ctx.train(out=out, run="r")
        moved = list(out.glob("corrupt-state/champion.json.*"))
        return proc, bool(moved) and check_json(out / "champion.json"), f"set aside: {bool(moved)}"


for _how in ("garbage", "list"):
    _damaged_champion(_how)


@case(T, "history-bad-lines", 0, "history.jsonl with a garbage line and a truncated line, then a new run")
def history(ctx: Ctx):
    out = ctx.copy_base()
    with (out / "history.jsonl").open("ab") as f:
        f.write(b'\x00garbage\n{"run_name": "half\n')
    proc = ctx.train(out=out, run="r")
    return proc, bool(list(out.glob("corrupt-state/history.jsonl.*"))), ""


def _damaged_checkpoint(how: str) -> None:
    @case(T, f"checkpoint-latest-{how}", 0, f"the latest checkpoint's largest file {how}, then resume to 3 epochs")
    def run(ctx: Ctx):
        out = ctx.copy_base()
        steps = sorted(
            (p for p in (out / "base" / "checkpoints").iterdir() if p.name.isdigit()), key=lambda p: int(p.name)
        )
        if how == "deleted":
            shutil.rmtree(steps[-1])
            steps[-1].mkdir()
        else:
            biggest = max((p for p in steps[-1].rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
            garbage(biggest, how)
        older = listing(steps[0])
        proc = ctx.train("--set", "train.epochs=3", out=out, run="base", timeout=300)
        ok = listing(steps[0]) == older and check_json(out / "base" / "report.json")
        return proc, ok, "older step intact" if ok else "older step changed or no report"


for _how in ("truncated", "deleted"):
    _damaged_checkpoint(_how)


def _damaged_run_file(name: str, how: str) -> None:
    @case(T, f"{name.split('.')[0].replace('_', '-')}-{how}", 0, f"the run's {name} {how}, then resume to 3 epochs")
    def run(ctx: Ctx):
        out = ctx.copy_base()
        garbage(out / "base" / name, how)
        proc = ctx.train("--set", "train.epochs=3", out=out, run="base", timeout=300)
        return proc, check_json(out / "base" / "report.json"), ""


for _name, _how in (("report.json", "garbage"), ("data_snapshot.json", "garbage")):
    _damaged_run_file(_name, _how)


def _damaged_data_file(label: str, pattern: str, how: str) -> None:
    @case(T, f"{label}-{how}", 0, f"the data dir's {pattern} {how} (copied data dir), then a new run")
    def run(ctx: Ctx):
        data = ctx.dir / "data"
        shutil.copytree(ctx.data, data, symlinks=True)
        targets = sorted(data.glob(pattern))
        for t in targets:
            garbage(t, how)
        sets: tuple[str, ...] = ("--set", f"data.data_dir={data}")
        if label == "derived-cache":  # build the cache first (a run with the rotation evaluator)
            sets += ("--set", "eval.evaluators=[test,rotation]")
            ctx.train(*sets, out=ctx.dir / "runs", run="r0", timeout=300)
            targets = sorted(data.glob(pattern))
            for t in targets:
                garbage(t, how)
        proc = ctx.train(*sets, out=ctx.dir / "runs", timeout=300)
        ok = bool(targets) and check_json(ctx.dir / "runs" / "r" / "report.json")
        return proc, ok, f"{len(targets)} file(s) damaged"


_damaged_data_file("snapshot-json", "snapshots/mnist5k/*/snapshot.json", "garbage")
_damaged_data_file("derived-cache", "snapshots/mnist5k/*/ensemble-derived/**/*.npz", "garbage")  # after r0


# MARK: stop signals and kills


def stop_and_resume(ctx: Ctx, sig: int, when: str, *args: str, run: str = "r", entry_timeout: float = 300):
    """Start a run, send ``sig`` at ``when`` (startup: 0.3-2 s in; training: 0-1.5 s after
    the first checkpoint; evaluation: 0-1 s after evaluate_members starts), then rerun."""
    out = ctx.dir / "runs"
    p = ctx.start(ctx.train_args(*args, out=out, run=run))
    reached = True
    if when == "startup":
        time.sleep(ctx.rng.uniform(0.3, 2.0))
    elif when == "training":
        reached = ctx.wait_path(p, f"{run}/**/checkpoints/[0-9]*", out, entry_timeout)
        time.sleep(ctx.rng.uniform(0, 1.5))
    else:
        reached = ctx.wait_output(p, r"evaluate_members", entry_timeout)
        time.sleep(ctx.rng.uniform(0, 1.0))
    ctx.notes.append(f"signal sent {time.monotonic() - p.t0:.1f} s in (reached {when}: {reached})")
    if sig == signal.SIGINT:
        os.killpg(p.pid, sig)  # Ctrl-C: the terminal signals the whole foreground group
    else:
        os.kill(p.pid, sig)  # kill PID, as an operator or a scheduler would
    first = ctx.finish(p, 180)
    ok, note = resumed_ok(ctx, out, run, *args)
    return first, ok and reached, note + ("" if reached else f"; never reached {when}")


STOPPED = r"stopped|by SIGTERM|received SIGTERM|signal"  # a stop by SIGTERM (kill PID)
INTERRUPTED = r"stopped|by SIGINT|received SIGINT|interrupted|Ctrl-C|signal"  # a stop by SIGINT (Ctrl-C)


def _stop(name: str, sig: int, when: str, *args: str, entry: str = T, cause: str = STOPPED) -> None:
    @case(entry, name, 75, f"{signal.Signals(sig).name} during {when}, then rerun the run name", cause=cause)
    def run(ctx: Ctx):
        return stop_and_resume(ctx, sig, when, *args)


_stop("sigterm-startup", signal.SIGTERM, "startup")
_stop("sigint-training", signal.SIGINT, "training", *LONG, cause=INTERRUPTED)
_stop("sigterm-evaluation", signal.SIGTERM, "evaluation", "--set", "eval.evaluators=[test,rotation,translation]")


@case(T, "sigkill-training", 0, "SIGKILL of the command's group during training; the rerun (judged) resumes")
def sigkill(ctx: Ctx):
    out = ctx.dir / "runs"
    p = ctx.start(ctx.train_args(*LONG, out=out))
    ctx.wait_path(p, "r/checkpoints/[0-9]*", out, 300)
    time.sleep(ctx.rng.uniform(0, 1.5))
    os.killpg(p.pid, signal.SIGKILL)
    ctx.finish(p, 30)
    ctx.procs.pop()  # killed on purpose: its output is cut off, not judged
    rerun = ctx.train(*LONG, out=out, timeout=400)
    resumed = check_json(out / "r" / "report.json") and json.loads((out / "r" / "report.json").read_text()).get(
        "resumed_from_epoch"
    )
    tmp = [x for x in listing(out) if "orbax-checkpoint-tmp" in x]
    return rerun, bool(resumed is not None) and not tmp, f"resumed_from_epoch {resumed}"


# MARK: member groups and JAX processes

for _name, _sets, _what, _cause in (
    (
        "groups-not-dividing",
        ("distributed.member_groups=3",),
        "3 member groups of 4 members",
        r"does not divide|not divisible|evenly",
    ),
    (
        "dask-address-closed",
        ("distributed.task_runner=dask", "distributed.address=tcp://127.0.0.1:PORT"),
        "",
        r"(scheduler|dask|address).*(does not answer|connection refused|unreachable|cannot connect)",
    ),
    (
        "dask-tls-missing-files",  # tls_ca_file names no file; tls_cert and tls_key are not set
        ("distributed.task_runner=dask", "distributed.address=tls://127.0.0.1:PORT"),
        "",
        r"tls.*(not (all )?set|(is|are) missing|does not exist|no such file|not found)",
    ),
    (
        "processes-too-many",
        ("distributed.num_processes=16",),
        "16 JAX processes for 8 devices",
        r"num_processes.*(less than or equal|at most|more than|exceed|only 8)",
    ),
    (
        "processes-with-groups",
        ("distributed.num_processes=2", "distributed.member_groups=2"),
        "both at once",
        r"does not combine|cannot combine|not both|one of the two|mutually exclusive",
    ),
):

    def _make(name=_name, sets=_sets, what=_what, cause=_cause):
        entry = J if name.startswith("processes") else G
        tls = ("distributed.tls_ca_file=/nonexistent/ca.pem",) if "tls" in name else ()

        @case(entry, name, 2, what or " ".join(sets + tls), cause=cause)
        def run(ctx: Ctx):
            port = str(free_port())
            args = [a.replace("PORT", port) for s in sets + tls for a in ("--set", s)]
            return (
                refused(ctx, "--set", "distributed.member_groups=2", *args) if "dask" in name else refused(ctx, *args)
            )

    _make()


@case(
    G,
    "groups-changed-on-resume",
    2,
    "rerun a finished run with distributed.member_groups=2",
    cause=r"(another|different|changed) config.*member_groups|member_groups.*(->|changed|differs)",
)
def groups_changed(ctx: Ctx):
    return rerun_base(ctx, "distributed.member_groups=2")


_stop("groups-local-sigterm", signal.SIGTERM, "training", *LONG, "--set", "distributed.member_groups=2", entry=G)
_stop(
    "groups-dask-sigterm",
    signal.SIGTERM,
    "training",
    *LONG,
    "--set",
    "distributed.member_groups=2",
    "--set",
    "distributed.task_runner=dask",
    entry=G,
)
_stop("processes-sigterm", signal.SIGTERM, "training", *LONG, *PROCS, entry=J)


def _children(pid: int) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found += [int(proc.name), *_children(int(proc.name))]
        except (OSError, ValueError, IndexError):
            continue
    return found


@case(
    J,
    "processes-child-sigkill",
    75,
    "SIGKILL of JAX process 1 of 2 during training, then rerun",
    cause=r"process 1.*(SIGKILL|killed|died|lost)",
)
def child_killed(ctx: Ctx):
    out, args = ctx.dir / "runs", (*LONG, *PROCS)
    p = ctx.start(ctx.train_args(*args, out=out))
    ctx.wait_path(p, "r/checkpoints/[0-9]*", out, 300)
    kids = [k for k in _children(p.pid) if b"--process-id\x001" in Path(f"/proc/{k}/cmdline").read_bytes()]
    for k in kids[:1]:
        os.kill(k, signal.SIGKILL)
    first = ctx.finish(p, 240)
    ok, note = resumed_ok(ctx, out, "r", *args)
    return first, ok and bool(kids), note + ("" if kids else "; no JAX process 1 found")


PROC_CASES = {
    # name: (the arguments, what is wrong, the cause its line must name)
    "no-coordinator": (
        [],
        "no --coordinator and no cluster environment to detect one from",
        r"coordinator_address|no (--)?coordinator|without (a |--)?coordinator|coordinator .*(not (set|given)|missing)",
    ),
    "spec-missing": (
        ["--spec", "/nonexistent/spec.json", "--num-processes", "1", "--process-id", "0"],
        "",
        r"spec.*(not a file|does not exist|no such file|not found)",
    ),
    "bad-set": (
        ["--set", "train.lr=1", "--num-processes", "1", "--process-id", "0"],
        "an unknown key, one process",
        r"unknown config key 'train\.lr'",
    ),
}


def _proc_case(name: str, args: list[str], what: str, cause: str) -> None:
    @case(P, name, 2, what or " ".join(args), cause=cause)
    def run(ctx: Ctx):
        argv = [
            "-m",
            "ensemble_core.runs.training.processes",
            str(ctx.dir / "run"),
            "--config",
            str(ctx.base.parent / "tiny.yaml"),
        ]
        if name != "no-coordinator":
            argv += ["--coordinator", f"127.0.0.1:{free_port()}"]
        proc = ctx.cli(argv + args, timeout=200, env={"XLA_FLAGS": "--xla_force_host_platform_device_count=8"})
        return proc, nothing_under(ctx.dir / "run"), ""


for _name, (_args, _what, _cause) in PROC_CASES.items():
    _proc_case(_name, _args, _what, _cause)
