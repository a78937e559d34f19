"""The names of the pluggable modules: one file per model and per evaluator.

Names only, found by listing the package directories (nothing is imported), so the config
schema (:mod:`ensemble_core.config`) and the figures (:mod:`ensemble_core.figures`) can
check a name without importing JAX, Flax or the evaluators.
"""

from __future__ import annotations

import pkgutil
from pathlib import Path


def _registered(package: str) -> tuple[str, ...]:
    """The modules of ``ensemble_core/<package>/`` (one per model or evaluator), by name, sorted;
    names starting with ``_`` (shared helpers) are left out."""
    found = pkgutil.iter_modules([str(Path(__file__).parent / package)])
    return tuple(sorted(m.name for m in found if not m.name.startswith("_")))


#: ``model.name`` values: one file per model in ``ensemble_core/models/``.
MODEL_NAMES = _registered("models")
#: ``eval.evaluators`` values: one file per evaluator in ``ensemble_core/evaluators/``.
EVALUATOR_NAMES = _registered("evaluators")
