"""The evaluation stage: every evaluator of ``eval.evaluators`` on a run's ensemble, and
nothing else (the ensemble is chosen by the select stage and loaded by
:func:`ensemble_core.runs.ensemble.load.load_ensemble`)."""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import time
from pathlib import Path

import numpy as np
import scipy.special

from ensemble_core import accuracy_estimation, diskspace, evaluators, stopping, timing
from ensemble_core.atomic import atomic_savez
from ensemble_core.config import PipelineConfig
from ensemble_core.data import DatasetInfo
from ensemble_core.decisions import DecisionFit, fit_all
from ensemble_core.runs.dataset import load
from ensemble_core.runs.ensemble.load import load_ensemble
from ensemble_core.runs.evaluation.cache import MIB, cached_arrays, derived_dir, disk_use
from ensemble_core.runs.results import Evaluation, EvaluatorResult
from ensemble_core.runs.storage.layout import RunDir

log = logging.getLogger(__name__)

#: The parts of an evaluator's time in ``Evaluation.timing`` (:mod:`ensemble_core.timing`)
#: that this module times, besides the evaluator's own (``ensemble_core.evaluators.METRICS``,
#: ``DATA``, ``DERIVED``, ``IMPORTS``) and ``other`` (the rest): the ensemble's forward passes,
#: its arrays and plots written.
FORWARD, WRITE = "forward passes", "writing and plotting"
#: The evaluation's part after the last evaluator: waiting for the background writer to
#: finish the arrays and plots (each evaluator's own seconds: ``timing["background"][WRITE]``).
WAIT = "waiting for writing and plotting"


def import_libraries(cfg: PipelineConfig) -> None:
    """Import now the libraries evaluation imports on first use: scikit-learn's metrics (the
    detection metrics and the confusion matrix; with SciPy's statistics, about 0.5 s) and,
    with ``eval.plots``, matplotlib (about 0.5 s). For a command with idle time before its
    flow (:func:`flows.ephemeral.while_starting`); evaluation is the same without it."""
    import sklearn.metrics  # noqa: F401  (imported for its side effect: loaded once per process)

    if cfg.eval.plots:
        from ensemble_core import plotting

        plotting.import_matplotlib()


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
    :mod:`ensemble_core.evaluators`) and, with ``eval.plots`` (default), its plots drawn
    into ``plots/``.

    The arrays and plots of an evaluator are written by a background thread while the next
    one computes; the stage returns when all are written (an error writing them is raised here).

    Each evaluator that used derived sets (shifted, corrupted, OOD images cached beside the
    dataset, within ``eval.derived_cache_mb``) gets ``derived_sets`` in its metrics:
    ``{"bytes", "files": {key: bytes on disk}}`` (0: larger than the cap, not kept); the
    stage logs their total and the cache directory's.

    The result's ``timing`` says where the stage's wall time went: ``load ensemble``, one
    part per evaluator, each split into :data:`ensemble_core.evaluators.DERIVED` (its
    derived sets, built or read), :data:`FORWARD`, :data:`ensemble_core.evaluators.DATA` (the
    splits, read where first needed), :data:`ensemble_core.evaluators.METRICS` (its scoring;
    an OOD evaluator also :data:`ensemble_core.evaluators.IMPORTS`) and ``other`` (the rest
    of its own code), then :data:`WAIT` (:meth:`ensemble_core.timing.Span.to_json`); and
    ``background``: ``{WRITE: {evaluator: seconds}}``, the writer thread's time per evaluator.

    Raises:
      CheckpointError: no checkpoint, or one that does not fit ``cfg``.
      DivergenceError: every member diverged (there is no ensemble to evaluate).
    """
    with timing.measure() as span:
        evaluation, background = _evaluate(cfg, dataset, RunDir(Path(run_dir)), strategy, write)
    return evaluation.model_copy(update={"timing": {**span.to_json(), "background": background}})


def _evaluate(
    cfg: PipelineConfig, dataset: DatasetInfo, run: RunDir, strategy: str | None, write: bool
) -> tuple[Evaluation, dict]:
    with timing.part("load ensemble"):
        ensemble = load_ensemble(cfg, run.path, dataset.num_classes, dataset.image_shape, strategy=strategy)
    cfg, members = ensemble.config, ensemble.members

    # Every evaluator starts from the test split: read it, and predict it, once per evaluation.
    def predict(images: np.ndarray) -> tuple[np.ndarray, float]:
        with timing.part(FORWARD):
            return members.predict(cfg, images)

    def predict_logits(images: np.ndarray) -> np.ndarray:
        with timing.part(FORWARD):
            return members.predict(cfg, images, logits=True)[0]

    # The derived sets each evaluator used, {evaluator: {key: bytes on disk}}: its metrics'
    # ``derived_sets`` (report.json), within eval.derived_cache_mb (cache.py).
    derived: dict[str, dict[str, int]] = {}
    current = {"name": ""}
    cap = cfg.eval.derived_cache_mb * MIB

    def cached(key, build, shapes=None):
        with timing.part(evaluators.DERIVED):
            arrays = cached_arrays(dataset, key, build, shapes, cap_bytes=cap)
        path = derived_dir(dataset) / f"{key}.npz"
        derived.setdefault(current["name"], {})[key] = path.stat().st_size if path.exists() else 0
        return arrays

    @functools.cache
    def load_split(split: str) -> tuple[np.ndarray, np.ndarray]:
        with timing.part(evaluators.DATA):
            return load(cfg, dataset, split)

    @functools.cache
    def split_outputs(split: str) -> tuple[np.ndarray, np.ndarray, float]:
        # One forward pass per split: the members' logits, their softmax (the probabilities
        # the test evaluator scores; the OOD evaluators' energy needs the logits) and the
        # steady-state throughput.
        images = load_split(split)[0]
        with timing.part(FORWARD):
            logits, throughput = members.predict(cfg, images, logits=True)
            probs = scipy.special.softmax(logits, axis=-1).astype(np.float32, copy=False)
        return logits, probs, throughput

    @functools.cache
    def held_out() -> tuple[np.ndarray, np.ndarray] | None:
        # Every member on the held-out split decisions.json was fitted on (the calibration
        # split): predicted once, for the members' own rules and the accuracy estimators.
        split = cfg.decision_split
        if split is None or ensemble.decisions is None:
            return None
        images, labels = load_split(split)
        return predict(images)[0], labels

    @functools.cache
    def decision_fit() -> DecisionFit | None:
        # The rules of the ensemble and of every member on that split (the same ensemble, so
        # the ensemble's rules are decisions.json's).
        split, held = cfg.decision_split, held_out()
        if split is None or held is None:
            return None
        probs, labels = held
        return fit_all(probs, labels, members.healthy, ensemble.temperature, cfg.prediction_sets, cfg.abstention, split)

    @functools.cache
    def accuracy_reference() -> accuracy_estimation.Reference | None:
        held = held_out()
        if held is None:
            return None
        probs, labels = held
        return accuracy_estimation.fit_reference(probs[members.healthy], labels, ensemble.temperature)

    ctx = evaluators.EvalContext(
        config=cfg,
        dataset=dataset,
        healthy=members.healthy,
        predict=predict,
        load=load_split,
        predict_split=lambda split: split_outputs(split)[1:],
        cached=cached,
        predict_logits=predict_logits,
        predict_split_logits=lambda split: split_outputs(split)[0],
        temperature=ensemble.temperature,
        decision_fit=decision_fit,
        accuracy_reference=accuracy_reference,
    )
    outputs = {}
    # Each evaluator's arrays and plots are written by one background thread while the next
    # evaluator computes (matplotlib runs in that thread only); its errors surface here.
    writer = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="evaluation-writer")
    jobs: dict[str, concurrent.futures.Future] = {}
    try:
        for name, spec in cfg.eval.evaluators.items():
            stopping.check()  # a stop request ends evaluation between evaluators (and batches)
            module = evaluators.get(spec.type)
            current["name"] = name
            with timing.part(name):
                out = module.evaluate(ctx.for_evaluator(name, spec))
            if derived.get(name) and not out.skipped:
                files = derived[name]
                out.metrics["derived_sets"] = {"bytes": sum(files.values()), "files": files}
            outputs[name] = (spec, out)
            if out.skipped:
                log.warning("evaluator %s skipped: %s", name, out.skipped)
            elif write:
                jobs[name] = writer.submit(_write, run, module, name, out, cfg)
        with timing.part(WAIT):
            written = {name: job.result() for name, job in jobs.items()}
    finally:
        writer.shutdown(wait=True, cancel_futures=True)
    if derived:
        log.info(
            "derived sets: %.1f MB used by this evaluation (%s); %s holds %.1f MB (cap eval.derived_cache_mb %d MB)",
            sum(sum(files.values()) for files in derived.values()) / MIB,
            ", ".join(f"{name} {sum(files.values()) / MIB:.1f} MB" for name, files in derived.items()),
            derived_dir(dataset),
            disk_use(derived_dir(dataset)) / MIB,
            cfg.eval.derived_cache_mb,
        )
    results = {
        name: EvaluatorResult(
            name=name, type=spec.type, metrics=out.metrics, plots=written[name][0] if name in written else {}
        )
        for name, (spec, out) in outputs.items()
    }
    return Evaluation(results=results), {WRITE: {name: seconds for name, (_, seconds) in written.items()}}


def _write(run: RunDir, module, name: str, out, cfg: PipelineConfig) -> tuple[dict[str, str], float]:
    """Evaluator ``name``'s arrays (atomically) and plots: the plots' paths relative to the
    run directory, and the seconds it took."""
    t0 = time.perf_counter()
    atomic_savez(run.evaluator_arrays(name), **out.arrays)
    plots: dict[str, str] = {}
    if cfg.eval.plots and hasattr(module, "plot"):
        drawn = module.plot(out.metrics, out.arrays, run.plots, cfg, name=name)
        plots = {key: str(path.relative_to(run.path)) for key, path in drawn.items()}
    return plots, time.perf_counter() - t0
