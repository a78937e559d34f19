"""A user's module that ends the process at import cannot end the run (issue 43, class 3):
``sys.exit`` (any code) and ``KeyboardInterrupt`` raised by ``model.name``'s or
``data.builder``'s module become one-line errors naming the module, and what it prints
at import is logged instead of written to the command's output."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ensemble_core.data.preparation import import_builder
from ensemble_core.errors import ConfigError, DataError
from ensemble_core.models import import_model_function
from tests.prefect_api import cli_env

ROOT = Path(__file__).resolve().parents[1]

NET = """
import flax.linen as nn

class Net(nn.Module):
    num_classes: int = 10

    @nn.compact
    def __call__(self, x, train: bool = False):
        return nn.Dense(self.num_classes)(x.reshape((x.shape[0], -1)))
"""


@pytest.fixture
def modules(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(name: str, text: str) -> str:
        (tmp_path / f"{name}.py").write_text(text)
        return name

    return write


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ("import sys\nsys.exit(0)\n", "called sys.exit(0)"),
        ("import sys\nsys.exit()\n", "called sys.exit(None)"),
        ("raise SystemExit(3)\n", "called sys.exit(3)"),
        ("raise SystemExit('usage: train.py')\n", "called sys.exit('usage: train.py')"),
        ("raise KeyboardInterrupt\n", "raised KeyboardInterrupt"),
    ],
    ids=["exit_0", "exit_none", "exit_3", "exit_text", "interrupt"],
)
def test_an_exit_at_import_is_a_one_line_error_naming_the_module(modules, body, said, request):
    name = modules(f"exits_{request.node.callspec.id}", NET + body)
    with pytest.raises(ConfigError) as caught:
        import_model_function(f"{name}:Net")
    message = str(caught.value)
    assert "\n" not in message and f"module '{name}'" in message and said in message
    assert "if __name__ == '__main__'" in message  # the fix
    with pytest.raises(DataError, match=f"data.builder {name}:Builder: module '{name}' "):
        import_builder(f"{name}:Builder", "anything")


def test_what_a_module_prints_at_import_is_logged_not_printed(modules, capsys, caplog):
    caplog.set_level("INFO", logger="ensemble_core")
    chatty = 'print("loading my network")\nimport sys\nprint("warming up", file=sys.stderr)\n'
    name = modules("chatty_net", chatty + NET)
    fn = import_model_function(f"{name}:Net")
    assert fn.__name__ == "Net"
    captured = capsys.readouterr()
    assert "loading my network" not in captured.out and "warming up" not in captured.err
    assert any(
        f"module '{name}' printed at import: loading my network | warming up" in r.getMessage() for r in caplog.records
    )


@pytest.mark.slow  # the CLI in a subprocess: about 5 s of imports
def test_the_cli_refuses_a_network_module_that_exits_0_before_training(tmp_path, prefect_api):
    """The reported case: ``sys.exit(0)`` at import made the CLI exit 0 with nothing trained."""
    (tmp_path / "exiting_net.py").write_text(NET + "import sys\nsys.exit(0)\n")
    out = tmp_path / "runs"
    env = cli_env(prefect_api, PYTHONPATH=str(ROOT))  # the session's server: no temporary one to start
    cmd = [sys.executable, "-m", "flows.train_ensemble", "--set", "model.name=exiting_net:Net"]
    proc = subprocess.run(
        [*cmd, "--output-dir", str(out), "--run-name", "r"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 2, (proc.stdout[-1000:], proc.stderr[-2000:])
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "exiting_net" in lines[0] and "sys.exit(0)" in lines[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize(
    ("where", "body", "said"),
    [
        ("build", "    sys.exit(0)\n", "called sys.exit(0)"),
        ("build", "    sys.exit(3)\n", "called sys.exit(3)"),
        ("build", "    raise KeyboardInterrupt\n", "raised KeyboardInterrupt"),
        ("forward", "        sys.exit(0)\n", "called sys.exit(0)"),
    ],
    ids=["build_exit_0", "build_exit_3", "build_interrupt", "forward_exit_0"],
)
def test_an_exit_when_the_network_is_built_or_traced_is_a_one_line_error(modules, where, body, said, request):
    """The module imports cleanly; its network function (``build``) or its forward pass
    ends the process when called: found by the sweep of issue 43 (the CLI exited 0, 3 or
    75 with no error)."""
    from ensemble_core.config import load_config
    from ensemble_core.models import build_model, check_model

    forward = "        return nn.Dense(self.num_classes)(x.reshape((x.shape[0], -1)))\n"
    text = "import sys\nimport flax.linen as nn\n\nclass Net(nn.Module):\n    num_classes: int = 10\n\n"
    text += "    @nn.compact\n    def __call__(self, x, train: bool = False):\n"
    text += (body if where == "forward" else "") + forward
    text += "\ndef build(cfg, num_classes):\n" + (body if where == "build" else "") + "    return Net(num_classes)\n"
    name = modules(f"calls_{request.node.callspec.id}", text)
    cfg = load_config(None, [f"model.name={name}:build"])
    with pytest.raises(ConfigError) as caught:
        check_model(build_model(cfg.model, 10), cfg.model, (28, 28, 1), 10)
    message = str(caught.value)
    assert "\n" not in message and name in message and said in message and "fix: raise an exception" in message
