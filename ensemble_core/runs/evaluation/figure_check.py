"""Is ``promotion.metric`` a figure the configured evaluator really produces?

The config's schema checks that a dotted ``promotion.metric`` starts with an evaluator of
``eval.evaluators`` and ends in a known figure; it cannot see the path in between
(``rotation.means.ensemble.nll`` names nothing) or whether the evaluator will be skipped
on this dataset (letters on 32x32 RGB images). Such a run used to train, evaluate, warn
and never update the champion. :func:`check_promotion_figure` answers before any
compute by running the evaluator's own code on a probe: a handful of random images of
the dataset's shape and random member probabilities. The figures' *structure* comes from
the same code that will produce them after training, so the check cannot drift from
the evaluators.
"""

from __future__ import annotations

import difflib

import numpy as np

from ensemble_core import evaluators
from ensemble_core.accuracy_estimation import Reference, fit_reference
from ensemble_core.config import PipelineConfig
from ensemble_core.data import DatasetInfo
from ensemble_core.decisions import DecisionFit, fit_all
from ensemble_core.errors import ConfigError
from ensemble_core.figures import FIGURES, TEST_METRICS

#: Probe size: images per split (enough for every evaluator's statistics).
PROBE_IMAGES = 16


def probe(cfg: PipelineConfig, dataset: DatasetInfo, name: str) -> evaluators.EvaluatorOutput:
    """Run evaluator ``name`` of ``eval.evaluators`` on the probe (random uint8 images of the
    dataset's shape, labels cycling over the classes, Dirichlet probabilities of as many
    members as the run evaluates: ``ensemble.select_size`` picks or ``ensemble.size``;
    decision rules fitted on the probe when the config asks for them; seeded, nothing
    cached or written).

    Raises:
      KeyError: ``name`` is not in ``eval.evaluators``.
    """
    spec = cfg.eval.evaluators[name]
    rng = np.random.default_rng(0)
    c = dataset.num_classes
    members = cfg.ensemble.select_size or cfg.ensemble.size
    images = rng.integers(0, 256, (PROBE_IMAGES, *dataset.image_shape), dtype=np.uint8)
    labels = (np.arange(PROBE_IMAGES) % c).astype(np.int32)

    def predict(x: np.ndarray) -> tuple[np.ndarray, float]:
        return rng.dirichlet(np.ones(c), size=(members, len(x))).astype(np.float32), 1.0

    temperature = 1.0 if cfg.eval.temperature_scaling else None

    def decision_fit() -> DecisionFit | None:  # the rules' figures have the run's structure too
        if cfg.decision_split is None:
            return None
        probs, _ = predict(images)
        healthy = np.ones(members, bool)
        return fit_all(probs, labels, healthy, temperature, cfg.prediction_sets, cfg.abstention, cfg.decision_split)

    def accuracy_reference() -> Reference | None:
        if cfg.decision_split is None:
            return None
        return fit_reference(predict(images)[0], labels, temperature)

    ctx = evaluators.EvalContext(
        config=cfg,
        dataset=dataset,
        healthy=np.ones(members, bool),
        predict=predict,
        load=lambda split: (images, labels),
        predict_split=lambda split: predict(images),
        cached=lambda key, build, shapes=None: build(),
        predict_logits=lambda x: rng.normal(size=(members, len(x), c)).astype(np.float32),
        predict_split_logits=lambda split: rng.normal(size=(members, len(images), c)).astype(np.float32),
        temperature=temperature,
        decision_fit=decision_fit,
        accuracy_reference=accuracy_reference,
    )
    module = evaluators.get(spec.type)
    return module.evaluate(ctx.for_evaluator(name, spec))


#: Keys of an evaluator's metrics that are records of the run, not figures: the derived sets'
#: disk use (added by the evaluation stage, :mod:`ensemble_core.runs.evaluation.evaluate`).
NOT_FIGURES = ("derived_sets",)


def figure_paths(metrics: dict | list, prefix: str = "") -> list[str]:
    """Every dotted path to a figure in an evaluator's metrics (a list index is a path
    segment), in order: a number, or None where the data left it undefined (e.g. the
    accuracy above a confidence no example reaches); :data:`NOT_FIGURES` left out."""
    out: list[str] = []
    items = metrics.items() if isinstance(metrics, dict) else enumerate(metrics)
    for key, value in items:
        if not prefix and key in NOT_FIGURES:
            continue
        path = f"{prefix}{key}"
        if isinstance(value, dict | list):
            out += figure_paths(value, path + ".")
        elif value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
            out.append(path)
    return out


def check_promotion_figure(cfg: PipelineConfig, dataset: DatasetInfo) -> None:
    """Refuse a ``promotion.metric`` that no configured evaluator will produce on ``dataset``.

    A test metric (``nll``, ...) passes at once; a dotted path ``<evaluator>.<path>`` is
    looked up in the metrics of that evaluator run on the probe (:func:`probe`).

    Raises:
      ConfigError: the evaluator is skipped on this dataset (naming why), or the path
        does not lead to a number (naming some paths that do, with the metric's figure).
    """
    metric = cfg.promotion.metric
    if not cfg.promotion.enabled or metric in TEST_METRICS:
        return
    name, _, path = metric.partition(".")
    out = probe(cfg, dataset, name)
    if out.skipped:
        raise ConfigError(
            f"promotion.metric={metric} needs the evaluator '{name}', which is skipped on dataset "
            f"'{dataset.name}' ({out.skipped})",
            fix="choose a promotion.metric of an evaluator that runs here, e.g. nll",
        )
    paths = figure_paths(out.metrics)
    if path not in paths:
        last = next((p for p in reversed(metric.split(".")) if p in FIGURES), None)
        same_figure = [p for p in paths if last is not None and last in p.split(".")]
        examples = difflib.get_close_matches(path, same_figure or paths, n=3, cutoff=0)
        raise ConfigError(
            f"promotion.metric={metric}: the evaluator '{name}' produces no figure at '{path}'",
            fix=f"name one it produces, e.g. {', '.join(f'{name}.{p}' for p in examples)}",
        )
