"""Your data: Fashion-MNIST as an image folder and as arrays, against its IDX files.

    python -m benchmarks.own_data    # --out benchmarks/results/own-data-cpu-2core.json --work-dir DIR

Fashion-MNIST's four IDX files (``/usr/share/datasets/fashion-mnist``) are exported, in
file order, as a user would export their own images:

- an image folder of grey PNGs, ``<dir>/{train,test}/<i>_<class>/<index:05d>.png``
  (:func:`export_image_folder`; class folders sort in label order);
- arrays, ``<dir>/train.npz`` and ``<dir>/test.npz`` (:func:`export_arrays`);
- 10,000 RGB JPEGs of 32x32 (the test images resized and tinted per class, quality 90) in
  one ``train`` folder (:func:`export_rgb_jpegs`; the test split is carved from it).

Then:

1. **bit for bit**: the three sources (IDX ``fashion_mnist``, the image folder, the
   arrays) are prepared as data snapshots (:func:`ensemble_core.data.prepare`) and their
   counts, class counts and decoded train/test arrays compared (``np.array_equal``); each
   is trained with the same small config through :func:`ensemble_core.runs.run` (the
   flow's sequence without Prefect) and the ``report.json`` test figures (``ensemble``,
   ``member_mean``, ``members``, ``diversity``) and the ``predictions.npz`` member
   probabilities compared for exact equality;
2. **preparation throughput**: the preparation (fingerprint + decode + snapshot write, in
   a fresh data dir, so the hash cache is cold) of the 60,000 training PNGs and of the
   10,000 JPEGs, in images/s; the decode alone
   (:func:`ensemble_core.data.image_folder.decode_images` on the files of
   :func:`~ensemble_core.data.image_folder.scan_image_folder`) with 1 and 2 workers, and
   as a plain loop of ``image_decoding.decode_file`` (no blocks, no workers); the fingerprint (scan +
   SHA-256 of every file) with a cold and a warm hash cache. Each is the fastest of
   ``--repeats`` (3) interleaved tries, with how busy the rest of the machine was.

The files were just written, so the OS page cache holds them: the timings are of a warm
page cache (decoding and hashing, not disk reads). Writes JSON (``--out``) and prints a
table; exits 1 when the three sources are not bit for bit equal.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from PIL import __version__ as pillow_version

from benchmarks.provenance import busy_seconds, stamp
from flows import environment  # noqa: F401  (applies the XLA/JAX environment on import)

#: Where Debian's dataset-fashion-mnist puts the four IDX files.
IDX_DIR = Path("/usr/share/datasets/fashion-mnist")
#: The dataset names of the exports (snapshots are kept under them).
PNG_NAME, NPZ_NAME, JPEG_NAME = "fashion_png", "fashion_npz", "fashion_rgb_jpeg"
#: One RGB tint per class for the JPEG export (label i gets TINTS[i]).
TINTS = (
    (255, 64, 64),
    (64, 255, 64),
    (64, 64, 255),
    (255, 255, 64),
    (255, 64, 255),
    (64, 255, 255),
    (255, 160, 64),
    (160, 64, 255),
    (64, 160, 255),
    (200, 200, 200),
)
#: The report.json figures compared between the sources.
FIGURE_KEYS = ("ensemble", "member_mean", "members", "diversity")


def class_folder_names(class_names: Iterable[str]) -> list[str]:
    """Folder names whose sorted order is the label order: ``<label>_<name>`` with ``/`` and
    spaces as ``_`` (``T-shirt/top`` -> ``0_T-shirt_top``). Up to 10 classes (one digit)."""
    names = [f"{i}_{name.replace('/', '_').replace(' ', '_')}" for i, name in enumerate(class_names)]
    if sorted(names) != names:
        raise ValueError(f"class folders {names} do not sort in label order")
    return names


def _run_all(jobs: list[Callable[[], None]], workers: int) -> None:
    """Run every job on ``workers`` threads (Pillow releases the GIL while it encodes)."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for _ in pool.map(_call, jobs):
            pass


def _call(job: Callable[[], None]) -> None:
    job()


def _save_grey(path: Path, grey: np.ndarray) -> None:
    Image.fromarray(grey, "L").save(path)


def export_image_folder(idx_dir: Path, out: Path, workers: int | None = None) -> dict[str, int]:
    """Export the IDX dataset in ``idx_dir`` as grey PNGs (Pillow, mode ``L``):
    ``<out>/<split>/<class folder>/<index:05d>.png`` for split ``train`` and ``test``, the
    index being the example's position in its IDX file (so the folder's file-name order
    is the file order) and the class folders :func:`class_folder_names` of
    ``FASHION_MNIST_CLASSES``.

    Returns:
      The number of files written per split.
    """
    from ensemble_core.data import FASHION_MNIST_CLASSES, read_idx_split

    folders = class_folder_names(FASHION_MNIST_CLASSES)
    counts = {}
    for split in ("train", "test"):
        images, labels = read_idx_split(idx_dir, split)
        for folder in folders:
            (out / split / folder).mkdir(parents=True, exist_ok=True)
        jobs: list[Callable[[], None]] = []
        for i in range(len(labels)):
            path = out / split / folders[int(labels[i])] / f"{i:05d}.png"
            jobs.append(functools.partial(_save_grey, path, images[i, :, :, 0]))
        _run_all(jobs, workers or os.cpu_count() or 1)
        counts[split] = len(jobs)
    return counts


def export_arrays(idx_dir: Path, out: Path) -> dict[str, int]:
    """Export the IDX dataset in ``idx_dir`` as ``<out>/train.npz`` and ``<out>/test.npz``
    (``numpy.savez``: ``image`` uint8 ``[N, 28, 28]``, ``label`` int64 ``[N]``, file order).

    Returns:
      The number of examples per split.
    """
    from ensemble_core.data import read_idx_split

    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for split in ("train", "test"):
        images, labels = read_idx_split(idx_dir, split)
        np.savez(out / f"{split}.npz", image=images[..., 0], label=labels.astype(np.int64))
        counts[split] = len(labels)
    return counts


def export_rgb_jpegs(
    idx_dir: Path, out: Path, size: int = 32, quality: int = 90, workers: int | None = None
) -> dict[str, int]:
    """Export the IDX dataset's test images as RGB JPEGs of ``size`` x ``size``: each resized
    with Pillow (bilinear) and tinted with its class's colour (:data:`TINTS`: pixel
    ``grey * tint / 255``), saved with ``quality``, all in ``<out>/train/<class folder>/<index:05d>.jpg``
    (no test folder: the preparation carves the test split).

    Returns:
      The number of files written (``{"train": N}``).
    """
    from ensemble_core.data import FASHION_MNIST_CLASSES, read_idx_split

    folders = class_folder_names(FASHION_MNIST_CLASSES)
    images, labels = read_idx_split(idx_dir, "test")
    for folder in folders:
        (out / "train" / folder).mkdir(parents=True, exist_ok=True)

    def write(path: Path, grey: np.ndarray, label: int) -> None:
        small = np.asarray(Image.fromarray(grey, "L").resize((size, size), Image.Resampling.BILINEAR), np.float32)
        rgb = np.rint(small[..., None] * np.asarray(TINTS[label], np.float32) / 255).astype(np.uint8)
        Image.fromarray(rgb, "RGB").save(path, "JPEG", quality=quality)

    jobs: list[Callable[[], None]] = []
    for i in range(len(labels)):
        label = int(labels[i])
        path = out / "train" / folders[label] / f"{i:05d}.jpg"
        jobs.append(functools.partial(write, path, images[i, :, :, 0], label))
    _run_all(jobs, workers or os.cpu_count() or 1)
    return {"train": len(jobs)}


def hardlink_split(src: Path, dst: Path, split: str = "train") -> int:
    """``dst/<split>/...``: hard links to every file of ``src/<split>/...`` (the same bytes,
    another folder without the other splits). Returns the number of files."""
    count = 0
    for path in sorted((src / split).rglob("*")):
        target = dst / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(path, target)
            count += 1
    return count


def _timed(call: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """``call(*args, **kwargs)`` and its wall seconds."""
    start = time.perf_counter()
    value = call(*args, **kwargs)
    return value, time.perf_counter() - start


# MARK: 1. bit for bit


def prepare_sources(sources: dict[str, Any], data_dir: Path) -> dict[str, Any]:
    """Prepare each ``name -> UserSource | None`` (None: the IDX dataset ``fashion_mnist``)
    in ``data_dir``. Returns ``name -> (DatasetInfo, seconds)``."""
    from ensemble_core import data

    out = {}
    for name, user in sources.items():
        info, seconds = _timed(data.prepare, name, str(data_dir), None, user=user)
        out[name] = (info, seconds)
    return out


def compare_prepared(prepared: dict[str, Any]) -> dict[str, Any]:
    """The snapshots' counts and class counts per source, and whether every source's
    decoded train and test images and labels equal the first source's (``np.array_equal``)."""
    from ensemble_core import data

    names = list(prepared)
    arrays = {
        name: {split: data.load_split(name, split, info.tfds_data_dir) for split in ("train", "test")}
        for name, (info, _) in prepared.items()
    }
    reference = names[0]
    rows: dict[str, Any] = {}
    for name, (info, seconds) in prepared.items():
        snapshot = info.snapshot
        same = {
            split: {
                "images": bool(np.array_equal(arrays[name][split][0], arrays[reference][split][0])),
                "labels": bool(np.array_equal(arrays[name][split][1], arrays[reference][split][1])),
            }
            for split in ("train", "test")
        }
        rows[name] = {
            "kind": snapshot.kind,
            "fingerprint": snapshot.fingerprint,
            "splits": snapshot.splits,
            "class_counts": snapshot.class_counts,
            "class_names": list(snapshot.class_names),
            "image_shape": list(arrays[name]["train"][0].shape[1:]),
            "image_dtype": str(arrays[name]["train"][0].dtype),
            "prepare_seconds": round(seconds, 2),
            f"arrays_equal_{reference}": same,
        }
    counts_equal = all(
        rows[n]["splits"] == rows[reference]["splits"] and rows[n]["class_counts"] == rows[reference]["class_counts"]
        for n in names
    )
    arrays_equal = all(v for n in names for s in rows[n][f"arrays_equal_{reference}"].values() for v in s.values())
    return {"reference": reference, "counts_equal": counts_equal, "arrays_equal": arrays_equal, "sources": rows}


def train_config(args: argparse.Namespace) -> list[str]:
    """The ``--set`` overrides every source trains with (its data section aside)."""
    sets = [
        "model.name=mlp",
        f"model.hidden_sizes=[{args.hidden}]",
        f"ensemble.size={args.size}",
        f"train.epochs={args.epochs}",
        f"train.batch_size={args.batch_size}",
        "eval.evaluators=[test]",
    ]
    if args.max_train_examples is not None:
        sets.append(f"data.max_train_examples={args.max_train_examples}")
    return sets


def train_sources(
    sources: dict[str, list[str]], common: list[str], data_dir: Path, out_dir: Path
) -> dict[str, dict[str, Any]]:
    """Train each source (``name -> its data overrides``) with ``common`` through
    :func:`ensemble_core.runs.run`, each in its own output directory (no champion of
    another source); returns ``name -> {seconds, figures of report.json, whether its test
    member probabilities equal the first source's}``."""
    from ensemble_core import runs
    from ensemble_core.config import load_config

    results, probs = {}, {}
    for name, data_sets in sources.items():
        cfg = load_config(None, [*common, *data_sets, f"data.data_dir={data_dir}"])
        result, seconds = _timed(runs.run, cfg, out_dir / name, "run")
        report = json.loads(result.run_dir.report_json.read_text())
        probs[name] = np.load(result.run_dir.predictions)["member_probs"]
        results[name] = {
            "seconds": round(seconds, 1),
            "train_seconds": round(report["timing"]["train_seconds"], 2),
            "snapshot": report["data_snapshot"]["fingerprint"],
            **{key: report[key] for key in FIGURE_KEYS if key in report},
        }
    first = next(iter(probs.values()))
    for name in results:
        results[name]["member_probs_shape"] = list(probs[name].shape)
        results[name]["member_probs_equal_first"] = bool(np.array_equal(probs[name], first))
    return results


def figures_equal(results: dict[str, dict[str, Any]]) -> dict[str, bool]:
    """Per figure set (:data:`FIGURE_KEYS`): whether every source's equals the first's exactly
    (JSON floats compared with ``==``: bit for bit); and ``member_probs``: whether every
    source's ``predictions.npz`` member probabilities equal the first's (``np.array_equal``)."""
    first = next(iter(results.values()))
    equal = {key: all(r.get(key) == first.get(key) for r in results.values()) for key in FIGURE_KEYS if key in first}
    equal["member_probs"] = all(r["member_probs_equal_first"] for r in results.values())
    return equal


# MARK: 2. preparation throughput


def _decode_loop(paths: list[Path], shape: tuple[int, int, int]) -> np.ndarray:
    """The same decode as ``decode_images`` without blocks or workers: ``decode_file`` per file, in order."""
    from ensemble_core.image_decoding import decode_file

    images = np.empty((len(paths), *shape), np.uint8)
    for i, path in enumerate(paths):
        images[i] = decode_file(str(path), None, None, shape)
    return images


def _own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # every thread of this process
    return usage.ru_utime + usage.ru_stime


def _measured(call: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, dict[str, float | None]]:
    """``call(*args, **kwargs)``, its wall ``seconds`` and ``other_cores_busy``: the cores'
    worth of CPU time the rest of the machine took meanwhile (0 on an idle machine; 1: another
    job took a whole core), None without ``/proc/stat``."""
    busy0, own0 = busy_seconds(), _own_cpu_seconds()
    value, seconds = _timed(call, *args, **kwargs)
    busy1, own1 = busy_seconds(), _own_cpu_seconds()
    others = None if busy0 is None or busy1 is None else max(0.0, (busy1 - busy0) - (own1 - own0)) / seconds
    return value, {"seconds": seconds, "other_cores_busy": None if others is None else round(others, 2)}


def _fastest(tries: list[dict[str, Any]], count: int) -> dict[str, Any]:
    """The fastest of ``tries`` (each ``{seconds, other_cores_busy}``) with ``count`` images
    per try: its seconds, images/s and other load, and every try's seconds."""
    best = min(tries, key=lambda t: t["seconds"])
    return {
        "seconds": round(best["seconds"], 3),
        "images_per_s": round(count / best["seconds"], 1),
        "other_cores_busy": best["other_cores_busy"],
        "tries_seconds": [round(t["seconds"], 3) for t in tries],
        "tries_other_cores_busy": [t["other_cores_busy"] for t in tries],
    }


def measure_folder(root: Path, name: str, work: Path, label: str, repeats: int = 3) -> dict[str, Any]:
    """Time, ``repeats`` times each (interleaved; the fastest kept, every try recorded), the
    preparation of the image folder ``root`` as ``name`` (each in a fresh data dir: a cold
    hash cache), the decode alone with 1 and 2 workers (and every core) and as a plain loop
    of ``decode_file`` (``loop``: no blocks, no workers), and the fingerprint with a cold and a warm
    hash cache. ``other_seconds``: the fastest preparation less the fastest cold fingerprint
    and decode (every core, the default): the second scan, the test carve, the TFDS write,
    the lineage (labels read back) and the changed-file checks."""
    from ensemble_core import data
    from ensemble_core.data import image_folder as folder
    from ensemble_core.data.user_source import UserSource

    user = UserSource(kind="image_folder", path=str(root))
    scan, scan_s = _timed(folder.scan_image_folder, root)
    paths = scan.all_files()
    count = len(paths)
    shape = folder.image_geometry(paths[0], None, None)
    default = os.cpu_count() or 1  # decode_images' default: every core
    variants = [f"workers_{w}" for w in sorted({1, 2, default})] + ["loop"]
    tries: dict[str, list[dict[str, Any]]] = {k: [] for k in ["prepare", *variants, "hash_cold", "hash_warm"]}
    fingerprints = set()
    for attempt in range(repeats):
        prepare_dir, hash_dir = work / f"tfds-prepare-{label}-{attempt}", work / f"tfds-hash-{label}-{attempt}"
        for directory in (prepare_dir, hash_dir):
            shutil.rmtree(directory, ignore_errors=True)  # fresh: a cold hash cache
        info, t = _measured(data.prepare, name, str(prepare_dir), None, user=user)
        tries["prepare"].append(t)
        fingerprints.add(info.snapshot.fingerprint)
        for variant in variants:
            if variant == "loop":
                decoded, t = _measured(_decode_loop, paths, shape)
            else:
                workers = int(variant.split("_")[1])
                (decoded, kept), t = _measured(folder.decode_images, paths, None, None, shape, workers=workers)
                if len(kept) != count:
                    raise RuntimeError(f"decoded {len(kept)} of {count} files of {root}")
            if decoded.shape != (count, *shape):
                raise RuntimeError(f"decoded {decoded.shape} from {count} files of {root}")
            tries[variant].append(t)
            del decoded
        cold, t = _measured(data.fingerprint_source, name, str(hash_dir), None, user)
        tries["hash_cold"].append(t)
        warm, t = _measured(data.fingerprint_source, name, str(hash_dir), None, user)
        tries["hash_warm"].append(t)
        fingerprints |= {cold.fingerprint, warm.fingerprint}
        shutil.rmtree(prepare_dir, ignore_errors=True)
    if len(fingerprints) != 1:
        raise RuntimeError(f"the fingerprints of {root} differ: {sorted(fingerprints)}")
    size = sum(p.stat().st_size for p in paths)
    decode: dict[str, Any] = {"images": count, "shape": list(shape), "scan_seconds": round(scan_s, 3)}
    decode |= {variant: _fastest(tries[variant], count) for variant in variants}
    rate = {variant: decode[variant]["images_per_s"] for variant in variants}
    decode["speedup_2_over_1"] = round(rate["workers_2"] / rate["workers_1"], 3)
    decode["loop_over_workers_1"] = round(rate["loop"] / rate["workers_1"], 3)
    prepare = _fastest(tries["prepare"], count)
    cold, warm = _fastest(tries["hash_cold"], count), _fastest(tries["hash_warm"], count)
    return {
        "folder_images": count,
        "snapshot_splits": info.snapshot.splits,
        "image_shape": list(shape),
        "bytes": size,
        "repeats": repeats,
        "prepare": prepare,
        "decode": decode,
        "other_seconds": round(prepare["seconds"] - cold["seconds"] - decode[f"workers_{default}"]["seconds"], 3),
        "fingerprint": {
            "files": count,
            "cold_seconds": cold["seconds"],
            "warm_seconds": warm["seconds"],
            "cold_mb_per_s": round(size / 2**20 / cold["seconds"], 1),
            "cold": cold,
            "warm": warm,
        },
    }


def _print_table(result: dict[str, Any]) -> None:
    bit = result["bitwise"]
    print(f"\nbit for bit (reference {bit['prepared']['reference']}):")
    print(f"  counts equal {bit['prepared']['counts_equal']}, decoded arrays equal {bit['prepared']['arrays_equal']}")
    print(f"  {'source':<16} {'prepare s':>9} {'run s':>7} {'accuracy':>10} {'nll':>10} {'member acc':>10}")
    for name, row in bit["runs"].items():
        prep = bit["prepared"]["sources"][name]["prepare_seconds"]
        print(
            f"  {name:<16} {prep:>9.1f} {row['seconds']:>7.1f} {row['ensemble']['accuracy']:>10.4f} "
            f"{row['ensemble']['nll']:>10.4f} {row['member_mean']['accuracy']:>10.4f}"
        )
    print(f"  report figures equal: {bit['figures_equal']} -> bitwise_equal {result['bitwise_equal']}")
    print("\npreparation (cold hash cache, warm page cache):")
    print(
        f"  {'source':<10} {'images':>7} {'prepare img/s':>13} {'decode 1w img/s':>15} {'2w img/s':>9} "
        f"{'2w/1w':>6} {'loop img/s':>10} {'hash cold s':>11} {'warm s':>7}"
    )
    for label, row in result["prepare"].items():
        d, f = row["decode"], row["fingerprint"]
        print(
            f"  {label:<10} {row['folder_images']:>7} {row['prepare']['images_per_s']:>13,.0f} "
            f"{d['workers_1']['images_per_s']:>15,.0f} {d['workers_2']['images_per_s']:>9,.0f} "
            f"{d['speedup_2_over_1']:>6.2f} {d['loop']['images_per_s']:>10,.0f} {f['cold_seconds']:>11.2f} "
            f"{f['warm_seconds']:>7.2f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/own-data-cpu-2core.json")
    parser.add_argument("--work-dir", help="keep the exports, snapshots and runs here (default: a removed temp dir)")
    parser.add_argument("--idx-dir", default=str(IDX_DIR), help="Fashion-MNIST's four IDX files")
    parser.add_argument("--size", type=int, default=4, help="ensemble.size of the training runs")
    parser.add_argument("--epochs", type=int, default=2, help="train.epochs of the training runs")
    parser.add_argument("--hidden", type=int, default=128, help="the MLP's one hidden layer (model.hidden_sizes)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--max-train-examples", type=int, default=None)
    parser.add_argument("--skip-training", action="store_true", help="prepare and compare only")
    parser.add_argument("--repeats", type=int, default=3, help="timings of the preparation: the fastest of this many")
    args = parser.parse_args(argv)

    from ensemble_core.data.user_source import UserSource

    idx_dir = Path(args.idx_dir)
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="ensemble-own-data-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        png, npz, jpeg, png_train = work / PNG_NAME, work / NPZ_NAME, work / JPEG_NAME, work / "fashion_png_train"
        for path in (png, npz, jpeg, png_train):
            shutil.rmtree(path, ignore_errors=True)
        exports = {}
        for label, call in (
            ("png", functools.partial(export_image_folder, idx_dir, png)),
            ("npz", functools.partial(export_arrays, idx_dir, npz)),
            ("jpeg", functools.partial(export_rgb_jpegs, idx_dir, jpeg)),
        ):
            counts, seconds = _timed(call)
            exports[label] = {"files": counts, "seconds": round(seconds, 1)}
            print(f"exported {label}: {counts} in {seconds:.1f} s", flush=True)
        hardlink_split(png, png_train)

        # 1. bit for bit
        data_dir = work / "tfds-bitwise"
        shutil.rmtree(data_dir, ignore_errors=True)
        prepared = prepare_sources(
            {
                "fashion_mnist": None,
                PNG_NAME: UserSource(kind="image_folder", path=str(png)),
                NPZ_NAME: UserSource(kind="arrays", path=str(npz)),
            },
            data_dir,
        )
        comparison = compare_prepared(prepared)
        print(f"prepared: counts equal {comparison['counts_equal']}, arrays equal {comparison['arrays_equal']}")
        runs: dict[str, dict[str, Any]] = {}
        equal: dict[str, bool] = {}
        if not args.skip_training:
            shutil.rmtree(work / "runs", ignore_errors=True)
            runs = train_sources(
                {
                    "fashion_mnist": ["data.name=fashion_mnist"],
                    PNG_NAME: ["data.source=image_folder", f"data.path={png}", f"data.name={PNG_NAME}"],
                    NPZ_NAME: ["data.source=arrays", f"data.path={npz}", f"data.name={NPZ_NAME}"],
                },
                train_config(args),
                data_dir,
                work / "runs",
            )
            equal = figures_equal(runs)

        # 2. preparation throughput
        prepare = {
            "png_60k": measure_folder(png_train, "fashion_png_train", work, "png", args.repeats),
            "jpeg_10k": measure_folder(jpeg, JPEG_NAME, work, "jpeg", args.repeats),
        }
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)

    bitwise = comparison["counts_equal"] and comparison["arrays_equal"] and bool(equal) and all(equal.values())
    result = {
        **stamp(),
        "cpu_count": os.cpu_count(),
        "repeats": args.repeats,
        "pillow": pillow_version,
        "command": "python -m benchmarks.own_data " + " ".join(sys.argv[1:] if argv is None else argv),
        "data": f"Fashion-MNIST from its IDX files in {idx_dir}",
        "exports": exports,
        "bitwise_equal": bitwise,
        "bitwise": {
            "config": {"base": "configs/default.yaml (the defaults)", "sets": train_config(args)},
            "prepared": comparison,
            "figures_equal": equal,
            "runs": runs,
        },
        "prepare": prepare,
        "notes": (
            "prepare: data.prepare in a fresh data dir (cold hash cache): scan, SHA-256 of every file, decode on "
            "every core, carve of the test split (20%, the folders have no test/), TFDS array_record write, lineage. "
            "decode: decode_images alone on scan_image_folder's files; loop: decode_file file by file, no workers. "
            "fingerprint: fingerprint_source twice in one fresh data dir (cold, then warm: the hash cache). "
            "other_seconds: prepare less the cold fingerprint and the decode on every core. "
            "Every file was just written: a warm OS page cache. Each timing is the fastest of --repeats tries, "
            "interleaved (tries_seconds: every try); other_cores_busy: the cores' worth of CPU the rest of the "
            "machine took meanwhile (0: idle). png_60k: the train split of the PNG export (hard links)."
        ),
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    _print_table(result)
    print(args.out)
    return 0 if bitwise or args.skip_training else 1


if __name__ == "__main__":
    sys.exit(main())
