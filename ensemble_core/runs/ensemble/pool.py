"""Which pool a run's ensemble is selected from, and how it is selected.

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

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from ensemble_core import hyper
from ensemble_core.atomic import atomic_write_json
from ensemble_core.config import PipelineConfig
from ensemble_core.errors import CheckpointError, IncompatibleRunError
from ensemble_core.rngs import key_layout, stratified_member_keys
from ensemble_core.runs.storage.layout import RunDir
from ensemble_core.runs.training.keys import MemberKeyData
from ensemble_core.setup import group_size, plan

#: Padding members of the stratified pool (dropped at evaluation) take this setting id.
PADDING_SETTING = 2**32 - 1


@dataclasses.dataclass(frozen=True)
class StratificationPlan:
    """The first selection's outcome: which settings the stratified pool trains.

    Attributes:
      settings: search-pool member indices of the D distinct selected settings, in order
        of first pick.
      inits: J, initialisations per setting.
      first_selection: the first selection's record (``members``, ``multiplicities``,
        ``validation_nll``, ``member_validation_nll``, ``distinct``, ``validation_examples``).
    """

    settings: list[int]
    inits: int
    first_selection: dict[str, Any]

    @property
    def size(self) -> int:
        """D x J, the stratified pool's size."""
        return len(self.settings) * self.inits

    def member(self, m: int) -> tuple[int, int]:
        """Stratified pool member ``m`` as ``(setting, initialisation)``."""
        return self.settings[m // self.inits], m % self.inits

    def to_json(self) -> dict[str, Any]:
        return {"settings": self.settings, "inits": self.inits, "first_selection": self.first_selection}


def plan_path(run: RunDir) -> Path:
    return run.stratified.path / "plan.json"


def write_plan(run: RunDir, stratification: StratificationPlan) -> None:
    """Write ``<run>/stratified/plan.json`` atomically."""
    atomic_write_json(plan_path(run), stratification.to_json())


_REDO = "delete the run's stratified/ directory and rerun the run name (the stratified pool trains again)"


def read_plan(run: RunDir, search_pool: int) -> StratificationPlan | None:
    """``<run>/stratified/plan.json``, or None when absent.

    Raises:
      CheckpointError: the file is damaged (not JSON, settings not distinct member indices
        of the search pool of ``search_pool`` members, inits not a positive int).
    """
    path = plan_path(run)
    try:
        raw = json.loads(path.read_text("utf-8"))
        settings, inits = raw["settings"], raw["inits"]
        ok = (
            isinstance(settings, list)
            and settings
            and len(set(settings)) == len(settings)
            and all(isinstance(s, int) and 0 <= s < search_pool for s in settings)
            and isinstance(inits, int)
            and inits >= 1
            and isinstance(raw["first_selection"], dict)
        )
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"{path} is damaged ({type(err).__name__}); fix: {_REDO}") from None
    if not ok:
        raise CheckpointError(f"{path} does not hold a stratification plan; fix: {_REDO}")
    return StratificationPlan(settings=settings, inits=inits, first_selection=raw["first_selection"])


def saved_plan(cfg: PipelineConfig, run: RunDir) -> StratificationPlan | None:
    """The run's stratification plan made for ``cfg`` (None: not made yet).

    Raises:
      CheckpointError: a damaged plan file (:func:`read_plan`).
      IncompatibleRunError: the plan was made for another ``ensemble.stratify``.
    """
    saved = read_plan(run, cfg.ensemble.size)
    if saved is not None and saved.inits != cfg.ensemble.stratify:
        raise IncompatibleRunError(
            f"'{run.path}' trains its stratified pool with ensemble.stratify={saved.inits}, not "
            f"{cfg.ensemble.stratify}; fix: rerun with ensemble.stratify={saved.inits}, or use a new run name"
        )
    return saved


def stratified_config(cfg: PipelineConfig, stratification: StratificationPlan) -> PipelineConfig:
    """The stratified pool's config: D x J members, member m with setting
    ``stratification.member(m)[0]``'s hyperparameters (``ensemble.search`` as one value per
    member), no further stratification; everything else as ``cfg``.

    Member groups: ``distributed.member_groups`` if it divides D x J, else their greatest
    common divisor; an explicit ``mesh.ensemble`` axis that does not divide the pool is padded.
    """
    size = stratification.size
    search_hp = cfg.member_hyperparameters()
    hp = [search_hp[stratification.member(m)[0]] for m in range(size)]
    search = {name: [h[name] for h in hp] for name in hyper.SEARCHABLE} if cfg.ensemble.search else None
    groups = math.gcd(size, cfg.distributed.member_groups)
    update = {"size": size, "search": search, "stratify": None}
    if cfg.mesh.ensemble is not None and size % cfg.mesh.ensemble:
        update["pad"] = True
    raw = cfg.model_dump(mode="json")
    raw["ensemble"].update(update)
    raw["distributed"]["member_groups"] = groups
    return PipelineConfig.model_validate(raw, context={"stratified_pool": True})


def stratified_keys(pool_cfg: PipelineConfig, stratification: StratificationPlan) -> MemberKeyData:
    """Raw key data of the stratified pool (:func:`ensemble_core.rngs.stratified_member_keys`)
    for every member any member group's mesh trains, padding included."""
    groups = pool_cfg.distributed.member_groups
    padded = plan(pool_cfg).padded_members
    if groups > 1:
        padded = max(padded, (groups - 1) * group_size(pool_cfg) + plan(pool_cfg, group=True).padded_members)
    pairs = [stratification.member(m) for m in range(stratification.size)]
    pairs += [(PADDING_SETTING, p) for p in range(padded - len(pairs))]
    return key_layout(stratified_member_keys(pool_cfg.seed, pairs))


def final_pool(cfg: PipelineConfig, run: RunDir) -> tuple[PipelineConfig, RunDir, StratificationPlan | None]:
    """The pool the run's ensemble is selected from: ``(config, run directory, plan)``;
    ``cfg``, ``run`` and None without ``ensemble.stratify``.

    Raises:
      CheckpointError: stratification is configured but its plan is missing or damaged
        (the stratification stage has not run: rerun the run name).
    """
    if cfg.ensemble.stratify is None:
        return cfg, run, None
    stratification = read_plan(run, cfg.ensemble.size)
    if stratification is None:
        raise CheckpointError(
            f"'{run.path}' has no stratified pool yet (ensemble.stratify={cfg.ensemble.stratify}); fix: rerun the "
            f"run name to train it"
        )
    return stratified_config(cfg, stratification), run.stratified, stratification
