"""Figures of merit: the numbers report.json holds, what each is called and which way is better.

A :class:`Figure` is a small frozen descriptor (in the manner of kauldron's metric objects):
its key in report.json, whether higher is better, and how reports and plots name it. The
computations themselves live in :mod:`ensemble_core.metrics`; promotion
(:mod:`ensemble_core.runs.champion.promotion`) compares a challenger with the champion on the figure
``promotion.metric`` names, in that figure's direction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from ensemble_core.registry import EVALUATOR_NAMES


@dataclass(frozen=True)
class Figure:
    """One figure of merit.

    Attributes:
      name: its key in report.json's metrics (e.g. ``"nll"``), also the last part of a
        ``promotion.metric`` path that names it.
      higher_is_better: True for accuracy-like figures, False for losses and error rates.
      label: how report.md and plots name it (``"NLL"``, ``"FPR@95%TPR"``).
      unit: the unit of its values (``"nats"``), or ``""`` for a fraction or a score.
      source: the definition it follows.
    """

    name: str
    higher_is_better: bool
    label: str
    unit: str = ""
    source: str = ""

    def not_worse(self, new: float, old: float) -> bool:
        """Whether ``new`` is at least as good as ``old`` in this figure's direction (ties count)."""
        return new >= old if self.higher_is_better else new <= old


ACCURACY = Figure("accuracy", True, "accuracy", source="fraction of examples whose most probable class is the label")
AUROC = Figure("auroc", True, "AUROC", source="area under the ROC curve, OOD positive (Hendrycks & Gimpel 2017)")
AUPR_IN = Figure(
    "aupr_in",
    True,
    "AUPR-in",
    source="area under the precision-recall curve, in-distribution positive (Hendrycks & Gimpel 2017)",
)
AUPR_OUT = Figure(
    "aupr_out", True, "AUPR-out", source="area under the precision-recall curve, OOD positive (Hendrycks & Gimpel 2017)"
)
NLL = Figure("nll", False, "NLL", unit="nats", source="mean negative log-likelihood of the label")
BRIER = Figure("brier", False, "Brier", source="multi-class Brier score (Brier 1950), in [0, 2]")
ECE = Figure("ece", False, "ECE", source="expected calibration error, top-label confidence (Guo et al. 2017)")
ADAPTIVE_ECE = Figure(
    "adaptive_ece",
    False,
    "adaptive ECE",
    source="ECE over equal-mass confidence bins (Mukhoti et al. 2020; Nixon et al. 2019)",
)
ACCURACY_AT_80_COVERAGE = Figure(
    "accuracy_at_80_coverage", True, "accuracy@80% coverage", source="accuracy on the 80% most confident examples"
)
FPR_AT_95_TPR = Figure(
    "fpr_at_95_tpr", False, "FPR@95%TPR", source="false positive rate at 95% TPR (Hendrycks & Gimpel 2017)"
)
AURC = Figure("aurc", False, "AURC", source="area under the risk-coverage curve (Geifman et al. 2019)")
CONFIDENT_OOD_FRACTION = Figure(
    "confident_ood_fraction", False, "confident-OOD fraction", source="OOD inputs predicted with confidence >= 0.9"
)

#: Every figure promotion can compare, by name.
FIGURES: Mapping[str, Figure] = MappingProxyType(
    {
        f.name: f
        for f in (
            ACCURACY,
            AUROC,
            AUPR_IN,
            AUPR_OUT,
            NLL,
            BRIER,
            ECE,
            ADAPTIVE_ECE,
            FPR_AT_95_TPR,
            AURC,
            ACCURACY_AT_80_COVERAGE,
            CONFIDENT_OOD_FRACTION,
        )
    }
)
#: The ensemble test metrics ``promotion.metric`` may name without a path.
TEST_METRICS = ("nll", "brier", "ece", "accuracy")
#: Compatibility name: figure name -> whether higher is better (:data:`FIGURES` holds more).
FIGURE_HIGHER_IS_BETTER = {name: f.higher_is_better for name, f in FIGURES.items()}


def figure(metric: str) -> Figure:
    """The figure ``promotion.metric`` names: a test metric, or the last segment of the dotted
    path ``<evaluator>.<path>`` that is a known figure (``letters.ensemble.auroc.entropy``
    names AUROC). Whether the path leads to a figure the evaluator produces is checked
    before training, on the dataset (:mod:`ensemble_core.runs.evaluation.figure_check`).

    Raises:
      ValueError: not a test metric, no evaluator name first, or no known figure in the path.
    """
    if metric in TEST_METRICS:
        return FIGURES[metric]
    parts = metric.split(".")
    if len(parts) < 2 or parts[0] not in EVALUATOR_NAMES or not all(parts):
        raise ValueError(
            f"'{metric}' is neither a test metric {TEST_METRICS} nor a dotted path <evaluator>.<figure path> "
            f"with an evaluator of {EVALUATOR_NAMES}"
        )
    for part in reversed(parts):
        if part in FIGURES:
            return FIGURES[part]
    raise ValueError(f"'{metric}' names none of the figures {tuple(FIGURES)}")


def figure_direction(metric: str) -> bool:
    """Whether higher is better for ``promotion.metric`` (:func:`figure`'s ``higher_is_better``).

    Raises:
      ValueError: as :func:`figure`.
    """
    return figure(metric).higher_is_better


def decide_promotion(challenger: float, champion: float | None, metric: str) -> tuple[bool, str]:
    """Promote the challenger if it is not worse than the champion on ``metric``.

    Args:
      challenger, champion: the figure ``metric`` of each, measured on the same data
        (``champion`` None: there is no champion, the challenger is promoted).
      metric: ``promotion.metric`` (its direction: :func:`figure_direction`).

    Returns:
      (promoted, a one-line reason).
    """
    if champion is None:
        return True, "no champion yet"
    new, old = challenger, champion
    better_or_equal = new >= old if figure_direction(metric) else new <= old
    relation = "not worse than" if better_or_equal else "worse than"
    return better_or_equal, f"challenger {metric} {new:.4f} is {relation} champion {metric} {old:.4f}"
