"""The run report: ``report.json``, ``report.md`` and the training curves in ``plots/``
(each evaluator draws its own plots, :mod:`ensemble_core.evaluators`)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ensemble_core import diskspace, evaluators
from ensemble_core import metrics as metrics_lib
from ensemble_core.atomic import atomic_write_json, atomic_write_text
from ensemble_core.plotting import save, subplots
from ensemble_core.runs.report.data import drift_lines, snapshot_lines
from ensemble_core.runs.report.decisions import decision_report_lines
from ensemble_core.runs.report.numbers import fixed
from ensemble_core.runs.report.stratify import stratification_lines, stratification_report
from ensemble_core.runs.report.timing import command_timing, timing_lines, timing_section
from ensemble_core.runs.results import (
    DriftReport,
    Evaluation,
    PromotionDecision,
    StratificationSummary,
    TrainingSummary,
)
from ensemble_core.runs.storage.layout import RunDir

if TYPE_CHECKING:
    from ensemble_core.data import DatasetInfo

SCORE_KEYS = ("accuracy", "nll", "brier", "ece")
#: The member table's columns (:data:`ensemble_core.metrics.SCORES`).
MEMBER_KEYS = metrics_lib.SCORES
TRAINING_CURVES = "training_curves.png"
#: The test evaluator's class-level figures copied to the top of ``report.json``.
CLASS_LEVEL_KEYS = ("per_class", "confusion_matrix")
#: The test evaluator's prediction-set and abstention figures and the rules they come from.
DECISION_KEYS = ("decisions", "decision_rules")
#: The test evaluator's class-level plots: drawn in report.md's class-level section.
CLASS_LEVEL_PLOTS = ("confusion_matrix", "uncertain_examples", "confident_wrong_examples")


def build_report(
    run_name: str,
    config: dict,
    training: TrainingSummary,
    evaluation: Evaluation,
    run_dir: str | Path,
    promotion: PromotionDecision | None = None,
    dataset: DatasetInfo | None = None,
    drift: DriftReport | None = None,
    stratification: StratificationSummary | None = None,
    selection: dict[str, Any] | None = None,
) -> dict:
    """Assemble the ``report.json`` object (docs/evaluation.md lists every key).

    The ``test`` evaluator's figures are the top-level ``ensemble``, ``members``,
    ``member_mean``, ``diversity`` and ``diverged_members`` (and its class-level view,
    ``per_class`` and ``confusion_matrix``, :data:`CLASS_LEVEL_KEYS`); any other evaluator's are
    under ``evaluations.<name>`` (``metrics`` and ``plots``). ``promotion`` is the
    champion/challenger decision (:func:`ensemble_core.runs.champion.promotion.promote`), stored
    without its history; ``data_snapshot`` the lineage of the data
    (:class:`~ensemble_core.data.DataSnapshot`), ``drift`` the drift signal computed before
    training (:class:`~ensemble_core.runs.results.DriftReport`); ``stratification`` the
    hyper-deep ensemble's first selection and stratified pool
    (:func:`ensemble_core.runs.report.stratify.stratification_report`; None without one);
    ``selection`` the select stage's record (:func:`ensemble_core.runs.ensemble.select.select`;
    None without a validation split)."""
    train_summary = training.model_dump()  # python floats: NaN stays NaN in report.json
    test = evaluation.test
    timing = train_summary["timing"]
    run = RunDir(Path(run_dir))
    plots = dict(evaluation.results["test"].plots)
    if figures_drawn(config):
        plots["training_curves"] = str((run.plots / TRAINING_CURVES).relative_to(run.path))
    others = {name: r.model_dump() for name, r in evaluation.results.items() if name != "test"}
    report = {
        "run_name": run_name,
        "config": config,
        "backend": train_summary["backend"],
        "devices": train_summary["devices"],
        "mesh": train_summary["mesh"],
        "strategy": train_summary["strategy"],
        "member_choice": member_choice(config, training),
        "ensemble": test["ensemble"],
        "members": test["members"],
        "member_mean": test["member_mean"],
        "diversity": test["diversity"],
        "diverged_members": test["diverged_members"],
        "timing": {
            "compile_seconds": timing["compile_seconds"],
            "train_seconds": timing["train_seconds"],
            "train_member_images_per_s": timing["train_member_images_per_s"],
            "eval_member_images_per_s": test["eval_member_images_per_s"],
        },
        "checkpoint": {"dir": train_summary["checkpoint_dir"], "step": train_summary["checkpoint_step"]},
        "resumed_from_epoch": train_summary["resumed_from"],
        "training_sessions": train_summary["sessions"],
        "topology": train_summary["topology"],
        "history": train_summary["history"],
        "plots": plots,
        "run_dir": str(run_dir),
        "promotion": None if promotion is None else promotion.model_dump(exclude={"history"}),
        "selection": selection,
        "pool": pool_rows(training, stratification, selection),
        "stratification": stratification_report(stratification, selection),
        "data_snapshot": None
        if dataset is None or dataset.snapshot is None
        else dataset.snapshot.model_dump(mode="json"),
        "drift": None if drift is None else {**drift.model_dump(mode="json"), "drifted": drift.drifted},
    }
    for key in (*CLASS_LEVEL_KEYS, *DECISION_KEYS):  # the test split's (absent in older evaluations)
        if key in test:
            report[key] = test[key]
    if "temperature" in test:
        report["temperature"] = test["temperature"]
        report["ensemble_temperature_scaled"] = test["ensemble_temperature_scaled"]
    if others:
        report["evaluations"] = others
    return report


MEMBER_CHOICE_TEXT = {
    "best_validation_nll": "its epoch of lowest validation NLL",
    "best_validation_accuracy": "its epoch of highest validation accuracy",
    "final": "its final epoch",
}
"""How report.md names each ``train.member_choice``."""


def member_choice(config: dict, training: TrainingSummary) -> str:
    """The ``train.member_choice`` the evaluated parameters came from: the config's when
    best epochs were tracked (a validation split), else ``"final"``."""
    tracked = any(m.get("best_epoch") is not None for m in training.members)
    chosen = (config.get("train") or {}).get("member_choice", "best_validation_nll")
    return chosen if tracked else "final"


def pool_rows(
    training: TrainingSummary,
    stratification: StratificationSummary | None = None,
    selection: dict[str, Any] | None = None,
) -> list[dict]:
    """Every trained member: ``member``, ``hyperparameters``, ``best_epoch``,
    ``stopped_epoch``, ``healthy``, ``validation_nll`` (its best epoch's parameters on the
    validation split, as evaluation saw them; None without one) and ``selected`` (how many
    times the ensemble holds it; with ``stratification``, the first selection's picks of
    the search pool); ``selection`` is the select stage's record (None: no validation split)."""
    selection = (selection or {}) if stratification is None else stratification.first_selection
    nll = selection.get("member_validation_nll") or []
    counts = {int(k): v for k, v in (selection.get("multiplicities") or {}).items()}
    rows = []
    for m in training.members:
        i = m["member"]
        picked = counts.get(i, 0) if selection else int(m["healthy"])
        rows.append(
            {
                "member": i,
                "hyperparameters": m["hyperparameters"],
                "best_epoch": m["best_epoch"],
                "stopped_epoch": m["stopped_epoch"],
                "healthy": m["healthy"],
                "validation_nll": nll[i] if i < len(nll) else None,
                "selected": picked,
            }
        )
    return rows


def pool_table(report: dict) -> list[dict]:
    """The pool as table rows (member, its hyperparameters, best/stop epoch, validation
    NLL, times selected) for the Prefect table artifact."""
    rows = []
    for m in report.get("pool") or []:
        hp = m["hyperparameters"]
        row = {"member": m["member"]}
        row.update({k: round(v, 6) if isinstance(v, float) else v for k, v in hp.items()})
        row.update(
            best_epoch=m["best_epoch"],
            stopped_epoch=m["stopped_epoch"],
            validation_nll=None if m["validation_nll"] is None else round(m["validation_nll"], 4),
            selected=m["selected"],
        )
        rows.append(row)
    return rows


def _selection_lines(report: dict) -> list[str]:
    sel, rows = report.get("selection"), report.get("pool") or []
    if not sel:
        return []
    searched = sorted(k for k in (report["config"]["ensemble"].get("search") or {}))
    lines = []
    if report["config"]["ensemble"].get("select_size"):
        strat = report.get("stratification")
        pool_name = "the stratified pool" if strat else "a pool"
        pool_size = len(strat["pool"]) if strat else len(rows)
        picks = ", ".join(f"{m} x{n}" if n > 1 else f"{m}" for m, n in sel["multiplicities"].items())
        steps = " -> ".join(fixed(v) for v in sel["validation_nll"])
        lines += [
            f"**Greedy ensemble selection** (Caruana et al. 2004) of {len(sel['members'])} from {pool_name} of "
            f"{pool_size} on {sel['validation_examples']} validation examples: members {picks} "
            f"({sel.get('distinct', len(sel['multiplicities']))} distinct networks); "
            f"validation NLL as members are added: {steps}.",
            "",
        ]
    if sel.get("temperature") is not None:
        t = report.get("ensemble_temperature_scaled") or {}
        ens = report["ensemble"]
        lines += [
            f"**Temperature scaling** (Guo et al. 2017): T = {sel['temperature']:.4f} fitted on validation NLL "
            f"({fixed(sel['validation_nll'][-1])} -> {fixed(sel['validation_nll_temperature_scaled'])}); test NLL "
            f"{fixed(ens['nll'])} -> {fixed(t['nll'])}, ECE {fixed(ens['ece'])} -> {fixed(t['ece'])}, Brier "
            f"{fixed(ens['brier'])} -> {fixed(t['brier'])}.",
            "",
        ]
    choice = report.get("member_choice")
    if choice in MEMBER_CHOICE_TEXT:
        lines += [f"Each member is evaluated at {MEMBER_CHOICE_TEXT[choice]} (`train.member_choice: {choice}`).", ""]
    lines += [
        "| member | "
        + " | ".join(searched)
        + (" | " if searched else "")
        + "best epoch | stopped | validation NLL | selected |",
        "| --- | " + "--- | " * len(searched) + "--- | --- | --- | --- |",
    ]
    for m in rows:
        hp = m["hyperparameters"]
        values = [f"{hp[k]:.4g}" if isinstance(hp[k], float) else str(hp[k]) for k in searched]
        nll = "" if m["validation_nll"] is None else fixed(m["validation_nll"])
        lines.append(
            f"| {m['member']} | "
            + "".join(f"{v} | " for v in values)
            + f"{m['best_epoch'] or ''} | {m['stopped_epoch'] or ''} | {nll} | {m['selected'] or ''} |"
        )
    return [*lines, ""]


def _topology_lines(report: dict) -> list[str]:
    """Which process trained which members: one row per member group (nothing for one
    group in one process)."""
    rows = report.get("topology") or []
    if len(rows) < 2 and not any(t.get("processes", 1) > 1 for t in rows):
        return []
    head = (
        f"**Topology**: {len(rows)} member groups, each trained by its own task run."
        if len(rows) > 1
        else f"**Topology**: one program across {rows[0]['processes']} JAX processes (process 0 listed)."
    )
    lines = [
        head,
        "",
        "| group | members | host | process | Dask worker | JAX processes | devices | mesh | train s | member-img/s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for t in rows:
        mesh = f"{t['mesh']['ensemble']} x {t['mesh']['data']}"
        speed = t["train_member_images_per_s"]
        lines.append(
            f"| {t['group']} | {t['members'][0]}..{t['members'][1]} | {t['host']} | {t['pid']} | "
            f"{t['worker'] or '-'} | {t.get('processes', 1)} | {t['devices']} | {mesh} | {t['train_seconds']:.1f} | "
            f"{'-' if speed is None else f'{speed:.0f}'} |"
        )
    return [*lines, ""]


def member_table(report: dict) -> list[dict]:
    """One row per member plus the member mean and the ensemble (for tables/artifacts)."""
    sel = report.get("selection") or {}
    ids = sel.get("members") if report["config"]["ensemble"].get("select_size") else None
    ids = ids or list(range(len(report["members"])))
    rows = [
        {"model": f"member {i}", **{k: round(m[k], 4) for k in MEMBER_KEYS if k in m}}
        for i, m in zip(ids, report["members"], strict=True)
    ]
    for model, key in (("member mean", "member_mean"), ("ensemble", "ensemble")):
        rows.append({"model": model, **{k: round(v, 4) for k, v in report[key].items() if k in MEMBER_KEYS}})
    return rows


def evaluator_tables(report: dict) -> dict[str, list[dict]]:
    """One table (a list of rows) per evaluator in ``evaluations`` that ran and defines
    ``table(metrics)`` (:mod:`ensemble_core.evaluators`)."""
    tables = {}
    for name, section in (report.get("evaluations") or {}).items():
        module = evaluators.get(section.get("type") or name)
        if not section["metrics"].get("skipped") and hasattr(module, "table"):
            tables[name] = module.table(section["metrics"])
    return tables


def _cell(text: str) -> str:
    """``text`` fit for a markdown table cell: one line, ``|`` escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def class_level_lines(report: dict, plots: bool = True) -> list[str]:
    """report.md's class-level section of the test split (nothing without ``per_class``):
    the per-class table (class, count, accuracy = recall, NLL, ECE), the most confused
    pairs in one sentence and, with ``plots``, the confusion matrix and example grids."""
    rows, cm = report.get("per_class"), report.get("confusion_matrix") or {}
    if not rows:
        return []
    lines = [
        "**Class-level view** (test split, the ensemble; accuracy is the class's recall, NLL and ECE those of "
        "its examples):",
        "",
        "| # | class | count | accuracy | NLL | ECE |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        name = _cell(r.get("name", r["class"]))
        lines.append(
            f"| {r['class']} | {name} | {r['count']} | {fixed(r['accuracy'])} | {fixed(r['nll'])} | {fixed(r['ece'])} |"
        )
    pairs = cm.get("most_confused") or []
    names = cm.get("class_names") or [str(r["class"]) for r in rows]
    confused = ", ".join(
        f"{_cell(names[p['true']])} -> {_cell(names[p['predicted']])} {p['count']} ({100 * p['fraction']:.1f}%)"
        for p in pairs
    )
    lines += [
        "",
        f"**Most confused** (true -> predicted: examples, share of the true class): {confused}."
        if pairs
        else "**Most confused**: no test example was predicted as another class.",
        "",
    ]
    drawn = {k: v for k, v in (report.get("plots") or {}).items() if k in CLASS_LEVEL_PLOTS}
    if plots and drawn:
        lines += [" ".join(f"![{key.replace('_', ' ')}]({path})" for key, path in drawn.items()), ""]
    return lines


def class_level_tables(report: dict) -> dict[str, list[dict]]:
    """The test split's class-level tables for Prefect table artifacts (empty without
    ``per_class``): ``"per_class"``, one row per class (``class``, ``name``, ``count``,
    ``accuracy``, ``nll``, ``ece``, four decimals, None for a class without examples), and
    ``"confusion_matrix"``, one row per true class: ``true class`` (its name) and one column
    of counts per predicted class, named by the class name (made unique with `` (<index>)``
    where names repeat)."""
    rows, cm = report.get("per_class"), report.get("confusion_matrix")
    if not rows or not cm:
        return {}
    per_class = [
        {
            "class": r["class"],
            "name": r.get("name", str(r["class"])),
            "count": r["count"],
            **{k: None if r[k] is None else round(r[k], 4) for k in ("accuracy", "nll", "ece")},
        }
        for r in rows
    ]
    first = "true class"
    columns: list[str] = []
    for i, name in enumerate(cm["class_names"]):
        column = str(name)
        if column in columns or column == first or not column:
            column = f"{column} ({i})"
        columns.append(column)
    matrix = [
        {first: cm["class_names"][i], **dict(zip(columns, counts, strict=True))}
        for i, counts in enumerate(cm["counts"])
    ]
    return {"per_class": per_class, "confusion_matrix": matrix}


def render_markdown(report: dict, plots: bool = True) -> str:
    """``report.md``: headline, per-member table, diversity, timing, the class-level view
    (:func:`class_level_lines`), every other evaluator's section (and the plots; a run
    with ``eval.plots`` false says its figures were not drawn)."""
    ens, mean, div, t = report["ensemble"], report["member_mean"], report["diversity"], report["timing"]
    cfg = report["config"]
    diverged = report.get("diverged_members") or []
    warning = [f"**Diverged members** (frozen, left out of the ensemble figures): {diverged}.", ""] if diverged else []
    method = cfg["ensemble"].get("method", "deep")
    packed = cfg["ensemble"].get("packed") or {}
    method_line = {
        "mc_dropout": f"MC dropout: each network's {cfg['ensemble'].get('mc_samples')} stochastic passes are the "
        "members below.",
        "batch_ensemble": f"BatchEnsemble: each network holds {cfg['ensemble'].get('members_per_network')} members "
        "(shared weights, rank-1 fast weights), the members below.",
        "packed": f"Packed-Ensembles: each network holds {cfg['ensemble'].get('members_per_network')} members "
        f"(alpha {packed.get('alpha')}, gamma {packed.get('gamma')}), the members below.",
    }.get(method)
    mc = [method_line, ""] if method_line else []
    lines = [
        f"# Ensemble report: {report['run_name']}",
        "",
        f"{cfg['ensemble']['size']} x `{cfg['model']['name']}` on `{cfg['data']['name']}`, "
        f"{cfg['train']['epochs']} epochs, backend `{report['backend']}`, {report['devices']} devices, "
        f"mesh ensemble={report['mesh']['ensemble']} x data={report['mesh']['data']}, "
        f"member strategy `{report['strategy']}`.",
        "",
        *mc,
        *warning,
        f"**Ensemble**: accuracy {fixed(ens['accuracy'])}, NLL {fixed(ens['nll'])} "
        f"(member mean {fixed(mean['nll'])}), Brier {fixed(ens['brier'])}, ECE {fixed(ens['ece'])}.",
        "",
        "| model | accuracy | NLL | Brier | ECE | adaptive ECE | AURC | accuracy@80% coverage |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in member_table(report):
        lines.append(f"| {row['model']} | " + " | ".join(fixed(row.get(k)) for k in MEMBER_KEYS) + " |")
    lines += [
        "",
        f"**Diversity**: pairwise disagreement {fixed(div['disagreement'])}, mean predictive entropy "
        f"{fixed(div['predictive_entropy'])} nats, mean mutual information {fixed(div['mutual_information'])} nats.",
        "",
        f"**Timing** (steady state): compile {t['compile_seconds']:.2f} s, train {t['train_seconds']:.1f} s, "
        f"{t['train_member_images_per_s'] or 0:.0f} member-images/s training, "
        f"{t['eval_member_images_per_s']:.0f} member-images/s evaluation.",
        "",
        *([*(f"- {line}" for line in timing_lines(t)), ""] if "stages" in t else []),
        f"Checkpoint: `{report['checkpoint']['dir']}` step {report['checkpoint']['step']}.",
        "",
        *snapshot_lines(report.get("data_snapshot")),
        *drift_lines(report.get("drift")),
        *_topology_lines(report),
        *_selection_lines(report),
        *stratification_lines(report),
    ]
    promo = report.get("promotion")
    if promo:
        verdict = "**promoted** to champion" if promo["promoted"] else "**rejected** (the champion stays)"
        lines += [f"**Champion/challenger** on ensemble {promo['metric']}: {verdict}; {promo['reason']}.", ""]
        if promo["champion"]:
            lines += [
                f"| | {' | '.join(SCORE_KEYS)} |",
                "| --- | --- | --- | --- | --- |",
                "| challenger (this run) | " + " | ".join(fixed(promo["challenger"][k]) for k in SCORE_KEYS) + " |",
                f"| champion ({promo['champion_run']}) | "
                + " | ".join(fixed(promo["champion"][k]) for k in SCORE_KEYS)
                + " |",
                "",
            ]
    lines += class_level_lines(report, plots)
    lines += decision_report_lines(report)
    for name, section in (report.get("evaluations") or {}).items():
        kind = section.get("type") or name
        module = evaluators.get(kind)
        if kind != name:  # one of several evaluators of this type: say which
            lines += [f"**{name}** ({kind}):", ""]
        if section["metrics"].get("skipped"):
            lines += [f"**{name}**: skipped ({section['metrics']['skipped']}).", ""]
            continue
        if hasattr(module, "markdown"):
            lines += [*module.markdown(section["metrics"]), ""]
        if plots and section.get("plots"):
            lines += [" ".join(f"![{key.replace('_', ' ')}]({path})" for key, path in section["plots"].items()), ""]
    if not figures_drawn(report["config"]):
        lines += ["Figures: not drawn (eval.plots is false).", ""]
    elif plots:
        rest = {k: v for k, v in report["plots"].items() if not (report.get("per_class") and k in CLASS_LEVEL_PLOTS)}
        lines += [" ".join(f"![{key.replace('_', ' ')}]({path})" for key, path in rest.items()), ""]
    else:
        lines += [f"Plots: `{report['run_dir']}/plots/`.", ""]
    return "\n".join(lines)


def figures_drawn(config: dict) -> bool:
    """Whether the run of ``config`` (a :class:`~ensemble_core.config.PipelineConfig` as a
    dict) draws its figures: ``eval.plots``, true when absent (a report of a run from before
    the setting)."""
    return bool((config.get("eval") or {}).get("plots", True))


def plot_training_curves(report: dict, plots_dir: str | Path) -> Path:
    """``training_curves.png``: every member's training loss and accuracy per epoch and,
    with a validation split, its validation NLL per epoch (its best epoch circled, its
    stop marked with a cross)."""
    hist = report["history"]
    validated = bool(hist) and all("validation_nll" in r for r in hist)
    panels = [("train_loss", "train loss (nats)"), ("train_accuracy", "train accuracy")]
    if validated:
        panels.append(("validation_nll", "validation NLL (nats)"))
    fig, axes = subplots(1, len(panels), figsize=(5 * len(panels), 4))
    epochs = [r["epoch"] for r in hist]
    members = report["config"]["ensemble"]["size"]
    for ax, (key, label) in zip(axes, panels, strict=True):
        values = np.asarray([r[key] for r in hist])  # [epochs, E_trained]
        for m in range(members):
            (line,) = ax.plot(epochs, values[:, m], marker=".", label=f"member {m}")
            if key == "validation_nll" and m < len(report.get("pool") or []):
                row = report["pool"][m]
                for epoch, marker in ((row["best_epoch"], "o"), (row["stopped_epoch"], "x")):
                    if epoch and epoch in epochs:
                        at = epochs.index(epoch)
                        ax.plot([epoch], [values[at, m]], marker, color=line.get_color(), fillstyle="none")
        ax.set(xlabel="epoch", ylabel=label, title=f"{label} per member")
    if members <= 16:
        axes[0].legend(fontsize=7, ncol=2)
    return save(fig, Path(plots_dir) / TRAINING_CURVES)


@diskspace.output_errors("run_dir")
def write_report(
    run_name: str,
    config: dict,
    training: TrainingSummary,
    evaluation: Evaluation,
    run_dir: str | Path,
    promotion: PromotionDecision | None = None,
    dataset: DatasetInfo | None = None,
    drift: DriftReport | None = None,
    stratification: StratificationSummary | None = None,
    selection: dict[str, Any] | None = None,
    timing: dict[str, Any] | None = None,
) -> dict:
    """Write ``report.json``, ``report.md`` and, with ``eval.plots``, ``plots/training_curves.png``
    (atomically, the plot first); returns the report dict (:func:`build_report`).

    ``timing`` (from :func:`ensemble_core.runs.run`): ``started_at`` (the run's start,
    seconds since the epoch) and ``stages`` (seconds of every stage before this one); with
    it, ``report.json -> timing`` gains ``stages`` (this stage's own time, up to writing the
    files, as ``report``), ``wall_seconds``, ``training_steps_seconds`` and
    ``not_training_steps_fraction`` (:func:`ensemble_core.runs.report.timing.timing_section`).
    """
    t0 = time.perf_counter()
    run = RunDir(Path(run_dir))
    args = (run_name, config, training, evaluation, run.path, promotion, dataset, drift, stratification, selection)
    rep = build_report(*args)
    if figures_drawn(config):
        plot_training_curves(rep, run.plots)
    if timing is not None:
        stage_seconds = {**timing["stages"], "report": time.perf_counter() - t0}
        strat = stratification.training.timing.train_seconds if stratification is not None else 0.0
        wall = time.time() - timing["started_at"]
        rep["timing"].update(timing_section(stage_seconds, wall, training, evaluation, strat))
    markdown = render_markdown(rep)
    atomic_write_json(run.report_json, rep)
    atomic_write_text(run.report_md, markdown)
    return rep


def record_command_timing(run_dir: str | Path, start_seconds: float, flow_seconds: float, end_seconds: float) -> bool:
    """Make ``report.json -> timing`` (and ``report.md``'s lines) the whole command line's:
    :func:`ensemble_core.runs.report.timing.command_timing` with the command's seconds
    before, during and after the flow. Written atomically; the artifact the report stage
    published keeps the run's own timing.

    Returns False, writing nothing, when the run has no report with stage timings (a run
    that was refused, stopped or skipped). Raises nothing for a damaged report (False);
    OSError when the rewrite itself fails.
    """
    run = RunDir(Path(run_dir))
    try:
        rep = json.loads(run.report_json.read_text())
    except (OSError, ValueError):
        return False
    timing = rep.get("timing") if isinstance(rep, dict) else None
    if not isinstance(timing, dict) or "stages" not in timing or "wall_seconds" not in timing:
        return False
    rep["timing"] = command_timing(timing, start_seconds, flow_seconds, end_seconds)
    markdown = render_markdown(rep)
    atomic_write_json(run.report_json, rep)
    atomic_write_text(run.report_md, markdown)
    return True
