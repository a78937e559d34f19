"""A user's own networks through the command line: a Flax-examples-style ResNet (BatchNorm
with ``axis_name='batch'``, dropout before the head) written as Flax NNX and as Linen,
trained on the embedded MNIST subset by ``flows.train_ensemble``, killed and resumed.

    python -m benchmarks.user_networks    # --out benchmarks/results/user-networks-cpu-2core.json

The networks are ``tests.user_models.flax_resnets:NnxResNet`` and ``:SmallLinenResNet``, the
same ResNet (5,442 parameters) in the two APIs, named by class path with no options. For
each, in subprocesses of the CLI (``python -m flows.train_ensemble --set ...``), each with
its own temporary Prefect server:

1. a reference run, uninterrupted (its own output directory and an empty JAX compilation
   cache, so its compile is cold): wall seconds, ensemble test accuracy and NLL
   (``report.json``: ``ensemble.accuracy``, ``ensemble.nll``);
2. the same config under another run name (and output directory, so that the reference is
   not its champion), SIGKILLed ``--kill-delay`` seconds after its first committed
   checkpoint (a directory named by its step under ``<run>/checkpoints/``) while it trains
   on, then the same command again, which resumes from the latest checkpoint: the step and
   epoch it resumed from (``report.json``: ``training_sessions``, ``resumed_from_epoch``),
   and whether its ``predictions.npz`` ``member_probs`` equal the reference's bitwise
   (``np.array_equal``), with the largest absolute difference.

Writes JSON (``--out``) and prints one line per network.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.provenance import ROOT, stamp

NETWORKS = {
    "nnx": "tests.user_models.flax_resnets:NnxResNet",
    "linen": "tests.user_models.flax_resnets:SmallLinenResNet",
}
RUN_TIMEOUT_S = 600


def _command(model: str, args: argparse.Namespace, output_dir: Path, run_name: str) -> list[str]:
    sets = [
        f"model.name={model}",
        f"ensemble.size={args.size}",
        f"train.epochs={args.epochs}",
        f"train.batch_size={args.batch_size}",
        f"eval.evaluators={args.evaluators}",
        "checkpoint.every_epochs=1",
    ]
    if args.max_train_examples is not None:
        sets.append(f"data.max_train_examples={args.max_train_examples}")
    return [
        sys.executable,
        "-m",
        "flows.train_ensemble",
        *(a for s in sets for a in ("--set", s)),
        "--output-dir",
        str(output_dir),
        "--run-name",
        run_name,
    ]


def _start(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with log.open("a") as err:  # the child holds its own descriptor
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err, text=True)


def _finish(p: subprocess.Popen, run_name: str, log: Path) -> Path:
    """The run directory (the CLI's last stdout line) of a run that must succeed."""
    out, _ = p.communicate(timeout=RUN_TIMEOUT_S)
    if p.returncode != 0:
        raise RuntimeError(f"run {run_name} exited {p.returncode}: {log.read_text()[-3000:]}")
    return Path(out.strip().splitlines()[-1])


def _committed(checkpoints: Path) -> list[int]:
    """Steps of the committed checkpoints (orbax names a committed one by its step)."""
    if not checkpoints.is_dir():
        return []
    return sorted(int(d.name) for d in checkpoints.iterdir() if d.name.isdigit())


def _kill_after_first_checkpoint(p: subprocess.Popen, run_dir: Path, delay: float, timeout: float = 300.0) -> dict:
    deadline = time.monotonic() + timeout
    while not _committed(run_dir / "checkpoints"):
        if p.poll() is not None:
            raise RuntimeError("the run ended before its first committed checkpoint")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no committed checkpoint under {run_dir} after {timeout} s")
        time.sleep(0.02)
    first = _committed(run_dir / "checkpoints")
    time.sleep(delay)
    if p.poll() is not None:
        raise RuntimeError(f"the run ended within {delay} s of its first checkpoint: lower --kill-delay")
    at_kill = _committed(run_dir / "checkpoints")
    p.send_signal(signal.SIGKILL)
    p.wait()
    return {"first_checkpoint_step": first[0], "checkpoints_at_kill": at_kill, "killed_rc": p.returncode}


def measure(name: str, model: str, args: argparse.Namespace, tmp: Path) -> dict:
    cache = tmp / f"{name}-jax-cache"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_COMPILATION_CACHE_DIR"] = str(cache)  # empty: the reference compiles cold
    log = tmp / f"{name}.log"

    ref_cmd = _command(model, args, tmp / f"{name}-reference", "reference")
    t0 = time.perf_counter()
    ref_dir = _finish(_start(ref_cmd, env, log), "reference", log)
    seconds = time.perf_counter() - t0
    ref_report = json.loads((ref_dir / "report.json").read_text())
    final_step = ref_report["checkpoint"]["step"]

    cmd = _command(model, args, tmp / f"{name}-killed", "killed")
    run_dir = tmp / f"{name}-killed" / "killed"
    kill = _kill_after_first_checkpoint(_start(cmd, env, log), run_dir, args.kill_delay)
    if kill["checkpoints_at_kill"][-1] >= final_step:
        raise RuntimeError(f"killed after the last checkpoint (step {final_step}): not mid-training")
    t0 = time.perf_counter()
    resumed_dir = _finish(_start(cmd, env, log), "killed", log)
    resume_seconds = time.perf_counter() - t0
    report = json.loads((resumed_dir / "report.json").read_text())

    want = np.load(ref_dir / "predictions.npz")["member_probs"]
    got = np.load(resumed_dir / "predictions.npz")["member_probs"]
    same_shape = got.shape == want.shape
    sessions = report["training_sessions"]
    return {
        "network": name,
        "model": model,
        "reference": {
            "seconds": round(seconds, 1),
            "accuracy": ref_report["ensemble"]["accuracy"],
            "nll": ref_report["ensemble"]["nll"],
            "member_mean_accuracy": ref_report["member_mean"]["accuracy"],
            "compile_seconds": round(ref_report["timing"]["compile_seconds"], 2),
            "train_seconds": round(ref_report["timing"]["train_seconds"], 2),
            "final_step": final_step,
            "training_sessions": len(ref_report["training_sessions"]),
        },
        "resumed": {
            **kill,
            "seconds": round(resume_seconds, 1),
            "resumed_from_step": sessions[-1]["start_step"],
            "resumed_from_epoch": report["resumed_from_epoch"],
            "training_sessions": len(sessions),
            "accuracy": report["ensemble"]["accuracy"],
            "nll": report["ensemble"]["nll"],
        },
        "member_probs_shape": list(want.shape),
        "bitwise_equal": bool(same_shape and np.array_equal(got, want)),
        "max_abs_diff": float(np.abs(got - want).max()) if same_shape else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--networks", default=",".join(NETWORKS), help=f"a subset of {','.join(NETWORKS)}")
    parser.add_argument("--size", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--max-train-examples", type=int, default=None)
    parser.add_argument("--evaluators", default="[test]", help="eval.evaluators (default: [test] only)")
    parser.add_argument("--kill-delay", type=float, default=0.5, help="seconds after the first checkpoint")
    parser.add_argument("--keep", help="keep the runs and logs in this directory (default: a removed temp dir)")
    parser.add_argument("--out", default="benchmarks/results/user-networks-cpu-2core.json")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.networks.split(",") if n.strip()]
    if unknown := set(names) - set(NETWORKS):
        parser.error(f"unknown --networks {sorted(unknown)}; choose from {list(NETWORKS)}")

    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="ensemble-user-networks-"))
    tmp.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        for name in names:
            rows.append(measure(name, NETWORKS[name], args, tmp))
            r = rows[-1]
            print(
                f"{name}: accuracy {r['reference']['accuracy']:.4f} nll {r['reference']['nll']:.4f} "
                f"in {r['reference']['seconds']} s; killed at checkpoints {r['resumed']['checkpoints_at_kill']}, "
                f"resumed from step {r['resumed']['resumed_from_step']}: bitwise {r['bitwise_equal']} "
                f"(max |diff| {r['max_abs_diff']})",
                flush=True,
            )
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    result = {
        **stamp(),
        "data": "mnist5k (embedded MNIST subset)",
        "config": {
            "ensemble.size": args.size,
            "train.epochs": args.epochs,
            "train.batch_size": args.batch_size,
            "data.max_train_examples": args.max_train_examples,
            "eval.evaluators": args.evaluators,
            "checkpoint.every_epochs": 1,
        },
        "kill_delay_s": args.kill_delay,
        "compile_cache": "an empty JAX compilation cache per network: the reference compiles cold",
        "command": "python -m benchmarks.user_networks " + " ".join(sys.argv[1:] if argv is None else argv),
        "all_bitwise_equal": all(r["bitwise_equal"] for r in rows),
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(args.out)
    return 0 if result["all_bitwise_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
