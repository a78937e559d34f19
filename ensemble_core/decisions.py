"""The decisions a user makes with an ensemble's uncertainty, fitted on held-out data and
scored on labelled sets: prediction sets (split conformal prediction,
:mod:`ensemble_core.conformal`) and abstention at a chosen risk (selective prediction,
:mod:`ensemble_core.selective`).

:func:`fit_rules` fits the rules of one predictor (the ensemble, or one member) on the
calibration split: one :class:`~ensemble_core.conformal.ConformalCalibration` per score
(LAC, APS, RAPS) at ``prediction_sets.alpha``, and one
:class:`~ensemble_core.selective.SelectiveThreshold` for ``abstention``.
:func:`apply_rules` gives the sets and abstentions of new inputs; :func:`score_rules`
their empirical coverage, mean set size, selective risk and coverage on a labelled set.
:class:`DecisionFit` holds the rules of the ensemble *and* of every member, so that the
evaluation can compare the ensemble with the mean member and the best member on the test
split and under every shift (:meth:`DecisionFit.score`).

The ensemble's probabilities are what prediction uses: the members' mean, temperature
scaled when the run fitted a temperature (:func:`ensemble_core.calibration.apply_temperature`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ensemble_core import conformal, selective
from ensemble_core import metrics as metrics_lib
from ensemble_core.calibration import apply_temperature
from ensemble_core.config import AbstentionConfig, PredictionSetsConfig

#: A single network has no mutual information (it is 0 for one member): a member's
#: abstention on ``mutual_information`` uses its max probability instead.
MEMBER_FALLBACK_CRITERION = "max_probability"
#: Whose figures :meth:`DecisionFit.score` gives.
WHO = ("ensemble", "member_mean", "best_member")


@dataclasses.dataclass(frozen=True)
class DecisionRules:
    """One predictor's rules: ``prediction_sets`` ({score: calibration} for every score of
    :data:`ensemble_core.conformal.METHODS`), ``method`` (the score prediction uses),
    ``abstention`` (the SGR threshold), ``split`` (what they were fitted on:
    ``'calibration'`` or ``'validation'``), ``num_examples`` (its size) and ``lineage``
    (which examples those were, :func:`ensemble_core.runs.dataset.split_lineage`; None
    where unknown)."""

    prediction_sets: dict[str, conformal.ConformalCalibration]
    method: str
    abstention: selective.SelectiveThreshold
    split: str
    num_examples: int
    lineage: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able (``decisions.json``)."""
        return {
            "method": self.method,
            "split": self.split,
            "num_examples": self.num_examples,
            "lineage": self.lineage,
            "prediction_sets": {m: c.to_dict() for m, c in self.prediction_sets.items()},
            "abstention": self.abstention.to_dict(),
        }

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> DecisionRules:
        """The inverse of :meth:`to_dict`.

        Raises:
          KeyError, TypeError, ValueError: a record of another shape (the caller sets it aside).
        """
        sets = {str(m): conformal.ConformalCalibration.from_dict(c) for m, c in record["prediction_sets"].items()}
        method = str(record["method"])
        if method not in sets:
            raise ValueError(f"method {method!r} has no calibration")
        return cls(
            prediction_sets=sets,
            method=method,
            abstention=selective.SelectiveThreshold.from_dict(record["abstention"]),
            split=str(record["split"]),
            num_examples=int(record["num_examples"]),
            lineage=record.get("lineage"),
        )


def fit_rules(
    probs: np.ndarray,
    labels: np.ndarray,
    sets_cfg: PredictionSetsConfig,
    abstention_cfg: AbstentionConfig,
    split: str,
    *,
    member_probs: np.ndarray | None = None,
) -> DecisionRules:
    """Fit one predictor's rules on a held-out split.

    Args:
      probs: float ``[n, C]``: the predictor's probabilities of the held-out examples.
      labels: int ``[n]``.
      sets_cfg: ``prediction_sets`` (alpha, the score prediction uses).
      abstention_cfg: ``abstention`` (criterion, target risk, delta).
      split: the held-out split's name, recorded.
      member_probs: float ``[K, n, C]``, the members' (the ``mutual_information`` criterion);
        None for one network, whose ``mutual_information`` falls back to
        :data:`MEMBER_FALLBACK_CRITERION`.

    Raises:
      DataError: an empty split or malformed arrays (:func:`ensemble_core.conformal.calibrate`).
    """
    sets = {m: conformal.calibrate(probs, labels, m, sets_cfg.alpha) for m in conformal.METHODS}
    criterion: str = abstention_cfg.criterion
    if criterion == "mutual_information" and member_probs is None:
        criterion = MEMBER_FALLBACK_CRITERION
    kappa = selective.confidence(criterion, probs, member_probs)
    correct = np.argmax(probs, axis=-1) == np.asarray(labels)
    threshold = selective.select_threshold(
        kappa, correct, abstention_cfg.target_risk, abstention_cfg.delta, criterion=criterion
    )
    return DecisionRules(sets, sets_cfg.method, threshold, split, len(labels))


def apply_rules(
    rules: DecisionRules, probs: np.ndarray, member_probs: np.ndarray | None = None, *, method: str | None = None
) -> dict[str, np.ndarray]:
    """The rules on new inputs.

    Args:
      probs: float ``[N, C]``, the predictor's probabilities (as at :func:`fit_rules`).
      member_probs: float ``[K, N, C]`` (needed for the ``mutual_information`` criterion).
      method: the score of the sets (default ``rules.method``).

    Returns:
      ``prediction_set`` bool ``[N, C]`` (:func:`ensemble_core.conformal.prediction_sets`,
      seed 0: the same rows give the same sets; a set may be empty, the standard
      definitions whose coverage is exact),
      ``abstain`` bool ``[N]`` (confidence below the threshold) and ``confidence`` float ``[N]`` (the criterion's,
      :func:`ensemble_core.selective.confidence`).
    """
    calibration = rules.prediction_sets[method or rules.method]
    kappa = selective.confidence(rules.abstention.criterion, probs, member_probs)
    return {
        "prediction_set": conformal.prediction_sets(probs, calibration),
        "abstain": ~selective.accept(kappa, rules.abstention.threshold),
        "confidence": np.asarray(kappa, np.float32),
    }


def score_rules(
    rules: DecisionRules, probs: np.ndarray, labels: np.ndarray, member_probs: np.ndarray | None = None
) -> dict[str, Any]:
    """The rules' figures on a labelled set.

    Returns:
      ``{"prediction_sets": {score: {"coverage", "mean_set_size"}}, "selective":
      {"risk", "coverage"}}``: coverage the fraction of sets holding the true label,
      mean set size in classes; selective risk the error rate among the accepted
      (None when none is accepted) and coverage the accepted fraction
      (:func:`ensemble_core.selective.selective_risk_coverage`).
    """
    labels = np.asarray(labels)
    sets = {}
    for method in rules.prediction_sets:
        s = conformal.prediction_sets(probs, rules.prediction_sets[method])
        sets[method] = {"coverage": conformal.coverage(s, labels), "mean_set_size": conformal.mean_set_size(s)}
    kappa = selective.confidence(rules.abstention.criterion, probs, member_probs)
    risk, cover = selective.selective_risk_coverage(
        selective.accept(kappa, rules.abstention.threshold), np.argmax(probs, axis=-1) == labels
    )
    return {
        "prediction_sets": sets,
        "selective": {"risk": float(risk) if cover > 0 else None, "coverage": float(cover)},
    }


def ensemble_probs(member_probs: np.ndarray, healthy: np.ndarray, temperature: float | None) -> np.ndarray:
    """The ensemble's probabilities float ``[N, C]`` from every member's ``[E, N, C]``: the
    healthy members' mean (Lakshminarayanan et al. 2017), temperature scaled when
    ``temperature`` is set (Guo et al. 2017), as prediction computes them."""
    ens = metrics_lib.ensemble_probs(np.asarray(member_probs)[np.asarray(healthy, bool)])
    return ens if temperature is None else apply_temperature(ens, temperature)


@dataclasses.dataclass(frozen=True)
class DecisionFit:
    """The rules of the ensemble (``ensemble``) and of every healthy member (``members``,
    by member row; None for a diverged one), fitted on the same held-out split, with the
    ensemble's ``temperature`` (or None)."""

    ensemble: DecisionRules
    members: list[DecisionRules | None]
    temperature: float | None

    def ensemble_probs(self, member_probs: np.ndarray, healthy: np.ndarray) -> np.ndarray:
        """:func:`ensemble_probs` with this fit's temperature."""
        return ensemble_probs(member_probs, healthy, self.temperature)

    def score(
        self, member_probs: np.ndarray, labels: np.ndarray, healthy: np.ndarray, best_member: int | None = None
    ) -> dict[str, Any]:
        """:func:`score_rules` of the ensemble, the mean over healthy members of each
        member's own figures (``member_mean``), and of member ``best_member`` (the
        caller's best member, e.g. by NLL on the same set; omitted when None).

        Args:
          member_probs: float ``[E, N, C]`` of every member (rows as at fitting).
          labels: int ``[N]``. healthy: bool ``[E]``.
        """
        healthy = np.asarray(healthy, bool)
        out = {
            "ensemble": score_rules(
                self.ensemble, self.ensemble_probs(member_probs, healthy), labels, member_probs[healthy]
            )
        }
        rows = [
            score_rules(r, member_probs[i], labels) for i, r in enumerate(self.members) if r is not None and healthy[i]
        ]
        if rows:
            out["member_mean"] = mean_scores(rows)
        best = None if best_member is None else self.members[best_member]
        if best is not None:
            out["best_member"] = score_rules(best, member_probs[best_member], labels)
        return out


def fit_all(
    member_probs: np.ndarray,
    labels: np.ndarray,
    healthy: np.ndarray,
    temperature: float | None,
    sets_cfg: PredictionSetsConfig,
    abstention_cfg: AbstentionConfig,
    split: str,
) -> DecisionFit:
    """:func:`fit_rules` for the ensemble (the healthy members' mean, temperature scaled)
    and for every healthy member on its own.

    Args:
      member_probs: float ``[E, n, C]``, every member on the held-out split.
      labels: int ``[n]``. healthy: bool ``[E]``. temperature: the ensemble's, or None.
    """
    healthy = np.asarray(healthy, bool)
    ens = ensemble_probs(member_probs, healthy, temperature)
    rules = fit_rules(ens, labels, sets_cfg, abstention_cfg, split, member_probs=member_probs[healthy])
    members = [
        fit_rules(member_probs[i], labels, sets_cfg, abstention_cfg, split) if healthy[i] else None
        for i in range(len(member_probs))
    ]
    return DecisionFit(ensemble=rules, members=members, temperature=temperature)


def mean_scores(rows: list) -> Any:
    """The mean, figure by figure, of :func:`score_rules`-shaped dicts (None where a figure
    is None in every row: e.g. the selective risk where nothing was accepted)."""
    first = rows[0]
    if isinstance(first, dict):
        return {k: mean_scores([r[k] for r in rows]) for k in first}
    values = [r for r in rows if r is not None]
    return float(np.mean(values)) if values else None


def _pair(cell: dict, first: str, second: str) -> str:
    a, b = cell.get(first), cell.get(second)
    return f"{'-' if a is None else f'{a:.3f}'} / {'-' if b is None else f'{b:.2f}'}"


def decision_lines(rows: list[tuple[str, dict]]) -> list[str]:
    """A report.md table of :meth:`DecisionFit.score` results, one row per labelled set:
    the ensemble's coverage / mean set size for each conformal score, and the selective
    risk / coverage of the ensemble, the mean member and the best member.

    Args:
      rows: ``[(label, DecisionFit.score(...))]``.
    """
    if not rows:
        return []
    methods = list(rows[0][1]["ensemble"]["prediction_sets"])
    head = " | ".join(f"{m.upper()} coverage / size" for m in methods)
    lines = [
        "Prediction sets (split conformal, coverage / mean set size of the ensemble) and abstention "
        "(selective risk / coverage: ensemble, mean member, best member):",
        "",
        f"| set | {head} | abstention: ensemble | mean member | best member |",
        "| --- |" + " --- |" * (len(methods) + 3),
    ]
    for label, d in rows:
        sets = " | ".join(_pair(d["ensemble"]["prediction_sets"][m], "coverage", "mean_set_size") for m in methods)
        sel = [_pair(d[who]["selective"], "risk", "coverage") if who in d else "-" for who in WHO]
        lines.append(f"| {label} | {sets} | " + " | ".join(sel) + " |")
    return lines
