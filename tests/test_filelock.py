"""The one flock primitive: conflicts between open files (also in one process), the
holder's text in the refusal, shared locks, and release on close."""

import os

import pytest

from ensemble_core.filelock import LockHeldError, flocked


def test_an_exclusive_lock_refuses_a_second_open_and_names_its_holder(tmp_path):
    path = tmp_path / "x.lock"
    with flocked(path) as fd:
        os.pwrite(fd, b"4242", 0)
        with pytest.raises(LockHeldError) as held, flocked(path, blocking=False):
            pass
        assert held.value.holder == "4242"
        with pytest.raises(LockHeldError), flocked(path, shared=True, blocking=False):
            pass
    with flocked(path, blocking=False):  # released when the first descriptor closed
        pass


def test_shared_locks_coexist_and_keep_out_an_exclusive_one(tmp_path):
    path = tmp_path / "x.lock"
    with (
        flocked(path, shared=True),
        flocked(path, shared=True, blocking=False),
        pytest.raises(LockHeldError),
        flocked(path, blocking=False),
    ):
        pass


def test_without_create_a_missing_file_is_not_made(tmp_path):
    with pytest.raises(FileNotFoundError), flocked(tmp_path / "missing.lock", create=False):
        pass
    assert not (tmp_path / "missing.lock").exists()
