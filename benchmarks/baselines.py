"""Deep ensemble, MC dropout, BatchEnsemble and Packed-Ensembles at equal training compute.

    python -m benchmarks.baselines                                     # both datasets, every method
    python -m benchmarks.baselines --datasets mnist5k --methods deep packed --epochs 2
    python -m benchmarks.baselines --table                             # the docs' tables from --out

On each dataset (``mnist5k``: the embedded MNIST subset; ``fashion_mnist``: the first 4,000
training and 1,000 test images of Fashion-MNIST, :data:`benchmarks.hyper.DATASETS`), one
run per method through :func:`ensemble_core.runs.run` (``configs/default.yaml``: SGD 0.1,
momentum 0.9, batch 128, 10% of train held out for validation and best-epoch restore), all
with the registry's CNN and M = 4 members (``ensemble.method``, docs/evaluation.md
"Baselines in the same pipeline"):

- ``deep``: 4 CNNs (``ensemble.size=4``), K epochs each;
- ``mc_dropout``: one CNN with dropout (``model.options.dropout_rate`` :data:`DROPOUT_RATE`
  after its Dense256, the network's only dropout layer) trained 4K epochs, predicting with
  ``ensemble.mc_samples=4`` passes (4 members); its run directory is then evaluated again
  with :data:`MANY_PASSES` passes (the literature's T = 30, uncertainty-baselines'), without
  retraining (``mc_dropout_passes``);
- ``batch_ensemble``: one BatchEnsemble CNN of 4 members (``members_per_network=4``), K epochs;
- ``packed``: one Packed-Ensembles CNN of 4 members (alpha 2, gamma 1), K epochs.

**Equal training compute = equal member-epochs**: every member passes over the training
split K times (4K member-epochs). The deep ensemble's members each see their own batches;
BatchEnsemble's and Packed-Ensembles' members all see every batch of the network's K
epochs; MC dropout's one network (its passes share weights, so one network is the
"member" trained) sees the split 4K times. Beside it, what that compute costs here: each
method's training FLOPs per optimizer step and per epoch counted from its actual train
step's jaxpr (:func:`benchmarks.flops.count_flops`, matmuls and convolutions only), its
trained parameters (``jax.eval_shape`` of the network's init), and the wall time of the
optimizer steps (``report.json -> timing.training_steps_seconds``) and of the training stage.

Figures per run, from ``report.json``: the ensemble's test accuracy, NLL, Brier, ECE (and
the mean member's); the means over the common corruptions (15 corruptions x 5 severities,
50 images a cell) and over the MNIST-C corruptions (15, 200 images each); the mean over
13 rotations and 15 translations (200 images each); OOD AUROC of mutual information and of
predictive entropy against uniform noise, letters and (on mnist5k) Fashion-MNIST (200
images each); the diversity; each network's best epoch. The evaluators are
``configs/default.yaml``'s on both datasets (on Fashion-MNIST without its own OOD set).

Writes ``benchmarks/results/baselines-<backend>-<cpus>core.json`` (``--out``; a rerun with fewer
datasets or methods updates only those entries) and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.hyper import DATASETS as HYPER_DATASETS
from benchmarks.provenance import busy_seconds, stamp
from benchmarks.stage_timings import timed_stages
from flows import environment  # noqa: F401  (applies the XLA/JAX environment on import)

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("deep", "mc_dropout", "batch_ensemble", "packed")
#: members of every method's ensemble
M = 4
#: MC dropout's rate, not tuned: the default of uncertainty-baselines' CIFAR MC dropout
#: baseline (its ``dropout_rate`` flag) and the example the mc_dropout refusal's fix gives;
#: the CNN's one dropout layer (after Dense256) at a low rate keeps the network's single-pass
#: accuracy near the plain CNN's, at the price of less diverse passes.
DROPOUT_RATE = 0.1
#: the second evaluation of the MC dropout run: the literature's number of passes
MANY_PASSES = 30
#: K, epochs per member, by dataset (``--epochs`` sets one K for all)
EPOCHS = {"mnist5k": 10, "fashion_mnist": 10}
#: configs/default.yaml's evaluators; Fashion-MNIST leaves out its own OOD evaluator
EVALUATORS = {
    "mnist5k": None,
    "fashion_mnist": (
        "eval.evaluators={test: {}, rotation: {num_examples: 200}, translation: {num_examples: 200}, "
        "common_corruptions: {num_examples: 50}, ood: {source: uniform_noise}, corruptions: {num_examples: 200}, "
        "letters: {}}"
    ),
}
OOD_EVALUATORS = ("ood", "letters", "fashion_mnist")
OOD_SCORES = ("mutual_information", "entropy")


def method_overrides(method: str, epochs: int) -> list[str]:
    """The ``--set`` overrides of one method at K = ``epochs`` (module docstring)."""
    if method == "deep":
        return ["model.name=cnn", f"ensemble.size={M}", f"train.epochs={epochs}"]
    if method == "mc_dropout":
        return [
            "model.name=cnn",
            "ensemble.method=mc_dropout",
            "ensemble.size=1",
            f"model.options={{dropout_rate: {DROPOUT_RATE}}}",
            f"ensemble.mc_samples={M}",
            f"train.epochs={M * epochs}",
        ]
    common = ["model.name=cnn", f"ensemble.method={method}", "ensemble.size=1", f"ensemble.members_per_network={M}"]
    if method == "packed":
        common.append("ensemble.packed={alpha: 2.0, gamma: 1}")
    return [*common, f"train.epochs={epochs}"]


def dataset_overrides(dataset: str, data_dir: str | None) -> list[str]:
    """:data:`benchmarks.hyper.DATASETS`'s data options, with :data:`EVALUATORS`."""
    out = [o for o in HYPER_DATASETS[dataset] if not o.startswith("eval.evaluators=")]
    evaluators = EVALUATORS[dataset]
    if evaluators:
        out.append(evaluators)
    if data_dir and dataset == "mnist5k":
        out.append(f"data.data_dir={data_dir}")
    return out


def config(method: str, dataset: str, epochs: int, data_dir: str | None):
    from ensemble_core.config import load_config

    overrides = [*dataset_overrides(dataset, data_dir), "promotion.enabled=false", *method_overrides(method, epochs)]
    return load_config(ROOT / "configs" / "default.yaml", overrides)


def cost(cfg, num_classes: int, image_shape: tuple[int, ...], num_train: int) -> dict:
    """Trained parameters and training FLOPs of ``cfg``'s ensemble, without running it:
    the parameters of ``jax.eval_shape`` of every network's init, and
    :func:`benchmarks.flops.count_flops` of its train step (the pipeline's own,
    :meth:`ensemble_core.ensemble_setup.EnsembleSetup.train_step`) on abstract arguments."""
    import math

    import jax
    import jax.numpy as jnp

    from benchmarks.flops import count_flops
    from ensemble_core import ensemble_setup
    from ensemble_core.networks import build_network
    from ensemble_core.train.forward import init_variables, split_variables

    net = build_network(cfg, num_classes)
    variables = jax.eval_shape(lambda k: init_variables(net, k, image_shape), jax.random.key(0))
    params, _ = split_variables(variables)
    per_network = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(params))

    setup = ensemble_setup.build(cfg, num_classes)
    e, b = setup.plan.padded_members, cfg.train.batch_size
    state = setup.abstract_state(image_shape)
    # The step's jitted function carries XLA:CPU compiler options, which JAX refuses on a
    # jit nested in make_jaxpr's trace: count the Python function it wraps.
    by_collections: Any = setup.train_step(donate=False)
    step = by_collections.unjitted(state)
    step_flops = count_flops(
        step,
        state,
        jax.ShapeDtypeStruct((num_train, *image_shape), jnp.uint8),
        jax.ShapeDtypeStruct((num_train,), jnp.int32),
        jax.ShapeDtypeStruct((e, 2), jnp.uint32),
        jax.ShapeDtypeStruct((e, b), jnp.int32),
        jax.ShapeDtypeStruct((e,), jnp.float32),
    )
    steps_per_epoch = num_train // b
    return {
        "networks": cfg.ensemble.size,
        "params_per_network": per_network,
        "params": per_network * cfg.ensemble.size,
        "train_flops_per_step": step_flops,
        "steps_per_epoch": steps_per_epoch,
        "epochs": cfg.train.epochs,
        "train_flops_total": step_flops * steps_per_epoch * cfg.train.epochs,
    }


def _mean(res: dict, name: str, part: str = "ensemble") -> dict | None:
    if name not in res or res[name].metrics.get("skipped"):
        return None
    return res[name].metrics["mean"][part]


def _ood(res: dict) -> dict:
    out: dict[str, Any] = {}
    for name in OOD_EVALUATORS:
        if name in res and not res[name].metrics.get("skipped"):
            auroc = res[name].metrics["ensemble"]["auroc"]
            out[name] = {score: auroc.get(score) for score in OOD_SCORES}
    return out


def evaluation_figures(evaluation) -> dict:
    """The figures of one evaluation (:class:`ensemble_core.runs.results.Evaluation`)."""
    res = evaluation.results
    return {
        "test": {k: evaluation.ensemble[k] for k in ("accuracy", "nll", "brier", "ece")},
        "rotation_mean": _mean(res, "rotation"),
        "translation_mean": _mean(res, "translation"),
        "common_corruptions_mean": _mean(res, "common_corruptions"),
        "corruptions_mean": _mean(res, "corruptions"),
        "ood_auroc": _ood(res),
    }


def mc_passes(cfg, run_dir: Path, passes: int) -> dict:
    """The MC dropout run evaluated again with ``passes`` passes per network (every
    evaluator, nothing written): its figures and the evaluation's seconds."""
    from ensemble_core import runs
    from ensemble_core.runs.evaluation.evaluate import evaluate

    raw = cfg.model_dump(mode="json")
    raw["ensemble"]["mc_samples"] = passes
    many = type(cfg).model_validate(raw)
    t0 = time.perf_counter()
    evaluation = evaluate(many, runs.prepare(many.data), run_dir, write=False)
    return {"mc_samples": passes, "evaluate_seconds": time.perf_counter() - t0, **evaluation_figures(evaluation)}


def run_one(method: str, dataset: str, epochs: int, out_dir: Path, data_dir: str | None) -> dict:
    """One run: its cost, figures, wall time and time per stage."""
    from ensemble_core import runs
    from ensemble_core.runs.dataset import load

    cfg = config(method, dataset, epochs, data_dir)
    seconds: dict = {}
    busy0, t0 = busy_seconds(), time.perf_counter()
    result = runs.run(cfg, out_dir, f"{dataset}-{method}", timed_stages(seconds))
    wall = time.perf_counter() - t0
    busy1 = busy_seconds()
    report = json.loads((Path(result.run_dir.path) / "report.json").read_text())
    dataset_info = runs.prepare(cfg.data)
    num_train = len(load(cfg, dataset_info, "train")[1])  # the training split, validation held out
    timing = report["timing"]
    row = {
        "overrides": method_overrides(method, epochs),
        "members": len(report["members"]),
        "member_epochs": M * epochs,
        "train_examples": num_train,
        **cost(cfg, dataset_info.num_classes, tuple(dataset_info.image_shape), num_train),
        "wall_seconds": wall,
        "machine_cores_busy": None if busy0 is None or busy1 is None else (busy1 - busy0) / wall,
        "stage_seconds": seconds,
        "train_stage_seconds": timing["stages"]["train"]["seconds"],
        "training_steps_seconds": timing["training_steps_seconds"],
        "compile_seconds": timing["compile_seconds"],
        "train_member_images_per_s": timing["train_member_images_per_s"],
        "evaluate_seconds": timing["stages"]["evaluate"]["seconds"],
        "eval_member_images_per_s": timing["eval_member_images_per_s"],
        "best_epoch": [p["best_epoch"] for p in report["pool"]],
        "member_mean_test": {k: report["member_mean"][k] for k in ("accuracy", "nll", "brier", "ece")},
        "diversity": report["diversity"],
        **evaluation_figures(result.evaluation),
    }
    print(
        f"{dataset} {method}: {wall:.0f} s (train steps {row['training_steps_seconds']:.0f} s), "
        f"test {row['test']}, params {row['params']:,}, FLOPs/step {row['train_flops_per_step']:.3g}"
    )
    if method == "mc_dropout":
        row["mc_dropout_passes"] = mc_passes(cfg, result.run_dir.path, MANY_PASSES)
        many = row["mc_dropout_passes"]
        print(f"  T={MANY_PASSES}: {many['test']} ({many['evaluate_seconds']:.0f} s)")
    return row


def quality(out_dir: Path, data_dir: str | None, datasets, methods, epochs: dict, report: dict, out: Path) -> None:
    """Every (dataset, method) run in turn, written to ``out`` after each."""
    q = report.setdefault("quality", {})
    for dataset in datasets:
        report.setdefault("epochs", {})[dataset] = epochs[dataset]
        for method in methods:
            q.setdefault(dataset, {})[method] = run_one(method, dataset, epochs[dataset], out_dir, data_dir)
            out.write_text(json.dumps(report, indent=2))


NAMES = {
    "deep": "deep ensemble",
    "mc_dropout": f"MC dropout ({M} passes)",
    "batch_ensemble": "BatchEnsemble",
    "packed": "Packed-Ensembles (alpha 2, gamma 1)",
}


def table(report: dict) -> str:
    """A markdown table per dataset from a results file's ``quality``."""

    def f(x, digits=4):
        return "-" if x is None else f"{x:.{digits}f}"

    out = []
    for dataset, rows in (report.get("quality") or {}).items():
        lines = [
            f"{dataset} (K = {report['epochs'][dataset]})",
            "| method | members | params | train steps s | accuracy | NLL | ECE | common corr. NLL | MNIST-C NLL "
            "| OOD AUROC MI noise / letters / fashion |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for method in METHODS:
            if method not in rows:
                continue
            variants = [(NAMES[method], rows[method])]
            if "mc_dropout_passes" in rows[method]:
                variants.append(
                    (f"MC dropout ({MANY_PASSES} passes)", {**rows[method], **rows[method]["mc_dropout_passes"]})
                )
            for name, r in variants:
                ood = r["ood_auroc"]
                mi = " / ".join(f(ood[n]["mutual_information"], 3) if n in ood else "-" for n in OOD_EVALUATORS)
                cc, mc = r["common_corruptions_mean"], r["corruptions_mean"]
                lines.append(
                    f"| {name} | {r.get('mc_samples', r['members'])} | {r['params']:,} | "
                    f"{r['training_steps_seconds']:.0f} | "
                    f"{f(r['test']['accuracy'], 3)} | {f(r['test']['nll'])} | {f(r['test']['ece'])} | "
                    f"{f(cc and cc['nll'], 3)} | {f(mc and mc['nll'], 3)} | {mi} |"
                )
        out.append("\n".join(lines))
    return "\n\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--datasets", nargs="+", choices=sorted(EPOCHS), default=list(EPOCHS))
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--epochs", type=int, default=None, help="K for every dataset (default: EPOCHS)")
    parser.add_argument("--keep", type=Path, default=None, help="keep the run directories here (a new directory)")
    parser.add_argument("--table", action="store_true", help="print the tables from --out and stop")
    args = parser.parse_args()
    import jax

    default_out = ROOT / "benchmarks" / "results" / f"baselines-{jax.default_backend()}-{os.cpu_count()}core.json"
    if args.table:
        print(table(json.loads((args.out or default_out).read_text())))
        return
    out = args.out or default_out
    epochs = {d: args.epochs or k for d, k in EPOCHS.items()}
    report: dict = json.loads(out.read_text()) if out.exists() else {}
    now = stamp()
    report.update(
        date=now["date"],
        machine={**now["machine"], "backend": jax.default_backend(), "devices": jax.device_count()},
        commit=now["commit"],
        cpus=os.cpu_count(),
        command=" ".join(["python -m benchmarks.baselines", *sys.argv[1:]]),
        members=M,
        dropout_rate=DROPOUT_RATE,
        equal_compute=(
            f"equal member-epochs: each of the {M} members passes over the training split K times "
            f"(deep: {M} networks x K epochs; batch_ensemble, packed: 1 network of {M} members x K epochs, every "
            f"member on every batch; mc_dropout: 1 network x {M}K epochs)"
        ),
    )
    report["quality"] = {k: v for k, v in (report.get("quality") or {}).items() if k in EPOCHS}
    t0 = time.perf_counter()
    if args.keep:
        quality(args.keep, args.data_dir, args.datasets, args.methods, epochs, report, out)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            quality(Path(tmp), args.data_dir, args.datasets, args.methods, epochs, report, out)
    report["total_wall_seconds"] = time.perf_counter() - t0
    out.write_text(json.dumps(report, indent=2))
    print(table(report))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
