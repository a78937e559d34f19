"""A hyper-deep ensemble's stratified pool (Wenzel, Snoek, Tran & Jenatton 2020,
"Hyperparameter ensembles for robustness and uncertainty quantification", NeurIPS,
Algorithm 2): which setting and initialisation each member is, and the pool's config.

The first selection keeps D distinct settings of the search pool; each is trained again
from J = ``ensemble.stratify`` new initialisations. Member m of that D x J pool is setting
``settings[m // J]``, initialisation ``m % J``; its keys depend on ``(seed, setting, j)``
only (:func:`ensemble_core.rngs.stratified_member_keys`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ensemble_core import hyper
from ensemble_core.config import PipelineConfig

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

    def pairs(self, first: int, count: int) -> list[tuple[int, int]]:
        """``(setting, initialisation)`` of pool members ``first .. first+count-1``; a
        member past the pool (mesh padding) is ``(PADDING_SETTING, m - size)``."""
        return [
            self.member(m) if m < self.size else (PADDING_SETTING, m - self.size) for m in range(first, first + count)
        ]

    def to_json(self) -> dict[str, Any]:
        return {"settings": self.settings, "inits": self.inits, "first_selection": self.first_selection}


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
