"""Evaluators by name, one module each (``eval.evaluators`` in the config).

An evaluator scores the trained members on data it chooses. ``eval.evaluators`` names
each evaluator it runs and gives its type (the module) and options, as big_vision's
``config.evals`` does; one type may run under several names with other options. The
module ``ensemble_core/evaluators/<type>.py`` defines:

- ``Options`` (optional): a frozen pydantic model of its options with their defaults
  (without one, the evaluator takes none); checked by :func:`options` before any compute;

- ``requirements(config, dataset, options) -> str | None`` (optional): what it needs of
  the data (a minimum image size, channels, classes) that the dataset lacks, or None;
  checked by :func:`check_data` before training (a default evaluator is then skipped with
  one logged line, one the user named is refused) and by its own ``evaluate``, which
  returns :func:`skipped` with that reason;
- ``check(config, dataset, name, options) -> None`` (optional): refuses, before any
  compute, what would fail at evaluation on this dataset (an OOD dataset whose images
  cannot be converted, held-out classes with no class held out); called by :func:`check_data`;
- ``evaluate(ctx: EvalContext) -> EvaluatorOutput`` (required): loads or builds its data
  (``ctx.load(split)``, or a transformed test set, or another dataset), gets every
  member's probabilities through ``ctx.predict`` and returns its metrics (a JSON object
  of its own shape) and the arrays to keep;
- ``plot(metrics: dict, arrays: dict, plots_dir: Path, config) -> dict[str, Path]`` (optional):
  draws its PNGs into ``plots_dir`` and returns them by name;
- ``markdown(metrics: dict) -> list[str]`` (optional): its section of ``report.md``;
- ``table(metrics: dict) -> list[dict]`` (optional): the rows of its Prefect table
  artifact (key ``ensemble-eval-<name>``).

An evaluator times its own work with :func:`ensemble_core.timing.part` under the names
below (the run layer times the forward passes, derived sets and splits it serves): its
scoring under :data:`METRICS`, another dataset's files it reads under :data:`DATA`, a set it
builds without ``ctx.cached`` under :data:`DERIVED`, a library it imports on first use under
:data:`IMPORTS`, so that
``report.json -> timing`` explains where its seconds went and its ``other`` is small.

Plots, arrays, report sections and artifacts are named by the evaluator's *name*
(``ctx.name``; ``plot`` gets it as ``name=``). The run layer
(:mod:`ensemble_core.runs.evaluation.evaluate`) writes the arrays to
``<run>/predictions.npz`` for ``test`` and ``<run>/eval/<name>.npz`` for the others, and
the report puts the metrics of ``test`` at the top of ``report.json`` and every other
evaluator's under ``evaluations.<name>``. Evaluators do no file I/O of their own.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
import pydantic

from ensemble_core.accuracy_estimation import Reference
from ensemble_core.config import EVALUATOR_NAMES, EvaluatorSpec, PipelineConfig
from ensemble_core.data import DatasetInfo
from ensemble_core.decisions import DecisionFit
from ensemble_core.errors import ConfigError, DataError

log = logging.getLogger(__name__)

#: The part of an evaluator's time (:mod:`ensemble_core.timing`) spent computing its
#: figures from the members' probabilities: scores, intervals, decision rules' coverage,
#: label-free estimates, detection metrics, the arrays it keeps.
METRICS = "metrics"
#: The part spent reading data from disk: the training dataset's splits (``ctx.load``,
#: read once per evaluation and timed where first read) or another dataset's files.
DATA = "data"
#: The part spent building or reading its derived sets: shifted, corrupted or OOD images
#: made from other images (``ctx.cached`` times its own; an evaluator that builds a set
#: without caching it times that itself).
DERIVED = "derived sets"
#: The part of an OOD evaluator's time spent importing scikit-learn's metrics, which
#: :func:`ensemble_core.metrics.detection` imports on first use: 0.4-0.6 s in the first OOD
#: evaluator of a process (unless the command imported them while its temporary server
#: started), 0 after; it was the unexplained "other" of that evaluator.
IMPORTS = "imports"

__all__ = [
    "DATA",
    "DERIVED",
    "EVALUATOR_NAMES",
    "IMPORTS",
    "METRICS",
    "EvalContext",
    "EvaluatorOutput",
    "NoOptions",
    "check_data",
    "default_names",
    "get",
    "options",
    "requirements",
    "skipped",
]


@dataclasses.dataclass(frozen=True)
class EvalContext:
    """What an evaluator may use.

    Attributes:
      config: the run's config (``eval.batch_size``, ...).
      dataset: the training dataset's info (classes, image shape).
      healthy: bool ``[E]``; False for a member that diverged and was frozen (left out
        of ensemble figures).
      predict: ``predict(images) -> (member_probs, member_images_per_s)``: images uint8
        ``[N, H, W, C]`` (or float in [0, 1]) -> float32 ``[E, N, C]`` probabilities of
        every member, and the steady-state throughput.
      load: ``load(split) -> (images uint8 [N, H, W, C], labels int32 [N])`` of the
        training dataset ('train' or 'test', capped as the config says); read once per
        evaluation, the arrays are shared (do not modify them).
      predict_split: ``predict_split(split)``: ``predict`` of ``load(split)``'s images,
        computed once per evaluation (every evaluator that compares with the test split
        uses the same probabilities).
      predict_logits: ``predict_logits(images) -> member_logits`` float32 ``[E, N, C]``:
        every member's logits (the pre-softmax outputs ``predict`` normalises), for scores
        that need them (the energy of :func:`ensemble_core.metrics.energy`).
      predict_split_logits: ``predict_split_logits(split)``: ``predict_logits`` of
        ``load(split)``'s images, computed once per evaluation.
      cached: ``cached(key, build, shapes=None) -> arrays``: the arrays ``build()`` returns
        (a dict of numpy arrays, e.g. a transformed test set), computed once and kept beside
        the prepared dataset under ``key`` (the run layer decides where; a key must name
        everything the arrays depend on); a kept file whose arrays are not of ``shapes``
        (``{name: shape}``) is built again.
      temperature: the ensemble's fitted temperature (``eval.temperature_scaling``), or
        None; evaluators report their ensemble figures after scaling too
        (:func:`ensemble_core.calibration.apply_temperature`).
      name: the evaluator's name in ``eval.evaluators`` (its arrays, plots and report
        section are named by it).
      ece_bins: the bins of this evaluator's ECE and adaptive ECE (its ``ece_bins``, by
        default ``eval.ece_bins``).
      options: its validated ``Options`` (:func:`options`).
      decision_fit: ``decision_fit() -> DecisionFit | None``: the prediction sets and
        abstention thresholds of the ensemble and of every member, fitted on the run's
        calibration split (:func:`ensemble_core.decisions.fit_all`; computed once per
        evaluation), or None when the run has none; evaluators score them on their sets
        (:meth:`ensemble_core.decisions.DecisionFit.score`).
      accuracy_reference: ``accuracy_reference() -> Reference | None``: the label-free
        accuracy estimators fitted on the same split for the healthy members
        (:func:`ensemble_core.accuracy_estimation.fit_reference`: ATC's thresholds, the
        reference accuracy, confidence and agreement), or None; shift evaluators compare
        their estimates with each level's true accuracy.
    """

    config: PipelineConfig
    dataset: DatasetInfo
    healthy: np.ndarray
    predict: Callable[[np.ndarray], tuple[np.ndarray, float]]
    load: Callable[[str], tuple[np.ndarray, np.ndarray]]
    predict_split: Callable[[str], tuple[np.ndarray, float]]
    cached: Callable[..., dict[str, np.ndarray]]
    predict_logits: Callable[[np.ndarray], np.ndarray]
    predict_split_logits: Callable[[str], np.ndarray]
    temperature: float | None = None
    name: str = ""
    options: Any = None
    ece_bins: int = 15
    decision_fit: Callable[[], DecisionFit | None] = lambda: None
    accuracy_reference: Callable[[], Reference | None] = lambda: None

    def for_evaluator(self, name: str, spec: EvaluatorSpec) -> EvalContext:
        """This context as evaluator ``name`` of ``eval.evaluators`` sees it: its name, its
        validated options (:func:`options`) and its ECE bins (``spec.ece_bins``, else
        ``eval.ece_bins``).

        Raises:
          ConfigError: see :func:`options`.
        """
        bins = spec.bins(self.config.eval.ece_bins)
        return dataclasses.replace(self, name=name, options=options(name, spec), ece_bins=bins)


class NoOptions(pydantic.BaseModel):
    """The options of an evaluator that takes none."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)


@dataclasses.dataclass(frozen=True)
class EvaluatorOutput:
    """An evaluator's result: ``metrics`` (JSON-able) and ``arrays`` (numpy arrays to keep
    in the run directory; see the module docstring). An evaluator that cannot run here
    (its data is not installed) returns :func:`skipped`."""

    metrics: dict[str, Any]
    arrays: dict[str, np.ndarray]

    @property
    def skipped(self) -> str | None:
        """Why the evaluator did not run (None when it ran)."""
        return self.metrics.get("skipped")


def skipped(reason: str) -> EvaluatorOutput:
    """The output of an evaluator that did not run: ``{"skipped": reason}``, no arrays;
    the run goes on, the reason is logged once and shown in the report."""
    return EvaluatorOutput(metrics={"skipped": reason}, arrays={})


def get(name: str) -> ModuleType:
    """The evaluator module ``name``.

    Raises:
      ConfigError: no such evaluator.
    """
    if name not in EVALUATOR_NAMES:
        raise ConfigError(f"unknown evaluator '{name}'", fix=f"use one of {EVALUATOR_NAMES} in eval.evaluators")
    return importlib.import_module(f"ensemble_core.evaluators.{name}")


def options(name: str, spec: EvaluatorSpec) -> pydantic.BaseModel:
    """The options of evaluator ``name`` (``eval.evaluators.<name>``), validated by its
    module's ``Options`` (defaults for what is not given).

    Raises:
      ConfigError: an unknown option or a bad value, in one line naming
        ``eval.evaluators.<name>.<option>`` and the options there are.
    """
    model = getattr(get(spec.type), "Options", NoOptions)
    try:
        return model(**spec.options)
    except pydantic.ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        known = ", ".join(model.model_fields) or "none"
        raise ConfigError(
            f"config key 'eval.evaluators.{name}.{where}': {first['msg']}",
            fix=f"give {spec.type} options it takes ({known}) with valid values",
        ) from None


def default_names(config: PipelineConfig) -> frozenset[str]:
    """The evaluators of ``config`` the user did not list: all of them when
    ``eval.evaluators`` is the dataset's default set
    (:func:`ensemble_core.config.eval_section.default_evaluators`), none otherwise (a list
    of one's own names every evaluator in it)."""
    from ensemble_core.config.eval_section import EvalConfig, default_evaluators

    data = config.data
    specs = default_evaluators(data.name, data.source, data.classes is not None)
    defaults = EvalConfig(evaluators=specs).evaluators
    return frozenset(config.eval.evaluators) if dict(config.eval.evaluators) == dict(defaults) else frozenset()


def requirements(config: PipelineConfig, dataset: DatasetInfo, name: str, spec: EvaluatorSpec) -> str | None:
    """What evaluator ``name`` needs of the data (geometry such as a minimum size,
    channels, classes) that ``dataset`` lacks, from its module's
    ``requirements(config, dataset, options) -> str | None``, or None (also for a module
    without one). The module's ``evaluate`` returns :func:`skipped` with the same reason.

    Raises:
      ConfigError: its options are invalid (:func:`options`).
    """
    unmet = getattr(get(spec.type), "requirements", None)
    return None if unmet is None else unmet(config, dataset, options(name, spec))


def check_data(config: PipelineConfig, dataset: DatasetInfo) -> tuple[str, ...]:
    """Check every configured evaluator against the run's dataset before any compute (the
    preflight calls it): its :func:`requirements` on the data, then its module's ``check``.

    An evaluator whose requirements the data does not meet is skipped with one logged
    line when it is a default (:func:`default_names`: the user did not list it; its
    ``evaluate`` returns :func:`skipped`), and refused when the user named it in
    ``eval.evaluators``.

    Returns:
      The names of the default evaluators skipped on this dataset.

    Raises:
      ConfigError: an evaluator's options are invalid (:func:`options`).
      DataError: a named evaluator cannot run on this data, in one line naming it, what it
        needs and the fix; or an evaluator's data cannot be made for this dataset (its
        ``check``'s line).
    """
    defaults = default_names(config)
    skipped_here = []
    for name, spec in config.eval.evaluators.items():
        unmet = requirements(config, dataset, name, spec)
        if unmet is not None and name in defaults:
            log.warning("evaluator %s (a default) is skipped on dataset '%s': %s", name, dataset.name, unmet)
            skipped_here.append(name)
            continue
        if unmet is not None:
            raise DataError(
                f"eval.evaluators.{name} ({spec.type}) cannot run on dataset '{dataset.name}': {unmet}",
                fix=f"remove {name} from eval.evaluators, or give it data (or options) that meet this",
            )
        module = get(spec.type)
        if hasattr(module, "check"):
            module.check(config, dataset, name, options(name, spec))
    return tuple(skipped_here)
