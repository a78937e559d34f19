"""Temperature scaling as a default: the ensemble's test NLL and ECE with and without it.

    python -m benchmarks.temperature [--seeds 0,1,2] [--config FILE] [--set KEY=VALUE ...]
        [--protocol FILE ...] [--out FILE]

Trains ``--config`` (default: the built-in defaults, the default run) once per seed with
``eval.temperature_scaling: true`` and only the ``test`` evaluator, in this process
(:func:`ensemble_core.runs.run`, no Prefect), and reads each run's ``report.json``: the
ensemble's test figures before (``ensemble``) and after (``ensemble_temperature_scaled``)
one temperature fitted on the validation split by NLL (Guo et al. 2017, "On Calibration of
Modern Neural Networks"; the ensemble's mean probabilities are tempered, pool-then-calibrate,
Rahaman & Thiery 2021). ``--protocol`` adds runs already summarised by
:mod:`benchmarks.literature_protocol` (e.g. the Fashion-MNIST runs) that were made with
temperature scaling on. ``summary`` holds, over all rows, how often and by how much the
temperature lowered the test NLL and the ECE.

Writes ``benchmarks/results/temperature-<backend>-<cpus>core.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from benchmarks.provenance import ROOT, stamp

FIGURES = ("accuracy", "nll", "ece", "brier")


def row(name: str, before: dict, after: dict, temperature: float | None, source: str) -> dict:
    """One run's figures without and with the temperature, and the differences (after - before)."""
    return {
        "run": name,
        "source": source,
        "temperature": temperature,
        "ensemble": {f: before.get(f) for f in FIGURES},
        "ensemble_temperature_scaled": {f: after.get(f) for f in FIGURES},
        "delta_nll": after["nll"] - before["nll"],
        "delta_ece": after["ece"] - before["ece"],
    }


def train_rows(config: str | None, overrides: list[str], seeds: list[int]) -> list[dict]:
    """Train ``config`` once per seed with temperature scaling and return a :func:`row` each."""
    from ensemble_core import runs
    from ensemble_core.config import load_config

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            cfg = load_config(
                Path(config) if config else None,
                [*overrides, f"seed={seed}", "eval.temperature_scaling=true", 'eval.evaluators={"test":{}}'],
            )
            result = runs.run(cfg, Path(tmp) / "runs", f"seed{seed}")
            report = json.loads(result.run_dir.report_json.read_text())
            name = f"{Path(config).stem if config else 'default'} seed {seed}"
            out.append(
                row(name, report["ensemble"], report["ensemble_temperature_scaled"], report["temperature"], "trained")
            )
            print(json.dumps(out[-1]), flush=True)
    return out


def protocol_rows(paths: list[str]) -> list[dict]:
    """A :func:`row` for each literature-protocol result file made with temperature scaling."""
    out = []
    for p in paths:
        r = json.loads(Path(p).read_text())
        t = r["test"]
        if not t.get("ensemble_temperature_scaled"):
            raise SystemExit(f"{p} was made without eval.temperature_scaling; fix: pass a run made with it")
        out.append(row(r["run_name"], t["ensemble"], t["ensemble_temperature_scaled"], t.get("temperature"), p))
    return out


def summary(rows: list[dict]) -> dict:
    """How often and by how much the temperature lowered the test NLL and ECE."""
    n = len(rows)
    return {
        "runs": n,
        "nll_lower": sum(r["delta_nll"] < 0 for r in rows),
        "ece_lower": sum(r["delta_ece"] < 0 for r in rows),
        "mean_delta_nll": sum(r["delta_nll"] for r in rows) / n if n else None,
        "mean_delta_ece": sum(r["delta_ece"] for r in rows) / n if n else None,
        "max_delta_nll": max((r["delta_nll"] for r in rows), default=None),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=None, help="a config file (default: the built-in defaults)")
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds to train ('' for none)")
    parser.add_argument("--protocol", action="append", default=[], help="a literature-protocol result file")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    rows = train_rows(args.config, args.overrides, seeds) + protocol_rows(args.protocol)
    import jax

    out = Path(args.out or ROOT / f"benchmarks/results/temperature-{jax.default_backend()}-{os.cpu_count()}core.json")
    result = {
        **stamp(),
        "command": "python -m benchmarks.temperature " + " ".join(argv if argv is not None else sys.argv[1:]),
        "rows": rows,
        "summary": summary(rows),
    }
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"]))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
