"""Damaged champion/history state never blocks a later run (ensemble_core.runs.storage.champion_record,
and the promotion policy of ensemble_core.runs.champion.promotion that reads it).

Real files under tmp_path; what is read back is checked with the json module directly.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import threading
import types

import pytest

from ensemble_core.figures import decide_promotion
from ensemble_core.runs.storage import champion_record as champion_state
from ensemble_core.runs.storage import records
from ensemble_core.runs.storage.layout import OutputDir

LOGGER = "ensemble_core.runs.storage"  # the records' set-aside rule and the champion record both warn
METRICS = {"accuracy": 0.91, "nll": 0.31, "brier": 0.12, "ece": 0.02}


def _run_dir(tmp_path, name="run-1", checkpoints=True):
    d = tmp_path / "runs" / name
    (d / "checkpoints" if checkpoints else d).mkdir(parents=True)
    return d


def _record(run_dir, **changes):
    rec = {
        "run_name": run_dir.name,
        "run_dir": str(run_dir),
        "data": {"name": "mnist5k", "val_fraction": 0.1},
        "metrics": dict(METRICS),
        "promoted_at": "2024-01-01T00:00:00+00:00",
    }
    rec.update(changes)
    return rec


def _warnings(caplog):
    return [r for r in caplog.records if r.name.startswith(LOGGER + ".") and r.levelno == logging.WARNING]


def _corrupt_files(out):
    d = OutputDir(out).corrupt_state
    return sorted(d.iterdir()) if d.exists() else []


def _snapshot(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# MARK: champion.json


def _damaged_champions(tmp_path):
    """name -> (bytes of champion.json, the run_dir it points at)."""
    live = _run_dir(tmp_path, "live")
    good = json.dumps(_record(live), indent=2).encode()
    no_ckpt = _run_dir(tmp_path, "no-ckpt", checkpoints=False)
    dead = tmp_path / "runs" / "deleted"  # never created: the run dir was deleted
    missing_key = _record(live)
    del missing_key["run_dir"]
    return {
        "garbage-bytes": (b"\xff\xfe\x00\x9c garbage \x80\x81", None),
        "truncated-json": (good[: len(good) // 2], None),
        "empty": (b"", None),
        "json-list": (json.dumps([_record(live)]).encode(), None),
        "json-string": (b'"champion"', None),
        "missing-run_dir": (json.dumps(missing_key).encode(), None),
        "run_name-not-str": (json.dumps(_record(live, run_name=7)).encode(), None),
        "data-not-object": (json.dumps(_record(live, data="mnist")).encode(), None),
        "metrics-missing-nll": (
            json.dumps(_record(live, metrics={k: v for k, v in METRICS.items() if k != "nll"})).encode(),
            None,
        ),
        "metric-nan": (json.dumps(_record(live, metrics={**METRICS, "nll": float("nan")})).encode(), None),
        "metric-inf": (json.dumps(_record(live, metrics={**METRICS, "ece": float("inf")})).encode(), None),
        "metric-string": (json.dumps(_record(live, metrics={**METRICS, "brier": "0.1"})).encode(), None),
        "metric-bool": (json.dumps(_record(live, metrics={**METRICS, "accuracy": True})).encode(), None),
        "dead-run_dir": (json.dumps(_record(dead)).encode(), dead),
        "dead-run_dir-nested": (json.dumps(_record(dead / "deeper" / "run")).encode(), dead),
        "run_dir-without-checkpoints": (json.dumps(_record(no_ckpt)).encode(), no_ckpt),
    }


DAMAGE = [
    "garbage-bytes",
    "truncated-json",
    "empty",
    "json-list",
    "json-string",
    "missing-run_dir",
    "run_name-not-str",
    "data-not-object",
    "metrics-missing-nll",
    "metric-nan",
    "metric-inf",
    "metric-string",
    "metric-bool",
    "dead-run_dir",
    "dead-run_dir-nested",
    "run_dir-without-checkpoints",
]


@pytest.mark.parametrize("case", DAMAGE)
def test_damaged_champion_is_set_aside_with_one_warning(tmp_path, caplog, case):
    content, run_dir = _damaged_champions(tmp_path)[case]
    out = tmp_path / "out"
    out.mkdir()
    (out / "champion.json").write_bytes(content)
    runs_before = _snapshot(tmp_path / "runs")

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert champion_state.read_champion(out) is None

    assert not (out / "champion.json").exists()
    (moved,) = _corrupt_files(out)
    assert moved.name.startswith("champion.json.") and moved.read_bytes() == content
    (record,) = _warnings(caplog)
    message = record.getMessage()
    assert str(out / "champion.json") in message
    assert str(moved) in message
    assert "as if there were no champion" in message
    # nothing was created at (or under) the run directory the pointer named
    assert _snapshot(tmp_path / "runs") == runs_before
    if run_dir is not None and case.startswith("dead"):
        assert not run_dir.exists()
    # the next run finds no champion and no warning: the damage was dealt with once
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert champion_state.read_champion(out) is None
    assert not _warnings(caplog)
    assert _corrupt_files(out) == [moved]


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("garbage-bytes", "UTF-8"),
        ("truncated-json", "JSON"),
        ("json-list", "list"),
        ("missing-run_dir", "run_dir"),
        ("metric-nan", "nll"),
        ("dead-run_dir", "no longer exists"),
        ("run_dir-without-checkpoints", "checkpoints"),
    ],
)
def test_warning_says_what_was_wrong(tmp_path, caplog, case, words):
    content, _ = _damaged_champions(tmp_path)[case]
    (tmp_path / "champion.json").write_bytes(content)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        champion_state.read_champion(tmp_path)
    (record,) = _warnings(caplog)
    assert words in record.getMessage()


def test_valid_champion_is_returned_unchanged(tmp_path, caplog):
    run = _run_dir(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    rec = _record(run, metrics={**METRICS, "accuracy": 1})  # an int is a finite number too
    (out / "champion.json").write_text(json.dumps(rec, indent=2))
    before = (out / "champion.json").read_bytes()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        got = champion_state.read_champion(out)
    assert got == rec == json.loads(before)
    assert (out / "champion.json").read_bytes() == before
    assert not _warnings(caplog) and not _corrupt_files(out)


def test_missing_champion_is_none_silently_and_creates_nothing(tmp_path, caplog):
    out = tmp_path / "never-made"
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert champion_state.read_champion(out) is None
        assert champion_state.read_history(out) == []
    assert not out.exists()
    assert not _warnings(caplog)


def test_champion_pointer_dies_when_its_run_dir_is_deleted(tmp_path, caplog):
    """Valid today, pointer to a deleted run tomorrow: set aside, no dir re-created."""
    run = _run_dir(tmp_path)
    champion_state.write_champion(tmp_path / "out", _record(run))
    assert champion_state.read_champion(tmp_path / "out")["run_dir"] == str(run)
    for p in sorted(run.rglob("*"), reverse=True):
        p.rmdir()
    run.rmdir()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert champion_state.read_champion(tmp_path / "out") is None
    assert not run.exists()
    assert len(_warnings(caplog)) == 1


def test_decision_after_a_damaged_champion_promotes(tmp_path, caplog):
    out = tmp_path / "out"
    out.mkdir()
    (out / "champion.json").write_bytes(b'{"run_name": "old", "run_dir": ')  # a half-written pointer
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        current = champion_state.read_champion(out)
    challenger = {"accuracy": 0.5, "nll": 2.0, "brier": 0.6, "ece": 0.3}
    assert current is None and decide_promotion(challenger["nll"], current, "nll") == (True, "no champion yet")

    run = _run_dir(tmp_path, "new")
    champion_state.write_champion(out, _record(run, metrics=challenger))
    on_disk = json.loads((out / "champion.json").read_text())
    assert on_disk["run_name"] == "new" and on_disk["metrics"] == challenger
    assert dt.datetime.fromisoformat(on_disk["promoted_at"]).tzinfo is not None
    assert champion_state.read_champion(out) == on_disk
    # the damaged pointer is still there, untouched, for a human to look at
    (moved,) = _corrupt_files(out)
    assert moved.read_bytes() == b'{"run_name": "old", "run_dir": '


def test_set_aside_never_overwrites(tmp_path, monkeypatch, caplog):
    """Two set-asides in the same microsecond get distinct names; both contents survive."""
    fixed = dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=dt.UTC)

    class Frozen(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return fixed

    monkeypatch.setattr(records, "dt", types.SimpleNamespace(datetime=Frozen, UTC=dt.UTC))
    paths = []
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for i in range(3):
            (tmp_path / "champion.json").write_bytes(f"garbage {i}".encode())
            paths.append(
                records.set_aside(tmp_path, "champion.json", f"test {i}", consequence=champion_state.NO_CHAMPION)
            )
    assert [p.name for p in paths] == [
        "champion.json.20240506T070809.123456Z",
        "champion.json.20240506T070809.123456Z-1",
        "champion.json.20240506T070809.123456Z-2",
    ]
    assert [p.read_bytes() for p in paths] == [b"garbage 0", b"garbage 1", b"garbage 2"]
    assert len(_warnings(caplog)) == 3
    assert all("as if there were no champion" in r.getMessage() for r in _warnings(caplog))


def test_set_aside_a_directory_and_a_missing_name(tmp_path, caplog):
    d = tmp_path / "stale"
    (d / "inner").mkdir(parents=True)
    (d / "inner" / "f.bin").write_bytes(b"\x00\x01")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        moved = records.set_aside(tmp_path, "stale", "unreadable checkpoint", consequence="it is ignored")
    assert not d.exists() and moved.parent == tmp_path / "corrupt-state"
    assert (moved / "inner" / "f.bin").read_bytes() == b"\x00\x01"
    (record,) = _warnings(caplog)
    assert "unreadable checkpoint" in record.getMessage() and str(moved) in record.getMessage()
    with pytest.raises(FileNotFoundError):
        records.set_aside(tmp_path, "nothing-here", "x")


def test_write_champion_is_atomic(tmp_path, monkeypatch):
    run = _run_dir(tmp_path)
    out = tmp_path / "out"
    champion_state.write_champion(out, _record(run))  # creates out
    before = (out / "champion.json").read_bytes()

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError):
        champion_state.write_champion(out, _record(run, run_name="other"))
    monkeypatch.undo()
    assert (out / "champion.json").read_bytes() == before
    assert sorted(p.name for p in out.iterdir()) == ["champion.json"]  # no temporary file left


# MARK: history.jsonl


def _row(name, nll=0.3, promoted=True):
    return {"run_name": name, "accuracy": 0.9, "nll": nll, "promoted": promoted, "finished_at": "2024-01-01T00:00:00"}


def test_history_with_corrupt_lines_keeps_every_intact_row(tmp_path, caplog):
    good = [_row("a"), _row("c"), _row("d")]
    bad = [
        b'{"run_name": "b", "nll": 0.',  # cut mid-write
        b'\xff\xfe{"run_name": "x"}\x80',  # not UTF-8
        b"[1, 2, 3]",  # JSON, but not an object
        b'{"run_name": "e", "acc',  # the last line, truncated, without a newline
    ]
    lines = [json.dumps(good[0]).encode(), bad[0], json.dumps(good[1]).encode(), bad[1], b"", bad[2]]
    lines += [json.dumps(good[2]).encode(), bad[3]]
    path = tmp_path / "history.jsonl"
    path.write_bytes(b"\n".join(lines))

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        rows = champion_state.read_history(tmp_path)

    assert rows == good
    # independent check: the file now holds exactly the intact rows, in order
    assert [json.loads(line) for line in path.read_text().splitlines()] == good
    (aside,) = _corrupt_files(tmp_path)
    assert aside.name.startswith("history.jsonl.") and aside.name.endswith(".bad-lines")
    assert aside.read_bytes() == b"".join(line + b"\n" for line in bad)
    (record,) = _warnings(caplog)
    message = record.getMessage()
    assert str(path) in message and str(aside) in message
    assert "2, 4, 6, 8" in message  # 1-based line numbers of the bad lines
    # read again: nothing more to set aside
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert champion_state.read_history(tmp_path) == good
    assert not _warnings(caplog) and len(_corrupt_files(tmp_path)) == 1


def test_intact_history_lines_are_kept_byte_for_byte(tmp_path):
    """Rewriting after a bad line does not re-serialise the intact ones."""
    odd = b'{ "run_name" : "spaced",   "nll": 1.50 }'
    (tmp_path / "history.jsonl").write_bytes(odd + b"\nnot json\n")
    assert champion_state.read_history(tmp_path) == [{"run_name": "spaced", "nll": 1.5}]
    assert (tmp_path / "history.jsonl").read_bytes() == odd + b"\n"


def test_append_history_is_idempotent_per_run_name(tmp_path):
    first = champion_state.append_history(tmp_path, _row("r1", nll=0.5, promoted=False))
    again = champion_state.append_history(tmp_path, _row("r1", nll=0.4, promoted=True))  # a retried task
    assert first == [_row("r1", nll=0.5, promoted=False)]
    assert again == [_row("r1", nll=0.4, promoted=True)]
    both = champion_state.append_history(tmp_path, _row("r2"))
    assert both == [_row("r1", nll=0.4, promoted=True), _row("r2")]
    on_disk = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert on_disk == both
    # replacing r1 keeps its place
    assert champion_state.append_history(tmp_path, _row("r1", nll=0.1)) == [_row("r1", nll=0.1), _row("r2")]


def test_append_history_collapses_old_duplicates_and_skips_corrupt_lines(tmp_path, caplog):
    """A history written by the old code: a run appended twice, then a torn line."""
    lines = [_row("r1", nll=0.9), _row("r0"), _row("r1", nll=0.8)]
    text = "".join(json.dumps(r) + "\n" for r in lines) + '{"run_name": "r2", "nl'
    (tmp_path / "history.jsonl").write_text(text)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        rows = champion_state.append_history(tmp_path, _row("r1", nll=0.7))
    assert rows == [_row("r1", nll=0.7), _row("r0")]
    assert [json.loads(x) for x in (tmp_path / "history.jsonl").read_text().splitlines()] == rows
    assert len(_warnings(caplog)) == 1
    (aside,) = _corrupt_files(tmp_path)
    assert aside.read_bytes() == b'{"run_name": "r2", "nl\n'


def test_append_history_failure_keeps_the_old_file(tmp_path, monkeypatch):
    champion_state.append_history(tmp_path, _row("r1"))
    before = (tmp_path / "history.jsonl").read_bytes()

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError):
        champion_state.append_history(tmp_path, _row("r2"))
    monkeypatch.undo()
    assert (tmp_path / "history.jsonl").read_bytes() == before
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_concurrent_appends_lose_no_row(tmp_path):
    names = [f"t{t}-r{i}" for t in range(6) for i in range(8)]

    def worker(t):
        for i in range(8):
            champion_state.append_history(tmp_path, _row(f"t{t}-r{i}"))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    rows = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert sorted(r["run_name"] for r in rows) == sorted(names)


# MARK: the promotion policy that uses this module


def test_compare_with_champion_survives_a_damaged_state_and_a_retry(tmp_path, caplog):
    """The bug report end to end: garbage champion + corrupt history, the step runs twice."""
    from ensemble_core.config import PipelineConfig
    from ensemble_core.runs import Evaluation
    from ensemble_core.runs.champion.promotion import promote
    from ensemble_core.runs.results import EvaluatorResult

    out = tmp_path / "out"
    out.mkdir()
    dead = tmp_path / "runs" / "old-champion"
    (out / "champion.json").write_text(json.dumps(_record(dead)))
    (out / "history.jsonl").write_text(json.dumps(_row("old-champion")) + "\n\x00\x00garbage\n")
    run = _run_dir(tmp_path, "new-run")
    test = {"ensemble": {"accuracy": 0.8, "nll": 0.6, "brier": 0.2, "ece": 0.05}}
    evaluation = Evaluation(results={"test": EvaluatorResult(name="test", metrics=test)})
    cfg = PipelineConfig()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        results = [promote(cfg, None, "new-run", run, evaluation, out).to_json() for _ in range(2)]
    first, retry = results
    assert first["promoted"] and first["reason"] == "no champion yet" and first["champion"] is None
    assert retry["champion_run"] == "new-run" and retry["reason"].startswith("challenger nll")  # vs itself
    assert [r["run_name"] for r in retry["history"]] == ["old-champion", "new-run"]
    on_disk = [json.loads(x) for x in (out / "history.jsonl").read_text().splitlines()]
    assert [r["run_name"] for r in on_disk] == ["old-champion", "new-run"]
    assert json.loads((out / "champion.json").read_text())["run_name"] == "new-run"
    assert not dead.exists()
    assert len(_warnings(caplog)) == 2  # one for the pointer, one for the history line


@pytest.mark.parametrize("raised", ["CheckpointError", "TypeError"])
def test_only_a_damaged_champion_run_sets_the_pointer_aside(tmp_path, monkeypatch, caplog, raised):
    """A champion measured on another data config is re-evaluated. When its run cannot be
    (a damaged checkpoint: CheckpointError) the pointer is set aside and the challenger is
    promoted; a programming error (TypeError) propagates and champion.json stays."""
    from ensemble_core.config import PipelineConfig
    from ensemble_core.errors import CheckpointError
    from ensemble_core.runs import Evaluation
    from ensemble_core.runs.champion import promotion
    from ensemble_core.runs.results import EvaluatorResult

    out = tmp_path / "out"
    out.mkdir()
    old = _run_dir(tmp_path, "old-champion")
    pointer = json.dumps(_record(old, data={"name": "mnist5k", "val_fraction": 0.2}))
    (out / "champion.json").write_text(pointer)
    error = {"CheckpointError": CheckpointError("checkpoint 3 is damaged"), "TypeError": TypeError("a bug")}[raised]

    def unreadable(directory, **options):
        raise error

    monkeypatch.setattr(promotion, "EnsembleCheckpointer", unreadable)
    test = {"ensemble": {"accuracy": 0.8, "nll": 0.6, "brier": 0.2, "ece": 0.05}}
    evaluation = Evaluation(results={"test": EvaluatorResult(name="test", metrics=test)})
    run = _run_dir(tmp_path, "new-run")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        if raised == "TypeError":
            with pytest.raises(TypeError, match="a bug"):
                promotion.promote(PipelineConfig(), None, "new-run", run, evaluation, out)
            assert (out / "champion.json").read_text() == pointer and _corrupt_files(out) == []
            return
        decision = promotion.promote(PipelineConfig(), None, "new-run", run, evaluation, out).to_json()
    assert decision["promoted"] and decision["reason"] == "no champion yet"
    assert json.loads((out / "champion.json").read_text())["run_name"] == "new-run"
    (moved,) = _corrupt_files(out)
    assert moved.read_text() == pointer
