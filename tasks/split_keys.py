"""Prefect task: one seed -> per-member keys (init, data order), and the per-member
hyperparameters of ``ensemble.search`` in the task's logs; wraps
:func:`ensemble_core.runs.split_keys`."""

from __future__ import annotations

from prefect import get_run_logger, task

from ensemble_core import runs
from ensemble_core.config import PipelineConfig
from tasks import TRANSIENT_RETRIES


@task(name="split_keys", **TRANSIENT_RETRIES)
def split_keys(config: PipelineConfig, num_members: int) -> dict[str, list[list[int]]]:
    """Raw uint32 key data ``{purpose: [[k0, k1]] * E}`` for ``num_members`` members."""
    layout = runs.split_keys(config, num_members)
    logger = get_run_logger()
    logger.info(
        "seed %d -> %d members x %s keys, member i = fold_in(fold_in(key(seed), purpose), i)",
        config.seed,
        num_members,
        list(layout),
    )
    searched = sorted(config.ensemble.search or {})
    hyperparameters = config.member_hyperparameters(num_members)
    if searched:
        logger.info("ensemble.search varies %s per member, drawn from (seed, i)", ", ".join(searched))
    for i in range(num_members):
        logger.debug("member %d: %s", i, {p: v[i] for p, v in layout.items()})
        if searched:
            logger.info("member %d: %s", i, {k: hyperparameters[i][k] for k in searched})
    return layout
