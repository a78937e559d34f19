"""The champion record of an output directory: ``champion.json`` and ``history.jsonl``, read and written.

Files under an output directory:

- ``champion.json``: the current champion, one JSON object: ``run_name`` (str),
  ``run_dir`` (str, the run's directory; it holds ``checkpoints/``), ``data`` (object: the
  data config its figures were measured on), ``metrics`` (object: ensemble ``accuracy``,
  ``nll``, ``brier``, ``ece``, finite numbers), ``promoted_at`` (ISO time, UTC). Replaced
  atomically (a temporary file in the same directory, then ``os.replace``).
- ``history.jsonl``: one JSON object per line, one line per run (``run_name``, headline
  metrics, ``promoted``, ``finished_at``). At most one line per ``run_name``: a retried
  run replaces its line. Rewritten atomically (temporary file, then ``os.replace``), so an
  intact line is never lost or half-written.
- ``corrupt-state/``: damaged state set aside, never deleted and never overwritten:
  ``champion.json.<UTC timestamp>`` (the damaged pointer, byte-identical) and
  ``history.jsonl.<UTC timestamp>.bad-lines`` (the unreadable lines of the history,
  byte-identical, one per line). The timestamp is ``YYYYmmddTHHMMSS.ffffffZ``; a ``-N``
  suffix keeps names unique.
- ``.champion-state.lock``: an empty file locked (``flock``) while the history is read
  and rewritten, so that concurrent runs cannot lose each other's lines.

Damaged state never stops a run: a damaged champion pointer is set aside with a warning
(logger ``ensemble_core.runs.storage.records``) and the run is judged as if there were no champion;
corrupt history lines are set aside with a warning and every intact line is kept. Only
real I/O failures (a read-only or full disk, missing permissions) raise ``OSError``.

The promotion policy that reads and writes these files is :mod:`ensemble_core.runs.champion.promotion`.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ensemble_core.atomic import atomic_write_bytes
from ensemble_core.figures import TEST_METRICS
from ensemble_core.filelock import flocked
from ensemble_core.runs.storage.layout import CHAMPION_FILE, HISTORY_FILE, OutputDir, RunDir
from ensemble_core.runs.storage.records import release_corrupt_path, reserve_corrupt_path, set_aside

#: The ensemble test metrics every champion record holds, and whether higher is better.
NO_CHAMPION = "this run will be judged as if there were no champion"

log = logging.getLogger(__name__)

# MARK: champion.json


def read_champion(output_dir: str | Path) -> dict | None:
    """The current champion record, or None when there is none (or it was damaged).

    A damaged ``champion.json`` (not UTF-8 JSON, not an object, ``run_name``/``run_dir``
    not non-empty strings, ``data`` not an object, ``metrics`` without finite numbers for
    accuracy/nll/brier/ece, or a ``run_dir`` that no longer exists or has no
    ``checkpoints/`` in it) is moved to ``<output_dir>/corrupt-state/champion.json.<UTC
    timestamp>`` with one warning, and None is returned. Nothing is ever created at the
    champion's ``run_dir``. A missing ``champion.json`` returns None without a warning.

    Raises:
      OSError: the file exists but cannot be read, or cannot be moved aside (I/O failure).
    """
    path = OutputDir(Path(output_dir)).champion
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    record, problem = _parse_champion(raw)
    if problem is None:
        return record
    try:
        set_aside(output_dir, CHAMPION_FILE, problem, consequence=NO_CHAMPION)
    except FileNotFoundError:  # another process set it aside (or replaced it) first
        log.info("damaged champion pointer %s was already moved by another process", path)
    return None


def write_champion(output_dir: str | Path, record: dict) -> None:
    """Make ``record`` the champion, atomically (readers see the old or the new file).

    ``promoted_at`` (now, UTC) is added; ``output_dir`` is created if needed.

    Raises:
      OSError: the file cannot be written (I/O failure); the old champion is then kept.
    """
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps({**record, "promoted_at": dt.datetime.now(dt.UTC).isoformat()}, indent=2) + "\n"
    atomic_write_bytes(OutputDir(out).champion, text.encode())


def _parse_champion(raw: bytes) -> tuple[dict | None, str | None]:
    """``(record, None)`` for an intact champion pointer, ``(None, what is wrong)`` otherwise."""
    try:
        record = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        return None, f"not UTF-8 text: {err}"
    except json.JSONDecodeError as err:
        return None, f"not valid JSON: {err}"
    except RecursionError:
        return None, "not valid JSON: nested too deeply"
    if not isinstance(record, dict):
        return None, f"not a JSON object but a {type(record).__name__}"
    for key in ("run_name", "run_dir"):
        if not isinstance(record.get(key), str) or not record[key]:
            return None, f"'{key}' is missing or not a non-empty string"
    for key in ("data", "metrics"):
        if not isinstance(record.get(key), dict):
            return None, f"'{key}' is missing or not a JSON object"
    for key in TEST_METRICS:
        value = record["metrics"].get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            return None, f"metrics['{key}'] is {value!r}, not a finite number"
    run_dir = Path(record["run_dir"])
    if not run_dir.is_dir():
        return None, f"its run directory {run_dir} no longer exists"
    if not RunDir(run_dir).checkpoints.is_dir():
        return None, f"its run directory {run_dir} has no checkpoints/ in it"
    return record, None


# MARK: history.jsonl


def read_history(output_dir: str | Path) -> list[dict]:
    """Every intact row of ``history.jsonl``, in file order ([] when there is none).

    Lines that are not UTF-8 JSON objects are copied, byte-identical, to
    ``<output_dir>/corrupt-state/history.jsonl.<UTC timestamp>.bad-lines`` and removed
    from ``history.jsonl`` (rewritten atomically with the intact lines unchanged), with one
    warning naming the line numbers.

    Raises:
      OSError: the history cannot be read or rewritten (I/O failure).
    """
    out = Path(output_dir)
    if not (OutputDir(out).history).exists():
        return []
    with _locked(out):
        return [row for row, _ in _read_history_locked(out)]


def append_history(output_dir: str | Path, row: dict) -> list[dict]:
    """Record one run's row in ``history.jsonl``; returns every row so far.

    Idempotent per ``row["run_name"]``: a row already there for that run (a retried task)
    is replaced in place, not duplicated. Corrupt lines are set aside as in
    :func:`read_history`. The file is rewritten atomically (temporary file, ``os.replace``).

    Raises:
      OSError: the history cannot be written (I/O failure); the old file is then kept.
    """
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    new_line = json.dumps(row).encode()
    with _locked(out):
        kept: list[tuple[dict, bytes]] = []
        placed = False
        for old, line in _read_history_locked(out):
            if "run_name" in row and old.get("run_name") == row["run_name"]:
                if not placed:  # the run's first row is replaced; any duplicate of it dropped
                    kept.append((row, new_line))
                    placed = True
                continue
            kept.append((old, line))
        if not placed:
            kept.append((row, new_line))
        atomic_write_bytes(OutputDir(out).history, b"".join(line + b"\n" for _, line in kept))
    return [json.loads(line) for _, line in kept]


def _read_history_locked(out: Path) -> list[tuple[dict, bytes]]:
    """Intact ``(row, raw line)`` pairs; bad lines are set aside first (caller holds the lock)."""
    path = OutputDir(out).history
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    good: list[tuple[dict, bytes]] = []
    bad: list[tuple[int, bytes]] = []
    for number, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            row = None
        if isinstance(row, dict):
            good.append((row, line))
        else:
            bad.append((number, line))
    if bad:
        dest = reserve_corrupt_path(out, HISTORY_FILE, ".bad-lines", directory=False)
        try:
            atomic_write_bytes(dest, b"".join(line + b"\n" for _, line in bad))
            atomic_write_bytes(path, b"".join(line + b"\n" for _, line in good))
        except OSError:
            if dest.exists() and dest.stat().st_size == 0:
                release_corrupt_path(dest)
            raise
        numbers = ", ".join(str(n) for n, _ in bad)
        log.warning(
            "%s has %d corrupt line(s) (line %s: not a UTF-8 JSON object); copied them to %s and removed them "
            "from the history; the %d intact row(s) are kept",
            path,
            len(bad),
            numbers,
            dest,
            len(good),
        )
    return good


@contextmanager
def _locked(out: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``<out>/.champion-state.lock``."""
    with flocked(OutputDir(out).champion_lock):
        yield
