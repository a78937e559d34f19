"""Hyper-deep ensembles against the deep ensemble and the hyper ensemble, at equal final size.

    python -m benchmarks.hyper                                  # every dataset and method, then the cost pair
    python -m benchmarks.hyper --datasets mnist5k --methods deep hyper_deep
    python -m benchmarks.hyper --skip-runs                      # the cost pair only

1. **Quality and cost.** On each dataset (``mnist5k``: the embedded MNIST subset;
   ``fashion_mnist``: the same protocol on the first 4,000 training and 1,000 test images
   of Fashion-MNIST), three runs through :func:`ensemble_core.runs.run`, each with
   ``configs/default.yaml``'s evaluators (on Fashion-MNIST its own OOD evaluator is left out):

   - ``deep``: the deep ensemble of ``configs/default.yaml`` (8 CNNs, one setting);
   - ``hyper``: the hyper ensemble (``configs/hyper.yaml`` without stratification, greedy
     selection with replacement: a random search of 32, 8 picks);
   - ``hyper_deep``: ``configs/hyper.yaml`` as shipped (Wenzel et al. 2020, Algorithm 2).

   Each gives test accuracy, NLL, ECE, the mean NLL over the 13 rotated test sets, the OOD
   AUROC of mutual information on letters and Fashion-MNIST, the number of distinct
   networks in the ensemble, its wall time and the time of every stage.
2. **Selection variants** (Caruana et al. 2004) on the pools of the ``hyper`` and
   ``hyper_deep`` runs: greedy with replacement, without replacement, sorted
   initialisation, bagged (with and without replacement); each variant's validation NLL,
   distinct networks, and test NLL and accuracy (every pool member predicts the test split).
3. **Cost of per-member hyperparameters.** 32 members with ``configs/hyper.yaml``'s search
   space against 32 members with one setting, same step, same process, alternated
   (A B A B): steady-state member-images/s of one epoch.

Writes ``benchmarks/results/hyper-<backend>.json`` (``--out``; a rerun with fewer
datasets or methods updates only those entries) and prints a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from benchmarks.provenance import stamp
from benchmarks.stage_timings import timed_stages
from flows import environment  # noqa: F401  (applies the XLA/JAX environment on import)

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("deep", "hyper", "hyper_deep")
DATASETS = {
    "mnist5k": [],
    "fashion_mnist": [
        "data.name=fashion_mnist",
        "data.max_train_examples=4000",
        "data.max_test_examples=1000",
        "eval.evaluators=[test,rotation,translation,corruptions,letters]",
    ],
}
# The hyper ensemble as configs/hyper.yaml was before stratification.
HYPER = [
    "ensemble.size=32",
    "ensemble.stratify=null",
    "ensemble.selection={replacement: true, sorted_init: 0, bags: 0}",
]
K = 8
VARIANTS = {
    "greedy with replacement": {"replacement": True, "sorted_init": 0, "bags": 0},
    "greedy without replacement": {"replacement": False, "sorted_init": 0, "bags": 0},
    "sorted init 4, with replacement": {"replacement": True, "sorted_init": 4, "bags": 0},
    "bagged x20, with replacement": {"replacement": True, "sorted_init": 0, "bags": 20},
    "bagged x20, without replacement": {"replacement": False, "sorted_init": 0, "bags": 20},
}


def _config(method: str, dataset: str, data_dir: str | None):
    from ensemble_core.config import load_config

    path = ROOT / "configs" / ("default.yaml" if method == "deep" else "hyper.yaml")
    overrides = [*DATASETS[dataset], "promotion.enabled=false", *(HYPER if method == "hyper" else [])]
    if data_dir and dataset == "mnist5k":
        overrides.append(f"data.data_dir={data_dir}")
    return load_config(path, overrides)


def figures(result) -> dict:
    """The table's figures of one run (``nan`` where an evaluator was not run)."""
    ev = result.evaluation
    ens = ev.ensemble
    res = ev.results

    def ood(name):
        if name not in res or res[name].metrics.get("skipped"):
            return None
        return res[name].metrics["ensemble"]["auroc"]["mutual_information"]

    selection = result.selection or {}  # the select stage's record (RunResult.selection)
    members = selection.get("members") or list(range(len(ev.test["members"])))
    out = {
        "test": {k: ens[k] for k in ("accuracy", "nll", "brier", "ece")},
        "rotation_mean_nll": res["rotation"].metrics["mean"]["ensemble"]["nll"],
        "ood_auroc_mutual_information": {"letters": ood("letters"), "fashion_mnist": ood("fashion_mnist")},
        "distinct_networks": len(set(members)),
        "members": members,
        "selection": selection,
    }
    if result.stratification is not None:
        out["stratification"] = {
            "settings": result.stratification.settings,
            "inits": result.stratification.inits,
            "first_selection": result.stratification.first_selection,
        }
    test = ev.test
    if "ensemble_temperature_scaled" in test:
        out["test_temperature_scaled"] = test["ensemble_temperature_scaled"]
    return out


def selection_variants(cfg, run_dir: Path, search_pool: bool = False) -> dict:
    """Every variant of :data:`VARIANTS` on the run's final pool (the search pool of a
    hyper ensemble, the stratified pool of a hyper-deep one) or, with ``search_pool``, on a
    hyper-deep ensemble's search pool (its first selection), picking K."""
    import numpy as np

    from ensemble_core import metrics, runs
    from ensemble_core.runs.dataset import load
    from ensemble_core.runs.ensemble.load import all_members, restore
    from ensemble_core.runs.ensemble.pool import final_pool
    from ensemble_core.selection import select_members

    dataset = runs.prepare(cfg.data)
    run = runs.RunDir(run_dir)
    pool_cfg, pool_run, _ = (cfg, run, None) if search_pool else final_pool(cfg, run)
    arrays = run.stratified.path / "search_validation.npz" if search_pool else run.evaluator_arrays("validation")
    with np.load(arrays) as f:
        val, val_labels, healthy = f["member_probs"], f["labels"], f["healthy"]
    state, built = restore(pool_cfg, pool_run.path, dataset.num_classes, dataset.image_shape)
    images, labels = load(cfg, dataset, "test")
    test, _ = all_members(pool_cfg, state, built).predict(pool_cfg, images)
    out = {}
    for name, spec in VARIANTS.items():
        raw = pool_cfg.model_dump(mode="json")
        raw["ensemble"].update(selection=spec, select_size=K)
        sel_cfg = type(pool_cfg).model_validate(raw, context={"stratified_pool": True})
        picked = select_members(sel_cfg, val, val_labels, healthy)
        p = metrics.ensemble_probs(test[picked.members])
        out[name] = {
            "validation_nll": picked.validation_nll[-1],
            "distinct_networks": picked.distinct,
            "test_nll": metrics.nll(p, labels),
            "test_accuracy": float(np.mean(np.argmax(p, -1) == labels)),
        }
        print(f"  {name}: {out[name]}")
    return {"pool_size": int(val.shape[0]), "variants": out}


def run_one(method: str, dataset: str, out_dir: Path, data_dir: str | None) -> dict:
    """One run: its figures, wall time, time per stage and (pools) the selection variants."""
    from ensemble_core import runs

    cfg = _config(method, dataset, data_dir)
    seconds: dict = {}
    t0 = time.perf_counter()
    result = runs.run(cfg, out_dir, f"{dataset}-{method}", timed_stages(seconds))
    wall = time.perf_counter() - t0
    row = {
        "members_trained": cfg.ensemble.size
        + (0 if result.stratification is None else len(result.stratification.training.members)),
        "wall_seconds": wall,
        "stage_seconds": seconds,
        **figures(result),
    }
    print(f"{dataset} {method}: {wall:.0f} s {seconds}, test {row['test']}, rotation {row['rotation_mean_nll']}")
    if method != "deep":
        row["selection_variants"] = selection_variants(cfg, result.run_dir.path)
    if method == "hyper_deep":
        row["selection_variants_search_pool"] = selection_variants(cfg, result.run_dir.path, search_pool=True)
    return row


def quality(out_dir: Path, data_dir: str | None, datasets, methods, report: dict, out: Path) -> None:
    """Every (dataset, method) run in turn, written to ``out`` after each."""
    q = report.setdefault("quality", {})
    for dataset in datasets:
        for method in methods:
            q.setdefault(dataset, {})[method] = run_one(method, dataset, out_dir, data_dir)
            rows = q[dataset]
            if "deep" in rows and "hyper_deep" in rows:
                rows["hyper_deep_wall_over_deep"] = rows["hyper_deep"]["wall_seconds"] / rows["deep"]["wall_seconds"]
            out.write_text(json.dumps(report, indent=2))


def throughput(data_dir: str | None, rounds: int = 2) -> dict:
    """Member-images/s of one epoch of 32 members: searched hyperparameters vs one setting."""
    import jax

    from ensemble_core import data as data_lib
    from ensemble_core import ensemble_setup as setup
    from ensemble_core.config import load_config
    from ensemble_core.mesh import replicated
    from ensemble_core.train import fit

    tfds_dir = data_lib.prepare(data_lib.EMBEDDED, data_dir).tfds_data_dir
    images, labels = data_lib.load_split(data_lib.EMBEDDED, "train", tfds_dir)
    no_validation = [
        "train.patience=null",
        "ensemble.select_size=null",
        "ensemble.stratify=null",
        "eval.temperature_scaling=false",
        "data.validation_fraction=0",
    ]
    hyper = load_config(ROOT / "configs" / "hyper.yaml", no_validation)
    plain = load_config(None, ["ensemble.size=32", "data.validation_fraction=0"])
    built = {"search": setup.build(hyper, 10), "one_setting": setup.build(plain, 10)}
    out: dict = {name: [] for name in built}
    for _ in range(rounds):
        for name, b in built.items():
            keys = b.member_keys()
            state = b.init_state(keys["init"], images.shape[1:])
            x, y = (jax.device_put(a, replicated(b.mesh)) for a in (images, labels))
            _, timing = fit(
                state,
                b.train_step(),
                x,
                y,
                keys["data"],
                b.mesh,
                stochastic_keys=keys["stochastic"],
                epochs=1,
                batch_size=b.config.train.batch_size,
                learning_rates=b.learning_rates(len(images)),
            )
            seen = timing["steps"] * b.config.train.batch_size * b.plan.padded_members
            out[name].append(seen / timing["train_seconds"])
            print(f"{name}: {out[name][-1]:.0f} member-images/s")
    best = {name: max(v) for name, v in out.items()}
    return {
        "member_images_per_s": out,
        "best": best,
        "search_over_one_setting": best["search"] / best["one_setting"],
    }


NAMES = {
    "deep": "deep ensemble of 8 (one setting, 8 initialisations)",
    "hyper": "hyper ensemble (search of 32, greedy with replacement, 8 picks)",
    "hyper_deep": "hyper-deep ensemble (`configs/hyper.yaml`)",
}


def table(report: dict) -> str:
    """The README's table (markdown) from a results file's ``quality``."""

    def f(x, digits=4):
        return "-" if x is None else f"{x:.{digits}f}"

    lines = [
        "| dataset | ensemble of K = 8 | distinct networks | test accuracy | NLL | ECE | mean NLL, 13 rotations "
        "| OOD AUROC (MI), letters | OOD AUROC (MI), Fashion-MNIST | wall time |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for dataset, rows in (report.get("quality") or {}).items():
        for method in METHODS:
            if method not in rows:
                continue
            r = rows[method]
            ood = r["ood_auroc_mutual_information"]
            lines.append(
                f"| `{dataset}` | {NAMES[method]} | {r['distinct_networks']} | {f(r['test']['accuracy'], 3)} | "
                f"{f(r['test']['nll'])} | {f(r['test']['ece'])} | {f(r['rotation_mean_nll'], 3)} | "
                f"{f(ood['letters'], 3)} | {f(ood['fashion_mnist'], 3)} | {r['wall_seconds']:.0f} s |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--datasets", nargs="+", choices=sorted(DATASETS), default=list(DATASETS))
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--skip-runs", action="store_true")
    parser.add_argument("--keep", type=Path, default=None, help="keep the run directories here (a new directory)")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--table", action="store_true", help="print the README's table from --out and stop")
    args = parser.parse_args()
    import jax

    if args.table:
        print(table(json.loads((args.out or ROOT / "benchmarks" / "results" / "hyper-cpu.json").read_text())))
        return

    out = args.out or ROOT / "benchmarks" / "results" / f"hyper-{jax.default_backend()}.json"
    report: dict = json.loads(out.read_text()) if out.exists() else {}
    report.update(backend=jax.default_backend(), devices=jax.device_count(), cpus=os.cpu_count())
    now = stamp()  # date: of the quality runs; throughput_date: of the throughput pair
    report.update(machine={**now["machine"], "backend": jax.default_backend(), "devices": jax.device_count()})
    report["commit"] = now["commit"]
    if not args.skip_runs:
        report["date"] = now["date"]
    if not args.skip_throughput:
        report["throughput_date"] = now["date"]
    report["quality"] = {k: v for k, v in (report.get("quality") or {}).items() if k in DATASETS}
    if not args.skip_runs and args.keep:
        quality(args.keep, args.data_dir, args.datasets, args.methods, report, out)
    elif not args.skip_runs:
        with tempfile.TemporaryDirectory() as tmp:
            quality(Path(tmp), args.data_dir, args.datasets, args.methods, report, out)
    if not args.skip_throughput:
        report["throughput"] = throughput(args.data_dir)
        out.write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k != "quality"}, indent=2))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
