"""Every evaluator on 1- and 3-channel images of two sizes each (issue 41: evaluation for
any dataset), without training: the members are fixed random linear maps of the pixels, so
every figure can be recomputed here from the arrays the evaluator returns."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from scipy.ndimage import gaussian_filter
from sklearn.metrics import roc_auc_score

from ensemble_core import evaluators
from ensemble_core.config import EvaluatorSpec, PipelineConfig
from ensemble_core.data import DatasetInfo
from ensemble_core.evaluators import EvalContext, shift_base

SHAPES = [(28, 28, 1), (20, 36, 1), (32, 32, 3), (40, 24, 3)]
MEMBERS, CLASSES, N = 3, 4, 12
#: Every evaluator type that is not digits-only, with options that keep it small.
ANY = {
    "test": {},
    "rotation": {"degrees": [0, 45, 90], "selective_degrees": 45},
    "translation": {"pixels": [0, 3, 7]},
    "common_corruptions": {"num_examples": 6},
    "ood": {"source": "uniform_noise", "num_examples": 9},
    "ood_constant": {"type": "ood", "source": "constant", "num_examples": 9},
}
DIGITS_ONLY = ("corruptions", "letters", "fashion_mnist")


def _context(shape, tmp_path) -> EvalContext:
    rng = np.random.default_rng(sum(shape))
    smooth = gaussian_filter(rng.random((N, *shape)), sigma=(0, 2, 2, 0))
    images = np.round((smooth - smooth.min()) / np.ptp(smooth) * 255).astype(np.uint8)
    labels = (np.arange(N) % CLASSES).astype(np.int32)
    weights = rng.normal(size=(MEMBERS, int(np.prod(shape)), CLASSES)) / 30

    def logits(x):
        flat = np.asarray(x, np.float64).reshape(len(x), -1) / 255.0
        return np.einsum("nd,edc->enc", flat, weights).astype(np.float32)

    def predict(x):
        z = logits(x).astype(np.float64)
        p = np.exp(z - z.max(-1, keepdims=True))
        return (p / p.sum(-1, keepdims=True)).astype(np.float32), 1.0

    info = DatasetInfo(
        name="shapes", data_dir=str(tmp_path / "shapes" / "1.0.0"), num_classes=CLASSES, image_shape=shape,
        num_train=N, num_test=N,
    )  # fmt: skip
    return EvalContext(
        config=PipelineConfig.model_validate({"data": {"name": "shapes"}}),
        dataset=info,
        healthy=np.ones(MEMBERS, bool),
        predict=predict,
        load=lambda split: (images, labels),
        predict_split=lambda split: predict(images),
        cached=lambda key, build, shapes=None: build(),
        predict_logits=logits,
        predict_split_logits=lambda split: logits(images),
    )


def _run(ctx, name, options):
    spec = EvaluatorSpec.model_validate({"type": options.get("type", name), **options})
    module = evaluators.get(spec.type)
    return module, module.evaluate(ctx.for_evaluator(name, spec))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.slow  # over 1 CPU s with a warm compilation cache: make test-fast leaves it out (docs/development.md)
def test_every_evaluator_runs_on_this_geometry(shape, tmp_path, caplog):
    caplog.set_level("INFO", logger="ensemble_core")
    ctx = _context(shape, tmp_path)
    outputs = {}
    for name, options in ANY.items():
        module, out = _run(ctx, name, options)
        outputs[name] = out
        assert out.skipped is None, (name, out.skipped)
        probs = out.arrays["member_probs"]
        assert probs.dtype == np.float32 and probs.shape[0] == MEMBERS and probs.shape[2] == CLASSES
        if "level" in out.arrays:  # a shift: every level holds the test images, scored per level
            levels = out.metrics["levels"]
            per_level = options.get("num_examples", N)
            assert probs.shape[1] == len(out.arrays["labels"]) == len(levels) * per_level
            assert out.arrays["examples"].shape[2:] == shape
            for row in levels:
                at = out.arrays["level"] == np.float32(row["level"])
                ens = probs[:, at].astype(np.float64).mean(0)
                accuracy = np.mean(ens.argmax(-1) == out.arrays["labels"][at])
                assert row["ensemble"]["accuracy"] == pytest.approx(accuracy)
        elif "is_ood" in out.arrays:
            is_ood = out.arrays["is_ood"]
            assert out.metrics["num_ood"] == 9 and is_ood.sum() == 9 and out.arrays["examples"].shape[1:] == shape
            entropy = -np.sum(probs.mean(0) * np.log(probs.mean(0)), -1)
            assert out.metrics["ensemble"]["auroc"]["entropy"] == pytest.approx(roc_auc_score(is_ood, entropy))
        if shape == (32, 32, 3) and name in ("common_corruptions", "ood"):  # the new plots (the others: elsewhere)
            drawn = module.plot(out.metrics, out.arrays, tmp_path, ctx.config, name=name)
            assert drawn and all(p.stat().st_size > 2_000 for p in drawn.values())
    cc = outputs["common_corruptions"]
    # Progress: one line per corruption as it is generated (the flows send these to Prefect).
    progress = [r.getMessage() for r in caplog.records if "corrupting" in r.getMessage()]
    assert len(progress) == 15 and "with gaussian_noise (1/15" in progress[0]
    assert len(cc.metrics["levels"]) == 75 and len(cc.metrics["by_corruption"]) == 15
    # Severity 5 leaves the images further from the clean ones than severity 1 on average.
    examples = cc.arrays["examples"].astype(np.float64)  # [75, 6, H, W, C]
    clean = ctx.load("test")[0][shift_base.sample_indices(N, 6)].astype(np.float64)  # the cells' 6 of 12
    change = np.abs(examples - clean).reshape(15, 5, -1).mean(-1)
    assert (change[:, 4] > change[:, 0]).sum() >= 12


@pytest.mark.parametrize("shape", SHAPES[1:], ids=lambda s: "x".join(map(str, s)))
def test_the_digit_sets_are_skipped_elsewhere_in_one_line(shape, tmp_path):
    ctx = _context(shape, tmp_path)
    for name in DIGITS_ONLY:
        out = _run(ctx, name, {})[1]
        assert out.skipped and "\n" not in out.skipped and str(shape) in out.skipped


@pytest.mark.slow  # over 1 CPU s with a warm compilation cache: make test-fast leaves it out (docs/development.md)
def test_progress_lines_reach_prefects_handlers():
    """ensemble_core's INFO lines (the corruption progress above) reach Prefect's console
    handler once the flows' environment is applied (flows/environment.py): Prefect gives its extra
    loggers handlers but no level, so without the flows' setting they inherit WARNING."""
    code = (
        "import flows, logging\n"
        "from prefect.logging.configuration import setup_logging\n"
        "setup_logging()\n"
        "logging.getLogger('ensemble_core.evaluators.common_corruptions').info('corrupting 3 test images')\n"
    )
    env = {**os.environ, "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "INFO" in done.stdout + done.stderr and "corrupting 3 test images" in done.stdout + done.stderr
