"""How the report's markdown writes a figure: four decimals, nothing for a missing one."""

from __future__ import annotations


def fixed(x: float | None) -> str:
    """``x`` with four decimals (``0.0957``); ``""`` for None (a figure not computed)."""
    return "" if x is None else f"{x:.4f}"
