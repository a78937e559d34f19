"""The reliability sweep's verdict (``tests/system/sweep.py``) on made-up processes: a
refusal is clean only when its one line names the case's cause."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.system.sweep import Case, Ctx, Proc, case_table, verdict


def _case(expect: int, cause: str | None) -> Case:
    return Case("train CLI", "c", "what", expect, lambda ctx: None, "err", cause)


def _judge(c: Case, err: str, rc: int = 2) -> str:
    proc = Proc(rc, "", err, ["python", "-m", "x"], 0.1)
    ctx = Ctx(Path("."), Path("."), Path("."), {}, procs=[proc])
    return verdict(c, ctx, proc, True)


def test_the_right_cause_is_clean_and_another_is_wrong_cause():
    c = _case(2, r"16-bit|I;16")
    assert _judge(c, "error: image a.png is 16-bit grey (I;16); fix: ...\n") == "clean"
    # the wording the issue found: a true refusal for the wrong reason
    wrong = "error: cannot write 'img' (AssertionError: No examples were yielded.); fix: check it is writable\n"
    assert _judge(_case(2, r"empty|no (test )?images"), wrong) == "wrong-cause"
    # the cause is read before 'fix:' only: a fix that mentions it does not count
    assert _judge(c, "error: something else; fix: convert to 16-bit\n") == "wrong-cause"


def test_the_other_verdicts_come_first():
    c = _case(2, "anything")
    assert _judge(c, "error: a\nerror: b; fix: c\n") == "no-one-line"
    assert _judge(c, "Traceback (most recent call last):\nerror: anything; fix: c\n") == "traceback"
    assert _judge(c, "error: anything; fix: c\n", rc=1) == "wrong-exit"


def test_a_failing_case_must_name_its_cause():
    _, case = case_table()
    with pytest.raises(ValueError, match="needs cause="):
        case("train CLI", "no-cause", 2, "what")
    with pytest.raises(ValueError, match="needs cause="):
        case("train CLI", "passing-with-cause", 0, "what", cause="x")
