"""The run report: ``report.json``, ``report.md`` and matplotlib plots in ``plots/``."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from ensemble_core import metrics as metrics_lib  # noqa: E402

SCORE_KEYS = ("accuracy", "nll", "brier", "ece")


def build_report(
    run_name: str,
    config: dict,
    train_summary: dict,
    evaluation: dict,
    run_dir: str | Path,
    promotion: dict | None = None,
) -> dict:
    """Assemble the ``report.json`` object (see the README for every key).

    ``promotion`` is the champion/challenger decision
    (:func:`ensemble_core.pipeline.compare_with_champion`), stored without its history."""
    timing = train_summary["timing"]
    return {
        "run_name": run_name,
        "config": config,
        "backend": train_summary["backend"],
        "devices": train_summary["devices"],
        "mesh": train_summary["mesh"],
        "strategy": train_summary["strategy"],
        "ensemble": evaluation["ensemble"],
        "members": evaluation["members"],
        "member_mean": evaluation["member_mean"],
        "diversity": evaluation["diversity"],
        "diverged_members": evaluation["diverged_members"],
        "timing": {
            "compile_seconds": timing["compile_seconds"],
            "train_seconds": timing["train_seconds"],
            "train_member_images_per_s": timing["train_member_images_per_s"],
            "eval_member_images_per_s": evaluation["eval_member_images_per_s"],
        },
        "checkpoint": {"dir": train_summary["checkpoint_dir"], "step": train_summary["checkpoint_step"]},
        "resumed_from_epoch": train_summary["resumed_from"],
        "training_stretches": train_summary.get("stretches", []),
        "history": train_summary["history"],
        "plots": {
            "reliability": "plots/reliability.png",
            "members": "plots/members.png",
            "training_curves": "plots/training_curves.png",
        },
        "run_dir": str(run_dir),
        "promotion": None if promotion is None else {k: v for k, v in promotion.items() if k != "history"},
    }


def _fmt(x: float) -> str:
    return f"{x:.4f}"


def member_table(report: dict) -> list[dict]:
    """One row per member plus the member mean and the ensemble (for tables/artifacts)."""
    rows = [
        {"model": f"member {i}", **{k: round(m[k], 4) for k in SCORE_KEYS}} for i, m in enumerate(report["members"])
    ]
    rows.append({"model": "member mean", **{k: round(report["member_mean"][k], 4) for k in SCORE_KEYS}})
    rows.append({"model": "ensemble", **{k: round(report["ensemble"][k], 4) for k in SCORE_KEYS}})
    return rows


def render_markdown(report: dict, plots: bool = True) -> str:
    """``report.md``: headline, per-member table, diversity, timing (and the plots)."""
    ens, mean, div, t = report["ensemble"], report["member_mean"], report["diversity"], report["timing"]
    cfg = report["config"]
    diverged = report.get("diverged_members") or []
    warning = [f"**Diverged members** (frozen, left out of the ensemble figures): {diverged}.", ""] if diverged else []
    lines = [
        f"# Ensemble report: {report['run_name']}",
        "",
        f"{cfg['ensemble']['size']} x `{cfg['model']['name']}` on `{cfg['data']['name']}`, "
        f"{cfg['train']['epochs']} epochs, backend `{report['backend']}`, {report['devices']} devices, "
        f"mesh ensemble={report['mesh']['ensemble']} x data={report['mesh']['data']}, "
        f"member strategy `{report['strategy']}`.",
        "",
        *warning,
        f"**Ensemble**: accuracy {_fmt(ens['accuracy'])}, NLL {_fmt(ens['nll'])} "
        f"(member mean {_fmt(mean['nll'])}), Brier {_fmt(ens['brier'])}, ECE {_fmt(ens['ece'])}.",
        "",
        "| model | accuracy | NLL | Brier | ECE |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in member_table(report):
        lines.append(f"| {row['model']} | " + " | ".join(_fmt(row[k]) for k in SCORE_KEYS) + " |")
    lines += [
        "",
        f"**Diversity**: pairwise disagreement {_fmt(div['disagreement'])}, mean predictive entropy "
        f"{_fmt(div['predictive_entropy'])} nats, mean mutual information {_fmt(div['mutual_information'])} nats.",
        "",
        f"**Timing** (steady state): compile {t['compile_seconds']:.2f} s, train {t['train_seconds']:.1f} s, "
        f"{t['train_member_images_per_s'] or 0:.0f} member-images/s training, "
        f"{t['eval_member_images_per_s']:.0f} member-images/s evaluation.",
        "",
        f"Checkpoint: `{report['checkpoint']['dir']}` step {report['checkpoint']['step']}.",
        "",
    ]
    promo = report.get("promotion")
    if promo:
        verdict = "**promoted** to champion" if promo["promoted"] else "**rejected** (the champion stays)"
        lines += [f"**Champion/challenger** on ensemble {promo['metric']}: {verdict}; {promo['reason']}.", ""]
        if promo["champion"]:
            lines += [
                f"| | {' | '.join(SCORE_KEYS)} |",
                "| --- | --- | --- | --- | --- |",
                "| challenger (this run) | " + " | ".join(_fmt(promo["challenger"][k]) for k in SCORE_KEYS) + " |",
                f"| champion ({promo['champion_run']}) | "
                + " | ".join(_fmt(promo["champion"][k]) for k in SCORE_KEYS)
                + " |",
                "",
            ]
    if plots:
        lines += [
            "![reliability](plots/reliability.png) ![members](plots/members.png) "
            "![training curves](plots/training_curves.png)",
            "",
        ]
    else:
        lines += [f"Plots: `{report['run_dir']}/plots/`.", ""]
    return "\n".join(lines)


def make_plots(report: dict, member_probs: np.ndarray, labels: np.ndarray, plots_dir: str | Path) -> list[Path]:
    """Reliability diagram (ensemble vs best member), per-member vs ensemble accuracy/NLL,
    per-member training curves. Returns the PNG paths."""
    plots_dir = Path(plots_dir)
    plots_dir.mkdir(parents=True, exist_ok=True)
    bins = report["config"]["eval"]["ece_bins"]
    paths = []

    best = int(np.argmin([m["nll"] for m in report["members"]]))
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.plot([0, 1], [0, 1], "k:", label="perfect calibration")
    for name, probs in (
        (f"ensemble (ECE {report['ensemble']['ece']:.3f})", metrics_lib.ensemble_probs(member_probs)),
        (f"best member {best} (ECE {report['members'][best]['ece']:.3f})", member_probs[best]),
    ):
        curve = metrics_lib.reliability_curve(probs, labels, bins)
        xs = [c for c, n in zip(curve["confidence"], curve["count"], strict=True) if n]
        ys = [a for a, n in zip(curve["accuracy"], curve["count"], strict=True) if n]
        ax.plot(xs, ys, "o-", label=name)
    ax.set(xlabel="confidence (top label)", ylabel="accuracy", title="Reliability diagram", xlim=(0, 1), ylim=(0, 1))
    ax.legend(loc="upper left", fontsize=8)
    paths.append(_save(fig, plots_dir / "reliability.png"))

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    e = len(report["members"])
    for ax, key, label in ((axes[0], "accuracy", "test accuracy"), (axes[1], "nll", "test NLL (nats)")):
        ax.bar(range(e), [m[key] for m in report["members"]], color="tab:blue", label="members")
        ax.axhline(report["ensemble"][key], color="tab:red", label="ensemble")
        ax.axhline(report["member_mean"][key], color="tab:gray", linestyle="--", label="member mean")
        values = [m[key] for m in report["members"]] + [report["ensemble"][key]]
        span = max(values) - min(values) or abs(max(values)) * 0.1 or 0.1
        ax.set_ylim(min(values) - span, max(values) + span)
        ax.set(xlabel="member", ylabel=label, title=f"{label}: members vs ensemble")
        ax.legend(fontsize=8)
    paths.append(_save(fig, plots_dir / "members.png"))

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    hist = report["history"]
    epochs = [r["epoch"] for r in hist]
    for ax, key, label in ((axes[0], "train_loss", "train loss (nats)"), (axes[1], "train_accuracy", "train accuracy")):
        values = np.asarray([r[key] for r in hist])  # [epochs, E_trained]
        for m in range(e):
            ax.plot(epochs, values[:, m], marker=".", label=f"member {m}")
        ax.set(xlabel="epoch", ylabel=label, title=f"{label} per member")
    axes[0].legend(fontsize=7, ncol=2)
    paths.append(_save(fig, plots_dir / "training_curves.png"))
    return paths


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
