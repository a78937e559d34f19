"""State and cache files the project reads, damaged for real: set aside or built again with
one warning, never a traceback, never silently trusted."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from ensemble_core import data, runs
from ensemble_core.runs.evaluation.cache import cached_arrays, derived_dir
from tests.ensembles import tiny_config


@pytest.fixture(scope="module")
def selecting_run(tmp_path_factory, tfds_dir):
    """A run of 3 members with a validation split, greedy selection of 2 picks and a
    fitted temperature: its selection.json is what prediction uses."""
    cfg = tiny_config(
        tfds_dir,
        "ensemble.size=3",
        "data.validation_fraction=0.25",
        "ensemble.select_size=2",
        "eval.temperature_scaling=true",
    )
    result = runs.run(cfg, tmp_path_factory.mktemp("sel"), "r")
    return result.run_dir.path


DAMAGE = {
    "garbage": b"\x00\x01 not json",
    "not-an-object": b"[1, 2]",
    "member-out-of-range": json.dumps({"members": [0, 7], "temperature": 1.2}).encode(),
    "no-members": json.dumps({"members": [], "temperature": None}).encode(),
    "negative-temperature": json.dumps({"members": [0, 1], "temperature": -1.0}).encode(),
    "boolean-member": json.dumps({"members": [True, 1], "temperature": None}).encode(),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", DAMAGE)
def test_a_damaged_selection_is_set_aside_with_one_warning(selecting_run, mnist_test, caplog, case):
    path = selecting_run / "selection.json"
    intact = path.read_bytes()
    images = mnist_test[0][:20]
    with_selection = runs.predict_images(selecting_run, images)
    assert np.isfinite(with_selection["temperature"])  # the fixture's run does use its selection
    try:
        path.write_bytes(DAMAGE[case])
        with caplog.at_level(logging.WARNING):
            got = runs.predict_images(selecting_run, images)
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and "selection.json" in r.getMessage()]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        assert not path.exists()
        (aside,) = (selecting_run / "corrupt-state").glob("selection.json.*")
        assert aside.read_bytes() == DAMAGE[case]
        # every healthy member, no temperature: the mean of the three members' probabilities
        assert got["members"].tolist() == [0, 1, 2] and np.isnan(got["temperature"])
        np.testing.assert_allclose(got["ensemble_probs"], got["member_probs"].mean(0), rtol=1e-6)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            runs.predict_images(selecting_run, images)  # set aside once: no second warning
        assert not [r for r in caplog.records if "selection.json" in r.getMessage()]
    finally:
        path.write_bytes(intact)
        for p in (selecting_run / "corrupt-state").glob("selection.json.*"):
            p.unlink()
    np.testing.assert_array_equal(runs.predict_images(selecting_run, images)["members"], with_selection["members"])


def test_a_readable_cache_with_the_wrong_rows_is_built_again(tfds_dir, caplog):
    """Regression: a derived-set cache file that reads fine but holds another number of
    rows failed every later run (IndexError) and was never rebuilt."""
    info = data.prepare(data.EMBEDDED, tfds_dir)
    key = f"test-rows-{np.random.default_rng().integers(1 << 30)}"
    want = {"images": np.arange(24, dtype=np.uint8).reshape(6, 2, 2, 1)}
    path = derived_dir(info) / f"{key}.npz"
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, images=want["images"][:4])  # readable, two rows short
    with caplog.at_level(logging.WARNING):
        got = cached_arrays(info, key, lambda: want, {"images": (6, 2, 2, 1)})
    np.testing.assert_array_equal(got["images"], want["images"])
    assert "instead of (6, 2, 2, 1)" in caplog.text
    with np.load(path) as f:
        np.testing.assert_array_equal(f["images"], want["images"])  # the file itself was rebuilt


@pytest.mark.slow
def test_the_rotation_evaluator_rebuilds_a_wrong_cache(tmp_path, tfds_dir):
    """End to end: a rotation run, its cached rotated test set replaced by a readable file of
    the wrong length, and the same run evaluated again gives the same figures."""
    cfg = tiny_config(tfds_dir, "eval.evaluators=[test,rotation]")
    first = runs.run(cfg, tmp_path, "r")
    dataset = data.prepare(cfg.data.name, cfg.data.data_dir)
    from ensemble_core.evaluators import rotation, shift_base

    degrees = "_".join(f"{x:g}" for x in rotation.Options().degrees)
    cache = derived_dir(dataset) / f"rotation-v{shift_base.CACHE_VERSION}-n100-{degrees}.npz"  # this run's cache
    with np.load(cache) as f:
        images = f["images"]
    np.savez(cache, images=images[:7])
    again = runs.run(cfg, tmp_path, "r")  # a finished run: evaluated again
    assert again.evaluation.results["rotation"].metrics == first.evaluation.results["rotation"].metrics
