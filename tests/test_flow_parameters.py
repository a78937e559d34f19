"""The training flow's parameters: one typed ``config`` (what the CLI passes, what the
Prefect form shows), and the per-section parameters of the last release, deprecated."""

import pytest

from ensemble_core.config import PipelineConfig, load_config
from ensemble_core.errors import ConfigError
from flows.train_ensemble import as_config, deprecated_parameter, train_ensemble


def _leaf_fields(schema: dict, name: str, path: str = "") -> list[tuple[str, dict]]:
    """(dotted path, property) for every leaf field of definition ``name``."""
    out = []
    for key, prop in schema["definitions"][name]["properties"].items():
        ref = prop.get("$ref") or next((a["$ref"] for a in prop.get("allOf", []) if "$ref" in a), None)
        if ref:
            out += _leaf_fields(schema, ref.rsplit("/", 1)[1], f"{path}{key}.")
        else:
            out.append((f"{path}{key}", prop))
    return out


def _config_leaves(model, path: str = ""):
    """The dotted paths of every field of a pydantic config, nested sections expanded."""
    for name, field in model.model_fields.items():
        nested = getattr(field.annotation, "model_fields", None)
        if nested and field.annotation.__name__.endswith("Config"):
            yield from _config_leaves(field.annotation, f"{path}{name}.")
        elif path:
            yield f"{path}{name}"


def test_the_form_shows_every_config_field_with_its_description():
    """The deployment's parameter schema (what the Prefect UI renders as a form) holds the
    whole config under one parameter, every field with the description of its schema."""
    from prefect.utilities.callables import parameter_schema

    schema = parameter_schema(train_ensemble.fn).model_dump()
    assert schema["properties"]["config"]["$ref"].endswith("/PipelineConfig")
    leaves = dict(_leaf_fields(schema, "PipelineConfig"))
    expected = set(_config_leaves(PipelineConfig))
    assert expected and expected <= set(leaves), sorted(expected - set(leaves))
    missing = [path for path, prop in leaves.items() if not prop.get("description")]
    assert not missing, missing


def test_a_validated_config_is_passed_through_and_a_mapping_validated():
    cfg = load_config(None, ["ensemble.size=3"])
    assert as_config(cfg) is cfg  # the command line validated it already
    assert as_config({"ensemble": {"size": 3}}) == cfg
    assert as_config(None) == load_config(None)


def test_deprecated_section_parameters_replace_their_section():
    """As when each section was a parameter of its own: the section given replaces the
    config's (its unset keys take the defaults), the other sections stay."""
    got = as_config({"ensemble": {"size": 3}, "train": {"epochs": 7}}, {"train": {"batch_size": 32}, "seed": 5})
    assert got == load_config(None, ["ensemble.size=3", "train.batch_size=32", "seed=5"])
    assert "'train' is deprecated" in deprecated_parameter("train") and "fix: " in deprecated_parameter("train")


@pytest.mark.parametrize(
    ("config", "needle"),
    [("ensemble.size=3", "parameter config is a str"), ({"seed": -1}, "config key 'seed'"), ({"nope": 1}, "nope")],
)
def test_bad_config_parameters_are_refused_in_one_line(config, needle):
    with pytest.raises(ConfigError) as err:
        as_config(config)
    assert needle in str(err.value) and "fix:" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("evaluators", "accepted"),
    [
        (["test", "rotation"], True),
        ({"test": {}, "quarter": {"type": "rotation", "degrees": [0, 90]}}, True),
        (["nope"], False),
        ({"test": {"type": "nope"}}, False),
    ],
)
def test_the_server_side_schema_takes_both_forms_of_eval_evaluators(evaluators, accepted):
    """The Prefect server validates a deployment's parameters against the flow's JSON schema
    (jsonschema) before it creates the flow run: the list of names and the mapping both
    pass it, an unknown evaluator type does not."""
    import jsonschema
    from prefect.utilities.callables import parameter_schema

    schema = parameter_schema(train_ensemble.fn).model_dump()
    schema = {"type": "object", "properties": schema["properties"], "definitions": schema["definitions"]}
    params = {"config": {"eval": {"evaluators": evaluators}}}
    if accepted:
        jsonschema.validate(params, schema)
        assert as_config(params["config"]).eval.evaluators["test"].type == "test"
    else:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(params, schema)
