"""Nights of a nightly retraining replayed on a data export, as the README reports them.

    python -m benchmarks.nightly_replay [--config configs/default.yaml] [--out FILE]

A data team's export in ``data.manual_dir`` (MNIST IDX files of the embedded dataset's real
digits), one output directory, ``nightly.when_unchanged=skip``, each night through
:func:`ensemble_core.runs.run` (the flow's sequence without Prefect):

1. 1,000 training digits (the first champion);
2. 3,000 (a new snapshot: trained, the champion re-evaluated on the new test split);
3. the same 3,000 (skipped), then the same night with ``when_unchanged=train``;
4. 3,000 digits of classes 0-4 only (label shift on purpose: the drift signal fires).

Per night: the snapshot's fingerprint and training count, trained or skipped, the wall
time, the ensemble's test accuracy and NLL, the promotion reason and the drift figures.
Writes ``benchmarks/results/nightly-replay-<backend>.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._provenance import stamp
from flows import _env  # noqa: F401  (applies the XLA/JAX environment on import)

ROOT = Path(__file__).resolve().parents[1]


def _export(directory: Path, night: int) -> None:
    import numpy as np

    from ensemble_core import data

    images, labels = data.read_mnist5k_csv()
    train_idx, test_idx = data.mnist5k_split_indices(labels)
    test = (images[test_idx[:500]], labels[test_idx[:500]])
    if night == 1:
        idx = train_idx[:1000]
    elif night in (2, 3):
        idx = train_idx[:3000]
    else:  # night 4: classes 0-4 only
        idx = train_idx[np.isin(labels[train_idx], np.arange(5))][:3000]
    data.write_idx_dataset(directory, (images[idx], labels[idx]), test)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "default.yaml"))
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    import jax

    from ensemble_core import runs
    from ensemble_core.config import load_config

    work = Path(tempfile.mkdtemp(prefix="nightly-replay-"))
    export, out = work / "export", work / "runs"
    base = [
        "data.name=mnist",
        f"data.manual_dir={export}",
        f"data.data_dir={work / 'tfds'}",
        "eval.evaluators=[test]",
        "nightly.when_unchanged=skip",
    ]
    rows: list[dict[str, Any]] = []
    for label, night, extra in (
        ("1: 1,000 digits", 1, []),
        ("2: 3,000 digits", 2, []),
        ("3: same 3,000, skip", 3, []),
        ("3: same 3,000, train", 3, ["nightly.when_unchanged=train"]),
        ("4: 3,000 of classes 0-4", 4, []),
    ):
        _export(export, night)
        cfg = load_config(args.config, base + extra)
        start = time.perf_counter()
        result = runs.run(cfg, out, f"night{len(rows) + 1}")
        seconds = time.perf_counter() - start
        row: dict[str, Any] = {"night": label, "seconds": round(seconds, 1), "skipped": result.skipped is not None}
        if result.skipped is not None:
            row["reason"] = result.skipped.reason
        else:
            report = json.loads((result.run_dir.report_json).read_text())
            row.update(
                snapshot=report["data_snapshot"]["fingerprint"],
                train_examples=report["data_snapshot"]["splits"]["train"],
                accuracy=round(report["ensemble"]["accuracy"], 4),
                nll=round(report["ensemble"]["nll"], 4),
                promotion=report["promotion"]["reason"],
                promoted=report["promotion"]["promoted"],
                drift=report["drift"],
            )
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "drift"}), flush=True)
        if row.get("drift") and row["drift"]["champion_run"]:
            d = row["drift"]
            unc = d["uncertainty"] or {}
            print(
                "  drift: TV",
                round(d["label_shift"]["total_variation"], 4) if d["label_shift"] else None,
                "entropy",
                round(unc.get("new", {}).get("mean_predictive_entropy", float("nan")), 4),
                "vs",
                round(unc.get("reference", {}).get("mean_predictive_entropy", float("nan")), 4),
                "MI",
                round(unc.get("new", {}).get("mean_mutual_information", float("nan")), 4),
                "vs",
                round(unc.get("reference", {}).get("mean_mutual_information", float("nan")), 4),
                "exceeded:",
                d["exceeded"],
                flush=True,
            )
    path = Path(args.out or ROOT / "benchmarks" / "results" / f"nightly-replay-{jax.default_backend()}.json")
    path.write_text(json.dumps({**stamp(), "config": args.config, "nights": rows}, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
