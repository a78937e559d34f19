"""One unlabelled drop scored by a trained ensemble (the champion): how is tonight's data
served, without its labels?

A *drop* is what arrives for the ensemble to serve: image files, folders (with or without
class folders: the folder names are never read as labels), globs, or one ``.npy``/``.npz``
of images, decoded as the run's training decoded its images
(:mod:`ensemble_core.runs.prediction.inputs`).
:func:`ensemble_core.runs.monitoring.monitor.monitor_drop` predicts it with the run, and
:func:`summarize` here reduces the predictions to one night's figures:

- **estimated accuracy** by the label-free estimators
  (:func:`ensemble_core.accuracy_estimation.estimate_all`, the fitted ones from the run's
  ``accuracy_reference.json``), one of them the headline (:func:`choose_estimator`);
- **drift tests** against the run's calibration split (``drift_reference.json``):
  :func:`ensemble_core.drift_tests.drift_tests` at ``alpha``, Holm-corrected p-values;
- the **abstention rate** and **mean prediction-set size** of the run's decision rules
  (``decisions.json``), where it has them;
- the **predicted-class frequencies**, beside the reference's.

The default estimator (``"auto"``, :data:`ESTIMATOR_PREFERENCE`): the members'
disagreement (Jiang et al. 2022) when the ensemble has two members or more, else DoC
(Guillory et al. 2021) when the run has a fitted reference, else the average confidence.
Why: on the Fashion-MNIST ensemble's 75 corruption cells its mean absolute error was the
smallest of the seven (docs/evaluation.md, "Label-free accuracy estimates"), and it
needs no labelled reference; DoC was the best single-model estimator there.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from ensemble_core.accuracy_estimation import (
    AGREEMENT_ESTIMATORS,
    ESTIMATORS,
    REFERENCE_FREE,
    Reference,
    estimate_all,
)
from ensemble_core.drift_tests import DriftReference, drift_tests
from ensemble_core.errors import ConfigError, DataError
from ensemble_core.runs.storage.layout import RunDir
from ensemble_core.runs.storage.records import read_accuracy_reference, read_drift_reference

#: The estimators ``"auto"`` picks from, in order: the first one the run can compute.
ESTIMATOR_PREFERENCE = ("disagreement", "doc", "average_confidence")
AUTO = "auto"
#: What ``estimator`` may be: ``"auto"`` or a name of :data:`ensemble_core.accuracy_estimation.ESTIMATORS`.
ESTIMATOR_CHOICES = (AUTO, *ESTIMATORS)
DEFAULT_ALPHA = 0.05
#: A night's id: letters, digits, ``.``, ``_``, ``-`` (a file name under ``monitoring/``).
NIGHT_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_settings(alpha: float, estimator: str) -> None:
    """Refuse a family-wise error rate outside (0, 1) or an unknown estimator.

    Raises:
      ConfigError: naming the value and the choices.
    """
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 < float(alpha) < 1:
        raise ConfigError(f"alpha {alpha!r} is not in (0, 1)", fix="pass the drift tests' error rate, e.g. 0.05")
    if estimator not in ESTIMATOR_CHOICES:
        raise ConfigError(
            f"estimator {estimator!r} is not one of {', '.join(ESTIMATOR_CHOICES)}",
            fix="pass one of them (auto: the members' disagreement, the best on the corruption benchmark)",
        )


def night_id(stem: str, now: dt.datetime | None = None) -> str:
    """A new night's id: ``<UTC YYYYmmddTHHMMSSZ>-<stem>`` (the stem cut to a file-name-safe
    48 characters), what the night's files under ``monitoring/`` are named after."""
    stamp = (now or dt.datetime.now(dt.UTC)).strftime("%Y%m%dT%H%M%SZ")
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-.")[:48] or "drop"
    return f"{stamp}-{safe}"


def check_night(night: str) -> None:
    """Raises ConfigError when ``night`` is not a file-name-safe id (:data:`NIGHT_PATTERN`)."""
    if not isinstance(night, str) or not NIGHT_PATTERN.fullmatch(night):
        raise ConfigError(
            f"night {night!r} is not a name of letters, digits, '.', '_' and '-' (at most 128)",
            fix="pass such a name, or none (the time and the inputs' name)",
        )


def references(run_dir: str | Path) -> tuple[DriftReference | None, Reference | None]:
    """The run's drift reference and accuracy reference (each None when the run has none;
    a damaged one is set aside with a warning, :mod:`ensemble_core.runs.storage.records`)."""
    run = RunDir(Path(run_dir))
    return read_drift_reference(run), read_accuracy_reference(run)


def available_estimators(members: int, accuracy_reference: Reference | None) -> tuple[str, ...]:
    """The estimators a run of ``members`` members (E) can compute, in :data:`ESTIMATORS`
    order: the agreement ones only for E >= 2, the fitted ones only with a reference."""
    names = [n for n in ESTIMATORS if accuracy_reference is not None or n in REFERENCE_FREE]
    return tuple(n for n in names if members >= 2 or n not in AGREEMENT_ESTIMATORS)


def choose_estimator(requested: str, members: int, accuracy_reference: Reference | None) -> str:
    """The headline estimator: ``requested`` itself, or for ``"auto"`` the first of
    :data:`ESTIMATOR_PREFERENCE` the run can compute.

    Raises:
      ConfigError: an unknown name, or one the run cannot compute (one member, or no
        calibration split to fit it on), naming what it can compute.
    """
    check_settings(DEFAULT_ALPHA, requested)
    can = available_estimators(members, accuracy_reference)
    if requested == AUTO:
        return next(n for n in ESTIMATOR_PREFERENCE if n in can)
    if requested not in can:
        why = "it needs two members or more" if members < 2 else "the run has no calibration split to fit it on"
        raise ConfigError(
            f"estimator {requested!r} cannot be computed for this run ({why})",
            fix=f"pass one of {', '.join(can)} or auto "
            "(retrain with data.calibration_fraction > 0 for the fitted ones)",
        )
    return requested


def _frequencies(counts: np.ndarray, names: list[str]) -> dict[str, float]:
    total = max(int(counts.sum()), 1)
    return {name: float(c) / total for name, c in zip(names, counts, strict=True)}


def summarize(
    result: dict[str, Any],
    drift_reference: DriftReference | None,
    accuracy_reference: Reference | None,
    alpha: float = DEFAULT_ALPHA,
    estimator: str = AUTO,
) -> dict[str, Any]:
    """One night's figures from the run's predictions on the drop.

    Args:
      result: :func:`ensemble_core.runs.prediction.predict.predict_images`'s arrays:
        ``member_probs`` float32 ``[E, N, C]``, ``predicted_class`` int ``[N]``,
        ``class_names`` str ``[C]``, ``temperature`` (NaN: none), and where the run has
        decision rules ``prediction_set`` bool ``[N, C]`` and ``abstain`` bool ``[N]``.
      drift_reference, accuracy_reference: the run's (:func:`references`), or None.
      alpha: the drift tests' family-wise error rate, in (0, 1).
      estimator: ``"auto"`` or one of :data:`ensemble_core.accuracy_estimation.ESTIMATORS`.

    Returns:
      ``n_images``; ``accuracy``: ``{"estimator", "estimate", "estimates": {name: fraction}}``;
      ``drift``: the :func:`~ensemble_core.drift_tests.drift_tests` result or None;
      ``drifted`` (bool: a test rejected at ``alpha`` after Holm), ``alpha``;
      ``abstention_rate``, ``mean_set_size`` and ``empty_set_rate`` (the fraction of
      empty prediction sets, which LAC allows: an empty set means no class is plausible,
      so under shift the mean set size can *fall*; None without decision rules);
      ``class_counts``, ``class_frequencies`` ({class name: fraction of the drop}),
      ``reference_class_frequencies`` (of the calibration split; None without it);
      ``not_computed``: why a figure is missing.

    Raises:
      DataError: no images; member probabilities that do not match a reference (another
        member or class count: the run was evaluated again since).
      ConfigError: ``alpha`` or ``estimator`` refused (:func:`check_settings`,
        :func:`choose_estimator`).
    """
    check_settings(alpha, estimator)
    member_probs = np.asarray(result["member_probs"])
    if member_probs.ndim != 3 or member_probs.shape[1] == 0:
        raise DataError("the drop has no image to monitor", fix="pass a folder or files with at least one image")
    members, n, classes = member_probs.shape
    names = [str(c) for c in np.asarray(result["class_names"]).tolist()]
    raw_t = float(np.asarray(result["temperature"]))
    temperature = None if math.isnan(raw_t) else raw_t
    not_computed: list[str] = []
    for ref in (drift_reference, accuracy_reference):
        if ref is None or (ref.temperature is None and temperature is None):
            continue
        if (
            ref.temperature is None
            or temperature is None
            or not math.isclose(ref.temperature, temperature, rel_tol=1e-6)
        ):
            raise DataError(
                f"the run's references were fitted with temperature {ref.temperature}, its ensemble now has "
                f"{temperature}",
                fix="evaluate the run again (rerun its run name) so that its records agree",
            )
    t_drift = None if drift_reference is None else drift_reference.temperature
    t_acc = None if accuracy_reference is None else accuracy_reference.temperature
    if accuracy_reference is not None and (
        accuracy_reference.n_members != members or accuracy_reference.n_classes != classes
    ):
        not_computed.append(
            f"fitted estimators: the reference has {accuracy_reference.n_members} members and "
            f"{accuracy_reference.n_classes} classes, the ensemble {members} and {classes}"
        )
        accuracy_reference = None
    elif accuracy_reference is None:
        not_computed.append(
            "fitted estimators (ATC, DoC, agreement_corrected): the run has no accuracy_reference.json "
            "(no calibration split, or evaluated before this release: rerun its run name)"
        )
    chosen = choose_estimator(estimator, members, accuracy_reference)
    estimates = estimate_all(accuracy_reference, member_probs, t_acc if accuracy_reference is not None else temperature)
    drift = None
    if drift_reference is None:
        not_computed.append("drift tests: the run has no drift reference (no calibration split)")
    elif drift_reference.members != members or len(drift_reference.class_counts) != classes:
        not_computed.append(
            f"drift tests: the reference has {drift_reference.members} members and "
            f"{len(drift_reference.class_counts)} classes, the ensemble {members} and {classes}"
        )
    else:
        drift = drift_tests(drift_reference, member_probs, alpha, t_drift)
    abstain = result.get("abstain")
    sets = result.get("prediction_set")
    if abstain is None:
        not_computed.append("abstention and prediction sets: the run has no decision rules (no calibration split)")
    counts = np.bincount(np.asarray(result["predicted_class"], np.int64), minlength=classes)
    return {
        "n_images": int(n),
        "members": int(members),
        "accuracy": {"estimator": chosen, "estimate": float(estimates[chosen]), "estimates": estimates},
        "drift": drift,
        "drifted": bool(drift is not None and drift["drifted"]),
        "alpha": float(alpha),
        "abstention_rate": None if abstain is None else float(np.mean(abstain)),
        "mean_set_size": None if sets is None else float(np.asarray(sets).sum(1).mean()),
        "empty_set_rate": None if sets is None else float((np.asarray(sets).sum(1) == 0).mean()),
        "class_counts": {name: int(c) for name, c in zip(names, counts, strict=True)},
        "class_frequencies": _frequencies(counts, names),
        "reference_class_frequencies": None
        if drift_reference is None or len(drift_reference.class_counts) != classes
        else _frequencies(np.asarray(drift_reference.class_counts), names),
        "not_computed": not_computed,
    }


def p_values(summary: dict[str, Any]) -> dict[str, float]:
    """The night's Holm-adjusted p-value per drift test run (``{}`` without tests)."""
    drift = summary.get("drift") or {}
    return {name: float(t["p_adjusted"]) for name, t in (drift.get("tests") or {}).items()}


def summary_lines(record: dict[str, Any]) -> list[str]:
    """A night's record (:func:`summarize` plus ``night``, ``champion_run``) as short lines
    for a terminal or a log."""
    acc = record["accuracy"]
    lines = [
        f"night {record.get('night', '?')}: {record['n_images']} images, champion {record.get('champion_run', '?')}",
        f"estimated accuracy {acc['estimate']:.1%} ({acc['estimator']}); "
        + ", ".join(f"{k} {v:.1%}" for k, v in acc["estimates"].items() if k != acc["estimator"]),
    ]
    ps = p_values(record)
    if ps:
        verdict = "DRIFT" if record["drifted"] else "no drift"
        lines.append(
            f"drift tests (Holm, alpha {record['alpha']:g}): {verdict}; "
            + ", ".join(f"{k} p={v:.3g}" for k, v in ps.items())
        )
    if record.get("abstention_rate") is not None:
        lines.append(
            f"abstention rate {record['abstention_rate']:.1%}, mean prediction-set size {record['mean_set_size']:.2f}"
            f" ({record.get('empty_set_rate') or 0:.1%} empty)"
        )
    top = sorted(record["class_frequencies"].items(), key=lambda kv: -kv[1])[:5]
    lines.append("predicted classes: " + ", ".join(f"{k} {v:.1%}" for k, v in top))
    lines += [f"not computed: {why}" for why in record.get("not_computed", [])]
    return lines


def report_markdown(record: dict[str, Any]) -> str:
    """A night's record as a small Markdown report (the flow's artifact and ``<night>.md``)."""
    acc = record["accuracy"]
    out = [
        f"# Monitoring: {record.get('night', '')}",
        "",
        f"{record['n_images']} unlabelled images scored by champion `{record.get('champion_run', '')}`"
        f" ({record['members']} members).",
        "",
        "## Estimated accuracy (no labels)",
        "",
        "| estimator | estimate |",
        "| --- | --- |",
        *(
            f"| {'**' + k + '** (headline)' if k == acc['estimator'] else k} | {v:.1%} |"
            for k, v in acc["estimates"].items()
        ),
        "",
    ]
    drift = record.get("drift")
    if drift is not None:
        out += [
            f"## Drift tests against the calibration split ({drift['n_reference']} images)",
            "",
            f"Holm-corrected at alpha {record['alpha']:g}: **{'drift' if record['drifted'] else 'no drift'}**.",
            "",
            "| test | method | statistic | p-value | Holm-adjusted | rejected |",
            "| --- | --- | --- | --- | --- | --- |",
            *(
                f"| {name} | {t['method']} | {t['statistic']:.4g} | {t['p_value']:.3g} | {t['p_adjusted']:.3g} | "
                f"{'yes' if t['rejected'] else 'no'} |"
                for name, t in drift["tests"].items()
            ),
            *(f"- {name} skipped: {why}" for name, why in drift.get("skipped", {}).items()),
            "",
        ]
    if record.get("abstention_rate") is not None:
        out += [
            "## Decisions",
            "",
            f"- abstention rate: {record['abstention_rate']:.1%}",
            f"- mean prediction-set size: {record['mean_set_size']:.2f}",
            f"- empty prediction sets (no class plausible): {record.get('empty_set_rate') or 0:.1%}",
            "",
        ]
    ref = record.get("reference_class_frequencies") or {}
    out += ["## Predicted classes", "", "| class | tonight | calibration split |", "| --- | --- | --- |"]
    out += [
        f"| {k} | {v:.1%} | {'' if k not in ref else format(ref[k], '.1%')} |"
        for k, v in record["class_frequencies"].items()
    ]
    out += ["", *(f"- not computed: {why}" for why in record.get("not_computed", []))]
    return "\n".join(out) + "\n"
