"""The ``nightly`` and ``retention`` sections of the run configuration: what a retraining
run does when its data did not change, the drift signal the champion computes before
training, and what an output directory keeps."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ensemble_core.config.base import Section


class DriftConfig(Section):
    """Before training, the champion (if the output directory has one) scores the new data
    snapshot's training split: its class frequencies against the champion's snapshot, and
    the champion ensemble's mean predictive entropy and mutual information on the new data
    against its own test split (:mod:`ensemble_core.drift`). A figure above its threshold
    emits the Prefect event ``data.drift``."""

    enabled: bool = Field(True, description="Compute the drift figures when the output directory has a champion.")
    max_examples: int = Field(
        2000,
        ge=1,
        le=1_000_000,
        description="The champion scores at most this many examples of the new training split (the first N).",
    )
    label_shift_threshold: float | None = Field(
        0.1,
        ge=0,
        le=1,
        description="Emit data.drift when the total variation distance between the new and the champion's "
        "training class frequencies, 0.5 * sum_c |p_c - q_c| in [0, 1], exceeds this (None: never).",
    )
    entropy_threshold: float | None = Field(
        0.2,
        ge=0,
        description="Emit data.drift when the champion's mean predictive entropy on the new training split "
        "exceeds that on its own test split by more than this many nats (None: never).",
    )
    mutual_information_threshold: float | None = Field(
        None,
        ge=0,
        description="Emit data.drift when the champion's mean mutual information on the new training split "
        "exceeds that on its own test split by more than this many nats (None: never).",
    )
    test_alpha: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="Emit data.drift when a two-sample drift test rejects at this level after Holm's correction: "
        "Kolmogorov-Smirnov on the per-example predictive entropy and mutual information, chi-square on the "
        "predicted classes, the new training split against the champion's calibration split "
        "(ensemble_core.drift_tests). The tests' p-values are computed and reported whenever the champion has a "
        "calibration split; None: they never emit data.drift.",
    )


class NightlyConfig(Section):
    """Retraining against the champion of the output directory (nightly or not)."""

    when_unchanged: Literal["train", "skip"] = Field(
        "train",
        description="When the data snapshot (the source's fingerprint) and the config (all but the nightly and "
        "retention sections and the data locations) equal the champion's: 'skip' trains nothing and ends the "
        "run Completed with one line, an artifact and the event ensemble.skipped; 'train' trains anyway "
        "(with the same seed on CPU that reproduces the champion bit for bit; change seed to get new members). "
        "The nightly deployment uses 'skip'.",
    )
    when_classes_change: Literal["refuse", "retrain"] = Field(
        "refuse",
        description="When the data's class map differs from the champion's (a class folder appeared or "
        "disappeared, data.class_names changed): 'refuse' stops the run before training with one line naming the "
        "class; 'retrain' trains members with a new head for the new classes, and the challenger, having no "
        "common label space with the champion, replaces it unless promotion.metric is unavailable.",
    )
    drift: DriftConfig = Field(default_factory=DriftConfig, description="The drift signal computed before training.")


class RetentionConfig(Section):
    """What the output directory keeps after each run (``ensemble_core.runs.champion.retention``)."""

    enabled: bool = Field(True, description="Apply the policy after each run of the flow.")
    keep_last_runs: int = Field(
        10,
        ge=1,
        le=100_000,
        description="Finished runs kept whole, newest first by the time of their report; older finished runs "
        "keep their reports and plots and lose their checkpoints and predictions. The champion's run and runs "
        "in progress are always kept whole; unfinished runs (no report.json: they may be resumed) are never "
        "touched.",
    )
    snapshot_max_age_days: float = Field(
        14,
        ge=0,
        le=36_500,
        description="Prepared data snapshots that no run of this output directory refers to are removed when "
        "no run has used them for this many days.",
    )
