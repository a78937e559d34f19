"""Champion/challenger bookkeeping for nightly retraining (pure file I/O, no JAX).

Under an output directory:

- ``champion.json``: the current champion: ``run_name``, ``run_dir``, ``data`` (the data
  config its figures were measured on), ``metrics`` (ensemble accuracy/NLL/Brier/ECE),
  ``promoted_at``. Replaced atomically (write to a temporary file, ``os.replace``).
- ``history.jsonl``: one JSON line per run: headline metrics and the decision.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

CHAMPION_FILE = "champion.json"
HISTORY_FILE = "history.jsonl"
HIGHER_IS_BETTER = {"accuracy": True, "nll": False, "brier": False, "ece": False}


def read_champion(output_dir: str | Path) -> dict | None:
    """The current champion record, or None when there is none yet."""
    path = Path(output_dir) / CHAMPION_FILE
    if not path.exists():
        return None
    return json.loads(path.read_text())


def decide(challenger: dict, champion: dict | None, metric: str) -> tuple[bool, str]:
    """Promote the challenger if it is not worse than the champion on ``metric``.

    Args:
      challenger, champion: ensemble metric dicts measured on the same test split
        (``champion`` None: there is no champion, the challenger is promoted).
      metric: one of ``accuracy``, ``nll``, ``brier``, ``ece``.

    Returns:
      (promoted, a one-line reason).
    """
    if champion is None:
        return True, "no champion yet"
    new, old = challenger[metric], champion[metric]
    better_or_equal = new >= old if HIGHER_IS_BETTER[metric] else new <= old
    relation = "not worse than" if better_or_equal else "worse than"
    return better_or_equal, f"challenger {metric} {new:.4f} is {relation} champion {metric} {old:.4f}"


def write_champion(output_dir: str | Path, record: dict) -> None:
    """Make ``record`` the champion, atomically (readers see the old or the new file)."""
    path = Path(output_dir) / CHAMPION_FILE
    tmp = path.with_name(f".{CHAMPION_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({**record, "promoted_at": dt.datetime.now(dt.UTC).isoformat()}, indent=2) + "\n")
    os.replace(tmp, path)


def append_history(output_dir: str | Path, row: dict) -> list[dict]:
    """Append one run's row to ``history.jsonl``; returns every row so far."""
    path = Path(output_dir) / HISTORY_FILE
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
