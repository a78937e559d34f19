"""A hyper-deep ensemble's run SIGKILLed in its stratification stage and run again resumes
the stratified pool from its latest checkpoint: the same first selection, and bitwise the
same stratified pool, final selection and predictions as a run never interrupted."""

import json
import random
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from tests.ensembles import predictions
from tests.test_reliability import _finish, _proc

# make soak (make test: test_stratify.py's stratified pool stopped and resumed in one process,
# and test_reliability.py's SIGKILL of a training process)
pytestmark = [pytest.mark.slow, pytest.mark.soak]  # training processes killed and resumed

HYPER_DEEP = [
    "ensemble.search={learning_rate: {distribution: log_uniform, low: 0.02, high: 0.2}, "
    "label_smoothing: {distribution: uniform, low: 0.0, high: 0.1}}",
    "ensemble.select_size=2",
    "ensemble.first_selection={replacement: false}",  # two settings, four stratified members
    "ensemble.stratify=2",
    "train.patience=4",  # every member trains every epoch: the kill lands mid-training
]


def _committed(d: Path) -> list[int]:
    return sorted(int(c.name) for c in d.iterdir() if c.name.isdigit()) if d.is_dir() else []


def test_sigkill_in_the_stratification_stage_then_resume_is_bitwise_identical(tmp_path, tfds_dir):
    """The killed and resumed run against one never interrupted (module docstring).

    Why not shorter (1.5-2.5 min under load): three hyper-deep runs in processes (the
    reference, the killed one, its rerun), each a search, a first selection and a
    stratified pool of CNNs; the kill must land inside the stratified pool's training."""
    ref = tmp_path / "ref" / "run"
    rc, _, err = _finish(_proc(ref, tfds_dir, *HYPER_DEEP))
    assert rc == 0, err[-2000:]

    run = tmp_path / "killed" / "run"
    p = _proc(run, tfds_dir, *HYPER_DEEP)
    ckpts = run / "stratified" / "checkpoints"
    deadline = time.monotonic() + 300
    while not _committed(ckpts):  # the stratified pool's first checkpoint
        assert p.poll() is None, "the run ended before the stratified pool saved a checkpoint: " + p.stderr.read()
        assert time.monotonic() < deadline, "no stratified checkpoint after 300 s"
        time.sleep(0.05)
    time.sleep(random.uniform(0.0, 1.0))
    assert p.poll() is None, "the run ended before the kill"
    p.send_signal(signal.SIGKILL)
    p.wait()
    p.stdout.close()
    p.stderr.close()
    killed_at = _committed(ckpts)
    assert killed_at and killed_at[-1] < _committed(ref / "stratified" / "checkpoints")[-1]
    assert not (run / "predictions.npz").exists()  # killed before evaluation

    rc, _, err = _finish(_proc(run, tfds_dir, *HYPER_DEEP))
    assert rc == 0, err[-2000:]
    assert json.loads((run / "stratified" / "plan.json").read_text()) == json.loads(
        (ref / "stratified" / "plan.json").read_text()
    )
    meta = json.loads((run / "report.json").read_text())["stratification"]["checkpoint"]
    sessions = json.loads((run / "report.json").read_text())["stratification"]
    assert meta["step"] == _committed(ref / "stratified" / "checkpoints")[-1]
    assert sessions["pool"] and len(sessions["pool"]) == 4
    assert json.loads((run / "selection.json").read_text()) == json.loads((ref / "selection.json").read_text())
    got, want = predictions(run), predictions(ref)
    np.testing.assert_array_equal(got["member_probs"], want["member_probs"])
    with np.load(run / "eval" / "validation.npz") as a, np.load(ref / "eval" / "validation.npz") as b:
        np.testing.assert_array_equal(a["member_probs"], b["member_probs"])  # the whole stratified pool
