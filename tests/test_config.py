from pathlib import Path

import pytest

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
        (["model.name=resnet9000"], "config key 'model.name'"),
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
    scalar.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(scalar)


# MARK: refusals are one-line ConfigErrors that name the key and the fix


def _refused(path=None, overrides=None) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(path, overrides)
    message = str(err.value)
    assert len(message.splitlines()) == 1 and "\n" not in message, message
    assert "fix:" in message, message
    return message


@pytest.mark.parametrize(
    "text, key, lines",
    [
        ("seed: 1\ntrain:\n  epochs: 2\ntrain:\n  epochs: 3\n", "'train'", "lines 2 and 4"),
        ("train:\n  epochs: 2\n  batch_size: 4\n  epochs: 3\n", "'train.epochs'", "lines 2 and 4"),
        ("model:\n  name: mlp\n  name: cnn\n", "'model.name'", "lines 2 and 3"),
        ("seed: 1\nseed: 2\n", "'seed'", "lines 1 and 2"),
        ("train: {epochs: 1, learning_rate: 0.1, epochs: 2}\n", "'train.epochs'", "both on line 1"),
        ("data:\n  name: {a: 1, b: {c: 1, c: 2}}\n", "'data.name.b.c'", "both on line 2"),
    ],
)
def test_duplicate_keys_at_any_depth_are_refused(tmp_path, text, key, lines):
    path = tmp_path / "dup.yaml"
    path.write_text(text)
    message = _refused(path)
    assert f"key {key} twice ({lines})" in message
    assert str(path) in message


def test_merge_keys_still_override_without_being_duplicates(tmp_path):
    path = tmp_path / "merge.yaml"
    path.write_text("train:\n  <<: {epochs: 2, batch_size: 4}\n  epochs: 3\n")
    cfg = load_config(path)
    assert (cfg.train.epochs, cfg.train.batch_size) == (3, 4)


def test_duplicate_key_in_an_override_value_is_refused():
    message = _refused(None, ["train={epochs: 1, epochs: 2}"])
    assert "'epochs' twice" in message and "'train'" in message


@pytest.mark.parametrize(
    "content, fragment",
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "is binary"),
        (bytes(range(256)), "is binary"),
        (b"seed: 1\ndata:\n  name: caf\xe9\n", "not UTF-8 text (byte 0xe9"),
        (b"\xff\xfes\x00e\x00e\x00d\x00", "is binary"),  # UTF-16
        (b"\xc3\x28: 1\n", "not UTF-8 text"),
        (b"#" * ((1 << 20) + 1), "larger than 1048576 bytes"),
    ],
)
def test_files_that_are_not_text_configs_are_refused(tmp_path, content, fragment):
    path = tmp_path / "cfg.yaml"
    path.write_bytes(content)
    message = _refused(path)
    assert fragment in message and str(path) in message


def test_a_directory_and_odd_paths_are_refused(tmp_path):
    assert "is a directory" in _refused(tmp_path)
    assert "cannot read config file" in _refused(tmp_path / "nul\x00byte.yaml")
    assert "cannot read config file" in _refused(tmp_path / "line\nbreak.yaml")


def test_a_utf8_file_with_a_bom_and_a_file_of_exactly_the_limit_are_read(tmp_path):
    bom = tmp_path / "bom.yaml"
    bom.write_bytes(b"\xef\xbb\xbfseed: 3\n")
    assert load_config(bom).seed == 3
    exact = tmp_path / "exact.yaml"
    body = b"seed: 4\n"
    exact.write_bytes(body + b"#" * ((1 << 20) - len(body) - 1) + b"\n")
    assert load_config(exact).seed == 4


@pytest.mark.slow
def test_deep_nesting_and_huge_numbers_are_one_line_errors(tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("seed: " + "[" * 5000 + "]" * 5000 + "\n")
    _refused(deep)
    digits = tmp_path / "digits.yaml"
    digits.write_text("seed: 1" + "0" * 5000 + "\n")
    _refused(digits)
    assert "'seed'" in _refused(None, ["seed=1" + "0" * 5000])
    assert "'seed'" in _refused(None, ["seed=" + "[" * 5000 + "]" * 5000])
    assert "'train.learning_rate'" in _refused(None, ["train.learning_rate=1" + "0" * 5000])


@pytest.mark.parametrize(
    "override",
    [
        "train.learning_rate=.inf",
        "train.learning_rate=-.inf",
        "train.learning_rate=.nan",
        "train.learning_rate=nan",
        "train.learning_rate=inf",
        "train.learning_rate=1e400",
        "train.learning_rate=1.0e+400",
        "train.learning_rate=1e39",
        "train.learning_rate=0",
        "train.learning_rate=1e-300",
        "train.momentum=.nan",
        "train.momentum=.inf",
        "train.weight_decay=.inf",
        "train.weight_decay=.nan",
        "train.weight_decay=-0.1",
        "train.weight_decay=1e39",
        "train.weight_decay=1e-40",
        "train.momentum=0.999999999",
        "train.momentum=1",
        "train.momentum=-0.1",
    ],
)
def test_float_keys_refuse_inf_nan_and_out_of_range(override):
    key = override.split("=")[0]
    assert f"config key '{key}'" in _refused(None, [override])


def test_float_keys_refuse_inf_and_nan_in_files(tmp_path):
    path = tmp_path / "lr.yaml"
    path.write_text("train:\n  learning_rate: .inf\n  weight_decay: .nan\n")
    message = _refused(path)
    assert "'train.learning_rate'" in message and "'train.weight_decay'" in message


@pytest.mark.parametrize(
    "override",
    [
        "seed=-1",
        "seed=4294967296",
        f"seed={2**63}",
        f"seed={2**64}",
        "seed=1.5",
        "seed=.inf",
        "seed=[1, 2]",
        "seed={a: [1, {b: 2}]}",
        "train.epochs=4294967297",
        "train.batch_size=2147483648",
        "eval.batch_size=2147483648",
        "eval.ece_bins=1001",
    ],
)
def test_int_keys_out_of_range_are_refused(override):
    key = override.split("=")[0]
    assert f"config key '{key}'" in _refused(None, [override])


def test_max_seed_is_a_distinct_jax_key_and_one_more_is_refused():
    import jax
    import numpy as np

    from ensemble_core.config import MAX_SEED
    from ensemble_core.rngs import member_keys

    assert load_config(None, [f"seed={MAX_SEED}"]).seed == MAX_SEED
    # Independently of the schema: the largest accepted seed is a key of its own ...
    top = np.asarray(jax.random.key_data(jax.random.key(MAX_SEED)))
    assert not np.array_equal(top, np.asarray(jax.random.key_data(jax.random.key(0))))
    keys = member_keys(MAX_SEED, 2)["init"]
    assert np.isfinite(jax.random.normal(keys[1], (3,))).all()
    # ... while one more either fails in JAX or silently collides with seed 0 (x64 off).
    try:
        over = np.asarray(jax.random.key_data(jax.random.key(MAX_SEED + 1)))
    except OverflowError:
        pass
    else:
        assert np.array_equal(over, np.asarray(jax.random.key_data(jax.random.key(0))))
    assert "config key 'seed'" in _refused(None, [f"seed={MAX_SEED + 1}"])


def test_last_epoch_index_works_as_a_fold_in_and_one_more_epoch_is_refused():
    from ensemble_core.config import MAX_EPOCHS
    from ensemble_core.rngs import epoch_order, member_keys

    assert load_config(None, [f"train.epochs={MAX_EPOCHS}"]).train.epochs == MAX_EPOCHS
    order = epoch_order(member_keys(0, 1)["data"], MAX_EPOCHS - 1, 8, 4)
    assert order.shape == (2, 1, 4)
    assert "config key 'train.epochs'" in _refused(None, [f"train.epochs={MAX_EPOCHS + 1}"])


@pytest.mark.parametrize(
    "override, key",
    [
        ("model.hidden_sizes=[0]", "model.hidden_sizes.0"),
        ("model.hidden_sizes=[32, -1]", "model.hidden_sizes.1"),
        ("model.hidden_sizes=[65537]", "model.hidden_sizes.0"),
        ("model.hidden_sizes=[1.5]", "model.hidden_sizes.0"),
        ("model.hidden_sizes=[[32]]", "model.hidden_sizes.0"),
        ("model.hidden_sizes=32", "model.hidden_sizes"),
        ("model.hidden_sizes={a: 1}", "model.hidden_sizes"),
        ("model.hidden_sizes=[16384, 16385]", "model.hidden_sizes"),
        (
            "model.hidden_sizes=" + str([4096] * 18),
            "model.hidden_sizes",
        ),
        ("model.hidden_sizes=" + str([1] * 65), "model.hidden_sizes"),
        ("data.name=''", "data.name"),
        ("data.data_dir=''", "data.data_dir"),
        ('data.manual_dir="a\\0b"', "data.manual_dir"),
    ],
)
def test_unbuildable_model_shapes_are_refused(override, key):
    assert f"config key '{key}'" in _refused(None, [override])


@pytest.mark.parametrize("hidden_sizes", [(), (1,), (1,) * 64])
def test_smallest_accepted_model_shapes_build_and_run(hidden_sizes):
    import jax
    import jax.numpy as jnp

    from ensemble_core.models import build_model

    cfg = load_config(None, ["model.name=mlp", f"model.hidden_sizes={list(hidden_sizes)}"])
    model = build_model(cfg.model, 10)
    x = jnp.ones((2, 28, 28, 1))
    params = model.init(jax.random.key(0), x)
    logits = model.apply(params, x)
    assert logits.shape == (2, 10) and bool(jnp.isfinite(logits).all())


@pytest.mark.parametrize("hidden_sizes", [(65536,), (16384, 16384), (4096,) * 17])
def test_largest_accepted_model_shapes_build(hidden_sizes):
    """Shapes only (jax.eval_shape): the largest accepted widths trace and initialise."""
    import jax

    from ensemble_core.models import build_model

    cfg = load_config(None, ["model.name=mlp", f"model.hidden_sizes={list(hidden_sizes)}"])
    model = build_model(cfg.model, 10)
    x = jax.ShapeDtypeStruct((2, 28, 28, 1), "float32")
    params = jax.eval_shape(model.init, jax.random.key(0), x)
    assert jax.eval_shape(model.apply, params, x).shape == (2, 10)


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (["train=5", "train.epochs=3"], "config key 'train' is not a section"),
        (["train=[1, 2]", "train.epochs=3"], "config key 'train' is not a section"),
        (["train=[1, 2]"], "config key 'train'"),
        (["train.learning_rate=[0.1, 0.2]"], "config key 'train.learning_rate'"),
        (["train.optimizer={name: sgd}"], "config key 'train.optimizer'"),
        (["ensemble.size=[[1], {a: [2]}]"], "config key 'ensemble.size'"),
        (['train.optimizer="a\\nb\\rc\\u2028d"'], "config key 'train.optimizer'"),
        (["model.hidden_sizes=" + str([[1] * 100] * 100)], "config key 'model.hidden_sizes.0'"),
    ],
)
def test_nested_or_list_values_where_a_scalar_belongs_stay_one_line(overrides, fragment):
    message = _refused(None, overrides)
    assert fragment in message
    assert len(message) < 4000


def test_an_empty_section_in_a_file_can_be_set_by_an_override(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("train:\n")
    assert load_config(path, ["train.epochs=3"]).train.epochs == 3


def test_largest_and_smallest_accepted_hyperparameters_are_finite_nonzero_float32_in_optax():
    import jax.numpy as jnp
    import numpy as np

    from ensemble_core.config import FLOAT32_MAX, FLOAT32_MIN_NORMAL
    from ensemble_core.train import make_optimizer

    for lr, wd, momentum in [(FLOAT32_MAX, FLOAT32_MAX, 0.9999999), (FLOAT32_MIN_NORMAL, FLOAT32_MIN_NORMAL, 0.0)]:
        cfg = load_config(
            None, [f"train.learning_rate={lr!r}", f"train.weight_decay={wd!r}", f"train.momentum={momentum}"]
        )
        for optimizer in ("sgd", "adamw"):
            train = cfg.train.model_copy(update={"optimizer": optimizer})
            hp = make_optimizer(train).init({"w": jnp.ones(2)}).hyperparams
            assert np.isfinite(hp["learning_rate"]) and hp["learning_rate"] > 0
            if optimizer == "adamw":
                assert np.isfinite(hp["weight_decay"]) and hp["weight_decay"] > 0
            elif momentum:
                assert hp["momentum"] < 1
    # The divergence tests train with an absurd but representable learning rate on purpose.
    assert load_config(None, ["train.learning_rate=1e30"]).train.learning_rate == 1e30
