"""A data snapshot in use by a run anywhere on its data dir is never removed (issue 43,
class 1): two output directories sharing one ``data.data_dir`` each apply retention to the
shared snapshots, and one's ``snapshot_max_age_days`` deleted the snapshot the other was
training on. A run holds a lease on its snapshot; retention skips a leased snapshot."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from ensemble_core.config import RetentionConfig
from ensemble_core.data import snapshot
from ensemble_core.runs.champion.retention import apply_retention

ROOT = Path(__file__).resolve().parents[1]

HOLDER = """
import sys, time
from pathlib import Path
from ensemble_core.data import snapshot
with snapshot.in_use(sys.argv[1]):
    print("leased", flush=True)
    while not Path(sys.argv[2]).exists():
        time.sleep(0.05)
"""


def _snapshot(root: Path, name: str = "shelf_parts", fingerprint: str = "0123456789abcdef") -> Path:
    snap = root / snapshot.SNAPSHOTS / name / fingerprint
    snap.mkdir(parents=True)
    (snap / snapshot.SNAPSHOT_FILE).write_text("{}")
    (snap / "shard-00000").write_bytes(b"x" * 1024)
    old = time.time() - 30 * 86400
    os.utime(snap, (old, old))
    return snap


def test_retention_keeps_a_snapshot_another_process_holds_and_removes_it_after(tmp_path):
    root = tmp_path / "tfds"
    snap = _snapshot(root)
    (tmp_path / "other-out").mkdir()  # another output directory on the same data dir
    release = tmp_path / "release"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(snap), str(release)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "leased"
        # another output directory's retention, snapshots unused for 0 days removed
        report = apply_retention(tmp_path / "other-out", RetentionConfig(snapshot_max_age_days=0), [root])
        assert report.snapshots_removed == () and snap.is_dir() and (snap / "shard-00000").is_file()
    finally:
        release.touch()
        holder.wait(timeout=60)
    report = apply_retention(tmp_path / "other-out", RetentionConfig(snapshot_max_age_days=0), [root])
    assert report.snapshots_removed == (str(snap),) and not snap.exists()


def test_a_run_holds_the_lease_of_its_snapshot_while_it_runs(tmp_path, tfds_dir):
    """``runs.run`` takes the lease after preparing the dataset and keeps it to its end:
    checked from inside the training stage with a non-blocking exclusive lock, which fails
    while the lease is held."""
    from ensemble_core import runs
    from ensemble_core.filelock import LockHeldError, flocked

    seen: list[str] = []

    def train(cfg, dataset, run_dir):
        try:
            with flocked(snapshot.lease_path(dataset.tfds_data_dir), blocking=False):
                seen.append("free")
        except LockHeldError:
            seen.append("leased")
        raise RuntimeError("stop here")

    from ensemble_core.config import load_config

    cfg = load_config(ROOT / "configs" / "tiny.yaml", [f"data.data_dir={tfds_dir}"])
    try:
        runs.run(cfg, tmp_path / "out", "r", runs.Stages(train=train))
    except RuntimeError as err:
        assert str(err) == "stop here"
    assert seen == ["leased"]
