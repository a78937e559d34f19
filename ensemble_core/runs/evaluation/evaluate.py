"""The evaluation stage: every evaluator of ``eval.evaluators`` on a run's ensemble, and
nothing else (the ensemble is chosen by the select stage and loaded by
:func:`ensemble_core.runs.ensemble.load.load_ensemble`)."""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import numpy as np

from ensemble_core import diskspace, evaluators, stopping
from ensemble_core.atomic import atomic_savez
from ensemble_core.config import PipelineConfig
from ensemble_core.data import DatasetInfo
from ensemble_core.runs.dataset import load
from ensemble_core.runs.ensemble.load import load_ensemble
from ensemble_core.runs.evaluation.cache import cached_arrays
from ensemble_core.runs.results import Evaluation, EvaluatorResult
from ensemble_core.runs.storage.layout import RunDir

log = logging.getLogger(__name__)


@diskspace.output_errors("run_dir")
def evaluate(
    cfg: PipelineConfig,
    dataset: DatasetInfo,
    run_dir: str | Path,
    *,
    strategy: str | None = None,
    write: bool = True,
) -> Evaluation:
    """Run every evaluator of ``eval.evaluators`` on the run's ensemble
    (:func:`~ensemble_core.runs.ensemble.load.load_ensemble`: the members and temperature
    its ``selection.json`` names; ``strategy`` overrides ``mesh.member_strategy``).

    With ``write`` (default), each evaluator's arrays are written atomically
    (``predictions.npz`` for ``test``, ``eval/<name>.npz`` for the others; see
    :mod:`ensemble_core.evaluators`) and its plots drawn into ``plots/``.

    Raises:
      CheckpointError: no checkpoint, or one that does not fit ``cfg``.
      DivergenceError: every member diverged (there is no ensemble to evaluate).
    """
    run = RunDir(Path(run_dir))
    ensemble = load_ensemble(cfg, run.path, dataset.num_classes, dataset.image_shape, strategy=strategy)
    cfg, members = ensemble.config, ensemble.members

    # Every evaluator starts from the test split: read it, and predict it, once per evaluation.
    def predict(images: np.ndarray) -> tuple[np.ndarray, float]:
        return members.predict(cfg, images)

    def predict_logits(images: np.ndarray) -> np.ndarray:
        return members.predict(cfg, images, logits=True)[0]

    load_split = functools.cache(lambda split: load(cfg, dataset, split))
    ctx = evaluators.EvalContext(
        config=cfg,
        dataset=dataset,
        healthy=members.healthy,
        predict=predict,
        load=load_split,
        predict_split=functools.cache(lambda split: predict(load_split(split)[0])),
        cached=lambda key, build, shapes=None: cached_arrays(dataset, key, build, shapes),
        predict_logits=predict_logits,
        predict_split_logits=functools.cache(lambda split: predict_logits(load_split(split)[0])),
        temperature=ensemble.temperature,
    )
    results = {}
    for name, spec in cfg.eval.evaluators.items():
        stopping.check()  # a stop request ends evaluation between evaluators (and batches)
        module = evaluators.get(spec.type)
        out = module.evaluate(ctx.for_evaluator(name, spec))
        plots: dict[str, str] = {}
        if out.skipped:
            log.warning("evaluator %s skipped: %s", name, out.skipped)
        elif write:
            atomic_savez(run.evaluator_arrays(name), **out.arrays)
            if hasattr(module, "plot"):
                drawn = module.plot(out.metrics, out.arrays, run.plots, cfg, name=name)
                plots = {key: str(path.relative_to(run.path)) for key, path in drawn.items()}
        results[name] = EvaluatorResult(name=name, type=spec.type, metrics=out.metrics, plots=plots)
    return Evaluation(results=results)
