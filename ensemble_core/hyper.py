"""Per-member hyperparameters: what ``ensemble.search`` gives member i, from ``(seed, i)`` only.

Hyper-deep ensembles (Wenzel, Snoek, Tran & Jenatton 2020, "Hyperparameter ensembles for
robustness and uncertainty quantification", NeurIPS) train members with *different*
hyperparameters and keep the best combination of them. Here every member's values are
drawn from its own random stream, ``numpy.random.default_rng([seed, i, crc32(name)])``,
so member i has the same hyperparameters whatever E, the device topology, or which
other hyperparameters are searched. The values ride on the member axis of the one
compiled train step (:mod:`ensemble_core.train`): the learning rate in the optimizer
state, set every step from the member's optax schedule; weight decay in the optimizer
state; label smoothing in the ensemble state.

Numpy only: the config (:mod:`ensemble_core.config`) samples with it to validate every
member's values before any compute.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

#: The hyperparameters ``ensemble.search`` may vary, each a ``train.*`` key.
SEARCHABLE = ("learning_rate", "weight_decay", "label_smoothing", "schedule", "warmup_epochs")
#: ``train.schedule`` values: optax's constant, cosine decay, and linear warm-up + cosine decay.
SCHEDULES = ("constant", "cosine", "warmup_cosine")
DISTRIBUTIONS = ("log_uniform", "uniform", "choice")


def member_rng(seed: int, member: int, name: str) -> np.random.Generator:
    """The random stream of hyperparameter ``name`` of member ``member`` (PCG64 seeded by
    ``SeedSequence([seed, member, crc32(name)])``)."""
    return np.random.default_rng([seed, member, zlib.crc32(name.encode())])


def sample(spec: Mapping[str, Any], seed: int, member: int, name: str) -> Any:
    """Draw member ``member``'s value of ``name`` from the distribution ``spec``.

    Args:
      spec: ``{"distribution": "log_uniform" | "uniform", "low": a, "high": b}`` or
        ``{"distribution": "choice", "values": [...]}``. log-uniform draws
        ``exp(U(log a, log b))`` (Bergstra & Bengio 2012's scale for learning rates).

    Returns:
      A float (log_uniform, uniform) or one of ``values``.

    Raises:
      ValueError: an unknown distribution.
    """
    rng = member_rng(seed, member, name)
    kind = spec["distribution"]
    if kind == "log_uniform":
        return float(math.exp(rng.uniform(math.log(spec["low"]), math.log(spec["high"]))))
    if kind == "uniform":
        return float(rng.uniform(spec["low"], spec["high"]))
    if kind == "choice":
        values = list(spec["values"])
        return values[int(rng.integers(len(values)))]
    raise ValueError(f"unknown distribution '{kind}'; fix: use one of {DISTRIBUTIONS}")


def member_hyperparameters(
    base: Mapping[str, Any], search: Mapping[str, Any] | None, seed: int, num_members: int
) -> list[dict[str, Any]]:
    """Every member's values of :data:`SEARCHABLE`.

    Args:
      base: the config's single values (``train.learning_rate``, ...), used for every
        hyperparameter ``search`` does not name.
      search: ``{name: distribution spec (see :func:`sample`) or a list of values}``; a
        list gives member i its i-th value (members past its end, i.e. padding members,
        take ``base``).
      num_members: how many members (padding included).

    Returns:
      ``num_members`` dicts ``{name: value}`` with every name of :data:`SEARCHABLE`.
    """
    out = []
    for i in range(num_members):
        hp = {name: base[name] for name in SEARCHABLE}
        for name, spec in (search or {}).items():
            if isinstance(spec, Mapping):
                hp[name] = sample(spec, seed, i, name)
            elif i < len(spec):
                hp[name] = _plain(spec[i])
        out.append(hp)
    return out


def _plain(value: Any) -> Any:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


def table(hyperparameters: Sequence[Mapping[str, Any]]) -> dict[str, list]:
    """Struct-of-arrays view: ``{name: [value of member 0, 1, ...]}``."""
    return {name: [hp[name] for hp in hyperparameters] for name in SEARCHABLE}
