"""A run's ``selection.json``: the members evaluation chose and the fitted temperature, what
prediction uses; read back validated (a damaged file is set aside with one warning)."""

from __future__ import annotations

import json
import math

from ensemble_core.runs.champion_state import set_aside
from ensemble_core.runs.layout import RunDir


def read_selection(run: RunDir, num_members: int) -> dict | None:
    """The run's ``selection.json`` (``members``: pool indices, ``temperature``), or None
    when absent.

    A damaged file (not UTF-8 JSON, not an object, ``members`` not a non-empty list of
    integers in ``[0, num_members)``, ``temperature`` neither null nor a finite positive
    number) is moved to ``<run>/corrupt-state/selection.json.<UTC timestamp>`` with one
    warning, and None is returned: prediction then uses every healthy member without a
    temperature until the run is evaluated again (rerun its run name).

    Raises:
      OSError: the file exists but cannot be read or moved (I/O failure).
    """
    try:
        raw = run.selection_json.read_bytes()
    except FileNotFoundError:
        return None
    record, problem = _parse_selection(raw, num_members)
    if problem is None:
        return record
    set_aside(
        run.path,
        run.selection_json.name,
        problem,
        consequence="predictions use every healthy member without a temperature until the run is evaluated "
        "again (rerun its run name)",
    )
    return None


def _parse_selection(raw: bytes, num_members: int) -> tuple[dict | None, str | None]:
    try:
        record = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        return None, f"not UTF-8 JSON ({type(err).__name__})"
    if not isinstance(record, dict):
        return None, f"not a JSON object but a {type(record).__name__}"
    members = record.get("members")
    if (
        not isinstance(members, list)
        or not members
        or not all(isinstance(m, int) and not isinstance(m, bool) and 0 <= m < num_members for m in members)
    ):
        return None, f"'members' is not a non-empty list of member indices in [0, {num_members})"
    t = record.get("temperature")
    if t is not None and (isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t <= 0):
        return None, f"'temperature' is {t!r}, not null or a finite positive number"
    return record, None
