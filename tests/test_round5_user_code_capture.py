"""A user's code that floods the output, every way it can (issue "reliability round five",
class 4): ``print``, ``sys.stderr``, ``os.write`` to descriptors 1 and 2, C's ``printf``,
``logging`` records, ``warnings``, bytes that are not UTF-8, carriage returns and terminal
escapes, a huge line without its end; while it is imported or built, while it is traced
(the model check, training's step, evaluation, prediction), and while its steps run
(``jax.debug.print``). Each is captured (:func:`ensemble_core.output_capture.captured_output`)
and logged once, bounded, with the count of what was left out; a stop signal in the
middle of a flood ends the process within seconds, with the real descriptors back.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]

# Every kind of noise, LINES times each (run in a real process: pytest records warnings
# instead of printing them, and holds descriptors 1 and 2 itself).
FLOOD = """
import ctypes, logging, os, sys, warnings

def flood(tag, lines):
    libc = ctypes.CDLL(None)
    for i in range(lines):
        print(f"{tag} print {i}")
        sys.stderr.write(f"{tag} stderr {i}\\n")
        os.write(1, f"{tag} fd1 {i}\\n".encode())
        os.write(2, f"{tag} fd2 {i}\\n".encode())
        logging.getLogger("noisy.user").warning("%s record %d", tag, i)
        warnings.warn(f"{tag} warning {i}")
        if i % 1000 == 0:
            libc.printf(b"%s printf %d\\n", tag.encode(), i)
    sys.stdout.buffer.write(b"\\xff\\xfe not utf-8 \\x1b[31mred\\x1b[0m\\r" + tag.encode() + b" 50%\\r 100%\\n")
    sys.stdout.write(tag + " huge " + "x" * 5_000_000)  # one line, no end
"""


def _python(tmp_path: Path, body: str, **popen) -> subprocess.Popen:
    (tmp_path / "flood.py").write_text(FLOOD)
    script = tmp_path / "main.py"
    script.write_text(textwrap.dedent(body))
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    out, err = (open(tmp_path / f"main.{s}", "w") for s in ("out", "err"))  # noqa: SIM115
    try:
        return subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=env, stdout=out, stderr=err, **popen)
    finally:
        out.close()
        err.close()


def test_every_way_out_is_captured_and_logged_once_with_its_count(tmp_path):
    """A real process: 2,000 rounds of print, sys.stderr, os.write(1), os.write(2), a
    logging record, a warning (and C printf, undecodable bytes, escapes, carriage
    returns, a 5 MB line) inside ``captured_output``: nothing reaches descriptors 1 or 2
    but one log line, printable, with the first and last lines and the count; the
    process's own output before and after goes out as it was."""
    proc = _python(
        tmp_path,
        """
        import logging, sys
        logging.basicConfig(level=logging.INFO, format="%(name)s - %(message)s")
        from ensemble_core.output_capture import captured_output
        from flood import flood
        print("before", flush=True)
        with captured_output("module 'flood' printed"):
            flood("noise", 2000)
        print("after")
        print("after on stderr", file=sys.stderr)
        """,
    )
    assert proc.wait(timeout=120) == 0, (tmp_path / "main.err").read_text()[-2000:]
    out, err = ((tmp_path / f"main.{s}").read_text(errors="replace") for s in ("out", "err"))
    assert out.splitlines() == ["before", "after"], out[:2000]
    lines = err.splitlines()
    assert len(lines) == 2 and lines[1] == "after on stderr", err[:3000]
    summary = lines[0]
    assert summary.startswith("ensemble_core.user_import - module 'flood' printed: "), summary[:300]
    assert summary.isprintable() and len(summary) < 3000, summary[:300]
    written, descriptors = summary.split("; on file descriptors 1 and 2: ")
    assert _left_out(written) == 2000 * 5 + 4 - 10, written[:400]  # print, stderr, record, warning (2 lines)
    huge = ("noise huge " + "x" * 5_000_000)[:200] + "..."  # cut, and marked so
    assert written.endswith(f"\ufffd\ufffd not utf-8 red | noise 50% |  100% | {huge}"), written[-400:]
    assert _left_out(descriptors) == 2000 * 2 + 2 - 10, descriptors[:400]  # os.write 1 and 2, C's printf
    assert "noise printf 0" in descriptors and descriptors.endswith("noise fd2 1999"), descriptors[-300:]


def test_the_root_logger_a_users_code_reconfigures_is_put_back(caplog):
    """A user's module that sets the root logger to DEBUG and gives it a handler of its own
    (``logging.basicConfig(force=True)``): the pipeline's root logger is as it was after
    the capture, and the log line says so."""
    from ensemble_core.output_capture import captured_output

    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    with (
        caplog.at_level(logging.INFO, logger="ensemble_core.user_import"),
        captured_output("module 'rooted' printed at import"),
    ):
        logging.basicConfig(level=logging.DEBUG, force=True)
        logging.getLogger("rooted").debug("a record of the user's")
    assert root.level == level and root.handlers == handlers
    records = [r.getMessage() for r in caplog.records if r.name == "ensemble_core.user_import"]
    assert len(records) == 1 and "root logger" in records[0] and "rooted:a record of the user's" in records[0], records


def test_a_stop_signal_in_the_middle_of_a_flood_ends_the_process_within_seconds(tmp_path):
    """SIGTERM (turned into an exception, as the command lines do) while a user's code
    floods every way it can, endlessly, inside ``captured_output``: the process ends
    within 5 s, its last line (printed after the capture) reaches the real stderr, and the
    flood is one log line, not hundreds of thousands."""
    proc = _python(
        tmp_path,
        """
        import logging, signal, sys
        logging.basicConfig(level=logging.INFO, format="%(name)s - %(message)s")
        from ensemble_core.output_capture import captured_output
        from flood import flood

        class Stopped(Exception):
            pass

        def on_term(signum, frame):
            raise Stopped()

        signal.signal(signal.SIGTERM, on_term)
        try:
            with captured_output("network 'flood' printed"):
                open("started", "w").close()
                while True:
                    flood("endless", 500)
        except Stopped:
            print("error: stopped by SIGTERM; fix: rerun", file=sys.stderr)
            sys.exit(75)
        """,
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "started").exists():
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "main.err").read_text()[-2000:]
        time.sleep(0.05)
    time.sleep(1.0)  # a second of flooding
    proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    try:
        rc = proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail("SIGTERM not obeyed within 20 s of a flood")
    stop_s = time.monotonic() - sent
    err = (tmp_path / "main.err").read_text(errors="replace").splitlines()
    out = (tmp_path / "main.out").read_text(errors="replace").splitlines()
    assert rc == 75 and stop_s < 5, (rc, round(stop_s, 1), err[-5:])
    assert err[-1] == "error: stopped by SIGTERM; fix: rerun", err[-5:]
    assert len(err) <= 3 and not out, (len(err), len(out), err[:3], out[:3])
    assert "network 'flood' printed: endless print 0" in err[0] and "more lines" in err[0], err[0][:300]


NOISY_NET = """
import os
import flax.linen as nn
import jax

LINES = 20_000


class Net(nn.Module):
    num_classes: int = 10

    @nn.compact
    def __call__(self, x, train: bool = False):
        for i in range(LINES):  # Python: runs each time the network is traced
            print("traced line", i)
        os.write(2, b"traced on fd 2\\n")
        jax.debug.print("step line {s}", s=x.shape[0])  # at run time: each step, each member
        return nn.Dense(self.num_classes)(x.reshape((x.shape[0], -1)))
"""


@pytest.mark.slow  # over 1 CPU s with a warm compilation cache: make test-fast leaves it out (docs/development.md)
def test_a_network_printing_while_traced_and_at_each_step_is_captured_in_training(
    tmp_path, monkeypatch, mnist_train, capfd, caplog
):
    """Training a user's network (two members, unrolled) whose ``__call__`` prints 20,000
    lines each time it is traced and ``jax.debug.print``s at each step: nothing reaches
    descriptors 1 or 2, and the log holds a handful of lines (each trace once, the steps
    once) with the counts. Before, every line of every trace went out (under a flow's
    ``log_prints``, each one a Prefect API record: minutes per trace)."""
    from tests.ensembles import BATCH, small_setup, train_small

    (tmp_path / "noisy_net.py").write_text(NOISY_NET)
    monkeypatch.syspath_prepend(str(tmp_path))
    images, labels = mnist_train[0][:256], mnist_train[1][:256]
    capfd.readouterr()
    with caplog.at_level(logging.INFO, logger="ensemble_core.user_import"):
        built = small_setup("noisy_net:Net", 2, "unroll", devices=1)  # both members in one shard
        state, timing = train_small(built, images, labels, epochs=2)
        jax.block_until_ready(state.params)
    out, err = capfd.readouterr()
    assert "traced line" not in out + err and "step line" not in out + err and "fd 2" not in err, (out[:500], err[:500])
    records = [r.getMessage() for r in caplog.records if r.name == "ensemble_core.user_import"]
    assert 2 <= len(records) <= 8, [r[:150] for r in records]
    step = [r for r in records if "printed while traced for the train step" in r]
    assert len(step) == 1 and _left_out(step[0]) >= 2 * 20_000 - 10, [r[:200] for r in records]  # 2 members
    ran = [r for r in records if "printed while it trained" in r]
    lines = 2 * timing["steps"]  # each member, each step
    assert len(ran) == 1 and _left_out(ran[0]) == lines - 10 and f"step line {BATCH}" in ran[0], ran
    assert np.isfinite(np.asarray(state.params["Dense_0"]["kernel"])).all()


def test_a_network_printing_while_traced_for_prediction_is_captured(tmp_path, monkeypatch, capfd, caplog):
    """The inference-mode forward pass, traced as evaluation and ``flows.predict`` trace it
    (``apply_inference`` under ``jax.jit``): one log line, nothing on the descriptors."""
    from ensemble_core.config import ModelConfig
    from ensemble_core.models import build_model
    from ensemble_core.train.forward import apply_inference, init_variables

    (tmp_path / "noisy_net.py").write_text(NOISY_NET)
    monkeypatch.syspath_prepend(str(tmp_path))
    model = build_model(ModelConfig(name="noisy_net:Net"), 10)
    capfd.readouterr()
    with caplog.at_level(logging.INFO, logger="ensemble_core.user_import"):
        variables = init_variables(model, jax.random.key(0), (28, 28, 1))
        logits = jax.jit(lambda v, x: apply_inference(model, v, x))(variables, np.zeros((3, 28, 28, 1), np.float32))
        jax.block_until_ready(logits)
    out, err = capfd.readouterr()
    assert "traced line" not in out + err and "fd 2" not in err, (out[:300], err[:300])
    records = [r.getMessage() for r in caplog.records if r.name == "ensemble_core.user_import"]
    inference = [r for r in records if "printed while run in inference mode" in r]
    assert len(inference) == 1 and _left_out(inference[0]) == 20_000 - 10, [r[:200] for r in records]
    assert inference[0].endswith("; on file descriptors 1 and 2: traced on fd 2"), inference[0][-200:]


def _left_out(summary: str) -> int:
    """N of a summary's ``... N more lines ...``."""
    return int(re.search(r"\.\.\. (\d+) more lines \.\.\.", summary).group(1))


def test_a_capture_of_the_streams_joined_by_one_that_needs_the_descriptors(capfd, caplog):
    """Training's capture holds the streams alone (``fds=False``: its callbacks' own output
    must get out); a trace inside it (the first validation pass) captures descriptors 1
    and 2 too, for its own body, and everything is in the one log line."""
    from ensemble_core.output_capture import captured_output

    capfd.readouterr()
    with (
        caplog.at_level(logging.INFO, logger="ensemble_core.user_import"),
        captured_output("network 'n' printed while it trained", fds=False),
    ):
        print("a step's line")
        with captured_output("network 'n' printed while run in inference mode"):
            os.write(2, b"a trace's line on fd 2\n")
            print("a trace's line")
        os.write(1, b"the project's own line on fd 1\n")
    out, err = capfd.readouterr()
    assert out == "the project's own line on fd 1\n" and err == "", (out, err)
    records = [r.getMessage() for r in caplog.records if r.name == "ensemble_core.user_import"]
    assert records == [
        "network 'n' printed while it trained: a step's line | a trace's line; "
        "on file descriptors 1 and 2: a trace's line on fd 2"
    ], records
