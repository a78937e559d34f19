"""``benchmarks.literature_protocol`` over several seeds of one config: each run's summary,
and the spread over the seeds checked against Python's ``statistics`` (an independent
reference for the mean and the sample standard deviation)."""

import itertools
import json
import statistics

import numpy as np
import pytest

from benchmarks import literature_protocol

FIGURES = ("accuracy", "nll", "ece", "brier")


def fake_report(seed: int, members: list[tuple[float, float]], ensemble: tuple[float, float]) -> dict:
    """A ``report.json`` cut to what the protocol reads: members' and the ensemble's
    accuracy and NLL (ECE and Brier derived from them, so each figure differs)."""

    def figures(acc: float, nll: float) -> dict:
        return {"accuracy": acc, "nll": nll, "ece": nll / 10, "brier": 1 - acc}

    rows = [figures(*m) for m in members]
    mean = {f: statistics.fmean(r[f] for r in rows) for f in FIGURES}
    return {
        "run_name": f"s{seed}",
        "config": {
            "seed": seed,
            "data": {"name": "fashion_mnist"},
            "model": {"name": "lenet5"},
            "train": {"epochs": 25},
        },
        "member_choice": "final",
        "members": rows,
        "member_mean": mean,
        "ensemble": figures(*ensemble),
        "ensemble_temperature_scaled": figures(ensemble[0], ensemble[1] - 0.01),
        "temperature": 1.1,
        "timing": {"command_seconds": 100.0, "wall_seconds": 90.0},
        "evaluations": {},
    }


def their_ece(probs: np.ndarray, labels: np.ndarray, num_bins: int = 10) -> float:
    """uncertainty-baselines' ``calibration`` (``baselines/mnist/utils.py``), restated:
    bins ``[tau_i, tau_i+1)`` of the top-label confidence, weighted by their counts."""
    pred, conf = probs.argmax(1), probs.max(1)
    edges = np.linspace(0, 1, num_bins + 1)
    total = 0.0
    for lo, hi in itertools.pairwise(edges):
        sec = (hi > conf) & (conf >= lo)
        if sec.any():
            total += sec.sum() / len(labels) * abs(conf[sec].mean() - (pred[sec] == labels[sec]).mean())
    return total


def test_seed_spread_over_three_runs(tmp_path, capsys):
    runs = {
        0: ([(0.90, 0.33), (0.91, 0.31)], (0.925, 0.21)),
        1: ([(0.905, 0.32), (0.912, 0.30)], (0.931, 0.20)),
        2: ([(0.899, 0.34), (0.908, 0.35)], (0.928, 0.205)),
    }
    dirs, predictions = [], {}
    for seed, (members, ensemble) in runs.items():
        d = tmp_path / f"s{seed}"
        d.mkdir()
        (d / "report.json").write_text(json.dumps(fake_report(seed, members, ensemble)))
        rng = np.random.default_rng(seed)
        member_probs = rng.dirichlet(np.full(10, 0.3), size=(2, 500))
        labels = rng.integers(0, 10, 500)
        np.savez(d / "predictions.npz", member_probs=member_probs, labels=labels)
        predictions[seed] = (member_probs, labels)
        dirs += ["--run-dir", str(d)]
    out = tmp_path / "out.json"
    assert literature_protocol.main([*dirs, "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [s["run_name"] for s in result["seeds"]] == ["s0", "s1", "s2"]
    spread = result["spread"]
    assert spread["seeds"] == [0, 1, 2]
    ensemble_acc = [e[0] for _, e in runs.values()]
    assert spread["ensemble"]["accuracy"]["mean"] == pytest.approx(statistics.fmean(ensemble_acc))
    assert spread["ensemble"]["accuracy"]["std"] == pytest.approx(statistics.stdev(ensemble_acc))
    assert spread["ensemble"]["nll"]["max"] == pytest.approx(0.21)
    assert spread["ensemble_temperature_scaled"]["nll"]["min"] == pytest.approx(0.19)
    member_nll = [m[1] for members, _ in runs.values() for m in members]
    assert spread["one_member"]["nll"]["n"] == 6
    assert spread["one_member"]["nll"]["mean"] == pytest.approx(statistics.fmean(member_nll))
    assert spread["one_member"]["nll"]["std"] == pytest.approx(statistics.stdev(member_nll))
    mean_member_acc = [statistics.fmean(m[0] for m in members) for members, _ in runs.values()]
    assert spread["member_mean"]["accuracy"]["std"] == pytest.approx(statistics.stdev(mean_member_acc))
    assert result["command"].count("--run-dir") == 3
    # uncertainty-baselines' 10-bin ECE from each run's predictions, against their formula
    ensemble_ece = [their_ece(p.mean(0), y) for p, y in predictions.values()]
    assert [s["test"]["ece_10_bins"]["ensemble"] for s in result["seeds"]] == pytest.approx(ensemble_ece)
    assert spread["ece_10_bins"]["ensemble"]["std"] == pytest.approx(statistics.stdev(ensemble_ece))
    member_ece = [their_ece(m, y) for p, y in predictions.values() for m in p]
    assert spread["ece_10_bins"]["one_member"]["mean"] == pytest.approx(statistics.fmean(member_ece))


def test_one_run_has_no_spread(tmp_path):
    d = tmp_path / "s0"
    d.mkdir()
    (d / "report.json").write_text(json.dumps(fake_report(0, [(0.9, 0.3)], (0.92, 0.25))))
    out = tmp_path / "out.json"
    literature_protocol.main(["--run-dir", str(d), "--out", str(out)])
    result = json.loads(out.read_text())
    assert "spread" not in result and result["test"]["ensemble"]["accuracy"] == 0.92
