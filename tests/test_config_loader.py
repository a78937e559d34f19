"""The YAML loader keeps what every config means.

``tests/data/config_loader_recorded.json`` holds what the previous loader (PyYAML's
SafeLoader with a duplicate-key check, before ruamel.yaml replaced it) made of every file in
``configs/`` and of tricky ``--set`` overrides (YAML 1.1 booleans, octal and sexagesimal
numbers, merge keys, per-member hyperparameter lists): the validated config's
``model_dump(mode="json")``, each member's hyperparameters where ``ensemble.search`` is set, or
the one-line error. The test fails if the loader changes any of them, except the few cases
listed in ``CHANGED`` with the reason. It was recorded with the PyYAML loader by
``python -m tests.test_config_loader > tests/data/config_loader_recorded.json``; re-record
only when a change of meaning is intended, and say so in the commit.
"""

import json
import sys
from pathlib import Path

import pytest

from ensemble_core.config import load_config
from ensemble_core.config.eval_section import default_evaluators
from ensemble_core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "tests" / "data" / "config_loader_recorded.json"
SEP = " ;; "  # several overrides of one case

OVERRIDES = [
    # YAML 1.1 booleans and null
    *(f"ensemble.pad={v}" for v in ("yes", "no", "on", "off", "True", "y", "n")),
    *(f"data.name={v}" for v in ("no", "yes", "on", "null", "~", "NULL", "y", "n", "Y")),
    # scalars that look like other types
    *(f"data.name={v}" for v in ("2001-12-14", "1:30", "0x1f", "foo: bar: baz", "a # c", "'quoted'", "[a]")),
    *(f"data.name={v}" for v in ("!!str 3", "&a x", "*a", "%x", "@x", "`x", " spaced ", "1e3", "1.0e3", "1.0e-3")),
    # YAML 1.1 integers: octal 017, hex, binary, underscores, sexagesimal
    *(f"seed={v}" for v in ("0o17", "017", "0x1f", "1_000", "1:30", "+5", "0b101", "1e3", "1.0e3", "1.0e+3")),
    *(f"seed={v}" for v in ("1.0", ".5", "", "~", "true")),
    # floats
    *(f"train.learning_rate={v}" for v in ("1e-3", "1E-3", "1.e-3", ".1", "1_0.5", "1:30.5", "+.5", "0.")),
    "train.learning_rate=1.0e-1",
    "train.learning_rate=1.0E+0",
    "train.warmup_epochs=1e0",
    "train.epochs=1e1",
    *(f"data.max_train_examples={v}" for v in ("null", "1e3", "0o10")),
    # sequences
    *(f"model.hidden_sizes={v}" for v in ("[0o10, 0x10, 010]", "[1_0]", "!!python/tuple [1]", "[]", "")),
    "eval.evaluators=[test, test]",
    # merge keys
    "train={epochs: 2, <<: {batch_size: 4}}",
    "train={<<: [{epochs: 2}, {epochs: 3, batch_size: 5}]}",
    "train={<<: {batch_size: 4}, <<: {epochs: 2}}",
    f"train={{epochs: 2, <<: {{batch_size: 4}}}}{SEP}train.epochs=5",
    # per-member hyperparameters
    "ensemble.search={learning_rate: [0.1, 0.2]}",
    f"ensemble.size=2{SEP}ensemble.search={{learning_rate: [1e-3, 2e-3]}}",
    f"ensemble.size=2{SEP}ensemble.search={{learning_rate: [0.001, 0.002]}}",
    f"ensemble.size=2{SEP}ensemble.search={{learning_rate: {{distribution: choice, values: [1e-3, 2e-3]}}}}",
    f"ensemble.size=2{SEP}ensemble.search={{schedule: {{distribution: choice, values: [constant, cosine]}}}}",
    "distributed.address=tcp://h:1",
    "train.optimizer=adam",
]

#: Cases whose meaning changed on purpose, with what they mean now and why.
CHANGED = {
    # YAML 1.1 asks for a '.' in a float's mantissa and a sign in its exponent, so PyYAML read
    # 1e3 and 1.0e3 as strings (1.0e+3 and 1.0e-3 as floats); ruamel.yaml reads them all as
    # the floats they look like. A float
    # key got the same number either way (pydantic parses the string); now an int key accepts
    # an integral 1e3, a string key refuses it, and a list of per-member values holds numbers
    # instead of strings.
    "seed=1e3": {"seed": 1000},
    "seed=1.0e3": {"seed": 1000},
    "train.epochs=1e1": {"train.epochs": 10},
    "data.max_train_examples=1e3": {"data.max_train_examples": 1000},
    "data.name=1e3": "config key 'data.name': Input should be a valid string (got 1000.0)",
    "data.name=1.0e3": "config key 'data.name': Input should be a valid string (got 1000.0)",
    f"ensemble.size=2{SEP}ensemble.search={{learning_rate: [1e-3, 2e-3]}}": {
        "ensemble.search.learning_rate": [0.001, 0.002]
    },
    f"ensemble.size=2{SEP}ensemble.search={{learning_rate: {{distribution: choice, values: [1e-3, 2e-3]}}}}": {
        "ensemble.search.learning_rate.values": [0.001, 0.002]
    },
    # ruamel.yaml's YAML 1.1 booleans include y/Y/n/N (the YAML 1.1 type repository lists
    # them); PyYAML left them out. A bool key reads them the same either way.
    "data.name=y": "config key 'data.name': Input should be a valid string (got True)",
    "data.name=n": "config key 'data.name': Input should be a valid string (got False)",
    "data.name=Y": "config key 'data.name': Input should be a valid string (got True)",
    # YAML's merge: in a list of merged mappings an earlier one wins; PyYAML let the later one
    # win for these keys.
    "train={<<: [{epochs: 2}, {epochs: 3, batch_size: 5}]}": {"train.epochs": 2},
    # A mapping may hold one merge key '<<' (a list merges several); PyYAML merged both.
    "train={<<: {batch_size: 4}, <<: {epochs: 2}}": "override 'train' has key '<<' twice",
}


def _outcome(case: str) -> dict:
    try:
        cfg = load_config(None, case.split(SEP))
    except ConfigError as err:
        return {"error": str(err)}
    out = {"ok": cfg.model_dump(mode="json")}
    if cfg.ensemble.search:
        out["members"] = cfg.member_hyperparameters()
    return out


def _record() -> dict:
    return {
        "configs": {p.name: load_config(p).model_dump(mode="json") for p in sorted((ROOT / "configs").glob("*.yaml"))},
        "overrides": {case: _outcome(case) for case in OVERRIDES},
    }


def _flat(tree, prefix=""):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _flat(v, f"{prefix}.{k}" if prefix else k)
    else:
        yield prefix, tree


#: The default ``eval.evaluators`` of the recording's time.
OLD_DEFAULT_EVALUATORS = ["test", "rotation", "translation", "corruptions", "letters", "fashion_mnist"]


def _evaluators_by_name(dump: dict) -> dict:
    """The recording holds ``eval.evaluators`` as the list of names it was then; the
    config now holds the same evaluators by name with their type and their ECE bins
    (``[a, b]`` means ``{a: {type: a, ece_bins: null}, ...}``, ``eval.ece_bins`` for each):
    the same meaning, another form. The recording's default list (every config that did
    not list its own) changed on purpose (issue 41): a run now gets its dataset's defaults
    (:func:`ensemble_core.config.eval_section.default_evaluators`: common corruptions and
    an OOD set for every dataset, the digit sets for digits)."""
    names = dump.get("eval", {}).get("evaluators")
    if names == OLD_DEFAULT_EVALUATORS:
        data = dump.get("data", {})
        specs = default_evaluators(
            data.get("name", "mnist5k"), data.get("source", "tfds"), data.get("classes") is not None
        )
        dump["eval"]["evaluators"] = {n: {"type": n, "ece_bins": None, **o} for n, o in specs.items()}
    elif isinstance(names, list):
        dump["eval"]["evaluators"] = {name: {"type": name, "ece_bins": None} for name in names}
    elif isinstance(names, dict):
        for spec in names.values():
            spec.setdefault("ece_bins", None)
    return dump


#: Keys added since the recording, at their defaults (no stratification; the data source
#: TFDS, as before the image folder and arrays sources; the selection's
#: variant only matters with ensemble.select_size, which only hyper.yaml sets; the group
#: lock's wait only matters when a member group's task runs again after its host was cut off).
NEW_KEYS = {
    "ensemble": {
        "selection": {"replacement": False, "sorted_init": 0, "bags": 20},
        "first_selection": {"replacement": True, "sorted_init": 0, "bags": 0},
        "stratify": None,
        # the baselines (issue 44): deep is the deep ensemble it always was; mc_samples only
        # matters with method mc_dropout
        "method": "deep",
        "mc_samples": 30,
        "members_per_network": 4,  # batch_ensemble and packed only
        "packed": {"alpha": 2.0, "gamma": 1},
    },
    "distributed": {"group_lock_wait_s": 120.0},
    # how many test images a shift level scores (the sampled protocol, with confidence
    # intervals; "full" is every test image) and the derived sets' disk cap
    # eval.plots (issue 61): the figures drawn unless a config says not
    "eval": {"protocol": "sampled", "derived_cache_mb": 512, "plots": True},
    # a user's own images (data.source image_folder/arrays) and its class-map policy
    "data": {
        "source": "tfds",
        "path": None,
        "builder": None,
        "image_size": None,
        "channels": None,
        "class_names": None,
        "classes": None,  # every class trains (data.classes: a subset, the rest scored as OOD)
        "test_fraction": 0.2,
        "on_bad_image": "fail",
        # the calibration split of prediction sets and abstention (issue 56): a deliberate change,
        # every config's members train on 10% fewer examples, held out for split conformal
        "calibration_fraction": 0.1,
    },
    "prediction_sets": {"method": "lac", "alpha": 0.1, "calibrate_on": "calibration"},
    "abstention": {"criterion": "max_probability", "target_risk": 0.05, "delta": 0.05},
    # the drift tests (issue 57) emit data.drift only when nightly.drift.test_alpha is set
    "nightly": {"when_classes_change": "refuse", "drift": {"test_alpha": None}},
    # the compute precision (issue 42); float32 computes as before. member_choice (issue 60): the
    # best epoch by validation NLL, what every run evaluated before the key
    "train": {"precision": "float32", "member_choice": "best_validation_nll"},
}

#: Config files whose meaning changed on purpose: {file: {dotted key: value now}}, with why.
CHANGED_CONFIGS: dict[str, dict] = {
    # configs/hyper.yaml became a hyper-deep ensemble (Wenzel et al. 2020, Algorithm 2): the
    # settings kept by the first selection are trained again from new initialisations, and
    # the selection keeps diversity (README, "Hyper-deep ensembles").
    # Its search pool is 24 (the 3 settings the first selection keeps on mnist5k are among
    # the first 24, and the whole flow stays within 6x the default run's time).
    "hyper.yaml": {"ensemble.stratify": 8, "ensemble.size": 24},
    # The CIFAR-10 recipe evaluates as every dataset does now (issue 41): the dataset's
    # defaults, the common corruptions and an OOD set beside test, rotation and translation.
    # Its sample sizes are eval.protocol's now (decided from the test split's size at
    # evaluation, not a num_examples of 1,000 per cell), and a dataset without OOD sets of its
    # own gets its test images with shuffled patches beside uniform noise.
    "cifar10_resnet20.yaml": {
        "eval.evaluators.common_corruptions.type": "common_corruptions",
        "eval.evaluators.common_corruptions.ece_bins": None,
        "eval.evaluators.ood.type": "ood",
        "eval.evaluators.ood.ece_bins": None,
        "eval.evaluators.ood.source": "uniform_noise",
        "eval.evaluators.ood_patches.type": "ood",
        "eval.evaluators.ood_patches.ece_bins": None,
        "eval.evaluators.ood_patches.source": "shuffled_patches",
    },
    # The literature's protocol, every test image in every corruption cell, as it always
    # scored: now said by eval.protocol full (the default samples).
    # Issue 60: the recipe that beats uncertainty-baselines' published ensemble replaced the SGD
    # one (docs/evaluation.md, "Measured: the literature's protocol"): 10 CNNs, Adam at a
    # constant 1e-3 without weight decay, 25 epochs, final weights, 50,000 training images.
    "fashion_mnist_best.yaml": {
        "eval.protocol": "full",
        "data.calibration_fraction": 0.0833333,
        "ensemble.size": 10,
        "train.epochs": 25,
        "train.learning_rate": 0.001,
        "train.optimizer": "adam",
        "train.weight_decay": 0.0,
        "train.schedule": "constant",
        "train.warmup_epochs": 0.0,
        "train.member_choice": "final",
        # its 15 x 5 corrupted test splits (561 MiB) are kept between runs, not rebuilt each time
        "eval.derived_cache_mb": 1024,
    },
    # uncertainty-baselines evaluates each member's final weights (issue 60); the temperature
    # is reported beside the unscaled figures; their 50,000 training images, the validation and
    # calibration splits sharing the other 10,000 (the calibration split's default 10% had left 44,000)
    # the smoke test writes every metric and the report without figures (issue 61: matplotlib's
    # 27 figures were over half of its command's time)
    "tiny.yaml": {"eval.plots": False},
    "fashion_mnist_lenet5.yaml": {
        "train.member_choice": "final",
        "eval.temperature_scaling": True,
        "data.validation_fraction": 0.0833333,
        "data.calibration_fraction": 0.0833333,
    },
}


def _with_new_keys(dump: dict) -> None:
    for section, keys in NEW_KEYS.items():
        for key, value in keys.items():
            have = dump.setdefault(section, {}).setdefault(key, json.loads(json.dumps(value)))
            if isinstance(value, dict) and isinstance(have, dict):  # a new key inside a recorded sub-section
                for inner, default in value.items():
                    have.setdefault(inner, default)


@pytest.fixture(scope="module")
def recorded() -> dict:
    data = json.loads(RECORDED.read_text())
    for dump in data["configs"].values():
        _evaluators_by_name(dump)
        _with_new_keys(dump)
    for outcome in data["overrides"].values():
        if "ok" in outcome:
            _evaluators_by_name(outcome["ok"])
            _with_new_keys(outcome["ok"])
    return data


def test_the_recording_covers_every_config_and_case(recorded):
    assert sorted(recorded["configs"]) == sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))
    assert sorted(recorded["overrides"]) == sorted(OVERRIDES)
    assert set(CHANGED) <= set(OVERRIDES)


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "configs").glob("*.yaml")))
def test_every_config_file_means_what_it_meant(recorded, name):
    now = dict(_flat(load_config(ROOT / "configs" / name).model_dump(mode="json")))
    then = dict(_flat(recorded["configs"][name]))
    changed = {k: v for k, v in now.items() if then.get(k, object()) != v}
    assert changed == CHANGED_CONFIGS.get(name, {})
    assert set(then) <= set(now)


@pytest.mark.parametrize("case", [c for c in OVERRIDES if c not in CHANGED])
def test_every_override_means_what_it_meant(recorded, case):
    assert _outcome(case) == recorded["overrides"][case]


@pytest.mark.parametrize("case", sorted(CHANGED))
def test_deliberate_changes_are_exactly_the_listed_ones(recorded, case):
    now, then, expected = _outcome(case), recorded["overrides"][case], CHANGED[case]
    assert now != then
    if isinstance(expected, str):
        assert "error" in now and now["error"].startswith(expected), now
        return
    assert "ok" in now, now
    changed = {k: v for k, v in _flat(now["ok"]) if dict(_flat(then.get("ok", {}))).get(k, object()) != v}
    if "ok" in then:
        assert changed == expected
    else:
        assert expected.items() <= changed.items()


BASE = ["seed: 0", "data:", "  name: mnist5k", "train:", "  epochs: 2", "  batch_size: 4"]


@pytest.mark.parametrize(
    "lines, key, first, second",
    [
        ([*BASE, "seed: 1"], "seed", 1, 7),
        ([*BASE, "data:", "  name: x"], "data", 2, 7),
        ([*BASE[:3], "  name: x", *BASE[3:]], "data.name", 3, 4),
        ([*BASE, "  epochs: 3"], "train.epochs", 5, 7),
        ([*BASE, "  batch_size: 4"], "train.batch_size", 6, 7),
        (
            ["data:", "  name:", "    a:", "      - {b: 1}", "      - b: {c: 1,", "            c: 2}"],
            "data.name.a.1.b.c",
            5,
            6,
        ),
        (["train: {epochs: 1, epochs: 2}"], "train.epochs", 1, 1),
        (["x: &a {k: 1}", "train:", "  <<: *a", "  <<: {epochs: 2}"], "train.<<", 3, 4),
    ],
)
def test_a_duplicate_key_at_any_depth_is_a_one_line_error_naming_key_and_lines(tmp_path, lines, key, first, second):
    path = tmp_path / "dup.yaml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    where = f"both on line {first}" if first == second else f"lines {first} and {second}"
    assert len(message.splitlines()) == 1, message
    assert message.startswith(f"config file '{path}' has key '{key}' twice ({where}); fix: keep only one '{key}'"), (
        message
    )


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("a: &x 1\nb: &x 2\n", "is not valid YAML (found duplicate anchor 'x')"),
        ("train: [1, 2\n", "is not valid YAML (line 2: while parsing a flow sequence, expected ',' or ']'"),
        ("seed: 1\n---\nseed: 2\n", "is not valid YAML (line 2: expected a single document in the stream"),
        ("seed: !!python/tuple [1]\n", "is not valid YAML (line 1: could not determine a constructor for the tag"),
        ("seed: !!bool x\n", "cannot be read as a config (KeyError: 'x')"),
        ("seed: 2001-13-45\n", "cannot be read as a config (ValueError: month must be in 1..12)"),
        ("? [a, {b: 1}]\n: 1\n", "cannot be read as a config (TypeError: unhashable type: 'dict')"),
        ("seed: !!omap [a: 1, a: 2]\n", "cannot be read as a config (AssertionError"),
        ("seed: " + "[" * 5000 + "]" * 5000 + "\n", "cannot be read as a config (RecursionError: nesting too deep)"),
        ("seed: 1" + "0" * 5000 + "\n", "cannot be read as a config (ValueError: a number with too many digits)"),
        ("{1: a, 1.0: b}\n", "has key '1.0' twice (both on line 1)"),
        ("{[1, 2]: 3}\n", "config key '(1, 2)': Keys should be strings"),
    ],
)
def test_yaml_the_library_refuses_or_cannot_build_is_a_one_line_error(tmp_path, text, fragment):
    path = tmp_path / "odd.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert len(message.splitlines()) == 1 and fragment in message and "fix:" in message, message


def test_loading_warns_about_nothing(tmp_path, recwarn):
    path = tmp_path / "floats.yaml"
    path.write_text("train:\n  learning_rate: 1e-1\n  weight_decay: 1E-4\n")
    cfg = load_config(path, ["train.label_smoothing=1e-2"])
    assert (cfg.train.learning_rate, cfg.train.weight_decay, cfg.train.label_smoothing) == (0.1, 1e-4, 0.01)
    assert not recwarn.list


if __name__ == "__main__":
    json.dump(_record(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
