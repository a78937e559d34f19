"""A stratification plan records what its first selection was made with, and a resume
that changes it is refused (issue 43, class 7): changing ``ensemble.first_selection.*``
after a stop was accepted while the old plan was reused, and the report then showed
settings the plan was not made with."""

from __future__ import annotations

from pathlib import Path

import pytest

from ensemble_core.config import load_config
from ensemble_core.errors import IncompatibleRunError
from ensemble_core.runs.ensemble.pool import first_selection_settings, saved_plan
from ensemble_core.runs.storage.layout import RunDir
from ensemble_core.runs.storage.records import write_plan
from ensemble_core.stratification import StratificationPlan

ROOT = Path(__file__).resolve().parents[1]
HYPER = ROOT / "configs" / "hyper.yaml"


def _plan(run: RunDir, cfg, made_with: bool = True) -> None:
    record = {"members": [0, 3, 3], "multiplicities": {"0": 1, "3": 2}}
    if made_with:
        record["made_with"] = first_selection_settings(cfg)
    write_plan(
        run.stratified.path, StratificationPlan(settings=[0, 3], inits=cfg.ensemble.stratify, first_selection=record)
    )


def test_the_plan_is_kept_while_its_first_selection_settings_hold(tmp_path):
    cfg = load_config(HYPER)
    run = RunDir(tmp_path / "hyper-run")
    _plan(run, cfg)
    assert saved_plan(cfg, run).settings == [0, 3]
    # the final selection's size may change on resume: recorded, not compared
    smaller = load_config(HYPER, [f"ensemble.select_size={cfg.ensemble.select_size - 2}"])
    assert saved_plan(smaller, run).first_selection["made_with"]["select_size"] == cfg.ensemble.select_size


@pytest.mark.parametrize(
    "override",
    [
        "ensemble.first_selection.sorted_init=2",
        "ensemble.first_selection.replacement=false",
        "ensemble.first_selection.bags=5",
    ],
)
def test_a_changed_first_selection_after_the_plan_is_refused_naming_both(tmp_path, override):
    cfg = load_config(HYPER)
    run = RunDir(tmp_path / "hyper-run")
    _plan(run, cfg)
    changed = load_config(HYPER, [override])
    key = override.split("=")[0]
    with pytest.raises(IncompatibleRunError, match=f"made its stratification plan with {key}=") as caught:
        saved_plan(changed, run)
    assert f"{key} to " in str(caught.value) and "use a new run name" in str(caught.value)


def test_a_plan_from_before_the_record_is_kept(tmp_path):
    cfg = load_config(HYPER)
    run = RunDir(tmp_path / "hyper-run")
    _plan(run, cfg, made_with=False)
    assert saved_plan(load_config(HYPER, ["ensemble.first_selection.bags=5"]), run).settings == [0, 3]
