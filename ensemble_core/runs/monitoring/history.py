"""The monitoring history of an output directory: one row per monitored night, and its plot.

``<output_dir>/monitoring/``::

    history.jsonl         one JSON object per night (:func:`history_row`), in the order monitored
    history.png           the estimated accuracy and the drift tests' p-values over the nights
    <night>.json, .md     each night's whole record and its Markdown report
    <night>.npz, .csv     each night's per-image predictions (:mod:`ensemble_core.runs.prediction`)
    .lock                 locked (``flock``) while the history is rewritten

The history is rewritten atomically under the lock, idempotent per ``night`` (a retried
task replaces its row, never duplicates it); a line that is not a JSON object is dropped
with a warning naming it, and every intact line is kept.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from ensemble_core import plotting
from ensemble_core.atomic import atomic_write_bytes
from ensemble_core.filelock import flocked
from ensemble_core.runs.monitoring.drop import p_values
from ensemble_core.runs.storage.layout import OutputDir

log = logging.getLogger(__name__)

HISTORY_FILE = "history.jsonl"
PLOT_FILE = "history.png"
#: The plot draws smaller p-values at this floor (the axis says so); the rows keep them exact.
P_FLOOR = 1e-16


def monitoring_dir(output_dir: str | Path) -> Path:
    """``<output_dir>/monitoring`` (not created)."""
    return OutputDir(Path(output_dir)).monitoring


def history_row(record: dict[str, Any]) -> dict[str, Any]:
    """What the history keeps of a night's record: ``night``, ``time``, ``champion_run``,
    ``n_images``, ``estimator``, ``estimate``, ``estimates``, ``p_values`` (Holm-adjusted,
    per test), ``drifted``, ``alpha``, ``abstention_rate``, ``mean_set_size``,
    ``empty_set_rate``, ``class_frequencies``."""
    acc = record["accuracy"]
    return {
        "night": record["night"],
        "time": record["time"],
        "champion_run": record.get("champion_run"),
        "n_images": record["n_images"],
        "estimator": acc["estimator"],
        "estimate": acc["estimate"],
        "estimates": acc["estimates"],
        "p_values": p_values(record),
        "drifted": record["drifted"],
        "alpha": record["alpha"],
        "abstention_rate": record.get("abstention_rate"),
        "mean_set_size": record.get("mean_set_size"),
        "empty_set_rate": record.get("empty_set_rate"),
        "class_frequencies": record["class_frequencies"],
    }


def _read_locked(path: Path) -> list[dict[str, Any]]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    rows = []
    for number, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            row = None
        if isinstance(row, dict) and isinstance(row.get("night"), str):
            rows.append(row)
        else:
            log.warning("%s line %d is not a monitored night (a JSON object with a night); it is dropped", path, number)
    return rows


def read_history(output_dir: str | Path) -> list[dict[str, Any]]:
    """Every intact row of ``monitoring/history.jsonl``, oldest first ([] when none).

    Raises:
      OSError: the file exists but cannot be read.
    """
    folder = monitoring_dir(output_dir)
    if not (folder / HISTORY_FILE).exists():
        return []
    with flocked(folder / ".lock"):
        return _read_locked(folder / HISTORY_FILE)


def append_history(output_dir: str | Path, row: dict[str, Any]) -> list[dict[str, Any]]:
    """Record a night's row (:func:`history_row`), replacing a row of the same ``night``;
    returns every row, oldest first. Written atomically under the lock.

    Raises:
      OSError: the history cannot be written (the old file is kept).
    """
    folder = monitoring_dir(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / HISTORY_FILE
    with flocked(folder / ".lock"):
        rows = [r for r in _read_locked(path) if r["night"] != row["night"]]
        rows.append(row)
        atomic_write_bytes(path, b"".join(json.dumps(r).encode() + b"\n" for r in rows))
    return rows


def plot_history(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """Two panels over the nights (x: night index, labelled by the night's id): the
    headline estimated accuracy (%); each drift test's Holm-adjusted p-value (log scale)
    with the nights' ``alpha`` as a dashed line (p-values below :data:`P_FLOOR` drawn at
    it), drifted nights marked in red. Saved with
    :func:`ensemble_core.plotting.save`.

    Raises:
      ValueError: no rows.
    """
    if not rows:
        raise ValueError("no monitored night to plot")
    fig, (top, bottom) = plotting.subplots(2, 1, figsize=(max(6.0, 0.45 * len(rows) + 3), 6), sharex=True)
    x = list(range(len(rows)))
    top.plot(x, [100 * r["estimate"] for r in rows], marker="o", color="C0")
    estimators = sorted({r["estimator"] for r in rows})
    top.set_ylabel("estimated accuracy (%)")
    top.set_title(f"Monitoring: estimated accuracy ({', '.join(estimators)}) and drift tests")
    top.grid(alpha=0.3)
    tests = sorted({name for r in rows for name in r.get("p_values", {})})
    for i, name in enumerate(tests):
        ys = [r.get("p_values", {}).get(name) for r in rows]
        pts = [(xi, max(y, P_FLOOR)) for xi, y in zip(x, ys, strict=True) if y is not None]
        if pts:
            bottom.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=f"C{i + 1}", label=name)
    alphas = [r["alpha"] for r in rows]
    bottom.plot(x, alphas, linestyle="--", color="black", label="alpha")
    for xi, r in zip(x, rows, strict=True):
        if r.get("drifted"):
            top.axvspan(xi - 0.4, xi + 0.4, color="red", alpha=0.12)
            bottom.axvspan(xi - 0.4, xi + 0.4, color="red", alpha=0.12)
    bottom.set_yscale("log")
    bottom.set_ylabel(f"Holm-adjusted p-value\n(below {P_FLOOR:g} drawn at it)")
    bottom.legend(fontsize=7, loc="lower left")
    bottom.grid(alpha=0.3)
    bottom.set_xticks(x)
    bottom.set_xticklabels([plotting.short_label(r["night"], 24) for r in rows], rotation=60, ha="right", fontsize=6)
    return plotting.save(fig, Path(path))
