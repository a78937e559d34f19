"""Sweep cases of issue 59 (round five): a user's code that floods the output, and messages that must name the real cause."""

from __future__ import annotations

from tests.system.sweep import case_table

CASES, case = case_table()
