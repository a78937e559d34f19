"""Inputs that would hang or exhaust memory are refused first (issue 43, class 2): a
special file (a FIFO, a character device) named as a config, an images file or a data
file is refused by its type before it is opened; a YAML alias bomb anywhere in a config,
free-form mappings included, is refused before any value is built."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ensemble_core.config import load_config
from ensemble_core.config.strict_yaml import MAX_VALUES, load_yaml
from ensemble_core.errors import ConfigError, DataError

ROOT = Path(__file__).resolve().parents[1]


def _bomb(levels: int = 8) -> str:
    """An anchor of ten aliases of an anchor of ten aliases ...: 10**(levels + 1) values."""
    lines = ["  a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels + 1):
        lines.append(f"  a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    return "model:\n  options:\n" + "\n".join("  " + line for line in lines) + "\n"


def _within(seconds: float, fn):
    """``fn()``'s outcome, or a failure if it has not returned within ``seconds`` (a blocked
    open must fail the test, not hang it)."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as err:  # noqa: BLE001  (handed to the test)
            box["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still blocked after {seconds} s"
    if "error" in box:
        raise box["error"]
    return box.get("value")


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


def test_a_fifo_or_a_device_as_the_config_is_refused_by_type(fifo):
    for path, kind in ((fifo, "FIFO"), (Path("/dev/zero"), "character device")):
        with pytest.raises(ConfigError, match=kind) as caught:
            _within(10, lambda p=path: load_config(p))
        assert "\n" not in str(caught.value)


def test_a_fifo_as_the_images_to_predict_is_refused_by_type(fifo):
    from ensemble_core.runs.prediction.files import read_images

    with pytest.raises(DataError, match="is a FIFO"):
        _within(10, lambda: read_images(fifo))


def test_a_fifo_as_an_arrays_file_is_refused_by_type(tmp_path):
    from ensemble_core.data.npz_arrays import array_files

    os.mkfifo(tmp_path / "train.npz")
    with pytest.raises(DataError, match=r"train\.npz is a FIFO"):
        _within(10, lambda: array_files(tmp_path))


def _expanded(levels: int = 8) -> int:
    """:func:`_bomb`'s values once expanded, counted by hand: anchor a0 is a list of 10
    scalars (11 values), a(i) a list of 10 copies of a(i-1); each anchor under a key, the
    keys and mappings above them (document, model, options) counted too."""
    sizes = [11]
    for _ in range(levels):
        sizes.append(1 + 10 * sizes[-1])
    return 5 + sum(1 + size for size in sizes)  # document, 'model', its mapping, 'options', its mapping


def test_an_alias_bomb_in_a_free_form_mapping_is_refused_at_once(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(_bomb())
    with pytest.raises(ConfigError, match=f"expands to {_expanded():,} values through its aliases") as caught:
        _within(10, lambda: load_config(path))
    assert "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match="expands to"):
        load_config(None, ["model.options=" + "{" + _bomb().split("options:\n", 1)[1].replace("\n", ", ") + "}"])


def test_aliases_that_stay_small_are_read_as_yaml_reads_them():
    assert load_yaml("a: &x {k: [1, 2]}\nb: *x\nc: {<<: *x, j: 3}") == {
        "a": {"k": [1, 2]},
        "b": {"k": [1, 2]},
        "c": {"k": [1, 2], "j": 3},
    }
    # 500 aliases of a 1,000-value list: about half of MAX_VALUES, read as it is
    large = "a: &a [" + ", ".join(["x"] * 999) + "]\nb: [" + ", ".join(["*a"] * 500) + "]\n"
    assert len(load_yaml(large)["b"]) == 500 and MAX_VALUES > 500 * 1000 + 1000 + 5


@pytest.mark.slow  # a subprocess under a 1 GiB address-space cap: about 3 s
def test_the_alias_bomb_under_a_memory_cap_is_refused_without_growing(tmp_path):
    """The reported case, for real: the bomb under ``model.options`` read, validated and
    serialised as the CLI would (the config as JSON for Prefect's parameters) in a process
    capped at 1 GiB of address space. Refused in one line, within seconds."""
    path = tmp_path / "bomb.yaml"
    path.write_text(_bomb())
    script = f"""
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from ensemble_core.config import load_config
from ensemble_core.errors import ConfigError
try:
    cfg = load_config({str(path)!r})
    json.dumps(cfg.model_dump(mode="json"))
except ConfigError as err:
    print("refused:", err)
    sys.exit(2)
print("accepted")
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, (proc.stdout[-500:], proc.stderr[-1500:])
    assert "expands to" in proc.stdout and "Traceback" not in proc.stderr


def _config_of_json_size(tmp_path, size: int) -> Path:
    """A valid config file whose validated config is about ``size`` bytes as JSON (a long
    free-form option)."""
    from ensemble_core.config import PipelineConfig

    base = len(PipelineConfig.model_validate({"model": {"options": {"note": ""}}}).model_dump_json())
    path = tmp_path / f"c{size}.yaml"
    path.write_text('model:\n  options: {note: "' + "x" * (size - base) + '"}\n')
    return path


def test_one_limit_for_a_configs_size_and_prefects_parameters(tmp_path):
    """A 590 KB config (under the 1 MiB file limit) passed our checks and died in Prefect's
    parameter-size check with a 48-line traceback (issue 43, class 4): now our limit, on the
    config as JSON, lies under Prefect's, with room for the flow's other parameters, as
    Prefect's own check (the oracle) confirms."""
    import json as json_lib

    from prefect._internal.schemas.validators import validate_parameter_size
    from prefect.settings import get_current_settings

    from ensemble_core.config.limits import MAX_CONFIG_JSON_BYTES, PREFECT_MAX_PARAMETER_BYTES

    assert get_current_settings().server.api.max_parameter_size == PREFECT_MAX_PARAMETER_BYTES  # the pin
    with pytest.raises(ConfigError, match=r"the config is 590,\d{3} bytes as JSON, more than the 507,904"):
        load_config(_config_of_json_size(tmp_path, 590_000))
    largest = load_config(_config_of_json_size(tmp_path, MAX_CONFIG_JSON_BYTES))
    parameters = {
        "config": json_lib.loads(largest.model_dump_json()),
        "output_dir": "/" + "d" * 4000,
        "run_name": "r" * 255,
    }
    validate_parameter_size(parameters, PREFECT_MAX_PARAMETER_BYTES)  # Prefect accepts it
