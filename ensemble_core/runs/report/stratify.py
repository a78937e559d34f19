"""The report's stratification section (hyper-deep ensembles, :mod:`ensemble_core.runs.ensemble.stratify`):
the first selection from the search pool, the stratified pool (which setting, which
initialisation, picked how many times) and how many distinct networks the ensemble holds,
as ``report.json`` data, ``report.md`` lines and Prefect table rows."""

from __future__ import annotations

from typing import Any

from ensemble_core.runs.report.numbers import fixed
from ensemble_core.runs.results import StratificationSummary


def stratification_report(stratification: StratificationSummary | None, final: dict | None) -> dict | None:
    """``report.json``'s ``stratification``: ``settings``, ``inits``, ``first_selection``,
    ``pool`` (one row per stratified-pool member: ``member``, ``setting``, ``init``,
    ``best_epoch``, ``stopped_epoch``, ``healthy``, ``validation_nll``, ``selected``),
    ``distinct_networks`` and ``distinct_settings`` of the final selection, and the
    stratified pool's ``train_seconds`` and ``checkpoint``. None without stratification.

    Args:
      final: the evaluation's selection record (:func:`ensemble_core.runs.ensemble.pool.selection_record`).
    """
    if stratification is None:
        return None
    final = final or {}
    counts = {int(k): v for k, v in (final.get("multiplicities") or {}).items()}
    nll = final.get("member_validation_nll") or []
    size, inits = len(stratification.settings) * stratification.inits, stratification.inits
    rows = []
    for m, rec in enumerate(stratification.training.members[:size]):
        rows.append(
            {
                "member": m,
                "setting": stratification.settings[m // inits],
                "init": m % inits,
                "best_epoch": rec.get("best_epoch"),
                "stopped_epoch": rec.get("stopped_epoch"),
                "healthy": rec.get("healthy", True),
                "validation_nll": nll[m] if m < len(nll) else None,
                "selected": counts.get(m, 0),
            }
        )
    training = stratification.training
    return {
        "settings": stratification.settings,
        "inits": inits,
        "first_selection": stratification.first_selection,
        "pool": rows,
        "distinct_networks": sum(1 for r in rows if r["selected"]),
        "distinct_settings": len({r["setting"] for r in rows if r["selected"]}),
        "train_seconds": training.timing.train_seconds,
        "checkpoint": {"dir": training.checkpoint_dir, "step": training.checkpoint_step},
    }


def stratification_lines(report: dict) -> list[str]:
    """``report.md``'s stratification section (nothing without one)."""
    strat = report.get("stratification")
    if not strat:
        return []
    first = strat["first_selection"]
    picks = ", ".join(f"{m} x{n}" if n > 1 else f"{m}" for m, n in first["multiplicities"].items())
    final = report.get("selection") or {}
    lines = [
        f"**Stratification** (hyper-deep ensemble, Wenzel et al. 2020): the first selection from the search pool "
        f"of {len(report.get('pool') or [])} picked members {picks} (validation NLL "
        f"{fixed(first['validation_nll'][-1])}); its {len(strat['settings'])} distinct settings "
        f"{strat['settings']} were each trained again from {strat['inits']} initialisations "
        f"({len(strat['pool'])} members, {strat['train_seconds']:.1f} s); the final selection of "
        f"{len(final.get('members') or [])} from that pool holds {strat['distinct_networks']} distinct networks of "
        f"{strat['distinct_settings']} settings.",
        "",
        "| stratified member | setting | initialisation | best epoch | stopped | validation NLL | selected |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in strat["pool"]:
        lines.append(
            f"| {r['member']} | {r['setting']} | {r['init']} | {r['best_epoch'] or ''} | {r['stopped_epoch'] or ''} | "
            f"{fixed(r['validation_nll'])} | {r['selected'] or ''} |"
        )
    return [*lines, ""]


def stratification_table(report: dict) -> list[dict[str, Any]]:
    """The stratified pool as Prefect table rows (empty without stratification)."""
    strat = report.get("stratification") or {}
    return [{k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()} for row in strat.get("pool") or []]
