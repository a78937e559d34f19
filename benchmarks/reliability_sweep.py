"""Reliability sweep: bad input and faults through every entry point, one table of outcomes.

    python -m benchmarks.reliability_sweep [--out benchmarks/results/reliability-sweep.json]
                                           [--only PATTERN] [--jobs 1] [--keep DIR]

Runs the sweep's tests (``tests/system/test_reliability_sweep.py``, marked ``sweep``: each
case real commands in a directory of its own, on the tiny config and a dataset prepared
once per test process; see that module for what makes a case ``clean``) under pytest,
``--jobs`` test processes side by side (the deployment cases share one, with its private
``make serve`` stack), and collects every case's row into one table: prints it as
Markdown, writes JSON (``--out``) and the same table beside it (``.md``). A case that
raised before it could be judged has the verdict ``no-result``. Runs as root (the cases
mount tmpfs file systems for read-only and full disks).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "reliability-sweep.json"
TEST = "tests/system/test_reliability_sweep.py"


def table(rows: list[dict]) -> str:
    out = ["| entry point | case | expected | got | verdict | line |", "| --- | --- | ---: | ---: | --- | --- |"]
    for r in rows:
        line = r.get("line", "")[:110].replace("|", "\\|").replace("\n", " ")
        got = r["got"] if r["got"] is not None else ("hung" if r["verdict"] == "hang" else "-")
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
    parser.add_argument("--jobs", type=int, default=1, help="test processes side by side (default 1)")
    parser.add_argument("--keep", help="keep the cases' directories under this directory (pytest's --basetemp)")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("error: the sweep mounts tmpfs file systems; fix: run it as root", file=sys.stderr)
        return 2
    from tests.system.test_reliability_sweep import CASES, case_id

    cases = [c for c in CASES if not args.only or re.search(args.only, f"{c.entry}/{c.name}")]
    if not cases:
        print(f"error: no case matches {args.only!r}; fix: see the case names in the JSON", file=sys.stderr)
        return 2
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ensemble-sweep-") as tmp:
        rows_file = Path(tmp) / "rows.jsonl"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "sweep"]
        # always under xdist, one worker or more: the cases use its worker_id fixture and xdist_group mark
        cmd += ["-n", str(args.jobs), "--dist", "loadgroup"]
        cmd += ["--basetemp", args.keep] if args.keep else []
        cmd += [TEST] if len(cases) == len(CASES) else [f"{TEST}::test_case[{case_id(c)}]" for c in cases]
        env = {**os.environ, "ENSEMBLE_SWEEP_ROWS": str(rows_file)}
        code = subprocess.run(cmd, cwd=ROOT, env=env, check=False).returncode
        got = [json.loads(line) for line in rows_file.read_text().splitlines()] if rows_file.exists() else []
    by_case = {(r["entry"], r["case"]): r for r in got}
    rows = [by_case.get((c.entry, c.name)) or _no_result(c) for c in cases]
    minutes = round((time.monotonic() - started) / 60, 1)
    command = "python -m benchmarks.reliability_sweep" + "".join(
        f" --{k} {v}" for k, v in (("only", args.only), ("jobs", args.jobs)) if v and not (k == "jobs" and v == 1)
    )
    result = {
        "command": command,
        "date": dt.date.today().isoformat(),
        "machine": {"cpu_cores": os.cpu_count(), "load_average_at_end": list(os.getloadavg())},
        "minutes": minutes,
        "summary": summary(rows),
        "pytest_exit_code": code,
        "rows": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    md = (
        f"`{command}` ({result['date']}, {os.cpu_count()} cores, {minutes} min): {result['summary']}\n\n{table(rows)}\n"
    )
    out.with_suffix(".md").write_text(md)
    print(md)
    return 0 if code == 0 and all(r["verdict"] == "clean" for r in rows) else 1


def _no_result(c) -> dict:
    """The row of a case that wrote none (it raised before it could be judged)."""
    return {"entry": c.entry, "case": c.name, "what": c.what, "expected": c.expect, "got": None, "verdict": "no-result"}


if __name__ == "__main__":
    sys.exit(main())
