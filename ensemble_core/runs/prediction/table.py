"""The predictions as a table, one row per input image, that pandas reads directly.

:func:`build_table` makes the rows from :func:`~ensemble_core.runs.prediction.predict.predict_images`'s
arrays, :func:`write_table` writes them atomically (CSV, or Parquet for a ``.parquet``
path), :func:`summarize` and :func:`render` give what the terminal shows.

Columns, in order (probabilities in [0, 1], entropies in nats):

- ``input``: the image file's path, or ``<file>[i]`` for row ``i`` of an array file;
- ``predicted_name``, ``probability``: the ensemble's class name and its probability;
- ``top1_name``, ``top1_probability`` .. ``topk_*``: the k = min(3, C) most probable classes;
- ``predictive_entropy``, ``mutual_information``: nats (the glossary's);
- ``disagreement``: the fraction of member pairs whose top classes differ on the image
  (:func:`ensemble_core.metrics.member_disagreement`);
- ``prediction_set`` (class names joined with ``|``), ``set_size``, ``abstain``: the run's
  conformal prediction set, empty for a run without a conformal calibration;
- ``error``: why the file was not predicted (``data.on_bad_image: skip``), empty otherwise;
  such a row has no prediction.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from ensemble_core import metrics as metrics_lib
from ensemble_core.atomic import atomic_write_bytes

#: At most this many top classes per row.
TOP_K = 3
#: The rows the terminal and the table artifact show.
HEAD_ROWS = 20
#: The separator of class names in ``prediction_set``.
SET_SEPARATOR = "|"


def columns(num_classes: int) -> list[str]:
    """The table's columns for a run of ``num_classes`` classes, in order."""
    top = [f"top{i + 1}_{what}" for i in range(min(TOP_K, num_classes)) for what in ("name", "probability")]
    return [
        "input",
        "predicted_name",
        "probability",
        *top,
        "predictive_entropy",
        "mutual_information",
        "disagreement",
        "prediction_set",
        "set_size",
        "abstain",
        "error",
    ]


def build_table(
    result: dict[str, np.ndarray],
    sources: Sequence[str],
    ok: np.ndarray | None = None,
    errors: dict[int, str] | None = None,
) -> pd.DataFrame:
    """One row per input, in input order.

    Args:
      result: :func:`~ensemble_core.runs.prediction.predict.predict_images`'s arrays for the
        ``n`` predicted images: ``ensemble_probs`` float ``[n, C]``, ``class_names`` str
        ``[C]``, ``predictive_entropy``, ``mutual_information`` ``[n]``, ``member_probs``
        ``[K, n, C]`` and, for a run with a conformal calibration, ``prediction_set`` bool
        ``[n, C]`` and ``abstain`` bool ``[n]``.
      sources: the ``N`` inputs' names (``N >= n``).
      ok: bool ``[N]``, the inputs ``result`` predicted (default: all); errors: input
        index -> reason for the others.

    Returns:
      A DataFrame of :func:`columns`; rows without a prediction have empty (NA)
      prediction columns and their ``error``.
    """
    probs = np.asarray(result["ensemble_probs"], np.float64)
    names = np.asarray(result["class_names"], dtype=str)
    n, c = probs.shape
    total = len(sources)
    ok = np.ones(total, bool) if ok is None else np.asarray(ok, bool)
    if int(ok.sum()) != n or len(ok) != total:
        raise ValueError(f"{n} predictions for {int(ok.sum())} of {total} inputs marked predicted")
    rows = np.flatnonzero(ok)
    order = np.argsort(-probs, axis=-1, kind="stable")
    k = min(TOP_K, c)

    def spread(values, dtype) -> pd.Series:
        column = pd.Series(pd.array([pd.NA] * total, dtype=dtype))
        column.iloc[rows] = pd.array(list(values), dtype=dtype)
        return column

    data: dict[str, pd.Series] = {"input": pd.Series(list(sources), dtype="string")}
    data["predicted_name"] = spread(names[order[:, 0]], "string")
    data["probability"] = spread(probs[np.arange(n), order[:, 0]], "Float64")
    for i in range(k):
        data[f"top{i + 1}_name"] = spread(names[order[:, i]], "string")
        data[f"top{i + 1}_probability"] = spread(probs[np.arange(n), order[:, i]], "Float64")
    data["predictive_entropy"] = spread(np.asarray(result["predictive_entropy"], np.float64), "Float64")
    data["mutual_information"] = spread(np.asarray(result["mutual_information"], np.float64), "Float64")
    data["disagreement"] = spread(metrics_lib.member_disagreement(np.asarray(result["member_probs"])), "Float64")
    if "prediction_set" in result and "abstain" in result:
        sets = np.asarray(result["prediction_set"], bool)
        data["prediction_set"] = spread((SET_SEPARATOR.join(names[s]) for s in sets), "string")
        data["set_size"] = spread(sets.sum(-1), "Int64")
        data["abstain"] = spread(np.asarray(result["abstain"], bool), "boolean")
    else:  # a run without a conformal calibration: the columns stay, empty
        data["prediction_set"] = pd.Series(pd.array([pd.NA] * total, dtype="string"))
        data["set_size"] = pd.Series(pd.array([pd.NA] * total, dtype="Int64"))
        data["abstain"] = pd.Series(pd.array([pd.NA] * total, dtype="boolean"))
    error = pd.Series(pd.array([pd.NA] * total, dtype="string"))
    for i, reason in (errors or {}).items():
        error.iloc[i] = reason
    data["error"] = error
    return pd.DataFrame(data, columns=columns(c))


def write_table(table: pd.DataFrame, path: str | Path) -> None:
    """Write ``table`` atomically: Parquet (pyarrow) for a ``.parquet`` path, else CSV
    (UTF-8, a header row, no index; empty cells for NA).

    Raises:
      OSError: the file cannot be written (the caller maps a full disk or a read-only
        directory to its one-line error).
    """
    path = Path(path)
    buffer = io.BytesIO()
    if path.suffix.lower() == ".parquet":
        table.to_parquet(buffer, index=False)
    else:
        buffer.write(table.to_csv(index=False).encode())
    atomic_write_bytes(path, buffer.getvalue())


def read_table(path: str | Path) -> pd.DataFrame:
    """A table :func:`write_table` wrote (CSV or Parquet by its suffix)."""
    path = Path(path)
    if path.suffix.lower() == ".parquet":
        return pd.read_parquet(path)
    return pd.read_csv(path, keep_default_na=False, na_values=[""], dtype={"input": str})


def summarize(table: pd.DataFrame) -> dict:
    """What the predictions add up to: ``images`` (rows), ``predicted``, ``skipped`` (rows
    with an ``error``), ``counts`` (predicted class name -> images, most frequent first),
    ``abstention_rate`` and ``mean_set_size`` (None without a conformal calibration), and
    ``mean_predictive_entropy`` (nats; None when nothing was predicted)."""
    predicted = table[table["error"].isna()]
    counts = predicted["predicted_name"].value_counts(sort=True)
    abstain = predicted["abstain"].dropna()
    sizes = predicted["set_size"].dropna()
    entropy = predicted["predictive_entropy"].dropna()
    return {
        "images": len(table),
        "predicted": len(predicted),
        "skipped": len(table) - len(predicted),
        "counts": {str(name): int(count) for name, count in counts.items()},
        "abstention_rate": float(abstain.astype(bool).mean()) if len(abstain) else None,
        "mean_set_size": float(sizes.astype(float).mean()) if len(sizes) else None,
        "mean_predictive_entropy": float(entropy.astype(float).mean()) if len(entropy) else None,
    }


def summary_lines(summary: dict) -> list[str]:
    """The summary as a few lines of text."""
    counts = ", ".join(f"{name}: {count}" for name, count in summary["counts"].items()) or "none"
    lines = [
        f"{summary['images']} images: {summary['predicted']} predicted, {summary['skipped']} skipped",
        f"predicted classes: {counts}",
    ]
    if summary["abstention_rate"] is not None:
        lines.append(
            f"abstention rate {summary['abstention_rate']:.3f}, mean prediction set size {summary['mean_set_size']:.2f}"
        )
    else:
        lines.append("prediction sets: none (the run has no conformal calibration)")
    if summary["mean_predictive_entropy"] is not None:
        lines.append(f"mean predictive entropy {summary['mean_predictive_entropy']:.4f} nats")
    return lines


#: The columns the terminal shows.
SHOWN = ("input", "predicted_name", "probability", "predictive_entropy", "prediction_set", "abstain", "error")


def head_rows(table: pd.DataFrame, rows: int = HEAD_ROWS) -> pd.DataFrame:
    """The first ``rows`` rows, the columns :data:`SHOWN`, probabilities rounded to 4
    digits, empty cells as ``""``."""
    head = table.loc[: rows - 1, [c for c in SHOWN if c in table.columns]].copy()
    for column in ("probability", "predictive_entropy"):
        head[column] = head[column].astype("Float64").round(4)
    return head.astype(object).where(head.notna(), "")


def head_records(table: pd.DataFrame, rows: int = HEAD_ROWS) -> list[dict]:
    """:func:`head_rows` as JSON-ready records (plain Python values, ``""`` for empty)."""
    return [
        {k: (v.item() if isinstance(v, np.generic) else v) for k, v in record.items()}
        for record in head_rows(table, rows).to_dict("records")
    ]


def skipped_lines(table: pd.DataFrame) -> list[str]:
    """One line per input that was not predicted: ``skipped <input>: <error>`` (escaped)."""
    bad = table[table["error"].notna()]
    return [f"skipped {str(s)!r}: {e}" for s, e in zip(bad["input"], bad["error"], strict=True)]


def summary_markdown(summary: dict) -> str:
    """The summary as a Markdown list, for the Prefect artifact."""
    return "\n".join(f"- {line}" for line in summary_lines(summary))


def render(table: pd.DataFrame, rows: int = HEAD_ROWS) -> list[str]:
    """The terminal's lines: the first ``rows`` rows (inputs printed escaped, one line
    each), a line for the rows left out, then the summary."""
    head = head_rows(table, rows)
    head["input"] = [repr(str(s))[1:-1] for s in head["input"]]
    head["error"] = [repr(str(s))[1:-1] if s else "" for s in head["error"]]
    lines = head.to_string(index=False).splitlines()
    if len(table) > rows:
        lines.append(f"... {len(table) - rows} more rows")
    return [*lines, *summary_lines(summarize(table))]
