"""A stop inside a run's sub-directory names the run to rerun (issue 43, class 6): a stop
during a hyper-deep run's stratification said ``--run-name stratified`` (the pool's
directory), and following it trained a new run from scratch."""

from __future__ import annotations

import pytest

from ensemble_core.runs.storage.layout import RunDir, owning_run
from ensemble_core.runs.training.trainer import TrainingRun


@pytest.fixture
def out(tmp_path):
    run = tmp_path / "nightly-3"
    (run / "stratified" / "groups" / "1").mkdir(parents=True)
    (run / "stratified" / "plan.json").write_text("{}")
    (run / "groups" / "0").mkdir(parents=True)
    (tmp_path / "stratified" / "groups" / "2").mkdir(parents=True)  # a run the user named 'stratified'
    return tmp_path


@pytest.mark.parametrize(
    ("where", "run"),
    [
        ("nightly-3", "nightly-3"),
        ("nightly-3/groups/0", "nightly-3"),
        ("nightly-3/stratified", "nightly-3"),
        ("nightly-3/stratified/groups/1", "nightly-3"),
        ("stratified", "stratified"),
        ("stratified/groups/2", "stratified"),
    ],
)
def test_every_training_directory_names_the_run_it_belongs_to(out, where, run):
    assert owning_run(out / where).path == out / run
    # the trainer's name for its stop messages (resume_fix) is that run's
    group = 1 if where.endswith(("groups/0", "groups/1", "groups/2")) else None
    training = TrainingRun(cfg=None, dataset=None, run=RunDir(out / where), setup=None, group=group)  # type: ignore[arg-type]
    assert training.run_name == run
