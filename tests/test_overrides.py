"""Overrides change what they say and nothing else (issue 43, class 7): a dotted override
changes one key, a sub-section given in part keeps the documented defaults of the keys it
leaves out, a mapping for a section merges into it, a free-form mapping is replaced."""

from __future__ import annotations

from pathlib import Path

import pytest

from ensemble_core.config import PipelineConfig, load_config

ROOT = Path(__file__).resolve().parents[1]
DEFAULTS = PipelineConfig()  # the documented defaults (configs/default.yaml)


@pytest.mark.parametrize("section", ["selection", "first_selection"])
def test_a_dotted_override_changes_one_key_of_a_sub_section(section):
    cfg = load_config(None, [f"ensemble.{section}.sorted_init=2"])
    got = getattr(cfg.ensemble, section).model_dump()
    expected = {**getattr(DEFAULTS.ensemble, section).model_dump(), "sorted_init": 2}
    assert got == expected


def test_the_two_selections_keep_their_own_documented_defaults():
    # bagged without replacement for the ensemble; greedy with replacement for the first selection
    assert DEFAULTS.ensemble.selection.model_dump() == {"replacement": False, "sorted_init": 0, "bags": 20}
    assert DEFAULTS.ensemble.first_selection.model_dump() == {"replacement": True, "sorted_init": 0, "bags": 0}


def test_a_sub_section_given_in_part_in_a_file_keeps_the_field_defaults(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("ensemble:\n  selection:\n    sorted_init: 3\n")
    got = load_config(path).ensemble.selection.model_dump()
    assert got == {**DEFAULTS.ensemble.selection.model_dump(), "sorted_init": 3}


def test_a_mapping_for_a_section_merges_into_the_files_section():
    file_cfg = load_config(ROOT / "configs" / "fashion_mnist_best.yaml")
    cfg = load_config(ROOT / "configs" / "fashion_mnist_best.yaml", ["train={epochs: 3, momentum: 0.8}"])
    assert cfg.train.model_dump() == {**file_cfg.train.model_dump(), "epochs": 3, "momentum": 0.8}
    nested = load_config(ROOT / "configs" / "default.yaml", ["ensemble={selection: {bags: 5}}"])
    assert nested.ensemble.size == 8 and nested.ensemble.selection.model_dump() == {
        **DEFAULTS.ensemble.selection.model_dump(),
        "bags": 5,
    }


def test_a_free_form_mapping_is_replaced_by_the_override():
    cfg = load_config(ROOT / "configs" / "default.yaml", ["eval.evaluators={test: {}, rotation: {}}"])
    assert list(cfg.eval.evaluators) == ["test", "rotation"]
    options = load_config(None, ["model.name=resnet", "model.options={depth: 20}", "model.options={width: 8}"])
    assert options.model.options == {"width": 8}
