"""Nights of a nightly retraining replayed on a data export, as the README reports them.

    python -m benchmarks.nightly_replay [--config configs/default.yaml] [--out FILE]
    python -m benchmarks.nightly_replay --source image_folder [--config ...] [--out FILE]

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

``--source image_folder``: a user's image folder instead (``data.source=image_folder``,
``data.path`` a folder ``digits/``: the same embedded digits as grey PNG files,
``train/<digit>/<index>.png`` and 500 in ``test/<digit>/``, :mod:`tests._image_export`),
three nights:

1. 1,500 training PNGs (half of them: the first champion);
2. all 3,000 (1,500 files added to the folder: a new snapshot, trained);
3. the folder unchanged (skipped).

Per night: the fingerprint, training count and file count of the snapshot, trained or
skipped, the wall time, the test accuracy and NLL and the promotion reason. Writes
``benchmarks/results/nightly-replay-image-folder-<backend>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.provenance import stamp
from flows import environment  # noqa: F401  (applies the XLA/JAX environment on import)

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
    parser.add_argument("--config", default="configs/default.yaml")
    parser.add_argument("--out", default=None)
    parser.add_argument(
        "--source",
        choices=("idx", "image_folder"),
        default="idx",
        help="idx: MNIST IDX files in data.manual_dir (five nights); image_folder: a folder of PNGs (three nights)",
    )
    args = parser.parse_args(argv)
    if args.source == "image_folder":
        _replay_image_folder(args.config, args.out)
        return

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


#: The image folder's nights: label, training PNGs in the folder (of 3,000), test PNGs.
IMAGE_NIGHTS = (("1: 1,500 PNGs (half)", 1500), ("2: all 3,000 PNGs", 3000), ("3: unchanged, skip", 3000))
IMAGE_TEST = 500


def _replay_image_folder(config: str, out_file: str | None) -> None:
    """The three nights of ``--source image_folder`` (see the module's docstring)."""
    import jax

    from ensemble_core import runs
    from ensemble_core.config import load_config
    from tests._image_export import write_digit_folder

    work = Path(tempfile.mkdtemp(prefix="nightly-replay-images-"))
    folder, out = work / "digits", work / "runs"
    overrides = [
        "data.source=image_folder",
        f"data.path={folder}",
        "data.name=digits",  # what data.path's folder names it anyway: explicit, whatever --config names
        f"data.data_dir={work / 'tfds'}",
        "eval.evaluators=[test]",
        "nightly.when_unchanged=skip",
    ]
    rows: list[dict[str, Any]] = []
    for night, (label, n_train) in enumerate(IMAGE_NIGHTS, 1):
        start = time.perf_counter()
        files = write_digit_folder(folder, n_train, IMAGE_TEST)
        written = time.perf_counter() - start
        cfg = load_config(config, overrides)
        load = os.getloadavg()[0]  # other processes on the machine: the wall time's context
        start = time.perf_counter()
        result = runs.run(cfg, out, f"night{night}")
        seconds = time.perf_counter() - start
        row: dict[str, Any] = {
            "night": label,
            "files_in_folder": files,
            "write_seconds": round(written, 1),
            "seconds": round(seconds, 1),
            "load_average_before": round(load, 2),
            "skipped": result.skipped is not None,
        }
        if result.skipped is not None:
            # the champion's snapshot: its fingerprint is the one this night computed
            lineage = json.loads((Path(result.skipped.champion_run_dir) / "data_snapshot.json").read_text())
            assert lineage["fingerprint"] == result.skipped.fingerprint
            row.update(
                fingerprint=result.skipped.fingerprint,
                train_examples=lineage["splits"]["train"],
                test_examples=lineage["splits"]["test"],
                file_count=lineage["file_count"],
                champion_run=result.skipped.champion_run,
                reason=result.skipped.reason,
            )
        else:
            report = json.loads((result.run_dir.report_json).read_text())
            snapshot = report["data_snapshot"]
            row.update(
                fingerprint=snapshot["fingerprint"],
                kind=snapshot["kind"],
                class_names=snapshot["class_names"],
                train_examples=snapshot["splits"]["train"],
                test_examples=snapshot["splits"]["test"],
                file_count=snapshot["file_count"],
                accuracy=round(report["ensemble"]["accuracy"], 4),
                nll=round(report["ensemble"]["nll"], 4),
                promotion=report["promotion"]["reason"],
                promoted=report["promotion"]["promoted"],
                label_shift_tv=(report["drift"]["label_shift"] or {}).get("total_variation"),
            )
        rows.append(row)
        print(json.dumps(row), flush=True)
    default = ROOT / "benchmarks" / "results" / f"nightly-replay-image-folder-{jax.default_backend()}.json"
    path = Path(out_file or default)
    setup = {"config": config, "overrides": [o.replace(str(work), "<work>") for o in overrides]}
    path.write_text(json.dumps({**stamp(), **setup, "test_pngs": IMAGE_TEST, "nights": rows}, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
