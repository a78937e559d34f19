"""Where the default run's time goes, cold and warm: every stage timed from outside.

    python -m benchmarks.stage_timings                       # this checkout, warm then cold
    python -m benchmarks.stage_timings --modes warm --label after
    git worktree add /tmp/before <commit>
    python -m benchmarks.stage_timings --checkout /tmp/before --label before

Runs :func:`ensemble_core.runs.run` on ``configs/default.yaml`` (no Prefect: the stages
as the library runs them) in a fresh process per measurement, with every stage of
:class:`ensemble_core.runs.Stages` wrapped in a timer from outside, so a checkout older
than ``report.json -> timing.stages`` is measured the same way (``--checkout``: that
directory's code, imported through ``PYTHONPATH``, run from that directory). Records per
run: the wall time of ``runs.run`` measured around it, each stage's seconds, the optimizer
steps' seconds (``TrainingSummary.timing.train_seconds``), ``not_training_steps_fraction``
= 1 - steps / wall, the run's own ``report.json -> timing`` where the checkout writes
one (its training and evaluation parts), and ``compile_seconds_by_stage``: JAX's compile
events (tracing, lowering, backend compile; :data:`COMPILE_EVENTS`) summed per stage, so a
stage that compiles where it should not shows it.

Modes: ``warm`` uses this user's caches as a nightly rerun finds them (the TFDS data dir,
the derived-set cache and JAX's persistent compilation cache; run the default config once
before, e.g. ``make run``); ``cold`` points ``TFDS_DATA_DIR`` and
``JAX_COMPILATION_CACHE_DIR`` at fresh empty directories, so the dataset is prepared, the
shifted and OOD sets generated and every program compiled within the run. The 1-minute
load average before and after each run is kept: other jobs on the cores slow it.

Writes ``benchmarks/results/stage-timings-<backend>-<cpus>core.json`` (or ``--out``): a
run with the same label and mode replaces the file's earlier one, others are kept.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("warm", "cold")


#: JAX's compile events (jax._src.dispatch): tracing, lowering to MLIR, the backend's
#: compile (or, with a warm persistent cache, its retrieval), in seconds each.
COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)


def timed_stages(seconds: dict, current: list[str] | None = None):
    """:class:`ensemble_core.runs.Stages` whose every stage adds its wall time to
    ``seconds`` (by field name), timed from outside the stage; ``current[0]``, where given,
    names the stage running (``"outside the stages"`` between them)."""
    import dataclasses
    import time

    from ensemble_core import runs

    def timed(name, fn):
        def call(*args, **kwargs):
            t0 = time.perf_counter()
            if current is not None:
                current[0] = name
            try:
                return fn(*args, **kwargs)
            finally:
                seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - t0
                if current is not None:
                    current[0] = "outside the stages"

        return call

    base = runs.Stages()
    return runs.Stages(**{f.name: timed(f.name, getattr(base, f.name)) for f in dataclasses.fields(base)})


def worker(mode: str, overrides: list[str]) -> dict:
    """One measurement in this process (``--worker``): see the module docstring."""
    import importlib
    import time

    if mode == "cold":
        fresh = tempfile.mkdtemp(prefix="stage-timings-cold-")
        os.environ["TFDS_DATA_DIR"] = f"{fresh}/tfds"
        os.environ["JAX_COMPILATION_CACHE_DIR"] = f"{fresh}/jax"
    started = time.perf_counter()
    importlib.import_module("flows.environment")  # device layout and caches, as the flows set them: before JAX
    import jax

    from ensemble_core import runs
    from ensemble_core.config import load_config

    cfg = load_config("configs/default.yaml", overrides)
    outside: dict[str, float] = {}
    current = ["outside the stages"]
    compile_seconds: dict[str, dict[str, float]] = {}

    def on_duration(event: str, duration_secs: float, **_: str | int) -> None:
        # every thread's compiles, counted against the stage running when they end
        if event in COMPILE_EVENTS:
            per_stage = compile_seconds.setdefault(current[0], {})
            key = event.rsplit("/", 1)[-1]
            per_stage[key] = per_stage.get(key, 0.0) + duration_secs

    jax.monitoring.register_event_duration_secs_listener(on_duration)
    stages = timed_stages(outside, current)
    out = tempfile.mkdtemp(prefix="stage-timings-out-")
    imported = time.perf_counter() - started
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    result = runs.run(cfg, out, "timed", stages)
    wall = time.perf_counter() - t0
    report = json.loads((Path(result.run_dir.path) / "report.json").read_text())
    assert result.training is not None  # a fresh output directory: never skipped
    steps = result.training.timing.train_seconds
    test = report["ensemble"]
    return {
        "mode": mode,
        "overrides": overrides,
        "import_seconds": imported,
        "wall_seconds": wall,
        "stages_outside": outside,
        "compile_seconds_by_stage": compile_seconds,
        "training_steps_seconds": steps,
        "not_training_steps_fraction": 1 - steps / wall,
        "train_member_images_per_s": result.training.timing.train_member_images_per_s,
        "timing": report["timing"],  # with timing.stages where the checkout writes them
        "ensemble": {"accuracy": test["accuracy"], "nll": test["nll"]},
        "load_average_1min": {"before": load_before, "after": os.getloadavg()[0]},
    }


def measure(checkout: Path, mode: str, overrides: list[str]) -> dict:
    """:func:`worker` in a fresh process running ``checkout``'s code."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--mode", mode]
    cmd += [arg for o in overrides for arg in ("--set", o)]
    proc = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"error: {' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stage_timings", description=__doc__.split("\n")[0])
    parser.add_argument("--checkout", type=Path, default=ROOT, help="the code to measure (default: this one)")
    parser.add_argument("--label", default="after", help="the name of these runs in the result file")
    parser.add_argument("--modes", default="warm,cold", help="comma-separated: warm, cold")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", type=Path, help="result file (default: benchmarks/results/stage-timings-...)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.mode, args.overrides)))
        return 0
    sys.path.insert(0, str(ROOT))
    from benchmarks.provenance import stamp

    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--modes takes {', '.join(MODES)}, comma-separated; got {args.modes!r}")
    commit = subprocess.run(
        ["git", "describe", "--always", "--dirty"], cwd=args.checkout, capture_output=True, text=True
    ).stdout.strip()
    out = args.out or ROOT / "benchmarks" / "results" / f"stage-timings-cpu-{os.cpu_count()}core.json"
    data = json.loads(out.read_text()) if out.exists() else {"runs": []}
    for mode in modes:
        row = {"label": args.label, "checkout_commit": commit, **measure(args.checkout, mode, args.overrides)}
        print(
            f"{args.label} {mode}: run {row['wall_seconds']:.1f} s, optimizer steps "
            f"{row['training_steps_seconds']:.1f} s, not training steps {row['not_training_steps_fraction']:.0%}; "
            + ", ".join(f"{k} {v:.1f} s" for k, v in row["stages_outside"].items() if v >= 0.05),
            flush=True,
        )
        data["runs"] = [r for r in data["runs"] if (r["label"], r["mode"]) != (args.label, mode)] + [row]
    data.update(command="python -m benchmarks.stage_timings", **stamp())
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
