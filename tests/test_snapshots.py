"""Data snapshots: a changed source is prepared anew, an unchanged one reused; the lineage
record against the files themselves; a source changing while read is refused."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np
import pytest

from ensemble_core import data
from ensemble_core.data import prepare_snapshot, snapshot
from ensemble_core.errors import DataError
from tests._idx_export import write_mnist_export


def _labels_of(directory: Path, prefix: str) -> np.ndarray:
    raw = gzip.decompress((directory / f"{prefix}-labels-idx1-ubyte.gz").read_bytes())
    return np.frombuffer(raw, np.uint8, offset=8)


@pytest.fixture
def export(tmp_path):
    src = tmp_path / "export"
    write_mnist_export(src, 300, 100)
    return src, str(tmp_path / "tfds")


def test_unchanged_source_reuses_its_snapshot(export):
    src, root = export
    first = data.prepare("mnist", root, str(src))
    variant = Path(first.data_dir)
    stamp = variant.stat().st_mtime_ns
    again = data.prepare("mnist", root, str(src))
    assert again == first  # same snapshot, same lineage record (prepared_at unchanged)
    assert variant.stat().st_mtime_ns == stamp  # not prepared again
    assert sorted(p.name for p in (Path(root) / "snapshots" / "mnist").iterdir()) == [first.snapshot.fingerprint]


def test_one_changed_byte_is_a_new_snapshot(export):
    src, root = export
    first = data.prepare("mnist", root, str(src))
    path = src / "train-images-idx3-ubyte.gz"
    raw = bytearray(gzip.decompress(path.read_bytes()))
    raw[16 + 5 * 784 + 400] ^= 0xFF  # one pixel of training image 5
    path.write_bytes(gzip.compress(bytes(raw), mtime=0))
    second = data.prepare("mnist", root, str(src))
    assert second.snapshot.fingerprint != first.snapshot.fingerprint
    assert second.tfds_data_dir != first.tfds_data_dir
    old, _ = data.load_split("mnist", "train", first.tfds_data_dir)
    new, _ = data.load_split("mnist", "train", second.tfds_data_dir)
    assert int((old != new).sum()) == 1 and new[5].ravel()[400] == 255 - old[5].ravel()[400]


def test_a_replaced_export_trains_on_the_new_files(export):
    """The issue's report: 1,000 then 3,000 images in the same manual_dir; the second
    prepare must read the new files (it reused the old directory before snapshots)."""
    src, root = export
    first = data.prepare("mnist", root, str(src))
    write_mnist_export(src, 900, 100)
    second = data.prepare("mnist", root, str(src))
    assert (first.num_train, second.num_train) == (300, 900)
    labels = _labels_of(src, "train")
    assert second.snapshot.class_counts["train"] == np.bincount(labels, minlength=10).tolist()
    assert second.snapshot.splits == {"train": 900, "test": 100}
    assert second.snapshot.class_counts["test"] == np.bincount(_labels_of(src, "t10k"), minlength=10).tolist()


def test_lineage_record_names_the_files_and_their_hashes(export):
    import hashlib

    src, root = export
    info = data.prepare("mnist", root, str(src))
    lineage = info.snapshot
    assert lineage.kind == "idx" and str(src) in lineage.source
    want = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in src.iterdir()}
    assert {Path(f.path).name: f.sha256 for f in lineage.files} == want
    on_disk = json.loads((Path(info.tfds_data_dir) / snapshot.SNAPSHOT_FILE).read_text())
    assert on_disk == lineage.model_dump(mode="json")
    assert lineage.prepared_at.endswith("+00:00")


def test_same_bytes_elsewhere_are_the_same_snapshot(export, tmp_path):
    src, root = export
    copy = tmp_path / "copy"
    copy.mkdir()
    for p in src.iterdir():
        (copy / p.name).write_bytes(p.read_bytes())
    a = data.fingerprint_source("mnist", root, str(src))
    b = data.fingerprint_source("mnist", root, str(copy))
    assert a.fingerprint == b.fingerprint and a.files != b.files


def test_hashes_are_cached_by_size_and_mtime(export, monkeypatch):
    src, root = export
    calls = []
    real = snapshot._digest
    monkeypatch.setattr(snapshot, "_digest", lambda p: calls.append(p.name) or real(p))
    data.fingerprint_source("mnist", root, str(src))
    assert len(calls) == 4
    data.fingerprint_source("mnist", root, str(src))
    assert len(calls) == 4  # all four from the cache
    label = src / "t10k-labels-idx1-ubyte.gz"
    st = label.stat()
    os.utime(label, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    data.fingerprint_source("mnist", root, str(src))
    assert calls[4:] == [label.name]


def test_a_source_changing_while_read_is_refused(export, monkeypatch):
    src, root = export
    real = data.read_idx_split

    def export_still_running(directory, split):
        out = real(directory, split)
        if split == "train":  # the export rewrites the test labels meanwhile
            write_mnist_export(src, 300, 120)
        return out

    monkeypatch.setattr("ensemble_core.data.idx.read_idx_split", export_still_running)
    with pytest.raises(DataError) as err:
        data.prepare("mnist", root, str(src))
    msg = str(err.value)
    assert "\n" not in msg and "changed while it was read" in msg and "t10k-" in msg and "fix:" in msg
    assert list((Path(root) / "snapshots" / "mnist").iterdir()) == []  # nothing half-prepared left
    monkeypatch.undo()
    assert data.prepare("mnist", root, str(src)).num_test == 120


def test_a_catalog_dataset_prepared_by_the_user_is_used_in_place(tmp_path):
    """A TFDS catalog dataset already prepared in data_dir (the user's own copy) is the
    snapshot itself: nothing copied, the fingerprint from its metadata."""
    from tests._cifar_mock import mocked_cifar10

    root = tmp_path / "tfds"
    with mocked_cifar10(root):
        info = data.prepare("cifar10", str(root))
        assert info.snapshot.kind == "prepared" and info.tfds_data_dir == str(root)
        assert sum(info.snapshot.class_counts["train"]) == info.num_train
        fp = prepare_snapshot.fingerprint_source("cifar10", str(root))
        assert fp.fingerprint == info.snapshot.fingerprint


@pytest.mark.slow  # over 1 CPU s with a warm compilation cache: make test-fast leaves it out (docs/development.md)
def test_concurrent_runs_prepare_a_snapshot_once_and_share_it(export):
    """Two processes prepare the same new export at once: they take turns on the
    preparation lock; one prepares, the other finds the snapshot and reuses it."""
    import subprocess
    import sys

    src, root = export
    code = (
        "import json, sys; from ensemble_core import data; "
        f"info = data.prepare('mnist', {root!r}, {str(src)!r}); "
        "print('RESULT', json.dumps([info.tfds_data_dir, info.snapshot.prepared_at, info.num_train]))"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    results = [json.loads(next(x for x in o.splitlines() if x.startswith("RESULT"))[7:]) for o in outputs]
    assert results[0] == results[1] and results[0][2] == 300  # the same snapshot and lineage record
    prepared = sum(o.count("downloaded and prepared to") for o in outputs)
    assert prepared == 1, outputs  # TFDS prepared it once


@pytest.mark.parametrize("damage", [b"", b"\x00garbage", b'{"fingerprint": 3}'])
def test_a_damaged_lineage_record_or_hash_cache_is_built_again(export, damage):
    """snapshot.json and the hash cache are read back validated: a damaged one is written
    again from the prepared snapshot and the files, never trusted or fatal."""
    src, root = export
    first = data.prepare("mnist", root, str(src))
    record = Path(first.tfds_data_dir) / snapshot.SNAPSHOT_FILE
    cache = Path(root) / snapshot.SNAPSHOTS / snapshot.HASH_CACHE
    record.write_bytes(damage)
    cache.write_bytes(damage)
    again = data.prepare("mnist", root, str(src))
    assert again.snapshot.model_dump(exclude={"prepared_at"}) == first.snapshot.model_dump(exclude={"prepared_at"})
    assert json.loads(record.read_text())["fingerprint"] == first.snapshot.fingerprint
    assert str(src.resolve() / "train-images-idx3-ubyte.gz") in json.loads(cache.read_text())
