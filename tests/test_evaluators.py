"""Shift and OOD evaluators: every figure in report.json recomputed from the .npz files
with independent references (scikit-learn), skipping, caching, promotion on any figure."""

import itertools
import json

import numpy as np
import pytest
import scipy.special
from scipy import stats
from sklearn.metrics import accuracy_score, average_precision_score, log_loss, roc_auc_score

from ensemble_core import data, runs
from ensemble_core.config import PipelineConfig, load_config
from ensemble_core.config.eval_section import examples_per_level
from ensemble_core.errors import ConfigError
from ensemble_core.evaluators import shift_base
from ensemble_core.runs.evaluation.cache import cached_arrays, derived_dir
from ensemble_core.runs.evaluation.figure_check import figure_paths, probe
from tests.ensembles import tiny_config

SHIFTS = ("rotation", "translation", "corruptions")
#: The ``ood`` evaluator under two names: uniform noise, and a folder of RGB 32x32 PNGs
#: (converted to the digits' 28x28 grey) as the OOD dataset of the user's choosing.
OOD_SOURCES = {"noise": "{type: ood}", "folder": "{type: ood, source: image_folder, path: FOLDER}"}
OOD = ("letters", "fashion_mnist", *OOD_SOURCES)
#: Three of the 15 common corruptions at two severities, 40 test images per cell, 10 ECE bins.
COMMON = "{corruptions: [gaussian_noise, fog, jpeg_compression], severities: [1, 5], num_examples: 40, ece_bins: 10}"
ALL = ("test", *SHIFTS, *OOD, "common_corruptions")


def _rgb_folder(root):
    """120 test and 2 training PNGs of RGB noise, 32x32, in two class folders."""
    from PIL import Image

    rng = np.random.default_rng(7)
    for split, n in (("test", 60), ("train", 1)):
        for c in ("a", "b"):
            (root / split / c).mkdir(parents=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(root / split / c / f"{i}.png")
    return root


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tfds_dir):
    """One tiny run with every evaluator (3 members, 120 test digits)."""
    out = tmp_path_factory.mktemp("evaluators")
    folder = _rgb_folder(tmp_path_factory.mktemp("ood-folder") / "shelf")
    options = {**{k: v.replace("FOLDER", str(folder)) for k, v in OOD_SOURCES.items()}, "common_corruptions": COMMON}
    specs = ", ".join(f"{name}: {options.get(name, '{}')}" for name in ALL)
    cfg = tiny_config(
        tfds_dir,
        "ensemble.size=3",
        "train.epochs=2",
        "data.max_test_examples=120",
        "data.calibration_fraction=0.1",  # prediction sets and abstention, fitted on 26 digits
        f"eval.evaluators={{{specs}}}",
        "promotion.metric=letters.ensemble.auroc.mutual_information",
        "eval.plots=true",
    )
    result = runs.run(cfg, out, "r")
    return result, json.loads(result.run_dir.report_json.read_text())


def _nll(probs, labels):
    return log_loss(labels, probs, labels=np.arange(probs.shape[-1]))


def _brier(probs, labels):
    onehot = np.eye(probs.shape[-1])[labels]
    return float(np.mean(np.sum((probs - onehot) ** 2, -1)))


# MARK: what the plots show

#: The three curves of every figure plot: the label each is drawn with, and its colour.
WHO = {"ensemble": "ensemble", "member_mean": "member mean", "best_member": "best member"}
TAB_RED = (214, 39, 40)  # matplotlib's tab:red, the ensemble's curves and bars


def _png(path) -> np.ndarray:
    """The PNG's pixels, RGB uint8 [H, W, 3] (Pillow)."""
    from PIL import Image

    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


def _not_blank(pixels: np.ndarray, size: tuple[int, int], red: bool = True) -> None:
    """``size`` (width, height) pixels at the plots' 100 dpi, not one flat colour, and (``red``)
    with curves in the ensemble's red."""
    assert (pixels.shape[1], pixels.shape[0]) == size
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 50  # lines, text, antialiasing
    if red:
        assert (pixels == TAB_RED).all(-1).sum() > 50, "no ensemble curve in the ensemble's colour"


def _redrawn(monkeypatch, tmp_path, result, report, name) -> dict[str, list[dict]]:
    """Evaluator ``name``'s plots drawn again (its own ``plot``, from report.json and its
    .npz) into ``tmp_path``, each figure's axes recorded as it is saved: ``{file name:
    [{"title", "lines": {label: y data}, "x": {label: x data}, "bars": [heights],
    "points": [scatter offsets], "image": the first image's array}]}``."""
    import importlib

    from ensemble_core import plotting

    module = importlib.import_module(f"ensemble_core.evaluators.{name}")
    drawn: dict[str, list[dict]] = {}
    real = plotting.save

    def recording(fig, path):
        drawn[path.name] = [
            {
                "title": ax.get_title(),
                "lines": {line.get_label(): np.asarray(line.get_ydata(), float) for line in ax.get_lines()},
                "x": {line.get_label(): np.asarray(line.get_xdata(), float) for line in ax.get_lines()},
                "bars": [patch.get_height() for patch in ax.patches],
                "points": [np.asarray(c.get_offsets()) for c in ax.collections],
                "image": np.asarray(ax.images[0].get_array()) if ax.images else None,
            }
            for ax in fig.axes
        ]
        return real(fig, path)

    for owner in {module, shift_base, importlib.import_module("ensemble_core.evaluators.common_corruptions")}:
        if hasattr(owner, "save"):  # translation and corruptions draw through shift_base
            monkeypatch.setattr(owner, "save", recording)
    with np.load(result.run_dir.eval_dir / f"{name}.npz") as f:
        arrays = dict(f)
    cfg = PipelineConfig.model_validate(report["config"])
    module.plot(report["evaluations"][name]["metrics"], arrays, tmp_path, cfg, name=name)
    for file in drawn:  # the run's PNG is this very figure, pixel for pixel
        np.testing.assert_array_equal(_png(result.run_dir.plots / file), _png(tmp_path / file), err_msg=file)
    return drawn


@pytest.mark.slow
@pytest.mark.parametrize("name", SHIFTS)
def test_shift_figures_are_recomputed_from_the_npz(finished, name, monkeypatch, tmp_path):
    result, report = finished
    section = report["evaluations"][name]["metrics"]
    with np.load(result.run_dir.eval_dir / f"{name}.npz") as f:
        probs, labels, level = f["member_probs"], f["labels"], f["level"]
    assert probs.dtype == np.float32 and probs.shape[0] == 3 and labels.shape == level.shape == probs.shape[1:2]
    n = examples_per_level(120, len(section["levels"]))  # eval.protocol sampled: 100 of the 120 per level
    assert section["intervals"]["examples_per_level"] == n == 100 and len(section["levels"]) * n == len(labels)
    for row in section["levels"]:
        at = level == np.float32(row["level"])
        p, y = probs[:, at].astype(np.float64), labels[at]
        ens = p.mean(0)
        assert row["ensemble"]["accuracy"] == pytest.approx(accuracy_score(y, ens.argmax(-1)))
        wilson = stats.binomtest(int((ens.argmax(-1) == y).sum()), n).proportion_ci(0.95, method="wilson")
        assert row["intervals"]["ensemble"]["accuracy"] == pytest.approx([wilson.low, wilson.high], abs=1e-12)
        nll = stats.ttest_1samp(-np.log(ens[np.arange(n), y]), 0.0).confidence_interval(0.95)
        assert row["intervals"]["ensemble"]["nll"] == pytest.approx([nll.low, nll.high], rel=1e-5)
        assert row["ensemble"]["nll"] == pytest.approx(_nll(ens, y), rel=1e-6)
        assert row["ensemble"]["brier"] == pytest.approx(_brier(ens, y), rel=1e-6)
        member_nll = [_nll(m, y) for m in p]
        best = int(np.argmin(member_nll))
        assert row["best_member_index"] == best
        assert row["best_member"]["nll"] == pytest.approx(member_nll[best], rel=1e-6)
        assert row["member_mean"]["nll"] == pytest.approx(np.mean(member_nll), rel=1e-6)
    mean_nll = np.mean([r["ensemble"]["nll"] for r in section["levels"]])
    assert section["mean"]["ensemble"]["nll"] == pytest.approx(mean_nll)
    # <name>.png: 1600x360 pixels (16 x 3.6 inches at 100 dpi), one panel per figure, each
    # curve the report's figures level by level.
    _not_blank(_png(result.run_dir.plots / f"{name}.png"), (1600, 360))
    panels = _redrawn(monkeypatch, tmp_path, result, report, name)[f"{name}.png"]
    assert [p["title"] for p in panels] == [f"{figure} under {name}" for figure in ("accuracy", "nll", "brier", "ece")]
    for panel, figure in zip(panels, ("accuracy", "nll", "brier", "ece"), strict=True):
        assert set(panel["lines"]) == set(WHO.values())
        for who, label in WHO.items():
            want = [r[who][figure] for r in section["levels"]]
            np.testing.assert_allclose(panel["lines"][label], want, rtol=1e-12, err_msg=f"{figure} {who}")
            if name != "corruptions":  # corruptions: one tick per corruption, at 0, 1, ...
                np.testing.assert_array_equal(panel["x"][label], [r["level"] for r in section["levels"]])


def _ece(probs, labels, bins):
    conf, correct = probs.max(-1), probs.argmax(-1) == labels
    edges = np.linspace(0, 1, bins + 1)
    total = 0.0
    for lo, hi in itertools.pairwise(edges):
        at = (conf > lo) & (conf <= hi)
        if at.any():
            total += at.mean() * abs(correct[at].mean() - conf[at].mean())
    return total


@pytest.mark.slow
def test_common_corruptions_figures_are_recomputed_from_the_npz(finished, tfds_dir, monkeypatch, tmp_path):
    from ensemble_core.shifts.common_corruptions import corrupt

    result, report = finished
    section = report["evaluations"]["common_corruptions"]["metrics"]
    cells = [(c, s) for c in ("gaussian_noise", "fog", "jpeg_compression") for s in (1, 5)]
    assert [(r["corruption"], r["severity"]) for r in section["levels"]] == cells
    assert section["num_examples"] == 40
    with np.load(result.run_dir.eval_dir / "common_corruptions.npz") as f:
        probs, labels, level, examples = f["member_probs"].astype(np.float64), f["labels"], f["level"], f["examples"]
    info = data.prepare(data.EMBEDDED, tfds_dir)
    test_images, test_labels = data.load_split(data.EMBEDDED, "test", info.tfds_data_dir, 120)
    sample = shift_base.sample_indices(120, 40)  # every cell: the same seeded sample of 40 of the 120
    assert len(labels) == 6 * 40 and (labels.reshape(6, 40) == test_labels[sample]).all()
    for row in section["levels"]:
        at = level == np.float32(row["level"])
        ens, y = probs[:, at].mean(0), labels[at]
        assert row["ensemble"]["accuracy"] == pytest.approx(accuracy_score(y, ens.argmax(-1)))
        assert row["ensemble"]["nll"] == pytest.approx(_nll(ens, y), rel=1e-6)
        assert row["ensemble"]["ece"] == pytest.approx(_ece(ens, y, 10), abs=1e-9)  # the evaluator's own bins
        # The cached corrupted images are the corruption of the 40 sampled test images.
        # (40 images are one block of the evaluator's, seeded with SeedSequence([seed 0, block 0]).)
        seed = int(np.random.SeedSequence([0, 0]).generate_state(1)[0])
        expected = corrupt(test_images[sample], row["corruption"], row["severity"], seed)
        np.testing.assert_array_equal(examples[int(row["level"])], expected[: examples.shape[1]])
    for who in ("ensemble", "best_member", "member_mean"):
        for figure in ("accuracy", "nll", "brier", "ece", "aurc"):
            mean = np.mean([r[who][figure] for r in section["levels"]])
            assert section["mean"][who][figure] == pytest.approx(mean)
    member_nll = [
        np.mean([_nll(probs[e, level == np.float32(k)], labels[level == np.float32(k)]) for k in range(6)])
        for e in range(3)
    ]
    assert [m["nll"] for m in section["members_mean"]] == pytest.approx(member_nll, rel=1e-6)
    fog = [r["ensemble"]["nll"] for r in section["levels"] if r["corruption"] == "fog"]
    assert section["by_corruption"]["fog"]["ensemble"]["nll"] == pytest.approx(np.mean(fog))
    # The plots: pixels, and the data drawn (the report's figures, the cached images).
    _not_blank(_png(result.run_dir.plots / "common_corruptions.png"), (1300, 360))
    _not_blank(_png(result.run_dir.plots / "common_corruptions_corruptions.png"), (600, 380))
    drawn = _redrawn(monkeypatch, tmp_path, result, report, "common_corruptions")
    for panel, figure in zip(drawn["common_corruptions.png"], ("accuracy", "nll", "ece"), strict=True):
        for who, label in WHO.items():
            by_severity = [np.mean([r[who][figure] for r in section["levels"] if r["severity"] == s]) for s in (1, 5)]
            np.testing.assert_allclose(panel["lines"][label], by_severity, rtol=1e-12)
            np.testing.assert_array_equal(panel["x"][label], [1, 5])
    (bars,) = drawn["common_corruptions_corruptions.png"]
    names = ("gaussian_noise", "fog", "jpeg_compression")
    nll_by = {c: [r for r in section["levels"] if r["corruption"] == c] for c in names}
    want = [np.mean([r[who]["nll"] for r in nll_by[c]]) for who in WHO for c in names]  # grouped by who
    np.testing.assert_allclose(bars["bars"], want, rtol=1e-9)
    (grid,) = drawn["common_corruptions_examples.png"]
    tiled = grid["image"]  # corruption rows x severity columns of 28x28 tiles, 2 pixels apart
    for i, _c in enumerate(names):
        for j in range(2):
            tile = tiled[30 * i : 30 * i + 28, 30 * j : 30 * j + 28]
            np.testing.assert_array_equal(tile, examples[2 * i + j, 0, ..., 0])


@pytest.mark.slow
def test_rotation_levels_and_selective_prediction(finished):
    result, report = finished
    section = report["evaluations"]["rotation"]["metrics"]
    assert [r["level"] for r in section["levels"]] == list(range(0, 181, 15))
    with np.load(result.run_dir.eval_dir / "rotation.npz") as f:
        at = f["level"] == 60
        ens, labels = f["member_probs"][:, at].astype(np.float64).mean(0), f["labels"][at]
    for row in section["selective_at_60"]["ensemble"]:
        confident = ens.max(-1) >= row["tau"]
        assert row["fraction"] == pytest.approx(confident.mean())
        if confident.any():
            assert row["accuracy"] == pytest.approx(accuracy_score(labels[confident], ens[confident].argmax(-1)))
    # rotating by 0 degrees is the test split itself
    with np.load(result.run_dir.predictions) as f:
        test_probs = f["member_probs"]
    with np.load(result.run_dir.eval_dir / "rotation.npz") as f:
        sample = shift_base.sample_indices(120, 100)  # the sampled protocol's 100 of the 120
        np.testing.assert_allclose(f["member_probs"][:, f["level"] == 0], test_probs[:, sample], atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("name", OOD)
def test_ood_figures_are_recomputed_from_the_npz(finished, name):
    result, report = finished
    section = report["evaluations"][name]["metrics"]
    if section.get("skipped"):
        pytest.skip(f"{name} was skipped: {section['skipped']}")
    with np.load(result.run_dir.eval_dir / f"{name}.npz") as f:
        probs, is_ood, labels = f["member_probs"].astype(np.float64), f["is_ood"], f["labels"]
    assert is_ood.sum() == (~is_ood).sum() == 120 and not is_ood[:120].any() and (labels[is_ood] == -1).all()
    ens = probs.mean(0)
    entropy = -np.sum(ens * np.log(np.maximum(ens, 1e-300)), -1)
    member_entropy = -np.sum(probs * np.log(np.maximum(probs, 1e-300)), -1).mean(0)
    with np.load(result.run_dir.eval_dir / f"{name}.npz") as f:
        member_energy, ensemble_energy = f["member_energy"].astype(np.float64), f["ensemble_energy"]
    # Each member's logits are log p_e - E_e (softmax: p = exp(z + E)), so the energy of the
    # mean logits follows from the probabilities and the member energies alone.
    mean_log_p = np.log(probs).mean(0)
    energy = member_energy.mean(0) - scipy.special.logsumexp(mean_log_p, axis=-1)
    np.testing.assert_allclose(ensemble_energy, energy, rtol=1e-4, atol=1e-4)
    preds = probs.argmax(-1)
    pairs = [(i, j) for i in range(len(probs)) for j in range(i + 1, len(probs))]
    disagreement = np.mean([preds[i] != preds[j] for i, j in pairs], axis=0)
    scores = {
        "max_prob": 1 - ens.max(-1),
        "entropy": entropy,
        "mutual_information": entropy - member_entropy,
        "energy": ensemble_energy,
        "disagreement": disagreement,
    }
    assert set(section["ensemble"]["auroc"]) == set(scores)
    for score, value in scores.items():
        fig = {f: section["ensemble"][f][score] for f in ("auroc", "aupr_in", "aupr_out")}
        assert fig["auroc"] == pytest.approx(roc_auc_score(is_ood, value), abs=1e-6)
        assert fig["aupr_out"] == pytest.approx(average_precision_score(is_ood, value), abs=1e-6)
        assert fig["aupr_in"] == pytest.approx(average_precision_score(~is_ood, -value), abs=1e-6)
    member_auroc = [roc_auc_score(is_ood, 1 - m.max(-1)) for m in probs]
    assert section["member_mean"]["auroc"]["max_prob"] == pytest.approx(np.mean(member_auroc))
    member_energy_auroc = [roc_auc_score(is_ood, e) for e in member_energy]
    assert section["member_mean"]["auroc"]["energy"] == pytest.approx(np.mean(member_energy_auroc), abs=1e-6)
    assert set(section["member_mean"]["auroc"]) == {"max_prob", "entropy", "energy"}
    assert section["confident_ood_fraction"]["ensemble"] == pytest.approx(np.mean(ens[is_ood].max(-1) >= 0.9))


def test_fashion_mnist_scores_the_first_test_images_of_the_files_and_prepares_no_dataset(tmp_path):
    """The OOD images are the first N of Debian's ``t10k-images`` file (read here with gzip and
    numpy, the IDX layout: 16 header bytes, then 28x28 uint8 rows), N the test split's size, and
    nothing is written under ``data.data_dir`` (no TFDS snapshot of Fashion-MNIST's 70,000
    images for the N it scores)."""
    import gzip

    from ensemble_core.data import DatasetInfo
    from ensemble_core.evaluators import EvalContext, fashion_mnist

    directory = data.idx_files_available("fashion_mnist")
    if directory is None:
        pytest.skip("dataset-fashion-mnist is not installed (make setup says how)")
    with gzip.open(directory / "t10k-images-idx3-ubyte.gz") as f:
        raw = f.read()
    expected = np.frombuffer(raw, np.uint8, offset=16).reshape(-1, 28, 28, 1)
    n = 300
    rng = np.random.default_rng(0)
    test_images, labels = rng.integers(0, 256, (n, 28, 28, 1), np.uint8), rng.integers(0, 10, n).astype(np.int32)
    weights = rng.normal(size=(2, 784, 10)).astype(np.float32)  # two members, fixed linear "networks"
    seen = []

    def predict_logits(x):
        seen.append(x)
        return np.einsum("np,epc->enc", x.reshape(len(x), -1).astype(np.float32) / 255, weights)

    data_dir = tmp_path / "tfds"
    info = DatasetInfo(
        name="digits", data_dir=str(data_dir), num_classes=10, image_shape=(28, 28, 1), num_train=n, num_test=n
    )
    ctx = EvalContext(
        config=PipelineConfig.model_validate({"data": {"data_dir": str(data_dir)}}),
        dataset=info,
        healthy=np.ones(2, bool),
        predict=lambda x: (scipy.special.softmax(predict_logits(x), -1), 1.0),
        load=lambda split: (test_images, labels),
        predict_split=lambda split: (scipy.special.softmax(predict_logits(test_images), -1), 1.0),
        cached=lambda key, build, shapes=None: build(),
        predict_logits=predict_logits,
        predict_split_logits=lambda split: predict_logits(test_images),
    )
    out = fashion_mnist.evaluate(ctx)
    assert out.skipped is None
    ood = [x for x in seen if x is not test_images]
    assert len(ood) == 1 and ood[0].dtype == np.uint8
    np.testing.assert_array_equal(ood[0], expected[:n])
    assert out.metrics["num_in"] == n and out.metrics["num_ood"] == n
    assert out.arrays["is_ood"].sum() == n
    assert not data_dir.exists() or not any(data_dir.rglob("*"))


@pytest.mark.slow  # over 1 CPU s with a warm compilation cache: make test-fast leaves it out (docs/development.md)
def test_fashion_mnist_is_skipped_with_one_line_when_its_files_are_absent(tmp_path, tfds_dir, monkeypatch, caplog):
    monkeypatch.setattr(data, "idx_files_available", lambda *a, **k: None)
    cfg = tiny_config(tfds_dir, "eval.evaluators=[test,fashion_mnist]", "promotion.enabled=false")
    result = runs.run(cfg, tmp_path, "r")
    report = json.loads(result.run_dir.report_json.read_text())
    reason = report["evaluations"]["fashion_mnist"]["metrics"]["skipped"]
    assert "apt-get install dataset-fashion-mnist" in reason
    assert f"fashion_mnist**: skipped ({reason})" in result.run_dir.report_md.read_text()
    assert not (result.run_dir.eval_dir / "fashion_mnist.npz").exists()
    assert [r.message for r in caplog.records if r.levelname == "WARNING" and "skipped" in r.message] == [
        f"evaluator fashion_mnist skipped: {reason}"
    ]


@pytest.mark.slow
def test_promotion_on_an_evaluator_figure(finished, tfds_dir):
    result, report = finished
    promo = report["promotion"]
    figure = report["evaluations"]["letters"]["metrics"]["ensemble"]["auroc"]["mutual_information"]
    assert promo["metric"] == "letters.ensemble.auroc.mutual_information"
    assert promo["challenger_figure"] == pytest.approx(figure) and promo["promoted"]
    champion = json.loads((result.run_dir.path.parent / "champion.json").read_text())
    assert champion["figures"] == {promo["metric"]: pytest.approx(figure)}


@pytest.mark.slow
@pytest.mark.parametrize("name", ALL)
def test_the_probe_produces_the_figure_paths_of_a_trained_run(finished, name):
    """The structure the check relies on is the real one: every evaluator's figure paths on
    the probe equal those of the same evaluator on a trained ensemble (same config)."""
    result, report = finished
    metrics = report["evaluations"][name]["metrics"] if name != "test" else result.evaluation.results["test"].metrics
    if metrics.get("skipped"):
        pytest.skip(f"{name} skipped here: {metrics['skipped']}")
    cfg = PipelineConfig.model_validate(report["config"])
    dataset = data.prepare(cfg.data.name, cfg.data.data_dir)
    probed = probe(cfg, dataset, name).metrics
    assert set(figure_paths(probed)) == set(figure_paths(metrics))


def test_promotion_metric_is_checked_before_any_compute(tfds_dir):
    with pytest.raises(ConfigError, match="names none of the figures"):
        load_config(None, ["eval.evaluators=[test,letters]", "promotion.metric=letters.ensemble.entropy"])
    with pytest.raises(ConfigError, match="needs the evaluator 'rotation'"):
        load_config(None, ["eval.evaluators=[test]", "promotion.metric=rotation.mean.ensemble.nll"])
    with pytest.raises(ConfigError, match="neither a test metric"):
        load_config(None, ["promotion.metric=auroc"])


def test_derived_sets_are_built_once_and_rebuilt_when_damaged(tfds_dir, caplog):
    info = data.prepare(data.EMBEDDED, tfds_dir)
    calls = []

    def build():
        calls.append(1)
        return {"images": np.arange(12, dtype=np.uint8).reshape(3, 2, 2, 1)}

    key = f"test-cache-{np.random.default_rng().integers(1 << 30)}"
    first = cached_arrays(info, key, build)
    again = cached_arrays(info, key, build)
    np.testing.assert_array_equal(first["images"], again["images"])
    assert len(calls) == 1
    path = derived_dir(info) / f"{key}.npz"
    path.write_bytes(b"not a zip")
    np.testing.assert_array_equal(cached_arrays(info, key, build)["images"], first["images"])
    assert len(calls) == 2 and "unreadable" in caplog.text


@pytest.mark.slow
def test_prediction_sets_and_abstention_are_recomputed_from_the_npz(finished, tfds_dir, monkeypatch, tmp_path):
    """Every shift level's ensemble coverage, set size and selective figures from its .npz
    and decisions.json, with LAC's set and the abstention rule written out by hand, and its
    reference-free accuracy estimates and their errors; prediction applies the same rules
    to new images."""
    from ensemble_core import conformal

    result, report = finished
    rules = json.loads((result.run_dir.path / "decisions.json").read_text())
    # tiny_config: 256 training digits, no validation split, 10% (26) held out for calibration
    assert (rules["split"], rules["num_examples"], rules["method"]) == ("calibration", 26, "lac")
    # the lineage names the calibration examples: the carve of the first 256 training digits
    import hashlib

    cfg = tiny_config(tfds_dir, "data.calibration_fraction=0.1")
    _, train_labels = data.load_split(cfg.data.name, "train", runs.prepare(cfg.data).tfds_data_dir, 256)
    idx = runs.dataset.split_indices(cfg, train_labels)
    assert rules["lineage"]["indices_sha256"] == hashlib.sha256(idx["calibration"].tobytes()).hexdigest()
    assert rules["lineage"]["class_counts"] == np.bincount(train_labels[idx["calibration"]], minlength=10).tolist()
    assert np.intersect1d(idx["calibration"], idx["train"]).size == 0  # it never trained
    qhat = rules["prediction_sets"]["lac"]["threshold"]
    qhat = np.inf if qhat is None else qhat
    theta = rules["abstention"]["threshold"]
    theta = np.inf if theta is None else theta
    for name in SHIFTS:
        with np.load(result.run_dir.eval_dir / f"{name}.npz") as f:
            probs, labels, level = f["member_probs"], f["labels"], f["level"]
        for row in report["evaluations"][name]["metrics"]["levels"]:
            at = level == np.float32(row["level"])
            ens, y = probs[:, at].astype(np.float64).mean(0), labels[at]
            sets = (1.0 - ens) <= qhat + 1e-9  # LAC: every class whose probability is at least 1 - qhat
            got = row["decisions"]["ensemble"]
            assert got["prediction_sets"]["lac"]["coverage"] == pytest.approx(sets[np.arange(len(y)), y].mean())
            assert got["prediction_sets"]["lac"]["mean_set_size"] == pytest.approx(sets.sum(1).mean())
            accepted = ens.max(-1) >= theta
            assert got["selective"]["coverage"] == pytest.approx(accepted.mean())
            if accepted.any():
                assert got["selective"]["risk"] == pytest.approx((ens.argmax(-1) != y)[accepted].mean())
            assert set(row["decisions"]) == {"ensemble", "member_mean", "best_member"}
            # the reference-free accuracy estimates, by hand: mean top probability, and one
            # minus the mean pairwise disagreement of the members' top classes
            est = row["accuracy_estimates"]
            assert est["average_confidence"] == pytest.approx(ens.max(-1).mean(), rel=1e-6)
            top = probs[:, at].argmax(-1)
            pairs = [(top[i] != top[j]).mean() for i in range(len(top)) for j in range(i + 1, len(top))]
            assert est["disagreement"] == pytest.approx(1 - np.mean(pairs))
        section = report["evaluations"][name]["metrics"]
        true = np.array([r["ensemble"]["accuracy"] for r in section["levels"]])
        for estimator, errors in section["accuracy_estimation"].items():
            guessed = np.array([r["accuracy_estimates"][estimator] for r in section["levels"]])
            assert errors["mae"] == pytest.approx(np.abs(guessed - true).mean())
            assert errors["max_abs_error"] == pytest.approx(np.abs(guessed - true).max())
    cc = report["evaluations"]["common_corruptions"]["metrics"]
    assert sorted(cc["decisions_by_severity"]) == ["1", "5"] and "clean" in cc
    # The two plots: not blank, and drawing the report's numbers.
    _not_blank(_png(result.run_dir.plots / "common_corruptions_prediction_sets.png"), (1700, 360))
    drawn = _redrawn(monkeypatch, tmp_path, result, report, "common_corruptions")
    coverage, sizes, risk, kept = drawn["common_corruptions_prediction_sets.png"]
    points = {0: cc["clean"], **{int(s): cc["decisions_by_severity"][s] for s in ("1", "5")}}
    for who, label in WHO.items():
        for method in cc["clean"]["ensemble"]["prediction_sets"]:
            line = f"{label} {method.upper()}"
            want = [points[x][who]["prediction_sets"][method]["coverage"] for x in (0, 1, 5)]
            np.testing.assert_allclose(coverage["lines"][line], want, rtol=1e-12, err_msg=line)
            want = [points[x][who]["prediction_sets"][method]["mean_set_size"] for x in (0, 1, 5)]
            np.testing.assert_allclose(sizes["lines"][line], want, rtol=1e-12, err_msg=line)
        want = [points[x][who]["selective"]["coverage"] for x in (0, 1, 5)]
        np.testing.assert_allclose(kept["lines"][who], want, rtol=1e-12)
        want = [np.nan if (v := points[x][who]["selective"]["risk"]) is None else v for x in (0, 1, 5)]
        np.testing.assert_allclose(risk["lines"][who], want, rtol=1e-12)  # None (nothing accepted): a gap
    estimates = drawn["common_corruptions_accuracy_estimates.png"]
    true = [r["ensemble"]["accuracy"] for r in cc["levels"]]
    estimators = list(cc["accuracy_estimation"])
    cols = min(4, len(estimators))  # a 4 x 3.8 inch panel per estimator, 4 a row
    size = (400 * cols, 380 * -(-len(estimators) // cols))
    _not_blank(_png(result.run_dir.plots / "common_corruptions_accuracy_estimates.png"), size, red=False)
    for panel, estimator in zip(estimates, estimators, strict=False):
        (scatter,) = panel["points"]
        guessed = [r["accuracy_estimates"][estimator] for r in cc["levels"]]
        np.testing.assert_allclose(scatter, np.column_stack([true, guessed]), rtol=1e-12, err_msg=estimator)
        assert panel["title"].startswith(f"{estimator} (MAE {100 * cc['accuracy_estimation'][estimator]['mae']:.1f}")

    cfg = load_config(None, [f"data.data_dir={tfds_dir}", "data.max_test_examples=120"])
    images, _ = runs.dataset.load(cfg, runs.prepare(cfg.data), "test")
    out = runs.predict_images(result.run_dir.path, images)
    aps = conformal.ConformalCalibration.from_dict(rules["prediction_sets"]["aps"])
    lac = (1.0 - out["ensemble_probs"]) <= qhat + 1e-9  # flows.predict's default score, LAC
    np.testing.assert_array_equal(out["prediction_set"], lac)
    assert out["conformal_method"] == "lac"
    # APS from the same record: what the primitives give for these probabilities
    assert conformal.prediction_sets(out["ensemble_probs"], aps).shape == lac.shape
    np.testing.assert_array_equal(out["abstain"], out["ensemble_probs"].max(-1) < theta)
