from pathlib import Path

import pytest
import yaml

from ensemble_core.config import PipelineConfig, load_config
from ensemble_core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def test_default_yaml_equals_builtin_defaults():
    assert load_config(ROOT / "configs" / "default.yaml") == PipelineConfig()


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")))
def test_every_config_validates_and_documents_its_command(path):
    load_config(path)
    first = path.read_text().splitlines()[0]
    assert first == f"# python -m flows.train_ensemble --config configs/{path.name}"


def test_required_keys_exist():
    cfg = PipelineConfig()
    for key in (
        "seed",
        "ensemble.size",
        "train.epochs",
        "train.batch_size",
        "train.learning_rate",
        "data.name",
        "model.name",
        "mesh.data",
    ):
        node = cfg
        for part in key.split("."):
            node = getattr(node, part)
        assert node is not None or key == "mesh.ensemble"


def test_overrides_are_parsed_as_yaml():
    cfg = load_config(None, ["ensemble.size=4", "train.learning_rate=0.05", "model.hidden_sizes=[32, 16]"])
    assert cfg.ensemble.size == 4
    assert cfg.train.learning_rate == 0.05
    assert cfg.model.hidden_sizes == (32, 16)


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (["train.lr=0.1"], "unknown config key 'train.lr'"),
        (["bogus=1"], "unknown config key 'bogus'"),
        (["train.epochs=many"], "config key 'train.epochs'"),
        (["train.learning_rate=-1"], "config key 'train.learning_rate'"),
        (["train.learning_rate=0"], "config key 'train.learning_rate'"),
        (["ensemble.size=0"], "config key 'ensemble.size'"),
        (["model.name=resnet"], "config key 'model.name'"),
        (["mesh.data=0"], "config key 'mesh.data'"),
        (["train.batch_size=0"], "config key 'train.batch_size'"),
        (["train.momentum=1.5"], "config key 'train.momentum'"),
        (["train.optimizer=lion"], "config key 'train.optimizer'"),
        (["trainepochs"], "has no '='"),
    ],
)
def test_bad_values_name_the_key(overrides, fragment):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert fragment in str(err.value)
    assert "fix" in str(err.value)


def test_unreadable_and_non_yaml_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text(yaml.safe_dump([1, 2]))
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(scalar)
