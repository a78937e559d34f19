"""The one loop over member groups (:func:`ensemble_core.runs.training.groups.train_groups`): each
group's call goes through the caller's mapper, results come back in group order, and the
caller's gather joins them; no training (stand-in calls), instant."""

from __future__ import annotations

import pytest

from ensemble_core import runs
from ensemble_core.config import load_config
from ensemble_core.runs.training.groups import map_groups, sequential


def test_map_groups_keeps_the_order_of_the_calls_whatever_the_mapper_does():
    def backwards(fn, calls):  # runs the last call first, returns in call order
        done = {i: fn(*args) for i, args in reversed(list(enumerate(calls)))}
        return [done[i] for i in range(len(calls))]

    calls = [(1, 2), (3, 4), (5, 6)]
    assert map_groups(lambda a, b: a * b, calls) == [2, 12, 30]
    assert map_groups(lambda a, b: a * b, calls, backwards) == [2, 12, 30]
    assert sequential(lambda a, b: a + b, calls) == [3, 7, 11]


def test_a_mapper_that_loses_a_group_is_an_error():
    with pytest.raises(ValueError, match="2 results for 3 member groups"):
        map_groups(lambda x: x, [(1,), (2,), (3,)], lambda fn, calls: [fn(*c) for c in calls[:2]])


def test_train_groups_maps_each_groups_keys_then_gathers(tmp_path):
    cfg = load_config(None, ["ensemble.size=4", "distributed.member_groups=2"])
    mapped, gathered = [], []

    def mapper(fn, calls):
        mapped.append([c[3] for c in calls])
        return [fn(*c) for c in calls]

    def group_call(cfg_, dataset, run_dir, group):
        assert run_dir == str(tmp_path)
        return f"summary-{group}"

    def gather(cfg_, dataset, run_dir, summaries):
        gathered.append((run_dir, summaries))
        return "joined"

    out = runs.train_groups(cfg, None, tmp_path, group_call=group_call, gather=gather, mapper=mapper)
    assert out == "joined" and mapped == [[0, 1]]
    assert gathered == [(str(tmp_path), ["summary-0", "summary-1"])]
