"""A training process for the reliability tests (run as ``python -m tests.train_proc``).

    python -m tests.train_proc RUN_DIR TFDS_DIR [--fsize-limit-after-epoch N BYTES] [KEY=VALUE ...]

Runs :func:`ensemble_core.runs.run` (no Prefect; promotion off), prints the training
summary as JSON on the last stdout line; an EnsembleError prints ``error: ...`` on
stderr and exits as the CLI does (2, or 75 when preempted).
"""

import os

from tests.xla_flags import xla_flags  # no JAX import

os.environ.setdefault("XLA_FLAGS", xla_flags(8))

import functools
import json
import resource
import signal
import sys
from pathlib import Path

from ensemble_core import runs
from ensemble_core.config import load_config
from ensemble_core.errors import EnsembleError, PreemptedError

BASE = [
    # 1,280 digits, 256 of them held out: members train on 1,024 (16 steps per epoch) and
    # validate after every epoch, so a kill also lands in the best-epoch bookkeeping
    "data.max_train_examples=1280",
    "data.validation_fraction=0.2",
    "data.calibration_fraction=0",  # no prediction sets: every other digit trains
    "train.patience=2",
    "data.max_test_examples=200",
    # A user's flax.nnx network named by class (Linear - BatchNorm - Dropout - Linear: BatchNorm
    # statistics and dropout in every checkpoint and resume) whose training steps wait 0.1 s
    # in a host callback: about 5 s of training after the first checkpoint for a kill to
    # land in, without the CPU seconds of a CNN
    "model.name=tests.user_models.paced_nets:PacedNnxNet",
    "model.options={hidden: 64, pause_s: 0.1}",
    "ensemble.size=4",
    "train.batch_size=64",
    "train.epochs=4",
    "checkpoint.keep=2",
    "promotion.enabled=false",
    "eval.evaluators=[test]",  # the shift/OOD evaluators are tested in test_evaluators.py
    "eval.plots=false",  # no test of a kill looks at figures (test_flow.py and test_evaluators.py do)
]


def main(argv: list[str]) -> int:
    run_dir, tfds_dir, *rest = argv
    limit = None
    if rest[:1] == ["--fsize-limit-after-epoch"]:
        limit = (int(rest[1]), int(rest[2]))
        rest = rest[3:]
    cfg = load_config(None, [*BASE, f"data.data_dir={tfds_dir}", *rest])

    def on_epoch(record: dict) -> None:
        print(json.dumps({"epoch_done": record["epoch"]}), flush=True)
        if limit and record["epoch"] == limit[0]:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit[1], limit[1]))

    run_path = Path(run_dir)
    stages = runs.Stages(train=functools.partial(runs.train, on_epoch=on_epoch))
    try:
        summary = runs.run(cfg, run_path.parent, run_path.name, stages).training
    except EnsembleError as err:
        print(f"error: {err}", file=sys.stderr)
        return 75 if isinstance(err, PreemptedError) else 2
    print(json.dumps(summary.model_dump(include={"checkpoint_step", "resumed_from", "diverged_members"})))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
