"""Member keys as the stages hand them on: raw uint32 key data, small and JSON-able.

Member i's keys (parameter initialisation, data order) depend on ``(seed, i)`` only
(:func:`ensemble_core.rngs.member_keys`), so any slice of the ensemble, e.g. a member
group, can be split on its own and equals the same rows of the whole ensemble's keys.
"""

from __future__ import annotations

from ensemble_core.config import PipelineConfig
from ensemble_core.rngs import key_layout, member_keys
from ensemble_core.setup import group_size, plan

#: ``{purpose: [[k0, k1]] * members}``: raw uint32 key data per purpose ("init", "data").
MemberKeyData = dict[str, list[list[int]]]


def split_keys(cfg: PipelineConfig, num_members: int, first: int = 0) -> MemberKeyData:
    """Per-member keys (init, data order) for members ``first..first+num_members-1``, as
    raw uint32 key data ``{purpose: [[k0, k1]] * num_members}`` (small and JSON-able: what
    the flow shows and hands to training). Member i's keys depend on ``(seed, i)`` only
    (:func:`ensemble_core.rngs.member_keys`)."""
    layout = key_layout(member_keys(cfg.seed, first + num_members))
    return {purpose: rows[first:] for purpose, rows in layout.items()}


def group_keys(cfg: PipelineConfig, keys: MemberKeyData, group: int) -> MemberKeyData:
    """Member group ``group``'s slice of the ensemble's ``keys`` (:func:`split_keys`),
    extended from the seed when the group's mesh trains padding members past them."""
    first = group * group_size(cfg)
    padded = plan(cfg, group=True).padded_members
    if all(len(rows) >= first + padded for rows in keys.values()):
        return {purpose: rows[first : first + padded] for purpose, rows in keys.items()}
    return split_keys(cfg, padded, first)
