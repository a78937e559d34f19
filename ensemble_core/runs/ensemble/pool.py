"""Which pool a run's ensemble is chosen from, and a stratified pool's saved plan checked
against the config.

Without ``ensemble.stratify`` the pool is the run's trained members (the search pool of
a hyper ensemble, or a deep ensemble's E members). With it (a *hyper-deep ensemble*,
Wenzel, Snoek, Tran & Jenatton 2020, "Hyperparameter ensembles for robustness and
uncertainty quantification", NeurIPS, Algorithm 2) the first selection keeps D distinct
settings of the search pool, each is trained again from J = ``ensemble.stratify`` new
initialisations under ``<run>/stratified/`` (a run directory of its own: checkpoints,
lock, member groups), and the final selection draws ``select_size`` from that D x J
*stratified pool*. Member m of the stratified pool is setting ``settings[m // J]``,
initialisation ``m % J``; ``<run>/stratified/plan.json`` records the first selection
(written before the stratified pool trains, read back on resume, so the pool never
changes under its checkpoints).
"""

from __future__ import annotations

from typing import Any

from ensemble_core.config import PipelineConfig
from ensemble_core.errors import CheckpointError, IncompatibleRunError
from ensemble_core.runs.storage.layout import RunDir
from ensemble_core.runs.storage.records import read_plan
from ensemble_core.stratification import StratificationPlan, stratified_config


def saved_plan(cfg: PipelineConfig, run: RunDir) -> StratificationPlan | None:
    """The run's stratification plan made for ``cfg`` (None: not made yet).

    Raises:
      CheckpointError: a damaged plan file (:func:`read_plan`).
      IncompatibleRunError: the plan was made for another ``ensemble.stratify`` or another
        ``ensemble.first_selection``.
    """
    saved = read_plan(run.stratified.path, cfg.ensemble.size)
    if saved is not None and saved.inits != cfg.ensemble.stratify:
        raise IncompatibleRunError(
            f"'{run.path}' trains its stratified pool with ensemble.stratify={saved.inits}, not "
            f"{cfg.ensemble.stratify}",
            fix=f"rerun with ensemble.stratify={saved.inits}, or use a new run name",
        )
    made_with = (saved.first_selection.get("made_with") if saved is not None else None) or {}
    now = first_selection_settings(cfg)
    # select_size is recorded, not compared: the final selection's size may change on resume
    changed = {k: (v, now[k]) for k, v in made_with.items() if k in now and k != "select_size" and now[k] != v}
    if changed:
        key = {k: f"ensemble.first_selection.{k}" for k in changed}
        was = ", ".join(f"{key[k]}={old!r}" for k, (old, _) in changed.items())
        raise IncompatibleRunError(
            f"'{run.path}' made its stratification plan with {was}; this config changes "
            + ", ".join(f"{key[k]} to {new!r}" for k, (_, new) in changed.items()),
            fix=f"rerun with {was}, or use a new run name",
        )
    return saved


def first_selection_settings(cfg: PipelineConfig) -> dict[str, Any]:
    """What a stratification plan is made with, recorded in it (``first_selection.made_with``):
    ``ensemble.first_selection``'s keys, compared on every resume (a change is refused, as a
    changed ``ensemble.stratify`` is), and ``ensemble.select_size`` (recorded only: the final
    selection's size may change on resume)."""
    return {**cfg.ensemble.first_selection.model_dump(), "select_size": cfg.ensemble.select_size}


def final_pool(cfg: PipelineConfig, run: RunDir) -> tuple[PipelineConfig, RunDir, StratificationPlan | None]:
    """The pool the run's ensemble is selected from: ``(config, run directory, plan)``;
    ``cfg``, ``run`` and None without ``ensemble.stratify``.

    Raises:
      CheckpointError: stratification is configured but its plan is missing or damaged
        (the stratification stage has not run: rerun the run name).
    """
    if cfg.ensemble.stratify is None:
        return cfg, run, None
    stratification = read_plan(run.stratified.path, cfg.ensemble.size)
    if stratification is None:
        raise CheckpointError(
            f"'{run.path}' has no stratified pool yet (ensemble.stratify={cfg.ensemble.stratify})",
            fix="rerun the run name to train it",
        )
    return stratified_config(cfg, stratification), run.stratified, stratification
