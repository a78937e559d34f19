"""The retention policy of an output directory on synthetic run directories (small fake
files, report.json mtimes set with os.utime): exactly the documented runs are kept whole,
the rest lose their checkpoints and predictions and keep their reports; runs in progress,
unfinished runs and the champion are never touched; data snapshots go only when nothing
kept refers to them and no run used them for M days (checked again under the prepare
lock); and a SIGKILL or an error at any moment leaves every run whole or without its
checkpoints, which the next call completes."""

from __future__ import annotations

import itertools
import json
import logging
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ensemble_core.config.nightly_section import RetentionConfig
from ensemble_core.data import snapshot
from ensemble_core.filelock import flocked
from ensemble_core.runs.champion import retention
from ensemble_core.runs.champion.retention import RetentionReport, apply_retention
from ensemble_core.runs.storage.champion_record import write_champion
from ensemble_core.runs.storage.lock import run_lock

ROOT = Path(__file__).resolve().parents[1]
#: The heavy entries of a run, in the order pruning removes them.
HEAVY = ("checkpoints", "groups", "corrupt-checkpoints", "predictions.npz", "eval")
HEAVY_FILES = (
    "checkpoints/200/state",
    "checkpoints/400/state",
    "groups/0/.lock",
    "groups/0/checkpoints/400",
    "corrupt-checkpoints/100",
    "predictions.npz",
    "eval/shifted.npz",
)
LIGHT_FILES = (".lock", "report.md", "plots/training_curves.png", "plots/reliability.png", "selection.json")
T0 = 1_700_000_000.0
DAY = 86400.0
METRICS = {"accuracy": 0.9, "nll": 0.3, "brier": 0.1, "ece": 0.02}


def make_run(out: Path, name: str, finished_at: float | None, snap: Path | None = None, where: str = "both") -> Path:
    """A fake run directory: every heavy and light file, report.json (mtime ``finished_at``;
    none when None) and the snapshot reference in data_snapshot.json and/or report.json."""
    run = out / name
    for rel in HEAVY_FILES + LIGHT_FILES:
        path = run / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"" if path.name == ".lock" else f"{name}/{rel}\n".encode() * 50)
    ref = {"path": str(snap), "fingerprint": snap.name} if snap is not None else None
    if ref is not None and where in ("both", "file"):
        (run / "data_snapshot.json").write_text(json.dumps(ref))
    if finished_at is not None:
        report = {"run_name": name, **({"data_snapshot": ref} if ref is not None and where != "file" else {})}
        (run / "report.json").write_text(json.dumps(report))
        os.utime(run / "report.json", (finished_at, finished_at))
    return run


def make_snapshot(root: Path, name: str, fingerprint: str, used_at: float) -> Path:
    """A fake prepared snapshot under ``root/snapshots/``, last used at ``used_at``."""
    snap = root / snapshot.SNAPSHOTS / name / fingerprint
    (snap / name / "1.0.0").mkdir(parents=True)
    (snap / name / "1.0.0" / "train.array_record-00000-of-00001").write_bytes(b"x" * 1000)
    (snap / snapshot.SNAPSHOT_FILE).write_text(json.dumps({"fingerprint": fingerprint}))
    (snap / snapshot.LAST_USED).touch()
    os.utime(snap / snapshot.LAST_USED, (used_at, used_at))
    return snap


def crown(out: Path, name: str) -> None:
    write_champion(out, {"run_name": name, "run_dir": str(out / name), "data": {}, "metrics": METRICS})


def tree(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` (relative name -> bytes; lock files' pid text blanked),
    the trash left out."""
    return {
        p.relative_to(path).as_posix(): b"" if p.name == ".lock" else p.read_bytes()
        for p in sorted(path.rglob("*"))
        if p.is_file() and retention.TRASH not in p.relative_to(path).parts
    }


def stage(run: Path, original: dict[str, bytes]) -> int:
    """How many heavy entries, in pruning order, ``run`` has lost (0: whole, 5: pruned),
    asserting that each entry is whole or gone, they went in order, and everything else
    is exactly as created."""
    now = tree(run)
    for rel, data in original.items():
        if rel.split("/")[0] not in HEAVY:
            assert now.get(rel) == data, f"{run.name}: {rel} changed or went"
    gone = []
    for entry in HEAVY:
        mine = {r: d for r, d in original.items() if r.split("/")[0] == entry}
        have = {r: d for r, d in now.items() if r.split("/")[0] == entry}
        assert have in (mine, {}), f"{run.name}/{entry} is half deleted"
        assert have or not (run / entry).exists(), f"{run.name}/{entry} is an empty husk"
        gone.append(not have)
    k = gone.count(True)
    assert gone == [True] * k + [False] * (len(HEAVY) - k), f"{run.name}: removed out of order: {gone}"
    extra = set(now) - set(original) - {retention.PRUNED_FILE}
    assert all(rel.rsplit("/", 1)[-1].startswith(".") for rel in extra), extra  # only atomic-write temporaries
    return k


def assert_documented(run: Path, original: dict[str, bytes], pruned: bool) -> None:
    """``run`` is whole (kept), or pruned: no heavy entry, no trash, its marker names them all."""
    assert stage(run, original) == (len(HEAVY) if pruned else 0)
    assert (run / retention.PRUNED_FILE).exists() == pruned
    if pruned:
        assert json.loads((run / retention.PRUNED_FILE).read_text())["removed"] == list(HEAVY)
        assert not (run / retention.TRASH).exists()


def heavy_bytes(original: dict[str, bytes]) -> int:
    return sum(len(d) for r, d in original.items() if r.split("/")[0] in HEAVY)


# MARK: which runs are kept


def test_the_champion_and_the_newest_runs_are_kept_whole_and_the_rest_pruned(tmp_path):
    out = tmp_path / "out"
    names = [f"run-{i:02d}" for i in range(15)]
    order = list(range(15))
    random.Random(0).shuffle(order)  # finish times unrelated to the names' order
    finished = {name: T0 + 60 * order[i] for i, name in enumerate(names)}
    for name in names:
        make_run(out, name, finished[name])
    newest_first = sorted(names, key=lambda n: finished[n], reverse=True)
    champion = newest_first[11]  # the 12th newest
    crown(out, champion)
    originals = {name: tree(out / name) for name in names}
    (out / "notes").mkdir()  # not a run directory: none of its markers
    (out / "notes" / "todo.txt").write_text("x")

    report = apply_retention(out, RetentionConfig(keep_last_runs=5))

    expected_kept = {**dict.fromkeys(newest_first[:5], "recent"), champion: "champion"}
    expected_pruned = set(names) - set(expected_kept)
    assert len(expected_pruned) == 9
    assert report.kept == expected_kept
    assert set(report.pruned) == expected_pruned
    assert report.already_pruned == () and report.skipped == () and report.snapshots_removed == ()
    for name in names:
        assert_documented(out / name, originals[name], pruned=name in expected_pruned)
    for name in expected_pruned:
        for rel in ("report.json", "report.md", "plots/reliability.png", "selection.json"):
            assert (out / name / rel).is_file()
    # ... plus the pid retention wrote into each member group's lock file while it held it.
    pid_text = len(str(os.getpid()))
    assert report.bytes_freed == sum(heavy_bytes(originals[n]) + pid_text for n in expected_pruned)
    assert (out / "notes" / "todo.txt").exists() and (out / "champion.json").exists()
    assert RetentionReport.model_validate_json(report.model_dump_json()) == report
    assert report.summary().startswith("retention: kept 6 run(s) whole (1 champion, 5 recent), pruned 9, 0 already")


def test_equal_finish_times_keep_the_greater_name(tmp_path):
    out = tmp_path / "out"
    for name in ("b", "a", "c"):
        make_run(out, name, T0 if name != "c" else T0 - 10)
    report = apply_retention(out, RetentionConfig(keep_last_runs=1))
    assert report.kept == {"b": "recent"}
    assert report.pruned == ("a", "c")


def test_runs_in_progress_unfinished_runs_and_an_old_champion_are_never_touched(tmp_path):
    out = tmp_path / "out"
    make_run(out, "locked", T0 + 1)  # old and finished, but a run holds its lock (a rerun)
    make_run(out, "group-locked", T0 + 2)  # a member group's lock is held
    make_run(out, "unfinished", None)  # no report: it may be resumed
    make_run(out, "champ", T0 + 3)
    make_run(out, "old", T0 + 4)
    make_run(out, "new-1", T0 + 100)
    make_run(out, "new-2", T0 + 101)
    crown(out, "champ")
    originals = {run.name: tree(run) for run in out.iterdir() if run.is_dir()}

    with run_lock(out / "locked"), run_lock(out / "group-locked" / "groups" / "0"):
        report = apply_retention(out, RetentionConfig(keep_last_runs=2))
        again = apply_retention(out, RetentionConfig(keep_last_runs=2))

    assert report.kept == {
        "champ": "champion",
        "group-locked": "in progress",
        "locked": "in progress",
        "new-1": "recent",
        "new-2": "recent",
        "unfinished": "unfinished",
    }
    assert report.pruned == ("old",) and again.pruned == () and again.already_pruned == ("old",)
    for name, original in originals.items():
        assert_documented(out / name, original, pruned=name == "old")
    assert not (out / "unfinished" / retention.PRUNED_FILE).exists()
    # Released, the old run that was in progress is pruned like any other.
    assert apply_retention(out, RetentionConfig(keep_last_runs=2)).pruned == ("group-locked", "locked")


def test_a_second_call_prunes_nothing_more(tmp_path):
    out = tmp_path / "out"
    for i in range(4):
        make_run(out, f"r{i}", T0 + i)
    first = apply_retention(out, RetentionConfig(keep_last_runs=1))
    state = {run.name: tree(run) for run in out.iterdir()}
    second = apply_retention(out, RetentionConfig(keep_last_runs=1))
    assert first.pruned == ("r0", "r1", "r2") and first.bytes_freed > 0
    assert second.pruned == () and second.already_pruned == ("r0", "r1", "r2") and second.bytes_freed == 0
    assert second.kept == first.kept == {"r3": "recent"}
    assert {run.name: tree(run) for run in out.iterdir()} == state  # pruned.json untouched too


def test_nothing_to_do_without_an_output_directory_or_with_the_policy_off(tmp_path):
    assert apply_retention(tmp_path / "missing", RetentionConfig()) == RetentionReport()
    assert not (tmp_path / "missing").exists()
    make_run(tmp_path / "out", "a", T0)
    make_run(tmp_path / "out", "b", T0 + 1)
    assert apply_retention(tmp_path / "out", RetentionConfig(enabled=False, keep_last_runs=1)) == RetentionReport()
    assert (tmp_path / "out" / "a" / "checkpoints").is_dir()
    assert RetentionReport().summary() == (
        "retention: kept 0 run(s) whole, pruned 0, 0 already pruned, removed 0 snapshot(s), freed 0 B"
    )


# MARK: data snapshots


def test_snapshots_go_only_when_unreferenced_by_kept_runs_and_unused_for_m_days(tmp_path):
    now = time.time()
    out, root = tmp_path / "out", tmp_path / "tfds"
    old, recent = now - 30 * DAY, now - 1 * DAY
    kept_ref = make_snapshot(root, "mnist", "aaaa", old)  # referenced by a kept run
    champ_ref = make_snapshot(root, "mnist", "bbbb", old)  # by the old champion, report.json only
    unfinished_ref = make_snapshot(root, "mnist", "cccc", old)  # by an unfinished run, data_snapshot.json only
    pruned_ref = make_snapshot(root, "mnist", "dddd", old)  # only by a run pruned now: goes
    orphan_old = make_snapshot(root, "cifar10", "eeee", old)  # goes
    orphan_recent = make_snapshot(root, "cifar10", "ffff", recent)  # used a day ago: stays
    outside = tmp_path / "elsewhere" / "gggg"  # a symlink under snapshots/ to something outside
    outside.mkdir(parents=True)
    (outside / "keep.txt").write_text("x")
    (root / snapshot.SNAPSHOTS / "cifar10" / "gggg").symlink_to(outside)
    make_run(out, "new", T0 + 10, kept_ref)
    make_run(out, "champ", T0, champ_ref, where="report")
    make_run(out, "building", None, unfinished_ref, where="file")
    make_run(out, "old", T0 + 1, pruned_ref)
    crown(out, "champ")

    report = apply_retention(out, RetentionConfig(keep_last_runs=1, snapshot_max_age_days=14), [root], now=now)

    assert report.pruned == ("old",)
    assert set(report.snapshots_removed) == {str(pruned_ref), str(orphan_old)}
    for snap in (kept_ref, champ_ref, unfinished_ref, orphan_recent):
        assert (snap / snapshot.SNAPSHOT_FILE).is_file(), snap
    assert not pruned_ref.exists() and not orphan_old.exists()
    assert (outside / "keep.txt").is_file()
    assert not [p for p in (root / snapshot.SNAPSHOTS).iterdir() if p.name.startswith(".")]  # no trash left
    assert report.bytes_freed > 2 * 1000
    # Older than M days by now's clock: the recently used orphan goes too.
    later = apply_retention(out, RetentionConfig(keep_last_runs=1, snapshot_max_age_days=0.5), [root], now=now)
    assert later.snapshots_removed == (str(orphan_recent),)


def test_no_snapshot_is_removed_while_a_kept_runs_reference_is_unreadable(tmp_path, caplog):
    out, root = tmp_path / "out", tmp_path / "tfds"
    orphan = make_snapshot(root, "mnist", "aaaa", T0)
    make_run(out, "old", T0)
    make_run(out, "new", T0 + 1)
    (out / "new" / "data_snapshot.json").write_text("{not json")
    with caplog.at_level(logging.WARNING, logger=retention.__name__):
        report = apply_retention(out, RetentionConfig(keep_last_runs=1), [root], now=T0 + 100 * DAY)
    assert report.pruned == ("old",) and report.snapshots_removed == ()
    assert orphan.is_dir()
    assert "removing no data snapshot" in caplog.text and "'new'" in caplog.text


def test_a_snapshot_reused_while_retention_waits_for_the_prepare_lock_is_kept(tmp_path, monkeypatch):
    now = time.time()
    root = tmp_path / "tfds"
    snap = make_snapshot(root, "mnist", "aaaa", now - 30 * DAY)
    make_run(tmp_path / "out", "a", T0)
    waiting = threading.Event()
    real_flocked = retention.flocked

    def flocked_spy(*args, **kwargs):
        waiting.set()
        return real_flocked(*args, **kwargs)

    monkeypatch.setattr(retention, "flocked", flocked_spy)
    result: list[RetentionReport] = []
    with flocked(snapshot.prepare_lock_path(root, "mnist")):  # a run preparing mnist holds the lock
        worker = threading.Thread(
            target=lambda: result.append(apply_retention(tmp_path / "out", RetentionConfig(), [root], now=now))
        )
        worker.start()
        assert waiting.wait(10), "retention never asked for the prepare lock"
        time.sleep(0.2)  # retention is blocked in flock now
        snapshot.mark_used(snap)  # ... and the run reuses the snapshot
    worker.join(10)
    assert result and result[0].snapshots_removed == ()
    assert (snap / snapshot.SNAPSHOT_FILE).is_file()


# MARK: crashes


def scenario(base: Path) -> tuple[Path, Path, dict[str, dict[str, bytes]], set[str]]:
    """An output dir (3 runs to prune, 2 recent, an old champion, an unfinished run) and a
    snapshot root with one old orphan; returns them, every run's files and the runs to prune."""
    out, root = base / "out", base / "tfds"
    make_snapshot(root, "mnist", "orphan", T0)
    for i in range(3):
        make_run(out, f"old-{i}", T0 + i)
    make_run(out, "champ", T0 - 1)
    make_run(out, "new-0", T0 + 50)
    make_run(out, "new-1", T0 + 51)
    make_run(out, "building", None)
    crown(out, "champ")
    return out, root, {run.name: tree(run) for run in out.iterdir() if run.is_dir()}, {f"old-{i}" for i in range(3)}


POLICY = RetentionConfig(keep_last_runs=2, snapshot_max_age_days=1)
NOW = T0 + 10 * DAY


def check_consistent(out: Path, originals: dict[str, dict[str, bytes]], to_prune: set[str]) -> list[int]:
    """Every run whole or partly pruned in order (kept ones whole); the stages of those to prune."""
    stages = {name: stage(out / name, original) for name, original in originals.items()}
    assert all(stages[name] == 0 for name in originals if name not in to_prune), stages
    return [stages[name] for name in sorted(to_prune)]


def check_completed(out: Path, root: Path, originals: dict[str, dict[str, bytes]], to_prune: set[str]) -> None:
    """A normal call finishes whatever an interrupted one left: the documented state."""
    report = apply_retention(out, POLICY, [root], now=NOW)
    assert set(report.pruned) | set(report.already_pruned) == to_prune
    for name, original in originals.items():
        assert_documented(out / name, original, pruned=name in to_prune)
    assert sorted(p.name for p in (root / snapshot.SNAPSHOTS).iterdir()) == ["mnist"]
    assert not (root / snapshot.SNAPSHOTS / "mnist" / "orphan").exists()


CHILD = r"""
import json, os, signal, sys, time, traceback
from ensemble_core.config.nightly_section import RetentionConfig
from ensemble_core.runs.champion.retention import apply_retention

args = json.loads(sys.argv[1])
policy = RetentionConfig(**args["policy"])


def slow(fn, pause):
    def wrapper(*a, **k):
        time.sleep(pause)
        return fn(*a, **k)
    return wrapper


def trial(out, root, delay):
    # One retention in a forked child (the imports are paid once), SIGKILLed after delay.
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        try:
            os.rename, os.unlink, os.rmdir = slow(os.rename, 0.02), slow(os.unlink, 0.003), slow(os.rmdir, 0.003)
            apply_retention(out, policy, [root], now=args["now"])
        except BaseException:
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    if delay is not None:
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
    return os.waitpid(pid, 0)[1]


start = time.monotonic()
assert trial(*args["calibrate"], None) == 0, "the unkilled retention failed"
full = time.monotonic() - start
for i, (out, root) in enumerate(args["trials"]):
    delay = full * (i + args["jitter"][i]) / len(args["trials"])  # spread over the whole call
    status = trial(out, root, delay)
    print(json.dumps({"trial": i, "delay": delay, "full": full, "status": status}), flush=True)
"""


@pytest.mark.slow
def test_sigkill_at_any_moment_leaves_every_run_whole_or_without_its_checkpoints(tmp_path):
    trials = 10
    scenarios = [scenario(tmp_path / f"t{i}") for i in range(trials + 1)]
    rng = random.Random(1234)
    args = {
        "policy": POLICY.model_dump(),
        "now": NOW,
        "calibrate": [str(scenarios[0][0]), str(scenarios[0][1])],
        "trials": [[str(out), str(root)] for out, root, _, _ in scenarios[1:]],
        "jitter": [rng.random() for _ in range(trials)],
    }
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(args)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == trials, proc.stdout

    out, root, originals, to_prune = scenarios[0]
    assert check_consistent(out, originals, to_prune) == [len(HEAVY)] * 3  # the unkilled call
    partial = 0
    for out, root, originals, to_prune in scenarios[1:]:
        stages = check_consistent(out, originals, to_prune)
        partial += any(0 < k < len(HEAVY) for k in stages)
        check_completed(out, root, originals, to_prune)
    assert partial, "no kill landed between two renames of a run"


def failing_after(k: int, real):
    """``real``, failing from its ``k+1``-th call on."""
    calls = itertools.count(1)

    def failing(*args, **kwargs):
        n = next(calls)
        if n > k:
            raise OSError(f"injected failure of call #{n}")
        return real(*args, **kwargs)

    return failing


@pytest.mark.parametrize("call", ["rename", "unlink"])
def test_an_error_after_any_step_leaves_every_run_whole_or_without_its_checkpoints(tmp_path, monkeypatch, call):
    real = getattr(os, call)
    counted = [0]

    def counting(*args, **kwargs):
        counted[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(os, call, counting)
    out, root = scenario(tmp_path / "count")[:2]
    apply_retention(out, POLICY, [root], now=NOW)
    total = counted[0]
    assert total >= (3 * len(HEAVY) + 1 if call == "rename" else 3 * len(HEAVY_FILES))
    steps = range(total) if call == "rename" else sorted(random.Random(7).sample(range(total), 12))
    for k in steps:
        out, root, originals, to_prune = scenario(tmp_path / f"{call}-{k}")
        monkeypatch.setattr(os, call, failing_after(k, real))
        with pytest.raises(OSError, match="injected failure"):
            apply_retention(out, POLICY, [root], now=NOW)
        monkeypatch.setattr(os, call, real)
        check_consistent(out, originals, to_prune)
        check_completed(out, root, originals, to_prune)
