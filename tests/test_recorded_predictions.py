"""The pipeline's predictions against predictions recorded before the redesign of issue 22.

A refactor (modules split, helpers merged, names changed) must not change what a config
computes. ``tests/data/recorded_predictions.npz`` holds, for three small configs that
between them cover the MLP and the CNN, several members per device and padding, the
validation split with best-epoch selection, a learning-rate schedule, label smoothing, a
hyperparameter search with greedy selection and temperature scaling, and the rotation and
MNIST-C evaluators: every member's test probabilities (``predictions.npz``), every
evaluator's arrays (``eval/<name>.npz``) and the report's headline figures, as the code
computed them before the redesign (commit 858e5e2). Each test runs the same config with
today's code (``runs.run``, no Prefect) and compares.

The recording was made on x86-64 with 8 simulated CPU devices. On that machine the
figures agree bit for bit; the tolerance (``ATOL``, absolute, on probabilities) admits
only the float rounding another CPU's XLA kernels may give. A changed member key, data
order, schedule or shift gives differences of order 0.1.

Re-record (only when a change is *meant* to change the numbers, and say so in the
commit): ``python -m tests.test_recorded_predictions``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

RECORDING = Path(__file__).parent / "data" / "recorded_predictions.npz"
ATOL = 1e-4  # probabilities; bit-for-bit on the recording machine

# name -> overrides on top of tests.ensembles.tiny_config (2 MLP members, 1 epoch, 256 digits;
# no calibration split, as when these were recorded).
CONFIGS: dict[str, tuple[str, ...]] = {
    "mlp_validation_shifts": (
        "data.validation_fraction=0.25",
        "train.epochs=2",
        "eval.evaluators=[test,rotation,corruptions]",
        "promotion.enabled=false",
    ),
    "cnn_padded_schedule": (
        "model.name=cnn",
        "ensemble.size=3",
        "ensemble.pad=true",
        "train.schedule=cosine",
        "train.label_smoothing=0.05",
        "data.max_test_examples=60",
        "promotion.enabled=false",
    ),
    "mlp_hyper_selection": (
        "ensemble.size=6",
        "ensemble.select_size=3",
        "ensemble.selection={replacement: true, bags: 0}",  # the greedy selection it was recorded with
        "ensemble.search.learning_rate={distribution: log_uniform, low: 0.02, high: 0.3}",
        "ensemble.search.schedule={distribution: choice, values: [constant, cosine]}",
        "data.validation_fraction=0.25",
        "train.epochs=2",
        "eval.temperature_scaling=true",
        "promotion.enabled=false",
    ),
}
FIGURES = ("accuracy", "nll", "brier", "ece")


def _compute(name: str, tfds_dir: str, out: Path) -> dict[str, np.ndarray]:
    """Run config ``name`` into ``out``; returns its arrays under ``<name>/<file>/<key>``."""
    from ensemble_core import runs
    from tests.ensembles import tiny_config

    result = runs.run(tiny_config(tfds_dir, *CONFIGS[name]), out, name)
    run = result.run_dir
    arrays: dict[str, np.ndarray] = {}
    files = [run.predictions, *sorted(run.eval_dir.glob("*.npz"))]
    for path in files:
        with np.load(path) as f:
            for key in f.files:
                arrays[f"{name}/{path.stem}/{key}"] = f[key]
    report = json.loads(run.report_json.read_text())
    arrays[f"{name}/report/ensemble"] = np.array([report["ensemble"][k] for k in FIGURES])
    return arrays


@pytest.fixture(scope="module")
def recording():
    with np.load(RECORDING) as f:
        return {k: f[k] for k in f.files}


@pytest.mark.slow  # three small trainings with shift evaluators: about 25 s of CPU
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_predictions_equal_the_recording_from_before_the_redesign(name, recording, tfds_dir, tmp_path):
    expected = {k: v for k, v in recording.items() if k.startswith(f"{name}/")}
    assert expected, f"{name} is not in {RECORDING.name}; re-record it"
    got = _compute(name, tfds_dir, tmp_path)
    # every recorded array is still computed; arrays added since (the class-level view's
    # example images in predictions.npz) are new keys, not changes
    assert set(expected) <= set(got)
    for key, want in expected.items():
        have = got[key]
        assert have.shape == want.shape and have.dtype == want.dtype, key
        if np.issubdtype(want.dtype, np.floating):
            np.testing.assert_allclose(have, want, rtol=0, atol=ATOL, err_msg=key)
        elif want.dtype == np.uint8:  # images of a shifted set: one grey level of rounding
            np.testing.assert_allclose(have.astype(int), want.astype(int), rtol=0, atol=1, err_msg=key)
        else:
            np.testing.assert_array_equal(have, want, err_msg=key)


def _record() -> None:
    """Write ``RECORDING`` from the code as it is now (a fresh TFDS dir and run dirs)."""
    import tempfile

    from ensemble_core import data

    with tempfile.TemporaryDirectory() as tmp:
        tfds_dir = str(Path(tmp) / "tfds")
        data.prepare(data.EMBEDDED, tfds_dir)
        arrays: dict[str, np.ndarray] = {}
        for name in sorted(CONFIGS):
            arrays.update(_compute(name, tfds_dir, Path(tmp) / "runs"))
    RECORDING.parent.mkdir(exist_ok=True)
    np.savez_compressed(RECORDING, **arrays)
    print(f"written: {RECORDING} ({len(arrays)} arrays)", file=sys.stderr)


if __name__ == "__main__":
    import os

    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    _record()
