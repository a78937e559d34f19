"""Retraining against the champion, three nights of exports through :func:`ensemble_core.runs.run`:
a new export trains and is compared with the champion re-evaluated on its test split (against
a NumPy recomputation), an unchanged night is skipped (snapshot AND config), a resumed run
never is, and every trained run records its data snapshot."""

from __future__ import annotations

import gzip
import json
import shutil
import types
from pathlib import Path

import numpy as np
import pytest

from ensemble_core import runs
from ensemble_core.config import load_config
from ensemble_core.runs.champion.retraining import training_identity
from ensemble_core.runs.dataset import load
from tests._idx_export import write_mnist_export

BASE = [
    "data.name=mnist",
    "model.name=mlp",
    "model.hidden_sizes=[64]",
    "ensemble.size=4",
    "train.epochs=2",
    "train.batch_size=64",
    "nightly.when_unchanged=skip",
    "eval.evaluators=[test]",
]


def idx_labels(directory: Path, prefix: str) -> np.ndarray:
    raw = gzip.decompress((directory / f"{prefix}-labels-idx1-ubyte.gz").read_bytes())
    return np.frombuffer(raw, np.uint8, offset=8).astype(np.int64)


def report_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "report.json").read_text())


def ensemble_nll(member_probs: np.ndarray, labels: np.ndarray) -> float:
    """-mean_n log(mean_e p_e[n, y_n]), in float64."""
    mean = np.asarray(member_probs, np.float64).mean(axis=0)
    return float(-np.mean(np.log(mean[np.arange(len(labels)), labels])))


@pytest.fixture(scope="module")
def nights(tmp_path_factory):
    """night1: the first 1,000 training digits (500 test); night2: 3,000 (600 test, so the
    champion must be measured on a test split it was never measured on); night3: the same
    export again with nightly.when_unchanged=skip."""
    tmp = tmp_path_factory.mktemp("nights")
    src, tfds, out = tmp / "export", tmp / "tfds", tmp / "out"

    def cfg(*extra: str, manual_dir: Path = src, data_dir: Path = tfds):
        return load_config(None, [*BASE, f"data.manual_dir={manual_dir}", f"data.data_dir={data_dir}", *extra])

    write_mnist_export(src, 1000, 500)
    night1 = runs.run(cfg(), out, "night1")
    train1 = idx_labels(src, "train")
    write_mnist_export(src, 3000, 600)
    night2 = runs.run(cfg(), out, "night2")
    champion_after_night2 = (out / "champion.json").read_bytes()
    history_after_night2 = (out / "history.jsonl").read_bytes()
    night3 = runs.run(cfg(), out, "night3")
    return types.SimpleNamespace(
        tmp=tmp,
        src=src,
        tfds=tfds,
        out=out,
        cfg=cfg,
        night1=night1,
        night2=night2,
        night3=night3,
        train1=train1,
        champion_after_night2=champion_after_night2,
        history_after_night2=history_after_night2,
    )


@pytest.fixture
def state(nights):
    """The champion state after night 2, restored after the test (tests that train promote)."""
    out = nights.out
    assert (out / "champion.json").read_bytes() == nights.champion_after_night2
    yield nights
    (out / "champion.json").write_bytes(nights.champion_after_night2)
    (out / "history.jsonl").write_bytes(nights.history_after_night2)


def fingerprints(nights) -> tuple[str, str]:
    return (
        report_of(nights.night1.run_dir.path)["data_snapshot"]["fingerprint"],
        report_of(nights.night2.run_dir.path)["data_snapshot"]["fingerprint"],
    )


# MARK: night 2: a new export


@pytest.mark.slow
def test_night2_trains_on_the_new_export(nights):
    r2 = nights.night2
    assert r2.skipped is None and r2.training is not None and r2.promotion is not None
    snap = report_of(r2.run_dir.path)["data_snapshot"]
    assert snap["splits"]["train"] == 3000 and snap["splits"]["test"] == 600
    assert snap["class_counts"]["train"] == np.bincount(idx_labels(nights.src, "train"), minlength=10).tolist()
    assert snap["class_counts"]["test"] == np.bincount(idx_labels(nights.src, "t10k"), minlength=10).tolist()
    fp1, fp2 = fingerprints(nights)
    assert fp1 != fp2
    assert report_of(nights.night1.run_dir.path)["data_snapshot"]["splits"]["train"] == 1000

    record = json.loads((nights.out / "champion.json").read_text())
    assert record["run_name"] == "night2"
    assert record["snapshot"] == snap
    assert record["config"] == nights.cfg().model_dump(mode="json")


@pytest.mark.slow
def test_night2_drift_is_computed_against_night1(nights):
    fp1, fp2 = fingerprints(nights)
    d = nights.night2.drift
    assert d is not None and d.champion_run == "night1"
    assert (d.snapshot, d.champion_snapshot) == (fp2, fp1)
    p = np.bincount(idx_labels(nights.src, "train"), minlength=10) / 3000
    q = np.bincount(nights.train1, minlength=10) / 1000
    assert d.label_shift["total_variation"] == pytest.approx(0.5 * np.abs(p - q).sum(), abs=1e-12)
    assert d.uncertainty is not None and d.not_computed == []
    # the first max_examples (2,000) of the 2,700 training digits; the champion's 500 test digits
    assert d.uncertainty["new"]["examples"] == 2000 and d.uncertainty["reference"]["examples"] == 500
    assert report_of(nights.night2.run_dir.path)["drift"] == {**d.model_dump(mode="json"), "drifted": d.drifted}
    assert nights.night1.drift is not None and nights.night1.drift.champion_run is None


@pytest.mark.slow
def test_the_champion_is_measured_on_night2s_test_split(nights):
    """The champion's NLL in night 2's decision: night 1's ensemble (every healthy member,
    the mean of their probabilities, no temperature) on night 2's test split."""
    r1, r2 = nights.night1, nights.night2
    cfg = nights.cfg()
    dataset = runs.prepare(cfg.data)
    assert dataset.snapshot.fingerprint == r2.promotion.challenger_snapshot
    images, labels = load(cfg, dataset, "test")
    assert len(labels) == 600
    np.testing.assert_array_equal(np.sort(labels), np.sort(idx_labels(nights.src, "t10k")))
    pred = runs.predict_images(r1.run_dir.path, images)
    assert len(pred["members"]) == 4 and np.isnan(pred["temperature"])
    want = ensemble_nll(pred["member_probs"], labels)

    decision = r2.promotion
    assert decision.champion_run == "night1" and decision.metric == "nll"
    assert decision.champion_figure == pytest.approx(want, rel=1e-5)
    assert decision.champion["nll"] == pytest.approx(want, rel=1e-5)
    # not the figure night 1 recorded on its own 500 test digits
    assert decision.champion_figure != pytest.approx(r1.evaluation.ensemble["nll"], rel=1e-6)

    # the challenger on the same split, recomputed the same way
    mine = runs.predict_images(r2.run_dir.path, images)["member_probs"]
    assert decision.challenger_figure == pytest.approx(ensemble_nll(mine, labels), rel=1e-5)
    assert decision.challenger_figure == pytest.approx(r2.evaluation.ensemble["nll"], rel=1e-12)

    fp1, fp2 = fingerprints(nights)
    assert (decision.challenger_snapshot, decision.champion_snapshot) == (fp2, fp1)
    assert "different data snapshots" in decision.reason
    assert fp1 in decision.reason and fp2 in decision.reason
    assert decision.promoted  # 3,000 digits against 1,000


# MARK: night 3: nothing new


@pytest.mark.slow
def test_an_unchanged_night_is_skipped(nights):
    r3 = nights.night3
    _, fp2 = fingerprints(nights)
    assert r3.skipped is not None
    assert r3.skipped.champion_run == "night2" and r3.skipped.fingerprint == fp2
    assert Path(r3.skipped.champion_run_dir) == nights.night2.run_dir.path.absolute()
    assert "skipped" in r3.skipped.reason and fp2 in r3.skipped.reason and "\n" not in r3.skipped.reason
    assert (r3.training, r3.evaluation, r3.promotion, r3.drift) == (None, None, None, None)
    assert r3.run_dir.path.absolute() == nights.night2.run_dir.path.absolute()
    assert not (nights.out / "night3").exists()
    assert (nights.out / "champion.json").read_bytes() == nights.champion_after_night2
    assert (nights.out / "history.jsonl").read_bytes() == nights.history_after_night2
    rows = [json.loads(line) for line in nights.history_after_night2.decode().splitlines() if line.strip()]
    assert [row["run_name"] for row in rows] == ["night1", "night2"]


@pytest.mark.slow  # over 1 CPU s with a warm compilation cache: make test-fast leaves it out (docs/development.md)
def test_when_unchanged_train_trains_the_same_night(state):
    cfg = state.cfg("nightly.when_unchanged=train")
    r = runs.run(cfg, state.out, "night3-train")
    run_dir = state.out / "night3-train"
    assert r.skipped is None and r.training is not None
    assert (run_dir / "report.json").is_file() and (run_dir / "data_snapshot.json").is_file()
    # the same snapshot: the champion's own figure, no re-evaluation, the label shift 0
    assert "different data snapshots" not in r.promotion.reason
    assert r.promotion.champion_figure == pytest.approx(state.night2.evaluation.ensemble["nll"], rel=1e-12)
    assert r.drift.label_shift["total_variation"] == 0.0


@pytest.mark.slow  # over 1 CPU s with a warm compilation cache: make test-fast leaves it out (docs/development.md)
def test_a_changed_training_key_trains(state):
    cfg = state.cfg("seed=1")
    r = runs.run(cfg, state.out, "night3-seed1")
    assert r.skipped is None and r.training is not None
    assert (state.out / "night3-seed1" / "report.json").is_file()
    rows = [json.loads(line) for line in (state.out / "history.jsonl").read_text().splitlines() if line.strip()]
    assert rows[-1]["run_name"] == "night3-seed1"


@pytest.mark.slow
@pytest.mark.parametrize(
    "change",
    [
        "train.epochs=3",
        "train.learning_rate=0.05",
        "model.hidden_sizes=[32]",
        "data.max_train_examples=2000",
        "eval.ece_bins=10",
    ],
)
def test_any_training_key_makes_a_night_changed(nights, change):
    cfg = nights.cfg(change)
    assert training_identity(cfg.model_dump(mode="json")) != training_identity(nights.cfg().model_dump(mode="json"))
    assert runs.unchanged_since_champion(cfg, runs.prepare(cfg.data), nights.out) is None
    assert runs.unchanged_since_champion(nights.cfg(), runs.prepare(cfg.data), nights.out) is not None


@pytest.mark.parametrize(
    "change",
    [
        "retention.keep_last_runs=5",
        "nightly.drift.max_examples=100",
        "nightly.drift.enabled=false",
        "data_dir",
        "manual_dir",
    ],
)
def test_a_change_outside_the_training_identity_skips(state, change, tmp_path):
    extra, kwargs = [change], {}
    if change == "data_dir":  # another TFDS root: prepared again there, the same content fingerprint
        extra, kwargs = [], {"data_dir": tmp_path / "tfds"}
    elif change == "manual_dir":  # the same bytes elsewhere
        shutil.copytree(state.src, tmp_path / "copy")
        extra, kwargs = [], {"manual_dir": tmp_path / "copy"}
    cfg = state.cfg(*extra, **kwargs)
    assert training_identity(cfg.model_dump(mode="json")) == training_identity(state.cfg().model_dump(mode="json"))
    r = runs.run(cfg, state.out, "night3-same")
    assert r.skipped is not None and r.skipped.champion_run == "night2"
    assert r.training is None and not (state.out / "night3-same").exists()
    assert (state.out / "champion.json").read_bytes() == state.champion_after_night2
    assert (state.out / "history.jsonl").read_bytes() == state.history_after_night2


@pytest.mark.slow
def test_a_champion_record_without_a_snapshot_trains(state):
    """A champion.json written by an older release (no "snapshot"): nothing to compare with."""
    path = state.out / "champion.json"
    record = json.loads(path.read_text())
    del record["snapshot"]
    path.write_text(json.dumps(record, indent=2))
    cfg = state.cfg()
    assert runs.unchanged_since_champion(cfg, runs.prepare(cfg.data), state.out) is None
    r = runs.run(cfg, state.out, "night3-older")
    assert r.skipped is None and r.training is not None
    assert (state.out / "night3-older" / "report.json").is_file()
    assert any("older release" in line for line in r.drift.not_computed)
    assert r.drift.label_shift is None and r.drift.uncertainty is not None
    assert "champion unknown" in r.promotion.reason  # re-evaluated on this run's test split


def test_the_champions_config_is_compared_with_todays_defaults(state):
    """A champion promoted by a night with when_unchanged=train, or by a release before the
    nightly and retention sections: the same training config, skipped; a champion config
    today's schema refuses: not the same config, trained."""
    path = state.out / "champion.json"
    record = json.loads(path.read_text())
    cfg = state.cfg()
    dataset = runs.prepare(cfg.data)
    record["config"]["nightly"]["when_unchanged"] = "train"
    path.write_text(json.dumps(record))
    assert runs.unchanged_since_champion(cfg, dataset, state.out) is not None
    del record["config"]["nightly"], record["config"]["retention"]
    path.write_text(json.dumps(record))
    assert runs.unchanged_since_champion(cfg, dataset, state.out) is not None
    record["config"]["train"]["no_such_key"] = 1
    path.write_text(json.dumps(record))
    assert runs.unchanged_since_champion(cfg, dataset, state.out) is None


@pytest.mark.slow  # over 1 CPU s with a warm compilation cache: make test-fast leaves it out (docs/development.md)
def test_a_resumed_run_is_never_skipped(state):
    """night2 again: its checkpoint makes it a resumed run (evaluated and reported again),
    although a new run name would be skipped."""
    cfg = state.cfg()
    assert runs.unchanged_since_champion(cfg, runs.prepare(cfg.data), state.out) is not None
    before = (state.night2.run_dir.path / "report.json").stat().st_mtime_ns
    r = runs.run(cfg, state.out, "night2")
    assert r.skipped is None and r.training is not None and r.evaluation is not None
    assert r.run_dir.path.absolute() == state.night2.run_dir.path.absolute()
    assert (state.night2.run_dir.path / "report.json").stat().st_mtime_ns > before
    assert r.evaluation.ensemble == pytest.approx(state.night2.evaluation.ensemble, rel=1e-6)


@pytest.mark.slow
def test_trained_runs_record_their_data_snapshot(nights):
    for result in (nights.night1, nights.night2):
        run_dir = result.run_dir.path
        recorded = json.loads((run_dir / "data_snapshot.json").read_text())
        assert recorded == report_of(run_dir)["data_snapshot"]
        assert (Path(recorded["path"]) / "snapshot.json").is_file()
        assert json.loads((Path(recorded["path"]) / "snapshot.json").read_text()) == recorded
