"""The report's prediction-set and abstention section: the rules the select stage fitted
(``decision_rules``) and their figures on the test split (``decisions``), for the
ensemble against the mean member and the best member."""

from __future__ import annotations

from ensemble_core.decisions import WHO


def _figure(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def decision_report_lines(report: dict) -> list[str]:
    """report.md's lines (nothing for a run without decision rules): the rules in two
    sentences, then one row per predictor (ensemble, mean member, best member) with each
    conformal score's coverage / mean set size and the abstention's selective risk /
    coverage on the test split."""
    rules, scored = report.get("decision_rules"), report.get("decisions")
    if not rules or not scored:
        return []
    chosen = rules["prediction_sets"][rules["method"]]
    alpha = chosen["alpha"]
    rule = rules["abstention"]
    if rule["feasible"]:
        abstain = (
            f"abstains where its {rule['criterion'].replace('_', ' ')} is past the threshold "
            f"{_figure(rule['threshold'], 4)}: a risk of at most {rule['target_risk']:g} with probability "
            f"{1 - rule['delta']:g} (selection with guaranteed risk, Geifman & El-Yaniv 2017), answering "
            f"{100 * rule['coverage']:.1f}% of the {rules['split']} split"
        )
    else:
        abstain = (
            f"**abstains on every input**: a risk of {rule['target_risk']:g} cannot be guaranteed on "
            f"{rules['num_examples']} {rules['split']} examples (smallest bound {_figure(rule['risk_bound'], 4)}); "
            "raise abstention.target_risk or data.calibration_fraction"
        )
    methods = list(scored["ensemble"]["prediction_sets"])
    lines = [
        f"**Prediction sets and abstention** (fitted on the {rules['split']} split, {rules['num_examples']} "
        f"examples{'; biased: it also selected the ensemble' if rules['split'] == 'validation' else ''}): "
        f"flows.predict gives {rules['method'].upper()} sets at alpha {alpha:g} (target coverage {1 - alpha:g}, "
        f"split conformal, Angelopoulos et al. 2021) and {abstain}.",
        "",
        "| test split | "
        + " | ".join(f"{m.upper()} coverage / size" for m in methods)
        + " | selective risk / coverage |",
        "| --- |" + " --- |" * (len(methods) + 1),
    ]
    for who in WHO:
        if who not in scored:
            continue
        d = scored[who]
        sets = d["prediction_sets"]
        cells = [f"{_figure(sets[m]['coverage'], 4)} / {_figure(sets[m]['mean_set_size'], 2)}" for m in methods]
        sel = d["selective"]
        lines.append(
            f"| {who.replace('_', ' ')} | "
            + " | ".join(cells)
            + f" | {_figure(sel['risk'], 4)} / {_figure(sel['coverage'], 4)} |"
        )
    return [*lines, ""]
