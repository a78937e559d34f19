"""The sections of the decisions a user makes with the ensemble's uncertainty: prediction
sets (split conformal prediction) and abstention at a chosen risk (selective prediction).

Both are fitted by the select stage on the calibration split (``data.calibration_fraction``)
and stored with the run (``decisions.json``); evaluation reports them on the test split and
every shift cell, and ``flows.predict`` applies them to new images.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ensemble_core.config.base import Section


class PredictionSetsConfig(Section):
    """Split conformal prediction sets (Angelopoulos et al. 2021, "Uncertainty Sets for
    Image Classifiers using Conformal Prediction"; Romano et al. 2020)."""

    method: Literal["lac", "aps", "raps"] = Field(
        "lac",
        description="The nonconformity score flows.predict's sets use: lac (a.k.a. THR, 1 - p_y: the smallest "
        "sets on average, deterministic: an image gets the same set however it is batched; empty when no class "
        "is plausible enough), aps (adaptive prediction sets: coverage more even across easy and hard images, "
        "randomised at the class boundary) or raps (APS with a penalty on unlikely classes: smaller sets than "
        "aps). The report shows all three.",
    )
    alpha: float = Field(
        0.1,
        gt=0,
        lt=1,
        description="Miscoverage: a set holds the true class with probability at least 1 - alpha on data "
        "exchangeable with the calibration split (0.1: 90% coverage).",
    )
    calibrate_on: Literal["calibration", "validation", "none"] = Field(
        "calibration",
        description="The held-out split the sets and the abstention threshold are fitted on: calibration (the "
        "split data.calibration_fraction carves, which neither trains nor selects the ensemble: the guarantee "
        "holds), validation (the split that also selects the ensemble and fits its temperature: the sets are "
        "biased towards too small, coverage may fall below 1 - alpha), or none (no sets, no abstention).",
    )


class AbstentionConfig(Section):
    """Abstention at a chosen risk: selection with guaranteed risk (SGR; Geifman &
    El-Yaniv 2017, "Selective Classification for Deep Neural Networks")."""

    criterion: Literal["max_probability", "entropy", "mutual_information"] = Field(
        "max_probability",
        description="What the ensemble abstains on: a low max probability (softmax response), a high predictive "
        "entropy, or a high mutual information (member disagreement).",
    )
    target_risk: float = Field(
        0.05,
        gt=0,
        lt=1,
        description="The error rate allowed among the predictions the ensemble makes (not abstaining). A target "
        "the calibration split cannot guarantee (too few examples, or too low) makes the ensemble abstain on "
        "everything; the select stage says so and the report shows the smallest bound reached.",
    )
    delta: float = Field(
        0.05,
        gt=0,
        lt=1,
        description="The guarantee's confidence: the risk on new data of the calibration split's distribution "
        "is at most target_risk with probability at least 1 - delta.",
    )
