"""The drift signal against plain NumPy recomputations: the pure figures
(:mod:`ensemble_core.drift`) and the champion's view of a new data snapshot
(:func:`ensemble_core.runs.detect_drift`), with a label distribution shifted on purpose and
one drawn like the champion's."""

from __future__ import annotations

import gzip
import json
import types
from pathlib import Path

import numpy as np
import pytest

from ensemble_core import data, drift, runs
from ensemble_core.config import load_config
from ensemble_core.runs.dataset import load
from tests._idx_export import write_export, write_mnist_export

# MARK: NumPy recomputations


def tv_numpy(new_counts, champion_counts) -> float:
    """0.5 * sum_c |p_c - q_c| with the shorter count list padded with zeros."""
    c = max(len(new_counts), len(champion_counts))
    p = np.zeros(c)
    q = np.zeros(c)
    p[: len(new_counts)] = new_counts
    q[: len(champion_counts)] = champion_counts
    p, q = p / p.sum(), q / q.sum()
    return 0.5 * float(np.sum(np.abs(p - q)))


def entropy_numpy(p: np.ndarray) -> np.ndarray:
    """-sum_c p log p over the last axis, 0 log 0 = 0, written out."""
    p = np.asarray(p, np.float64)
    logs = np.log(np.where(p > 0, p, 1.0))  # log 1 = 0 where p = 0
    return -np.sum(p * logs, axis=-1)


def uncertainty_numpy(member_probs: np.ndarray) -> tuple[float, float]:
    """Mean over examples of H(mean_e p_e) and of H(mean_e p_e) - mean_e H(p_e)."""
    p = np.asarray(member_probs, np.float64)
    total = entropy_numpy(p.mean(axis=0))
    aleatoric = np.mean([entropy_numpy(member) for member in p], axis=0)
    return float(total.mean()), float((total - aleatoric).mean())


def dirichlet_members(rng, e: int, n: int, c: int, zeros: bool = True) -> np.ndarray:
    probs = rng.dirichlet(np.full(c, 0.5), size=(e, n))
    if zeros:  # some exact zeros (a member sure a class is impossible), renormalised
        probs[rng.random(probs.shape) < 0.2] = 0.0
        probs[..., 0] += probs.sum(-1) == 0  # never an all-zero row
        probs /= probs.sum(-1, keepdims=True)
    return probs


# MARK: the pure figures


@pytest.mark.parametrize(
    "new, champion",
    [
        ([10, 20, 30], [30, 20, 10]),
        ([5, 5, 5, 5], [5, 5, 5, 5]),
        ([1, 0, 0], [0, 0, 7]),
        ([3, 4, 5, 6, 7], [3, 4, 5]),  # classes appeared
        ([8, 2], [1, 1, 1, 1]),  # classes disappeared
        ([0, 0, 9], [4]),
    ],
)
def test_label_shift_is_the_total_variation_of_the_class_frequencies(new, champion):
    out = drift.label_shift(new, champion)
    assert out["total_variation"] == pytest.approx(tv_numpy(new, champion), abs=1e-12)
    assert 0.0 <= out["total_variation"] <= 1.0
    c = max(len(new), len(champion))
    p = np.pad(np.asarray(new, float), (0, c - len(new)))
    q = np.pad(np.asarray(champion, float), (0, c - len(champion)))
    p, q = p / p.sum(), q / q.sum()
    assert len(out["new_frequencies"]) == len(out["champion_frequencies"]) == c
    np.testing.assert_allclose(out["new_frequencies"], p, atol=1e-6)
    np.testing.assert_allclose(out["champion_frequencies"], q, atol=1e-6)
    delta = p - q
    worst = out["largest_change"]
    assert abs(delta[worst["class"]]) == pytest.approx(np.abs(delta).max(), abs=1e-12)
    assert worst["delta"] == pytest.approx(delta[worst["class"]], abs=1e-6)


def test_label_shift_of_random_counts():
    rng = np.random.default_rng(3)
    for _ in range(50):
        new = rng.integers(0, 50, size=rng.integers(1, 12)).tolist()
        champion = rng.integers(0, 50, size=rng.integers(1, 12)).tolist()
        new[0] += 1
        champion[-1] += 1  # at least one example each
        out = drift.label_shift(new, champion)
        assert out["total_variation"] == pytest.approx(tv_numpy(new, champion), abs=1e-12)
        assert drift.label_shift(champion, new)["total_variation"] == pytest.approx(out["total_variation"], abs=1e-12)
    disjoint = drift.label_shift([4, 0], [0, 9])
    assert disjoint["total_variation"] == pytest.approx(1.0)
    assert disjoint["largest_change"]["delta"] in (1.0, -1.0)


@pytest.mark.parametrize(
    "new, champion",
    [([], [1, 2]), ([1, 2], []), ([0, 0, 0], [1, 2, 3]), ([1, 2, 3], [0, 0]), ([1, -1, 3], [1, 1, 1]), ([], [])],
)
def test_label_shift_refuses_bad_counts(new, champion):
    with pytest.raises(ValueError):
        drift.label_shift(new, champion)


@pytest.mark.parametrize("counts", [[], [0, 0], [2, -1], [[1, 2], [3, 4]]])
def test_class_frequencies_refuses_bad_counts(counts):
    with pytest.raises(ValueError):
        drift.class_frequencies(counts)


@pytest.mark.parametrize("zeros", [False, True])
def test_uncertainty_against_numpy(zeros):
    rng = np.random.default_rng(7)
    probs = dirichlet_members(rng, 5, 64, 10, zeros)
    if zeros:
        assert (probs == 0).any()
    out = drift.uncertainty(probs)
    entropy, mi = uncertainty_numpy(probs)
    assert out["examples"] == 64
    assert out["mean_predictive_entropy"] == pytest.approx(entropy, rel=1e-12)
    assert out["mean_mutual_information"] == pytest.approx(mi, rel=1e-10, abs=1e-12)
    assert out["mean_mutual_information"] >= 0.0


def test_uncertainty_of_agreeing_members_has_no_mutual_information():
    rng = np.random.default_rng(1)
    one = dirichlet_members(rng, 1, 20, 4)
    out = drift.uncertainty(np.repeat(one, 3, axis=0))
    assert out["mean_mutual_information"] == pytest.approx(0.0, abs=1e-12)
    assert out["mean_predictive_entropy"] == pytest.approx(uncertainty_numpy(one)[0], rel=1e-12)
    sure = np.zeros((2, 5, 3))
    sure[..., 1] = 1.0  # one-hot: 0 log 0 = 0, no NaN
    assert drift.uncertainty(sure) == {"mean_predictive_entropy": 0.0, "mean_mutual_information": 0.0, "examples": 5}


def test_uncertainty_shift_against_numpy():
    rng = np.random.default_rng(11)
    new, ref = dirichlet_members(rng, 4, 30, 10), dirichlet_members(rng, 4, 17, 10, zeros=False)
    out = drift.uncertainty_shift(new, ref)
    (h_new, mi_new), (h_ref, mi_ref) = uncertainty_numpy(new), uncertainty_numpy(ref)
    assert out["new"]["examples"] == 30 and out["reference"]["examples"] == 17
    assert out["new"]["mean_predictive_entropy"] == pytest.approx(h_new, rel=1e-12)
    assert out["reference"]["mean_mutual_information"] == pytest.approx(mi_ref, rel=1e-10)
    assert out["entropy_increase"] == pytest.approx(h_new - h_ref, rel=1e-9, abs=1e-12)
    assert out["mutual_information_increase"] == pytest.approx(mi_new - mi_ref, rel=1e-9, abs=1e-12)


FIGURES = {
    "label_shift": {"total_variation": 0.25},
    "uncertainty": {"entropy_increase": 0.5, "mutual_information_increase": -0.1},
}
NONE = {"label_shift_threshold": None, "entropy_threshold": None, "mutual_information_threshold": None}


def test_exceeded_needs_a_strictly_greater_figure():
    assert drift.exceeded(FIGURES, NONE) == []
    assert drift.exceeded(FIGURES, {}) == []
    # at the threshold: not exceeded; just below it: exceeded
    at = {"label_shift_threshold": 0.25, "entropy_threshold": 0.5, "mutual_information_threshold": -0.1}
    assert drift.exceeded(FIGURES, at) == []
    above = {"label_shift_threshold": 0.3, "entropy_threshold": 0.6, "mutual_information_threshold": 0.0}
    assert drift.exceeded(FIGURES, above) == []
    below = {"label_shift_threshold": 0.2, "entropy_threshold": 0.4, "mutual_information_threshold": -0.2}
    out = drift.exceeded(FIGURES, below)
    assert len(out) == 3
    assert "total variation" in out[0] and "label_shift_threshold" in out[0] and "0.2500" in out[0]
    assert "entropy" in out[1] and "nightly.drift.entropy_threshold" in out[1]
    assert "mutual information" in out[2] and "mutual_information_threshold" in out[2]
    only_labels = drift.exceeded(FIGURES, {**NONE, "label_shift_threshold": 0.1})
    assert len(only_labels) == 1 and "label_shift_threshold" in only_labels[0]


def test_exceeded_skips_figures_not_computed():
    thresholds = {"label_shift_threshold": 0.0, "entropy_threshold": 0.0, "mutual_information_threshold": 0.0}
    assert drift.exceeded({"label_shift": None, "uncertainty": None}, thresholds) == []
    assert drift.exceeded({}, thresholds) == []
    out = drift.exceeded({"label_shift": None, "uncertainty": FIGURES["uncertainty"]}, thresholds)
    assert len(out) == 1 and "entropy" in out[0]
    out = drift.exceeded({"label_shift": FIGURES["label_shift"]}, thresholds)
    assert len(out) == 1 and "total variation" in out[0]


# MARK: the champion's view of a new snapshot (one champion for the module)

MAX_EXAMPLES = 300  # below both the new training split (900) and the champion's test split (500)


def overrides(src: Path, tfds: Path, *extra: str) -> list[str]:
    return [
        "data.name=mnist",
        f"data.manual_dir={src}",
        f"data.data_dir={tfds}",
        "model.name=mlp",
        "model.hidden_sizes=[64]",
        "ensemble.size=4",
        "train.epochs=2",
        "train.batch_size=64",
        "nightly.when_unchanged=skip",
        "eval.evaluators=[test]",
        *extra,
    ]


def idx_labels(directory: Path, prefix: str = "train") -> np.ndarray:
    raw = gzip.decompress((directory / f"{prefix}-labels-idx1-ubyte.gz").read_bytes())
    return np.frombuffer(raw, np.uint8, offset=8).astype(np.int64)


@pytest.fixture(scope="module")
def champion(tmp_path_factory):
    """night1 trained on the first 1,000 training digits (test: the first 500 test digits)."""
    tmp = tmp_path_factory.mktemp("drift")
    src, tfds, out = tmp / "export", tmp / "tfds", tmp / "out"
    write_mnist_export(src, 1000, 500)
    result = runs.run(load_config(None, overrides(src, tfds)), out, "night1")
    assert result.promotion is not None and result.promotion.promoted
    record = json.loads((out / "champion.json").read_text())
    images, labels = data.read_mnist5k_csv()
    train_idx, test_idx = data.mnist5k_split_indices(labels)
    return types.SimpleNamespace(
        tmp=tmp,
        src=src,
        tfds=tfds,
        out=out,
        run_dir=result.run_dir.path,
        record=record,
        images=images,
        labels=labels,
        train_idx=train_idx,
        test_idx=test_idx,
    )


def new_export(champion, name: str, train_idx, test_idx, *extra: str):
    """Write an export of the given digits, prepare it, and return (cfg, dataset, src)."""
    src = champion.tmp / name
    write_export(
        src,
        champion.images[train_idx],
        champion.labels[train_idx],
        champion.images[test_idx],
        champion.labels[test_idx],
    )
    cfg = load_config(None, overrides(src, champion.tfds, f"nightly.drift.max_examples={MAX_EXAMPLES}", *extra))
    return cfg, runs.prepare(cfg.data), src


def expected_uncertainty(champion, cfg, dataset) -> tuple[dict, np.ndarray, np.ndarray]:
    """The champion's member probabilities on the first max_examples training images of the
    new snapshot and on its own snapshot's test images, each predicted on its own."""
    n = cfg.nightly.drift.max_examples
    new_images = load(cfg, dataset, "train")[0][:n]
    snap = champion.record["snapshot"]
    reference, _ = data.load_split(snap["name"], "test", snap["path"], n)
    new = runs.predict_images(champion.run_dir, new_images)["member_probs"]
    ref = runs.predict_images(champion.run_dir, reference)["member_probs"]
    (h_new, mi_new), (h_ref, mi_ref) = uncertainty_numpy(new), uncertainty_numpy(ref)
    figures = {
        "new": (h_new, mi_new, len(new_images)),
        "reference": (h_ref, mi_ref, len(reference)),
        "entropy_increase": h_new - h_ref,
        "mutual_information_increase": mi_new - mi_ref,
    }
    return figures, new_images, reference


def assert_uncertainty_matches(got: dict, want: dict) -> None:
    for side in ("new", "reference"):
        h, mi, n = want[side]
        assert got[side]["examples"] == n
        assert got[side]["mean_predictive_entropy"] == pytest.approx(h, rel=1e-5)
        assert got[side]["mean_mutual_information"] == pytest.approx(mi, rel=1e-4, abs=1e-6)
    assert got["entropy_increase"] == pytest.approx(want["entropy_increase"], rel=1e-4, abs=1e-5)
    assert got["mutual_information_increase"] == pytest.approx(want["mutual_information_increase"], rel=1e-4, abs=1e-5)


@pytest.mark.slow
def test_a_shifted_label_distribution_is_drift(champion):
    """Only the digits 0-4 (1,000 unseen ones), and another test split: the label shift is
    the total variation of the IDX labels, the uncertainty the champion's on the first
    max_examples training images against its own (not this snapshot's) test split."""
    pool = champion.train_idx[1000:]
    shifted = pool[champion.labels[pool] < 5][:1000]
    cfg, dataset, src = new_export(champion, "shifted", shifted, champion.test_idx[500:1000])
    report = runs.detect_drift(cfg, dataset, champion.out)

    assert report.champion_run == "night1"
    assert report.snapshot == dataset.snapshot.fingerprint != champion.record["snapshot"]["fingerprint"]
    assert report.champion_snapshot == champion.record["snapshot"]["fingerprint"]
    assert report.not_computed == []

    new_counts = np.bincount(idx_labels(src), minlength=10)
    old_counts = np.bincount(idx_labels(champion.src), minlength=10)
    assert new_counts[5:].sum() == 0 and old_counts.sum() == 1000
    tv = tv_numpy(new_counts, old_counts)
    assert tv > 0.4
    assert report.label_shift["total_variation"] == pytest.approx(tv, abs=1e-12)
    delta = new_counts / new_counts.sum() - old_counts / old_counts.sum()
    worst = report.label_shift["largest_change"]
    assert abs(delta[worst["class"]]) == pytest.approx(np.abs(delta).max(), abs=1e-12)
    assert worst["delta"] == pytest.approx(delta[worst["class"]], abs=1e-6)

    want, new_images, reference = expected_uncertainty(champion, cfg, dataset)
    assert len(new_images) == len(reference) == MAX_EXAMPLES
    assert_uncertainty_matches(report.uncertainty, want)

    assert report.drifted and report.exceeded
    assert any("total variation" in line and "label_shift_threshold 0.1" in line for line in report.exceeded)


@pytest.mark.slow
def test_an_export_drawn_like_the_champions_is_no_drift(champion):
    cfg, dataset, src = new_export(champion, "alike", champion.train_idx[1000:2000], champion.test_idx[:500])
    report = runs.detect_drift(cfg, dataset, champion.out)
    tv = tv_numpy(np.bincount(idx_labels(src), minlength=10), np.bincount(idx_labels(champion.src), minlength=10))
    assert report.label_shift["total_variation"] == pytest.approx(tv, abs=1e-12)
    assert tv < 0.1
    want, _, _ = expected_uncertainty(champion, cfg, dataset)
    assert_uncertainty_matches(report.uncertainty, want)
    assert report.not_computed == []
    assert report.exceeded == [] and not report.drifted


@pytest.mark.slow
def test_thresholds_of_the_config_apply(champion):
    """The same export with every threshold at 0: whatever figure is positive is exceeded."""
    cfg, dataset, _ = new_export(
        champion,
        "alike-strict",
        champion.train_idx[1000:2000],
        champion.test_idx[:500],
        "nightly.drift.label_shift_threshold=0",
        "nightly.drift.entropy_threshold=0",
        "nightly.drift.mutual_information_threshold=0",
    )
    report = runs.detect_drift(cfg, dataset, champion.out)
    figures = [
        report.label_shift["total_variation"],
        report.uncertainty["entropy_increase"],
        report.uncertainty["mutual_information_increase"],
    ]
    assert len(report.exceeded) == sum(v > 0 for v in figures)
    assert report.exceeded and report.drifted  # the total variation of two samples is > 0


@pytest.mark.slow
def test_without_its_snapshot_the_champion_is_measured_on_this_runs_test_split(champion):
    pool = champion.train_idx[1000:]
    shifted = pool[champion.labels[pool] < 5][:1000]
    cfg, dataset, _ = new_export(champion, "shifted-gone", shifted, champion.test_idx[500:1000])
    snap = Path(champion.record["snapshot"]["path"])
    aside = snap.with_name(snap.name + ".aside")
    snap.rename(aside)
    try:
        report = runs.detect_drift(cfg, dataset, champion.out)
    finally:
        aside.rename(snap)
    n = MAX_EXAMPLES
    probs = runs.predict_images(champion.run_dir, load(cfg, dataset, "test")[0][:n])["member_probs"]
    h_ref, mi_ref = uncertainty_numpy(probs)
    assert report.uncertainty["reference"]["mean_predictive_entropy"] == pytest.approx(h_ref, rel=1e-5)
    assert report.uncertainty["reference"]["mean_mutual_information"] == pytest.approx(mi_ref, rel=1e-4, abs=1e-6)
    assert report.label_shift is not None  # the counts come from the champion's record


@pytest.mark.slow
def test_no_champion_computes_nothing(champion, tmp_path):
    cfg = load_config(None, overrides(champion.src, champion.tfds))
    dataset = runs.prepare(cfg.data)
    report = runs.detect_drift(cfg, dataset, tmp_path / "empty")
    assert report.champion_run is None and report.champion_snapshot is None
    assert report.snapshot == dataset.snapshot.fingerprint
    assert report.label_shift is None and report.uncertainty is None
    assert report.not_computed == ["no champion in the output directory"]
    assert report.exceeded == [] and not report.drifted


@pytest.mark.slow
def test_drift_disabled_computes_nothing(champion):
    pool = champion.train_idx[1000:]
    shifted = pool[champion.labels[pool] < 5][:1000]
    cfg, dataset, _ = new_export(
        champion, "shifted-off", shifted, champion.test_idx[500:1000], "nightly.drift.enabled=false"
    )
    report = runs.detect_drift(cfg, dataset, champion.out)
    assert report.champion_run is None
    assert report.label_shift is None and report.uncertainty is None
    assert report.not_computed == ["nightly.drift.enabled=false"]
    assert report.exceeded == [] and not report.drifted


@pytest.mark.slow
def test_two_sample_drift_tests_against_the_champions_calibration_split(champion):
    """The select stage kept the champion's uncertainty on its calibration split; a new
    export is tested against it: the p-values are SciPy's on the same per-example
    figures; digits drawn like the champion's are not flagged, the same digits under heavy
    noise are, and with nightly.drift.test_alpha set that is data.drift."""
    import scipy.stats

    from ensemble_core import metrics
    from ensemble_core.drift_tests import DriftReference

    reference = DriftReference.from_dict(json.loads((champion.run_dir / "drift_reference.json").read_text()))
    assert reference.n == 100  # 10% of the champion's 1,000 training digits

    cfg, dataset, _ = new_export(champion, "alike-tests", champion.train_idx[1000:2000], champion.test_idx[:500])
    report = runs.detect_drift(cfg, dataset, champion.out)
    new = runs.predict_images(champion.run_dir, load(cfg, dataset, "train")[0][:MAX_EXAMPLES])["member_probs"]
    entropy = metrics.entropy(new.mean(0))
    want = scipy.stats.ks_2samp(np.asarray(reference.entropy), entropy).pvalue
    tests = report.tests["tests"]
    assert tests["predictive_entropy"]["p_value"] == pytest.approx(want, rel=1e-6)
    assert report.tests["n_new"] == MAX_EXAMPLES and not report.tests["drifted"]

    rng = np.random.default_rng(0)
    idx = champion.train_idx[1000:2000]
    noisy = np.clip(champion.images[idx].astype(np.int16) + rng.integers(-160, 160, champion.images[idx].shape), 0, 255)
    src = champion.tmp / "noisy"
    write_export(
        src,
        noisy.astype(np.uint8),
        champion.labels[idx],
        champion.images[champion.test_idx[:500]],
        champion.labels[champion.test_idx[:500]],
    )
    extra = (f"nightly.drift.max_examples={MAX_EXAMPLES}", "nightly.drift.test_alpha=0.01")
    cfg = load_config(None, overrides(src, champion.tfds, *extra))
    report = runs.detect_drift(cfg, runs.prepare(cfg.data), champion.out)
    assert report.tests["drifted"] and report.drifted
    assert any(line.startswith("two-sample drift tests") for line in report.exceeded)
