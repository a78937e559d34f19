"""Reliability sweep: bad input and faults through every entry point, one table of outcomes.

    python -m benchmarks.reliability_sweep [--out benchmarks/results/reliability-sweep.json]
                                           [--only PATTERN] [--jobs 1]

Each case (``benchmarks/_sweep_*.py``) runs real commands in a directory of its own, on
the tiny config and a dataset prepared once: the training CLI (``--config``, ``--set``,
``--run-name``, ``--output-dir``, damaged state files, SIGTERM/SIGINT/SIGKILL at random
moments then a rerun), member groups (local and Dask), JAX processes, ``python -m
ensemble_core.runs.training.processes``, the prediction CLI, and ``prefect deployment run``
against a private ``make serve`` stack (``tests/prefect_stack.py``). A case is ``clean``
only if: its exit code is the expected one (0 done, 2 refused or failed, 75 stopped;
1 for ``prefect deployment run`` of a failed flow run), a failure printed exactly one
line starting ``error: `` that holds ``fix:``, no command of the case printed
``Traceback`` or ``Exception ignored``, and the case's own check of what was lost or
left behind holds. Every command has a timeout: a hung one is ``hang``. Prints a
Markdown table and writes JSON (``--out``) and the same table beside it (``.md``).
Runs as root (it mounts tmpfs file systems for read-only and full disks).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import re
import shutil
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks import _sweep_faults, _sweep_predict, _sweep_train  # noqa: F401  (register the cases)
from benchmarks._sweep import CASES, ROOT, TINY, Case, Ctx, Proc, error_lines, verdict

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "reliability-sweep.json"


def base_env(tmp: Path) -> dict[str, str]:
    """The user's environment without Prefect's settings (each CLI starts its own
    temporary server) or XLA_FLAGS (the CLI sets the device count itself)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") and k != "XLA_FLAGS"}
    env["ENSEMBLE_VENV"] = str(Path(sys.executable).parent.parent)  # scripts/deployment-run.sh's interpreter
    return {**env, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "COLUMNS": "400", "TMPDIR": str(tmp / "tmp")}


def prepare(tmp: Path) -> tuple[Path, Path]:
    """The shared data dir and an output dir holding the finished, promoted run 'base'."""
    data, base = tmp / "data", tmp / "base-runs"
    text = Path(TINY).read_text().replace("data:\n", f"data:\n  data_dir: {data}\n") + "eval:\n  evaluators: [test]\n"
    (tmp / "tiny.yaml").write_text(text)
    ctx = Ctx(tmp / "setup", data, base, {**base_env(tmp), "PREFECT_HOME": str(tmp / "prefect-home-setup")})
    ctx.dir.mkdir()
    proc = ctx.train(out=base, run="base", timeout=600)
    if proc.rc != 0:
        sys.exit(f"the base run failed (rc {proc.rc}):\n{proc.err[-3000:]}")
    return data, base


def run_case(c: Case, tmp: Path, data: Path, base: Path, extra: dict) -> dict:
    slot = threading.current_thread().name.rsplit("_", 1)[-1]
    d = tmp / "cases" / f"{c.entry.split()[0]}-{c.name}"
    d.mkdir(parents=True)
    ctx = Ctx(d, data, base, {**base_env(tmp), "PREFECT_HOME": str(tmp / f"prefect-home-{slot}")})
    ctx.rng, ctx.stack_env = random.Random(f"{c.entry}/{c.name}"), extra.get("stack_env")
    started = time.monotonic()
    try:
        proc, ok, note = c.fn(ctx)
    except Exception as err:  # noqa: BLE001  (the sweep's own failure to set a case up: recorded, not fatal)
        proc, ok, note = Proc(-999, "", "", [], 0.0), False, f"sweep error: {err!r}"
        traceback.print_exc()
        verdict_ = "sweep-error"
    else:
        verdict_ = verdict(c, ctx, proc, ok)
    finally:
        ctx.cleanup()
    lines = error_lines(proc.out if c.stream == "out" else proc.err, c.stream)
    tracebacks = [p.argv[-1][:40] for p in ctx.procs if "Traceback" in p.out + p.err]
    return {
        "entry": c.entry,
        "case": c.name,
        "what": c.what,
        "expected": c.expect,
        "got": proc.rc,
        "verdict": verdict_,
        "line": lines[0][:240] if lines else "",
        "error_lines": len(lines),
        "check": bool(ok),
        "note": "; ".join([*ctx.notes, note] if note else ctx.notes),
        "tracebacks_in": tracebacks,
        "stderr_tail": (proc.out if c.stream == "out" else proc.err).strip().splitlines()[-4:],
        "commands": [" ".join(p.argv[1:])[-300:] for p in ctx.procs],
        "seconds": round(time.monotonic() - started, 1),
        "dir": str(d),
    }


def table(rows: list[dict]) -> str:
    out = ["| entry point | case | expected | got | verdict | line |", "| --- | --- | ---: | ---: | --- | --- |"]
    for r in rows:
        line = r["line"][:110].replace("|", "\\|").replace("\n", " ")
        got = "hung" if r["got"] is None else r["got"]
        v = r["verdict"] if r["verdict"] == "clean" else f"**{r['verdict']}**"
        out.append(f"| {r['entry']} | {r['case']} | {r['expected']} | {got} | {v} | {f'`{line}`' if line else ''} |")
    return "\n".join(out)


def summary(rows: list[dict]) -> str:
    clean = sum(r["verdict"] == "clean" for r in rows)
    per: dict[str, list[int]] = {}
    for r in rows:
        per.setdefault(r["entry"], [0, 0])
        per[r["entry"]][0] += 1
        per[r["entry"]][1] += r["verdict"] == "clean"
    parts = ", ".join(f"{e}: {c}/{n}" for e, (n, c) in per.items())
    return f"{clean} of {len(rows)} cases clean ({parts})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.reliability_sweep", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="JSON of every row (and a .md table beside it)")
    parser.add_argument("--only", help="regular expression on 'entry point/case' (e.g. 'predict|sigterm')")
    parser.add_argument("--jobs", type=int, default=1, help="cases run side by side (default 1)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("error: the sweep mounts tmpfs file systems; fix: run it as root", file=sys.stderr)
        return 2
    cases = [c for c in CASES if not args.only or re.search(args.only, f"{c.entry}/{c.name}")]
    if not cases:
        print(f"error: no case matches {args.only!r}; fix: see the case names in the JSON", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="ensemble-sweep-"))
    (tmp / "tmp").mkdir()
    started = time.monotonic()
    extra: dict = {}
    try:
        data, base = prepare(tmp)
        print(f"base run ready in {time.monotonic() - started:.0f} s; {len(cases)} cases", flush=True)
        with _maybe_stack(tmp, cases, extra), ThreadPoolExecutor(args.jobs) as pool:
            futures = [pool.submit(run_case, c, tmp, data, base, extra) for c in cases]
            rows = []
            for f in futures:
                rows.append(f.result())
                r = rows[-1]
                print(f"{r['verdict']:>12}  {r['entry']}/{r['case']} rc={r['got']} {r['seconds']} s", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    minutes = round((time.monotonic() - started) / 60, 1)
    cmd = "python -m benchmarks.reliability_sweep" + "".join(
        f" --{k} {v}" for k, v in (("only", args.only), ("jobs", args.jobs)) if v and not (k == "jobs" and v == 1)
    )
    result = {
        "command": cmd,
        "date": dt.date.today().isoformat(),
        "machine": {"cpu_cores": os.cpu_count(), "load_average_at_end": list(os.getloadavg())},
        "minutes": minutes,
        "summary": summary(rows),
        "rows": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    md = f"`{cmd}` ({result['date']}, {os.cpu_count()} cores, {minutes} min): {result['summary']}\n\n{table(rows)}\n"
    out.with_suffix(".md").write_text(md)
    print(md)
    return 0 if all(r["verdict"] == "clean" for r in rows) else 1


class _maybe_stack:  # noqa: N801  (a context manager)
    """The private deployment stack, only when a selected case needs it."""

    def __init__(self, tmp: Path, cases: list[Case], extra: dict):
        self.needed = any(c.stream == "out" for c in cases)
        self.tmp, self.extra, self.cm = tmp, extra, None

    def __enter__(self):
        if self.needed:
            from tests import prefect_stack

            self.cm = prefect_stack.stack(self.tmp / "stack")
            (self.tmp / "stack").mkdir()
            self.extra["stack_env"] = self.cm.__enter__()
        return self

    def __exit__(self, *exc):
        if self.cm is not None:
            self.cm.__exit__(*exc)


if __name__ == "__main__":
    sys.exit(main())
