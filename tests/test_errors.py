"""The errors' one constructor: problem plus fix, one line, intact across processes."""

from __future__ import annotations

import pickle

import pytest

from ensemble_core.errors import CheckpointError, ConfigError, EnsembleError, PreemptedError, resume_fix


def test_problem_and_fix_make_one_message():
    err = PreemptedError("training stopped at epoch 2", fix=resume_fix("nightly"))
    assert str(err) == ("training stopped at epoch 2; fix: rerun with the same run name (run_name nightly) to resume")
    assert str(CheckpointError("checkpoint 3 is damaged")) == "checkpoint 3 is damaged"


@pytest.mark.parametrize("cls", [EnsembleError, ConfigError, PreemptedError])
def test_an_error_crosses_a_process_boundary_unchanged(cls):
    """Dask and the JAX-process launcher pickle errors: the message must survive."""
    err = cls("ensemble.size=0 is out of range", fix="set ensemble.size >= 1")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls and str(back) == str(err) and str(back).count("; fix: ") == 1
