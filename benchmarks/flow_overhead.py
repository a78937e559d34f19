"""Wall time of the Prefect flow against calling the core stage functions directly.

    python -m benchmarks.flow_overhead [--set key=value ...]

Runs the same config twice in fresh processes, each in a fresh run directory and with
the same warm JAX compilation cache: (1) ``ensemble_core.runs.run``, the same sequence of
stages without Prefect, (2) the ``train-ensemble`` flow through its CLI, including Prefect's
temporary local server. Prints both wall times and the overhead in percent, and the
overhead without the temporary server's start (what a deployment run on a running
server pays).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

DIRECT = """
from flows import environment  # noqa: F401
import sys
from ensemble_core import runs
from ensemble_core.config import load_config
runs.run(load_config(None, sys.argv[2:]), sys.argv[1], "direct")
"""


def _timed(cmd: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(proc.stderr[-3000:])
    return time.perf_counter() - t0, proc.stderr


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="ensemble-overhead-"))
    sets = [x for o in args.overrides for x in ("--set", o)]
    # Warm-up run: fills the dataset and compilation caches for both measurements.
    _timed([sys.executable, "-c", DIRECT, str(tmp / "warm"), *args.overrides])
    direct, _ = _timed([sys.executable, "-c", DIRECT, str(tmp / "direct"), *args.overrides])
    flow, log = _timed(
        [sys.executable, "-m", "flows.train_ensemble", *sets, "--output-dir", str(tmp / "flow"), "--run-name", "flow"]
    )
    stamps = re.findall(r"^(\d\d:\d\d:\d\d\.\d+) \| INFO {4}\| prefect - Starting temporary server", log, re.M)
    begin = re.findall(r"^(\d\d:\d\d:\d\d\.\d+) \| INFO {4}\| Flow run .* - Beginning flow run", log, re.M)

    def secs(t: str) -> float:
        h, m, s = t.split(":")
        return int(h) * 3600 + int(m) * 60 + float(s)

    server = secs(begin[0]) - secs(stamps[0]) if stamps and begin else 0.0
    result = {
        "direct_seconds": direct,
        "flow_seconds": flow,
        "overhead_percent": 100 * (flow - direct) / direct,
        "temporary_server_seconds": server,
        "overhead_without_server_start_percent": 100 * (flow - server - direct) / direct,
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
