"""The JSON records of a run and of an output directory, and the set-aside rule they share.

A damaged record never stops a run: it is moved, byte-identical, to
``<dir>/corrupt-state/<name>.<UTC timestamp>`` (timestamp ``YYYYmmddTHHMMSS.ffffffZ``; a
``-N`` suffix keeps names unique; never deleted, never overwritten) with one warning
naming the consequence (:func:`set_aside`). Here: a run's ``selection.json`` (the members
the select stage chose and the fitted temperature) and a stratified pool's ``plan.json``
(the settings it trains, read back on resume so the pool never changes under its
checkpoints); the champion's record and history are
:mod:`ensemble_core.runs.storage.champion_record`.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import os
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any, TypeVar

from ensemble_core.accuracy_estimation import Reference
from ensemble_core.atomic import atomic_write_json
from ensemble_core.decisions import DecisionRules
from ensemble_core.drift_tests import DriftReference
from ensemble_core.errors import CheckpointError, EnsembleError
from ensemble_core.runs.storage.layout import OutputDir, RunDir
from ensemble_core.stratification import PADDING_SETTING, StratificationPlan

log = logging.getLogger(__name__)
T = TypeVar("T")
#: What reading a damaged record raises: not UTF-8 JSON, or refused by its parser.
DAMAGED = (UnicodeDecodeError, json.JSONDecodeError, RecursionError, EnsembleError, KeyError, TypeError, ValueError)


# MARK: corrupt-state/


def set_aside(
    output_dir: str | Path, name: str, reason: str, *, consequence: str = "it is ignored from now on"
) -> Path:
    """Move ``<output_dir>/<name>`` to ``<output_dir>/corrupt-state/<name>.<UTC timestamp>``.

    The move is one ``os.replace`` (atomic; a file or a directory); the destination name
    is reserved first, so nothing already set aside is overwritten. One warning (this
    module's logger) names the file, ``reason``, the new path and ``consequence``.

    Returns:
      The path the file now has.

    Raises:
      FileNotFoundError: ``<output_dir>/<name>`` does not exist.
      OSError: it cannot be moved (I/O failure).
    """
    src = Path(output_dir) / name
    if not src.exists() and not src.is_symlink():
        raise FileNotFoundError(f"cannot set aside {src}: it does not exist")
    dest = reserve_corrupt_path(Path(output_dir), Path(name).name, "", directory=src.is_dir() and not src.is_symlink())
    try:
        os.replace(src, dest)
    except OSError:
        release_corrupt_path(dest)
        raise
    log.warning("%s is damaged (%s); moved it to %s; %s", src, reason, dest, consequence)
    return dest


def reserve_corrupt_path(out: Path, name: str, suffix: str, *, directory: bool) -> Path:
    """Create and return a new, unique ``<out>/corrupt-state/<name>.<UTC timestamp>[-N]<suffix>``."""
    corrupt = OutputDir(out).corrupt_state
    corrupt.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    for n in range(10_000):
        dest = corrupt / f"{name}.{stamp}{'' if n == 0 else f'-{n}'}{suffix}"
        try:
            if directory:
                dest.mkdir()
            else:
                dest.open("xb").close()
        except FileExistsError:
            continue
        return dest
    raise FileExistsError(f"no free name for {name} in {corrupt}")


def release_corrupt_path(dest: Path) -> None:
    """Remove a path :func:`reserve_corrupt_path` made and nothing was moved to."""
    with suppress(OSError):
        dest.rmdir() if dest.is_dir() else dest.unlink()


# MARK: decisions.json, drift_reference.json: the select stage's records of the held-out split


def write_or_remove(path: Path, record: dict | None) -> None:
    """Write ``record`` to ``path`` atomically, or remove ``path`` when ``record`` is None
    (a run evaluated again without the held-out split keeps none of an earlier session's)."""
    if record is None:
        with suppress(FileNotFoundError):
            path.unlink()
        return
    atomic_write_json(path, record)


def read_record(run: RunDir, path: Path, parse: Callable[[Any], T], what: str, consequence: str) -> T | None:
    """``parse`` of the JSON at ``path``, or None when absent. A file that is not UTF-8
    JSON, or that ``parse`` refuses (EnsembleError, KeyError, TypeError, ValueError), is set
    aside (:func:`set_aside`, naming ``what`` and ``consequence``) and None returned.

    Raises:
      OSError: the file exists but cannot be read or moved (I/O failure).
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return parse(json.loads(raw.decode("utf-8")))
    except (
        UnicodeDecodeError,
        json.JSONDecodeError,
        RecursionError,
        EnsembleError,
        KeyError,
        TypeError,
        ValueError,
    ) as err:
        problem = f"not {what} ({type(err).__name__})"
    set_aside(run.path, path.name, problem, consequence=consequence)
    return None


def write_decisions(run: RunDir, record: dict | None) -> None:
    """Write the run's ``decisions.json`` (the select stage): the ensemble's
    :meth:`ensemble_core.decisions.DecisionRules.to_dict`; None removes the file."""
    write_or_remove(run.decisions_json, record)


def read_decisions(run: RunDir) -> DecisionRules | None:
    """The run's decision rules (``decisions.json``), or None when absent (a run that
    predates prediction sets, or none asked for). A damaged file is set aside: prediction
    then gives no sets and never abstains until the run is evaluated again.

    Raises:
      OSError: the file exists but cannot be read or moved (I/O failure).
    """
    return read_record(
        run,
        run.decisions_json,
        DecisionRules.from_dict,
        "a decisions record",
        "predictions carry no prediction sets and never abstain until the run is evaluated again (rerun its run name)",
    )


def write_drift_reference(run: RunDir, record: dict | None) -> None:
    """Write the run's ``drift_reference.json`` (the select stage):
    :meth:`ensemble_core.drift_tests.DriftReference.to_dict`; None removes the file."""
    write_or_remove(run.drift_reference_json, record)


def read_drift_reference(run: RunDir) -> DriftReference | None:
    """The run's drift reference, or None when absent (a run without a calibration split,
    or older). A damaged file is set aside: the drift tests against this champion are then
    not computed.

    Raises:
      OSError: the file exists but cannot be read or moved (I/O failure).
    """
    return read_record(
        run,
        run.drift_reference_json,
        DriftReference.from_dict,
        "a drift reference",
        "drift tests against this run are skipped",
    )


def write_accuracy_reference(run: RunDir, record: dict | None) -> None:
    """Write the run's ``accuracy_reference.json`` (the select stage):
    :meth:`ensemble_core.accuracy_estimation.Reference.to_dict`; None removes the file."""
    write_or_remove(run.accuracy_reference_json, record)


def read_accuracy_reference(run: RunDir) -> Reference | None:
    """The label-free accuracy estimators' reference fitted on the run's calibration split,
    or None when absent (a run without a calibration split, or older). A damaged file is
    set aside: monitoring then uses only the estimators that need no reference.

    Raises:
      OSError: the file exists but cannot be read or moved (I/O failure).
    """
    return read_record(
        run,
        run.accuracy_reference_json,
        Reference.from_dict,
        "an accuracy reference",
        "monitoring estimates the accuracy without the fitted estimators (ATC, DoC) until the run is evaluated again",
    )


# MARK: selection.json


def write_selection(run: RunDir, members: list[int], temperature: float | None) -> None:
    """Write the run's ``selection.json`` atomically: ``{"members": [pool index per pick],
    "temperature": float or null}`` (the select stage, :mod:`ensemble_core.runs.ensemble.select`)."""
    atomic_write_json(run.selection_json, {"members": [int(m) for m in members], "temperature": temperature})


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


# MARK: the stratification plan


def plan_path(pool_dir: str | Path) -> Path:
    """``<pool_dir>/plan.json``: the stratification plan of a stratified pool (``<run>/stratified/``)."""
    return Path(pool_dir) / "plan.json"


def write_plan(pool_dir: str | Path, stratification: StratificationPlan) -> None:
    """Write ``<pool_dir>/plan.json`` atomically (before the stratified pool trains)."""
    atomic_write_json(plan_path(pool_dir), stratification.to_json())


_REDO = "delete the run's stratified/ directory and rerun the run name (the stratified pool trains again)"


def read_plan(pool_dir: str | Path, search_pool: int | None = None) -> StratificationPlan | None:
    """``<pool_dir>/plan.json``, or None when absent (a pool that is no stratified pool).

    Raises:
      CheckpointError: the file is damaged (not JSON, settings not distinct member indices
        of the search pool of ``search_pool`` members (any, when None), inits not a positive int).
    """
    path = plan_path(pool_dir)
    try:
        raw = json.loads(path.read_text("utf-8"))
        settings, inits = raw["settings"], raw["inits"]
        ok = (
            isinstance(settings, list)
            and settings
            and len(set(settings)) == len(settings)
            and all(
                isinstance(s, int) and 0 <= s < (search_pool if search_pool is not None else PADDING_SETTING)
                for s in settings
            )
            and isinstance(inits, int)
            and inits >= 1
            and isinstance(raw["first_selection"], dict)
        )
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"{path} is damaged ({type(err).__name__})", fix=_REDO) from None
    if not ok:
        raise CheckpointError(f"{path} does not hold a stratification plan", fix=_REDO)
    return StratificationPlan(settings=settings, inits=inits, first_selection=raw["first_selection"])
