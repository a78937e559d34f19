"""The reliability sweep's harness: cases, the processes they run, and their verdicts.

A case is a function of a :class:`Ctx` (its own directory, the shared prepared data and
finished run) in a case module's table (:func:`case_table`); it runs one or more real
commands through :meth:`Ctx.cli` or :meth:`Ctx.start` and returns the primary command's
:class:`Proc` and the result of its own "nothing lost / left behind" check.
:func:`verdict` judges it and :func:`assert_clean` fails the test that ran it
(``tests/system/test_reliability_sweep.py``); :func:`row` is its line of
``benchmarks/results/reliability-sweep.json`` (``benchmarks.reliability_sweep``).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
TINY = str(ROOT / "configs" / "tiny.yaml")


@dataclass
class Proc:
    rc: int | None  # None: hung (killed at its timeout)
    out: str
    err: str
    argv: list[str]
    seconds: float


@dataclass
class Case:
    entry: str
    name: str
    what: str
    expect: int
    fn: Callable
    stream: str = "err"  # where the one `error:` line must be ("out" for prefect deployment run)
    cause: str | None = None  # regular expression (case-insensitive) the error line's cause must match


class CaseProcess(subprocess.Popen):
    """A command a case started: its output files (stdout, stderr), argv and start time
    (``time.monotonic()`` seconds)."""

    files: tuple[IO[str], IO[str]]
    argv: list[str]
    t0: float


@dataclass
class Ctx:
    """What one case sees: its directory, the shared data dir and base run, and every
    process it ran (all of them are checked for tracebacks)."""

    dir: Path
    data: Path
    base: Path  # output dir holding the finished run 'base' (the champion)
    env: dict[str, str]
    procs: list[Proc] = field(default_factory=list)
    mounts: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    rng: random.Random = field(default_factory=random.Random)  # the case's random moments
    stack_env: dict[str, str] | None = None  # the private make-serve stack's, for the cases that use it
    live: list[CaseProcess] = field(default_factory=list)  # started and not yet finished

    def cli(self, args: list[str], timeout: float = 240, env: dict | None = None, cwd: Path = ROOT) -> Proc:
        """Run ``python args`` to the end (killed at ``timeout``: rc None)."""
        return self.finish(self.start(args, env=env, cwd=cwd), timeout)

    def start(self, args: list[str], env: dict | None = None, cwd: Path = ROOT) -> CaseProcess:
        """Start ``python args`` in its own process group, its output to files of the case."""
        n = len(self.procs) + len(self.live)
        out, err = (open(self.dir / f"cmd{n}.{s}", "w+") for s in ("out", "err"))  # noqa: SIM115
        argv = [PY, *args] if not args[0].startswith(("/", "scripts/")) else list(args)
        p = CaseProcess(argv, cwd=cwd, env={**self.env, **(env or {})}, stdout=out, stderr=err, start_new_session=True)
        p.files, p.argv, p.t0 = (out, err), argv, time.monotonic()
        self.live.append(p)
        return p

    def finish(self, p: CaseProcess, timeout: float) -> Proc:
        """Wait for ``p`` (the whole group killed at ``timeout``); its :class:`Proc`."""
        try:
            rc: int | None = p.wait(timeout=max(1.0, timeout - (time.monotonic() - p.t0)))
        except subprocess.TimeoutExpired:
            rc = None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)  # whatever it left (its temporary server dies with it)
        p.wait()
        out, err = (Path(f.name).read_text(errors="replace") for f in p.files)
        for f in p.files:
            f.close()
        self.live.remove(p)
        proc = Proc(rc, out, err, p.argv, round(time.monotonic() - p.t0, 1))
        self.procs.append(proc)
        return proc

    def wait_output(self, p: CaseProcess, pattern: str, timeout: float = 180) -> bool:
        """Until ``pattern`` appears in ``p``'s stdout or stderr (False: it ended or timed out)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and p.poll() is None:
            text = "".join(Path(f.name).read_text(errors="replace") for f in p.files)
            if re.search(pattern, text):
                return True
            time.sleep(0.2)
        return False

    def wait_path(self, p: CaseProcess, glob: str, root: Path, timeout: float = 180) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and p.poll() is None:
            if any(p.name.isdigit() for p in root.glob(glob)):  # a committed checkpoint step
                return True
            time.sleep(0.2)
        return False

    def train(self, *args: str, out: Path | None = None, run: str = "r", timeout: float = 240, **kw) -> Proc:
        """The training CLI on the tiny config, the shared data and the test evaluator."""
        return self.cli(self.train_args(*args, out=out, run=run), timeout=timeout, **kw)

    def train_args(self, *args: str, out: Path | None = None, run: str | None = "r", config: str = TINY) -> list[str]:
        argv = ["-m", "flows.train_ensemble", "--config", config, "--set", f"data.data_dir={self.data}"]
        argv += ["--set", "eval.evaluators=[test]", "--output-dir", str(out or self.dir / "runs")]
        return argv + (["--run-name", run] if run else []) + list(args)

    def predict(self, *args: str, timeout: float = 180) -> Proc:
        return self.cli(["-m", "flows.predict", *args], timeout=timeout)

    def copy_base(self, name: str = "runs") -> Path:
        """A copy of the base output dir (its champion pointing into the copy)."""
        dst = self.dir / name
        shutil.copytree(self.base, dst, symlinks=True)
        for f in dst.glob("*.json*"):
            f.write_text(f.read_text().replace(str(self.base), str(dst)))
        return dst

    def mount_tmpfs(self, path: Path, options: str) -> Path:
        """A tmpfs at ``path`` (created), unmounted when the case ends."""
        path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=True)
        self.mounts.append(path)
        return path

    def cleanup(self) -> None:
        for p in list(self.live):
            self.finish(p, 0)
        for m in reversed(self.mounts):
            subprocess.run(["umount", "-l", str(m)], check=False)


def case_table() -> tuple[list[Case], Callable[..., Callable]]:
    """A case module's table and the decorator that fills it: ``CASES, case = case_table()``;
    ``@case(entry, name, expect, what[, stream], cause=REGEX)`` on ``fn(ctx) -> (Proc, ok,
    note)`` appends it as a :class:`Case` (the test parametrises over the modules' tables).
    A case that must fail (``expect`` not 0) names the cause its one line must give:
    ``cause`` is searched (case-insensitive) in the part of the line before ``fix:``.

    Raises:
      ValueError: a failing case without ``cause``, or a passing case with one.
    """
    cases: list[Case] = []

    def case(entry: str, name: str, expect: int, what: str, stream: str = "err", cause: str | None = None) -> Callable:
        if (expect != 0) != (cause is not None):
            raise ValueError(
                f"sweep case {entry}/{name}: a case expecting exit {expect} needs cause= exactly when it fails"
            )
        if cause is not None:
            re.compile(cause)

        def register(fn: Callable) -> Callable:
            cases.append(Case(entry, name, what, expect, fn, stream, cause))
            return fn

        return register

    return cases, case


def base_env(tmp: Path) -> dict[str, str]:
    """The user's environment without Prefect's settings (each CLI starts its own
    temporary server) or XLA_FLAGS (the CLI sets the device count itself)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") and k != "XLA_FLAGS"}
    env["ENSEMBLE_VENV"] = str(Path(sys.executable).parent.parent)  # scripts/deployment-run.sh's interpreter
    return {**env, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "COLUMNS": "400", "TMPDIR": str(tmp / "tmp")}


def prepare_base(tmp: Path) -> tuple[Path, Path]:
    """The shared data dir and an output dir holding the finished, promoted run 'base'
    (the training CLI on the tiny config and the test evaluator), and ``tmp/tiny.yaml``.

    Raises:
      RuntimeError: the base run failed (its stderr's end).
    """
    (tmp / "tmp").mkdir(parents=True, exist_ok=True)
    data, base = tmp / "data", tmp / "base-runs"
    # the tiny config on this data dir with the test evaluator, beside base: the processes cases' --config
    text = Path(TINY).read_text().replace("data:\n", f"data:\n  data_dir: {data}\n") + "eval:\n  evaluators: [test]\n"
    (tmp / "tiny.yaml").write_text(text)
    ctx = Ctx(tmp / "setup", data, base, {**base_env(tmp), "PREFECT_HOME": str(tmp / "prefect-home-setup")})
    ctx.dir.mkdir()
    proc = ctx.train(out=base, run="base", timeout=600)
    if proc.rc != 0:
        raise RuntimeError(f"the base run failed (rc {proc.rc}):\n{proc.err[-3000:]}")
    return data, base


def error_lines(text: str, stream: str) -> list[str]:
    if stream == "out":  # prefect's --watch output and state message: the line may be indented or quoted
        return [ln.strip() for ln in text.splitlines() if "error: " in ln]
    return [ln for ln in text.splitlines() if ln.startswith("error: ")]


def verdict(c: Case, ctx: Ctx, proc: Proc, ok: bool) -> str:
    """``clean`` or what is wrong, in the order an operator would notice it."""
    if proc.rc is None or any(p.rc is None for p in ctx.procs):
        return "hang"
    if proc.rc != c.expect:
        return "wrong-exit"
    text = "".join(p.out + p.err for p in ctx.procs)
    if "Traceback" in text or "Exception ignored" in text:
        return "traceback"
    lines = error_lines(proc.out if c.stream == "out" else proc.err, c.stream)
    if c.expect == 0 and lines:
        return "error-line"
    if c.expect != 0 and ((len(lines) != 1 and c.stream == "err") or not lines or "fix:" not in lines[0]):
        return "no-one-line" if not lines or "fix:" not in lines[0] else "many-lines"
    if c.expect != 0 and c.cause and not re.search(c.cause, lines[0].split("fix:")[0], re.IGNORECASE):
        return "wrong-cause"
    if not ok:
        return "left-behind"
    return "clean"


def row(c: Case, ctx: Ctx, proc: Proc, ok: bool, note: str, seconds: float) -> dict:
    """The case's line of the sweep's table: entry point, case, expected and actual exit
    code, :func:`verdict`, its one ``error:`` line, the commands it ran, seconds."""
    lines = error_lines(proc.out if c.stream == "out" else proc.err, c.stream)
    return {
        "entry": c.entry,
        "case": c.name,
        "what": c.what,
        "expected": c.expect,
        "got": proc.rc,
        "verdict": verdict(c, ctx, proc, ok),
        "line": lines[0][:240] if lines else "",
        "cause": c.cause,
        "error_lines": len(lines),
        "check": bool(ok),
        "note": "; ".join([*ctx.notes, note] if note else ctx.notes),
        "tracebacks_in": [p.argv[-1][:40] for p in ctx.procs if "Traceback" in p.out + p.err],
        "stderr_tail": (proc.out if c.stream == "out" else proc.err).strip().splitlines()[-4:],
        "commands": [" ".join(p.argv[1:])[-300:] for p in ctx.procs],
        "seconds": round(seconds, 1),
        "dir": str(ctx.dir),
    }


def assert_clean(line: dict) -> None:
    """Fail unless the case's :func:`row` says ``clean``, naming what went wrong."""
    assert line["verdict"] == "clean", (
        f"{line['entry']}/{line['case']} ({line['what']}): {line['verdict']}: exit {line['got']} (expected "
        f"{line['expected']}), {line['error_lines']} error line(s) {line['line']!r}, own check "
        f"{'held' if line['check'] else 'failed'} ({line['note']}); tracebacks in {line['tracebacks_in']}; "
        f"output ends {line['stderr_tail']}; commands {line['commands']}; kept in {line['dir']}"
    )


def listing(root: Path) -> list[str]:
    """Every path under ``root`` (relative), for before/after comparisons."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def nothing_under(root: Path) -> bool:
    """No run directory or file was written under ``root`` (absent or empty)."""
    return not root.exists() or not any(root.iterdir())


# MARK: what the cases share


def refused(ctx: Ctx, *args: str, run: str = "r", **kw):
    """The command refuses before compute: nothing under its output dir."""
    out = ctx.dir / "runs"
    proc = ctx.train(*args, out=out, run=run, **kw)
    return proc, nothing_under(out), "nothing written" if nothing_under(out) else f"wrote {listing(out)[:3]}"


def rerun_base(ctx: Ctx, *sets: str):
    """Rerun the finished base run's name with ``--set`` ``sets``: the process, and whether
    the output directory is left exactly as it was (a refusal writes nothing)."""
    out = ctx.copy_base()
    before = listing(out)
    proc = ctx.train(*(a for kv in sets for a in ("--set", kv)), out=out, run="base", timeout=180)
    return proc, listing(out) == before, ""


def check_json(path: Path) -> bool:
    try:
        return isinstance(json.loads(path.read_text()), dict)
    except (OSError, ValueError):
        return False


def garbage(path: Path, how: str) -> None:
    """Damage ``path`` the way a disk, an editor or a half-finished copy would."""
    data = path.read_bytes() if path.exists() else b""
    path.write_bytes(
        {"garbage": b"\x00\xffnot json at all\x13", "truncated": data[: len(data) // 2], "empty": b""}.get(how)
        or b'["a", "list"]'
    )
