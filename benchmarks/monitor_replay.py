"""Nights replayed through the monitor flow itself: false alarms, detections, estimated accuracy.

    python -m benchmarks.monitor_replay --run-dir RUN [--backfill] [--night-size 500]
                                        [--clean-nights 8] [--corruptions gaussian_noise contrast fog]

Each night is ``--night-size`` unlabelled test images of the run's dataset (drawn without
replacement, seeded: consecutive slices of a permutation of the test split, a new
permutation when one is used up), saved as a ``.npy`` and scored by
:func:`flows.monitor.monitor`, the Prefect flow (in this process, against a temporary
Prefect server of its own, with its own ``PREFECT_HOME``, as the command line runs it), into
a fresh output directory:

- ``--clean-nights`` clean nights (the test split as it is: never trained on);
- then for each of ``--corruptions`` (:data:`ensemble_core.shifts.common_corruptions.NAMES`,
  corrupted by the ``common_corruptions`` evaluator's
  :func:`ensemble_core.evaluators.common_corruptions.corrupt_in_blocks`), one night per
  severity 1..5, rising.

Per night: the ensemble's true accuracy (the night's labels against the ``predicted_class``
of the flow's ``<night>.npz``), the headline estimate and every estimator's, each drift
test's Holm-adjusted p-value, the verdict, the abstention rate and mean prediction-set size,
and the flow's wall time. After the nights, the ``data.drift`` events of the monitor
(resource label ``ensemble-pipeline.source: monitor``) are read back from the server: the
retrainings the ``retrain-on-drift`` automation would start; their count must equal the
drifted nights'.

``--backfill``: a run evaluated before the select stage wrote ``accuracy_reference.json``
gets it as :func:`ensemble_core.runs.ensemble.select.fit_decisions` writes it
(:func:`ensemble_core.accuracy_estimation.fit_reference` on the chosen members'
probabilities on the calibration split, the temperature of ``selection.json``), only when
it is missing, after checking that the calibration split predicted here is the one of the
run's ``drift_reference.json`` (same size, same predicted-class counts of the ensemble).

Writes ``benchmarks/results/monitor-replay-fashion-mnist-cpu-2core.json`` (``--out``) and the
flow's ``history.png`` beside it (same name, ``.png``), and prints one line per night.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.provenance import ROOT, stamp

OUT = ROOT / "benchmarks" / "results" / "monitor-replay-fashion-mnist-cpu-2core.json"
CORRUPTIONS = ("gaussian_noise", "contrast", "fog")
SEVERITIES = (1, 2, 3, 4, 5)
DRIFT_EVENT, SOURCE_LABEL, SOURCE = "data.drift", "ensemble-pipeline.source", "monitor"
#: The drift tests' names in the per-night table.
SHORT = {"predictive_entropy": "H", "mutual_information": "MI", "predicted_class": "cls"}


class ReplayError(RuntimeError):
    """The replay cannot go on: a backfill check failed, a night's flow run did not complete."""


def run_dataset(run_dir: Path) -> tuple[Any, Any]:
    """The run's config (from its checkpoint) and its dataset (prepared, or found)."""
    from ensemble_core.config import PipelineConfig
    from ensemble_core.runs.dataset import prepare
    from ensemble_core.runs.prediction.files import run_meta

    cfg = PipelineConfig.model_validate(run_meta(run_dir)["config"])
    return cfg, prepare(cfg.data)


def backfill(run_dir: Path, cfg: Any, dataset: Any) -> dict[str, Any]:
    """Write the run's missing ``accuracy_reference.json`` as the select stage does (see the
    module docstring); returns what was done and checked.

    Raises:
      ReplayError: the run does not calibrate on its calibration split, has no drift
        reference, or the split predicted here is not the drift reference's (size,
        predicted-class counts, member count).
    """
    from ensemble_core.accuracy_estimation import fit_reference
    from ensemble_core.runs.dataset import load
    from ensemble_core.runs.prediction.predict import predict_images
    from ensemble_core.runs.storage.layout import RunDir
    from ensemble_core.runs.storage.records import write_accuracy_reference

    run = RunDir(run_dir)
    if run.accuracy_reference_json.exists():
        return {"written": False, "why": f"{run.accuracy_reference_json} exists"}
    if cfg.decision_split != "calibration":
        raise ReplayError(f"the run fits its decisions on {cfg.decision_split!r}, not the calibration split")
    if not run.drift_reference_json.exists():
        raise ReplayError(f"{run.drift_reference_json} is missing: nothing to check the calibration split against")
    drift_ref = json.loads(run.drift_reference_json.read_text())
    temperature = json.loads(run.selection_json.read_text()).get("temperature")
    started = time.perf_counter()
    images, labels = load(cfg, dataset, "calibration")
    n_ref = len(drift_ref["entropy"])
    if len(labels) != n_ref:
        raise ReplayError(f"the calibration split loaded has {len(labels)} images, the drift reference {n_ref}")
    result = predict_images(run_dir, images)
    member_probs = np.asarray(result["member_probs"])
    counts = np.bincount(np.asarray(result["predicted_class"], np.int64), minlength=member_probs.shape[2]).tolist()
    if counts != list(drift_ref["class_counts"]):
        raise ReplayError(
            f"the ensemble's predicted-class counts on the calibration split {counts} are not the drift "
            f"reference's {drift_ref['class_counts']}: another split or another ensemble"
        )
    if member_probs.shape[0] != drift_ref["members"]:
        raise ReplayError(f"{member_probs.shape[0]} members predicted, the drift reference has {drift_ref['members']}")
    t_pred = float(result["temperature"])
    if (temperature is None) != np.isnan(t_pred) or (temperature is not None and not np.isclose(t_pred, temperature)):
        raise ReplayError(f"selection.json's temperature {temperature} is not the loaded ensemble's {t_pred}")
    reference = fit_reference(member_probs, labels, temperature)
    write_accuracy_reference(run, reference.to_dict())
    entropy = np.asarray(result["predictive_entropy"], np.float64)
    return {
        "written": True,
        "path": str(run.accuracy_reference_json),
        "calibration_examples": len(labels),
        "members": int(member_probs.shape[0]),
        "temperature": temperature,
        "predicted_class_counts": counts,
        "class_counts_match_drift_reference": True,
        "max_abs_entropy_difference_vs_drift_reference": float(
            np.max(np.abs(entropy - np.asarray(drift_ref["entropy"], np.float64)))
        ),
        "calibration_accuracy": float(np.mean(np.asarray(result["predicted_class"]) == labels)),
        "seconds": time.perf_counter() - started,
    }


def night_plan(
    n_test: int, night_size: int, clean: int, corruptions: list[str], severities: list[int], seed: int
) -> list[dict[str, Any]]:
    """The nights in order: ``name``, ``kind`` (``clean`` or the corruption), ``severity``
    (0 for clean) and ``indices`` into the test split (see the module docstring)."""
    if not 0 < night_size <= n_test:
        raise ReplayError(f"--night-size {night_size} is not in 1..{n_test} (the test split)")
    kinds = [("clean", 0)] * clean + [(c, s) for c in corruptions for s in severities]
    rng = np.random.default_rng(seed)
    pool = np.empty(0, np.int64)
    nights = []
    for i, (kind, severity) in enumerate(kinds, start=1):
        if len(pool) < night_size:  # a fresh permutation: no image twice within a night
            pool = rng.permutation(n_test)
        indices, pool = pool[:night_size], pool[night_size:]
        name = f"n{i:02d}-clean" if kind == "clean" else f"n{i:02d}-{kind}-s{severity}"
        nights.append({"name": name, "kind": kind, "severity": severity, "indices": indices})
    return nights


def drift_events(output_dir: Path, since: datetime, expected: int, wait_s: float = 90.0) -> list[dict[str, Any]]:
    """The monitor's ``data.drift`` events of this replay (resource label
    ``ensemble-pipeline.source: monitor``, payload ``output_dir``: this replay's), read from
    the server once the events worker has sent what it held; persisted asynchronously, so
    read until ``expected`` are there (twice in a row) or ``wait_s`` passed."""
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventOccurredFilter

    from flows.prefect_services import DRAIN_TIMEOUT_S, drain_services

    pending = drain_services(DRAIN_TIMEOUT_S)
    if pending:
        print(f"warning: {pending} events or logs were still not sent to the server", file=sys.stderr)
    deadline = time.monotonic() + wait_s
    seen: list[dict[str, Any]] = []
    stable = 0
    with get_client(sync_client=True) as client:
        while True:
            page = client.read_events(
                EventFilter(
                    occurred=EventOccurredFilter(since=since, until=datetime.now(UTC) + timedelta(minutes=5)),
                    event=EventNameFilter(name=[DRIFT_EVENT]),
                ),
                limit=50,  # the server's most per page
            )
            found = list(page.events)
            while page.next_page is not None:
                page = client.read_events_page(str(page.next_page))
                found += page.events
            mine = [
                {"night": e.payload.get("night"), "occurred": e.occurred.isoformat(), "id": str(e.id)}
                for e in found
                if e.resource.get(SOURCE_LABEL) == SOURCE and e.payload.get("output_dir") == str(output_dir.absolute())
            ]
            stable = stable + 1 if len(mine) == len(seen) and len(mine) >= expected else 0
            seen = mine
            if stable >= 2 or time.monotonic() > deadline:
                return sorted(seen, key=lambda e: e["occurred"])
            time.sleep(2)


def replay_nights(
    run_dir: Path, work: Path, nights: list[dict[str, Any]], images: np.ndarray, labels: np.ndarray, args: Any
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str | None]:
    """Every night through the monitor flow (see the module docstring); returns the nights'
    rows, the ``data.drift`` events read back and the API URL of the temporary server
    (None: a configured server was used)."""
    from ensemble_core.evaluators.common_corruptions import corrupt_in_blocks
    from flows import ephemeral
    from flows.monitor import monitor

    output_dir = work / "output"
    drops = work / "drops"
    drops.mkdir(parents=True)
    rows: list[dict[str, Any]] = []
    since = datetime.now(UTC) - timedelta(minutes=1)
    with ephemeral.temporary_server() as url:
        for i, night in enumerate(nights):
            drop = images[night["indices"]]
            if night["kind"] != "clean":
                drop = corrupt_in_blocks(drop, night["kind"], night["severity"], args.seed + i)
            path = drops / f"{night['name']}.npy"
            np.save(path, drop)
            started = time.perf_counter()
            state = monitor(
                images=str(path),
                output_dir=str(output_dir),
                run_dir=str(run_dir),
                alpha=args.alpha,
                night=night["name"],
                return_state=True,
            )
            seconds = time.perf_counter() - started
            if not state.is_completed():
                raise ReplayError(f"night {night['name']}: the flow run ended {state.name}: {state.message}")
            record = json.loads(Path(str(state.result())).read_text())
            with np.load(record["predictions"]) as f:
                predicted = np.asarray(f["predicted_class"])
            truth = labels[night["indices"]]
            drift = record.get("drift") or {}
            acc = record["accuracy"]
            row = {
                "night": night["name"],
                "kind": night["kind"],
                "severity": night["severity"],
                "true_accuracy": float(np.mean(predicted == truth)),
                "estimator": acc["estimator"],
                "estimate": acc["estimate"],
                "estimates": acc["estimates"],
                "p_adjusted": {name: t["p_adjusted"] for name, t in (drift.get("tests") or {}).items()},
                "p_value": {name: t["p_value"] for name, t in (drift.get("tests") or {}).items()},
                "drifted": record["drifted"],
                "abstention_rate": record["abstention_rate"],
                "mean_set_size": record["mean_set_size"],
                "empty_set_rate": record["empty_set_rate"],
                "not_computed": record.get("not_computed", []),
                "seconds": seconds,
            }
            rows.append(row)
            print(line(row), flush=True)
        events = drift_events(output_dir, since, sum(r["drifted"] for r in rows))
    return rows, events, url


def line(row: dict[str, Any]) -> str:
    """One night as a table line."""
    ps = " ".join(f"{SHORT.get(k, k)}={v:<8.2g}" for k, v in row["p_adjusted"].items())
    abst = "   -  " if row["abstention_rate"] is None else f"{row['abstention_rate']:6.1%}"
    sets = "  -  " if row["mean_set_size"] is None else f"{row['mean_set_size']:5.2f}"
    return (
        f"{row['night']:<22} true {row['true_accuracy']:6.1%}  est {row['estimate']:6.1%} "
        f"({row['estimator'][:12]})  {'DRIFT' if row['drifted'] else 'ok   '}  {ps}  abst {abst}  set {sets}  "
        f"{row['seconds']:5.1f}s"
    )


def summarize(rows: list[dict[str, Any]], events: list[dict[str, Any]]) -> dict[str, Any]:
    """The replay's figures (see :func:`main`'s result file)."""
    clean = [r for r in rows if r["kind"] == "clean"]
    shifted = [r for r in rows if r["kind"] != "clean"]

    def mae(group: list[dict[str, Any]], name: str | None = None) -> float | None:
        errs = [abs((r["estimate"] if name is None else r["estimates"][name]) - r["true_accuracy"]) for r in group]
        return float(np.mean(errs)) if errs else None

    estimators = sorted({name for r in rows for name in r["estimates"]})

    def worst_for(name: str) -> str:
        return str(max(rows, key=lambda r: abs(r["estimates"][name] - r["true_accuracy"]))["night"])

    worst = max(rows, key=lambda r: abs(r["estimate"] - r["true_accuracy"]))
    flagged = sum(r["drifted"] for r in clean)
    return {
        "clean_nights": len(clean),
        "clean_flagged": flagged,
        "clean_flagged_rate": flagged / len(clean) if clean else None,
        "shifted_flagged_by_severity": {
            str(s): float(np.mean([r["drifted"] for r in shifted if r["severity"] == s]))
            for s in sorted({r["severity"] for r in shifted})
        },
        "shifted_flagged_by_corruption": {
            c: float(np.mean([r["drifted"] for r in shifted if r["kind"] == c]))
            for c in dict.fromkeys(r["kind"] for r in shifted)
        },
        "shifted_flagged_rate": float(np.mean([r["drifted"] for r in shifted])) if shifted else None,
        "headline_estimators": sorted({r["estimator"] for r in rows}),
        "headline_mae": {"clean": mae(clean), "shifted": mae(shifted), "all": mae(rows)},
        "headline_worst_night": {
            "night": worst["night"],
            "true_accuracy": worst["true_accuracy"],
            "estimate": worst["estimate"],
            "absolute_error": abs(worst["estimate"] - worst["true_accuracy"]),
        },
        "mae_per_estimator": {
            name: {
                "clean": mae(clean, name),
                "shifted": mae(shifted, name),
                "all": mae(rows, name),
                "worst_night": worst_for(name),
            }
            for name in estimators
            if all(name in r["estimates"] for r in rows)
        },
        "drifted_nights": sum(r["drifted"] for r in rows),
        "data_drift_events": len(events),
        "seconds_per_night": statistics.median(r["seconds"] for r in rows),
        "seconds_first_night": rows[0]["seconds"],
        "checks": {"data_drift_events_equal_drifted_nights": len(events) == sum(r["drifted"] for r in rows)},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.monitor_replay", description=__doc__.split("\n")[0])
    parser.add_argument("--run-dir", type=Path, required=True, help="a trained run (its checkpoint, drift reference)")
    parser.add_argument("--backfill", action="store_true", help="write accuracy_reference.json when it is missing")
    parser.add_argument("--night-size", type=int, default=500, help="images per night")
    parser.add_argument("--clean-nights", type=int, default=8)
    parser.add_argument("--corruptions", nargs="+", default=list(CORRUPTIONS), help="one night per severity each")
    parser.add_argument("--severities", nargs="+", type=int, default=list(SEVERITIES))
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep the work directory (drops, monitoring/)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    run_dir = args.run_dir.absolute()
    work = Path(tempfile.mkdtemp(prefix="monitor-replay-"))
    # A Prefect home of its own (set before Prefect is imported): the temporary server's
    # database holds this replay's flow runs and events only.
    os.environ["PREFECT_HOME"] = str(work / "prefect-home")

    from flows import environment  # noqa: F401, I001  (before anything that imports JAX)
    from ensemble_core.runs.dataset import load
    from ensemble_core.shifts.common_corruptions import NAMES

    unknown = [c for c in args.corruptions if c not in NAMES]
    if unknown:
        parser.error(f"unknown corruptions {unknown}; choose among {', '.join(NAMES)}")
    try:
        cfg, dataset = run_dataset(run_dir)
        filled = backfill(run_dir, cfg, dataset) if args.backfill else {"written": False, "why": "no --backfill"}
        print(f"backfill: {json.dumps(filled)}", flush=True)
        images, labels = load(cfg, dataset, "test")
        nights = night_plan(
            len(labels), args.night_size, args.clean_nights, args.corruptions, args.severities, args.seed
        )
        started = time.perf_counter()
        rows, events, url = replay_nights(run_dir, work, nights, images, labels, args)
        total = time.perf_counter() - started
        plot = work / "output" / "monitoring" / "history.png"
        png = args.out.with_suffix(".png")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(plot, png)
        history = (work / "output" / "monitoring" / "history.jsonl").read_text().splitlines()
        summary = summarize(rows, events)
        summary["checks"]["history_rows_equal_nights"] = len(history) == len(rows)
        result = {
            "run_dir": str(run_dir),
            "dataset": cfg.data.name,
            "alpha": args.alpha,
            "night_size": args.night_size,
            "seed": args.seed,
            "corruptions": args.corruptions,
            "severities": args.severities,
            "prefect_server": "temporary (own PREFECT_HOME)" if url else "configured (PREFECT_API_URL)",
            "backfill": filled,
            "summary": summary,
            "nights": rows,
            "data_drift_events": events,
            "history_plot": str(png.relative_to(ROOT) if png.is_relative_to(ROOT) else png),
            "history_plot_written_by_flow": str(plot),
            "seconds_total": total,
            **stamp(),
        }
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print()
    for row in rows:
        print(line(row))
    s = summary
    print(f"clean nights flagged: {s['clean_flagged']}/{s['clean_nights']} (alpha {args.alpha})")
    print(
        "shifted nights flagged by severity: "
        + ", ".join(f"{k}: {v:.0%}" for k, v in s["shifted_flagged_by_severity"].items())
    )
    head, worst = s["headline_mae"], s["headline_worst_night"]
    print(
        f"headline MAE ({', '.join(s['headline_estimators'])}): clean {head['clean']:.3f}, "
        f"shifted {head['shifted']:.3f}; worst {worst['night']} ({worst['absolute_error']:.3f})"
    )
    for name, m in s["mae_per_estimator"].items():
        print(f"  MAE {name:<24} clean {m['clean']:.3f}  shifted {m['shifted']:.3f}")
    print(
        f"data.drift events (source monitor): {s['data_drift_events']} for {s['drifted_nights']} drifted nights; "
        f"median {s['seconds_per_night']:.1f} s per night"
    )
    print(args.out)
    return 0 if all(s["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
