"""What the stages of a run hand each other: small, typed, JSON-able (pydantic) values.

Prefect passes them between tasks as they are, and :mod:`ensemble_core.runs.report.write`
writes them into ``report.json`` (whose keys docs/evaluation.md documents). Arrays never travel
here: they stay in the run directory's files.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class _Result(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    def to_json(self) -> dict[str, Any]:
        """The JSON object (``model_dump(mode="json")``)."""
        return self.model_dump(mode="json")


class TrainingTiming(_Result):
    """Wall-clock figures of one training session (seconds; steady state)."""

    compile_seconds: float  # lowering + compiling the step (0 when no step ran)
    train_seconds: float  # all steps, checkpoint callbacks excluded
    steps: int  # optimizer steps run by this call
    stopped_at: dict | None = None  # the DataPosition where a stop request ended it
    train_member_images_per_s: float | None = None  # steps * batch * E / train_seconds
    validation_seconds: float = 0.0  # the validation split's forward passes after each epoch
    checkpoint_seconds: float = 0.0  # writing checkpoints (the loop's share, and waiting for the last)
    setup_seconds: float = 0.0  # building the network, mesh, optimizer and step (before any array)
    data_seconds: float = 0.0  # reading the train and validation splits and placing them on the devices
    order_seconds: float = 0.0  # each epoch's data order and learning rates, its first batch staged
    initialisation_seconds: float = 0.0  # the members' initial parameters, or restoring a checkpoint
    call_seconds: float = 0.0  # the whole training call (0: not measured, e.g. member groups joined)


class TrainingSummary(_Result):
    """What training did (:func:`ensemble_core.runs.training.trainer.train`, or the member groups joined by
    :func:`ensemble_core.runs.training.groups.gather_groups`).

    ``history``: one record per epoch (``epoch``, ``train_loss``/``train_accuracy``: lists
    of E_trained floats, ``diverged_members``, and with a validation split
    ``validation_nll``). ``sessions``: one record per session of
    training (the first run and each resume; see the resume policy in docs/evaluation.md).
    """

    checkpoint_dir: str
    checkpoint_step: int | None
    history: list[dict]
    timing: TrainingTiming
    mesh: dict[str, int]  # {"ensemble": axis size, "data": axis size}
    members_trained: int  # E plus padding members
    strategy: str
    backend: str
    devices: int
    resumed_from: int | None  # the epoch of the checkpoint this call resumed from
    sessions: list[dict]
    diverged_members: list[int]
    members: list[dict] = []  # per member: hyperparameters, best_epoch, stopped_epoch (summary.member_records)
    topology: list[dict] = []  # per member group: its members, host, process, worker (summary.where_trained)


class StratificationSummary(_Result):
    """What the stratification stage of a hyper-deep ensemble did
    (:func:`ensemble_core.runs.ensemble.stratify.stratify`): the first selection from the search
    pool, the settings it kept, and the stratified pool's training (member m = setting
    ``settings[m // inits]``, initialisation ``m % inits``)."""

    settings: list[int]  # search-pool member indices of the kept settings, in order of first pick
    inits: int  # J, initialisations per setting
    first_selection: dict[str, Any]  # ensemble_core.runs.ensemble.pool.selection_record of the search pool
    training: TrainingSummary  # the stratified pool's (checkpoints under <run>/stratified/)


class EvaluatorResult(_Result):
    """One evaluator's figures (:mod:`ensemble_core.evaluators`): ``metrics`` is a JSON
    object of that evaluator's own shape; ``plots`` names the PNGs it drew, relative to
    the run directory."""

    name: str
    type: str = ""  # the evaluator module (``eval.evaluators.<name>.type``); "" means the name
    metrics: dict[str, Any]
    plots: dict[str, str] = {}


class Evaluation(_Result):
    """Every evaluator's result, by name; ``results["test"]`` is always there. ``timing``:
    where the stage's wall time went (:meth:`ensemble_core.timing.Span.to_json`: loading
    the ensemble, then per evaluator its derived sets, forward passes, writing and plotting);
    None when not measured."""

    results: dict[str, EvaluatorResult]
    timing: dict[str, Any] | None = None

    @property
    def test(self) -> dict[str, Any]:
        """The test split's figures: ``ensemble``, ``members``, ``member_mean``,
        ``diversity``, ``diverged_members``, ``eval_member_images_per_s``."""
        return self.results["test"].metrics

    @property
    def ensemble(self) -> dict[str, float]:
        """The ensemble's test ``accuracy``, ``nll``, ``brier``, ``ece``: what promotion compares."""
        return self.test["ensemble"]


class PromotionDecision(_Result):
    """Champion/challenger (:func:`ensemble_core.runs.champion.promotion.promote`)."""

    promoted: bool
    reason: str
    metric: str
    challenger: dict[str, float]
    champion: dict[str, float] | None  # the champion's ensemble metrics; None when there was none
    champion_run: str | None
    challenger_figure: float | None = None  # promotion.metric of this run (None: not available)
    champion_figure: float | None = None  # promotion.metric of the champion on this run's data
    history: list[dict]  # every run's row of history.jsonl, oldest first
    challenger_snapshot: str | None = None  # the data snapshot's fingerprint this run trained on
    champion_snapshot: str | None = None  # the champion's (None: no champion, or it predates snapshots)


class SkipDecision(_Result):
    """``nightly.when_unchanged=skip`` found nothing new: the data snapshot and the config
    equal the champion's (:func:`ensemble_core.runs.champion.retraining.unchanged_since_champion`)."""

    champion_run: str
    champion_run_dir: str
    fingerprint: str
    reason: str  # one line


class DriftReport(_Result):
    """The drift signal computed before training (:func:`ensemble_core.runs.champion.retraining.detect_drift`).

    ``label_shift``: :func:`ensemble_core.drift.label_shift` (None: not computed);
    ``uncertainty``: :func:`ensemble_core.drift.uncertainty_shift` (None: not computed);
    ``tests``: :func:`ensemble_core.drift_tests.drift_tests` of the new training split
    against the champion's calibration split (None: not computed);
    ``exceeded``: the thresholds exceeded (one line each); ``not_computed``: why a figure
    is missing (no champion, another image shape, ...)."""

    champion_run: str | None
    snapshot: str | None  # the new data snapshot's fingerprint
    champion_snapshot: str | None
    label_shift: dict | None = None
    uncertainty: dict | None = None
    tests: dict | None = None
    exceeded: list[str] = []
    not_computed: list[str] = []

    @property
    def drifted(self) -> bool:
        """Whether any threshold was exceeded (what emits ``data.drift``)."""
        return bool(self.exceeded)
