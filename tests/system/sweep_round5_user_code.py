"""Sweep cases of issue 59 (round five), class 4: a user's code that floods the output.

One user module (:data:`MODULE`) makes noise of one kind (``print``, ``sys.stderr``,
``os.write`` to descriptors 1 and 2, C's ``printf``, ``logging`` records, a root logger
set to DEBUG, ``warnings``, one huge line without its end, bytes that are not UTF-8,
carriage returns and terminal escapes) at one place where the pipeline runs the user's
code: its import, the network's construction, every trace of its ``__call__`` (the model
check, training's step, validation, evaluation), each training step
(``jax.debug.print``, a host callback), ``flows.predict`` with the user's network, and the
user's ``data.builder``. Which, and how much, is set by environment variables, so that a
rerun can be quiet.

A case that runs to the end (expect 0) checks that the command's output, which is the
run's log on the console, stays bounded (a few hundred lines at most, none over a few
thousand characters) with the flood in a handful of summary lines that hold the count of
the lines left out. A stop case (expect 75) sends SIGTERM while the flood runs, checks
the time from the signal to the exit (under :data:`STOP_S`), then reruns the run name and
checks that it completes.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time

import numpy as np

from tests.system.sweep import Ctx, Proc, case_table, check_json

T, PR = "train CLI", "predict CLI"
CASES, case = case_table()
STOPPED = r"stopped|SIGTERM|signal"
STOP_S = 10.0  # seconds from SIGTERM to the command's exit
MAX_LINES = 400  # lines of a whole run's output (a quiet tiny run writes about 50)
MAX_WIDTH = 4_000  # characters of its longest line (a summary is one line of about 2,000)

MODULE = '''
"""A user's network (and data builder) that floods the output (the sweep's round five)."""
import ctypes, logging, os, sys, warnings

import flax.linen as nn
import jax

LINES = int(os.environ.get("NOISE_LINES", "0"))
KIND = os.environ.get("NOISE_KIND", "print")
WHERE = os.environ.get("NOISE_WHERE", "")
MARK = os.environ.get("NOISE_MARK")
TAG = "noise-" + KIND


def _mark(what):
    if MARK:
        with open(MARK, "a") as f:
            f.write(what + "\\n")


def noise(where):
    if where != WHERE or LINES <= 0:
        return
    _mark(where + " start")
    if KIND == "huge-line":  # one line without its end, on both streams
        sys.stdout.write(TAG + " " + "x" * LINES)
        sys.stdout.flush()
        os.write(2, (TAG + " " + "y" * LINES).encode())
    elif KIND == "root-logger":  # the root logger taken over, then DEBUG records
        logging.basicConfig(level=logging.DEBUG, force=True, format="%(message)s")
        for i in range(LINES):
            logging.getLogger().debug("%s %d", TAG, i)
    else:
        libc = ctypes.CDLL(None)
        log = logging.getLogger("usernoise")
        for i in range(LINES):
            if KIND == "print":
                print(TAG, i)
            elif KIND == "stderr":
                print(TAG, i, file=sys.stderr)
            elif KIND == "fd":
                os.write(1 + i % 2, f"{TAG} {i}\\n".encode())
            elif KIND == "printf":
                libc.printf(b"%s %d\\n", TAG.encode(), i)
            elif KIND == "logging":
                log.warning("%s %d", TAG, i)
            elif KIND == "warnings":
                warnings.warn(f"{TAG} {i}")
            elif KIND == "binary":
                sys.stdout.buffer.write(TAG.encode() + b" %d \\xff\\xfe\\x00\\x80 not utf-8\\n" % i)
                os.write(2, b"\\xc3\\x28 " + TAG.encode() + b" %d\\n" % i)
            elif KIND == "cr-ansi":  # a progress bar: carriage returns and colours, no line end
                sys.stdout.write(f"\\r\\x1b[2K\\x1b[32m{TAG} {i}%\\x1b[0m")
    _mark(where + " end")


noise("import")


def _each_step():
    noise("step-callback")


class Net(nn.Module):
    num_classes: int = 10

    @nn.compact
    def __call__(self, x, train: bool = False):
        noise("trace")  # Python: each time the network is traced
        if WHERE == "step" and LINES > 0:  # at run time: each step (each batch), each member
            for i in range(LINES):
                jax.debug.print(TAG + " {i} of a batch of {n}", i=i, n=x.shape[0])
        if WHERE == "step-callback" and LINES > 0:
            jax.debug.callback(_each_step)
        return nn.Dense(self.num_classes)(x.reshape((x.shape[0], -1)))


def build(num_classes: int = 10):
    noise("build")
    return Net(num_classes)
'''

BUILDER = """
import numpy as np
import tensorflow_datasets as tfds

from noisy_net import noise


class NoisyParts(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return self.dataset_info_from_configs(
            features=tfds.features.FeaturesDict(
                {
                    "image": tfds.features.Tensor(shape=(28, 28, 1), dtype=np.uint8),
                    "label": tfds.features.ClassLabel(names=["even", "odd"]),
                }
            )
        )

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(400), "test": self._generate_examples(100)}

    def _generate_examples(self, n):
        noise("data")
        rng = np.random.default_rng(n)
        for i in range(n):
            yield i, {"image": rng.integers(0, 256, (28, 28, 1), np.uint8), "label": i % 2}
"""


def _module(ctx: Ctx) -> dict[str, str]:
    """The user's modules in the case's directory; the environment that finds them."""
    (ctx.dir / "noisy_net.py").write_text(MODULE)
    (ctx.dir / "noisy_pkg").mkdir()  # TFDS reads a builder's resources from its package
    (ctx.dir / "noisy_pkg" / "__init__.py").write_text("")
    (ctx.dir / "noisy_pkg" / "data.py").write_text(BUILDER)
    return {"PYTHONPATH": str(ctx.dir), "NOISE_MARK": str(ctx.dir / "mark.txt")}


def _noise(where: str, kind: str, lines: int) -> dict[str, str]:
    return {"NOISE_WHERE": where, "NOISE_KIND": kind, "NOISE_LINES": str(lines)}


NET = ("--set", "model.name=noisy_net:build")


def bounded(procs: list[Proc], tag: str, lines: int, counted: bool = True) -> tuple[bool, str]:
    """Whether the commands' output is bounded: at most :data:`MAX_LINES` lines, none wider
    than :data:`MAX_WIDTH`, the flood (``tag``) on a few summary lines, and (``counted``)
    one of them counting at least ``lines - 10`` lines left out."""
    text = "".join(p.out + p.err for p in procs)
    rows = text.splitlines()
    noisy = [row for row in rows if tag in row]
    counts = [int(n) for row in noisy for n in re.findall(r"\.\.\. (\d+) more lines \.\.\.", row)]
    widest = max((len(row) for row in rows), default=0)
    ok = len(rows) <= MAX_LINES and widest <= MAX_WIDTH and 0 < len(noisy) <= 30
    if counted:
        ok = ok and bool(counts) and max(counts) >= lines - 10
    note = f"{len(rows)} lines (widest {widest}), {len(noisy)} with the noise, counts {sorted(set(counts))[-3:]}"
    return ok, note


def _completes(name: str, where: str, kind: str, lines: int, what: str, counted: bool = True) -> None:
    @case(T, name, 0, what)
    def run(ctx: Ctx):
        env = {**_module(ctx), **_noise(where, kind, lines)}
        out = ctx.dir / "runs"
        proc = ctx.train(*NET, out=out, env=env, timeout=400)
        ok, note = bounded(ctx.procs, f"noise-{kind}", lines, counted)
        last = proc.out.strip().splitlines()[-1:] == [str(out / "r")]
        return proc, ok and last and check_json(out / "r" / "report.json"), f"{note}; {proc.seconds} s"


_completes("noisy-import-print", "import", "print", 200_000, "a network module printing 200,000 lines at import")
_completes(
    "noisy-import-logging",
    "import",
    "logging",
    200_000,
    "a network module logging 200,000 warning records at import (logging.getLogger(...).warning)",
)
_completes(
    "noisy-import-root-logger",
    "import",
    "root-logger",
    50_000,
    "a network module taking over the root logger at import (basicConfig(level=DEBUG, force=True)) and "
    "logging 50,000 DEBUG records",
)
_completes("noisy-build-stderr", "build", "stderr", 200_000, "a network function printing 200,000 lines to stderr")
_completes(
    "noisy-build-fd", "build", "fd", 200_000, "a network function writing 200,000 lines with os.write to fds 1 and 2"
)
_completes("noisy-build-printf", "build", "printf", 100_000, "a network function calling C's printf 100,000 times")
_completes("noisy-build-warnings", "build", "warnings", 100_000, "a network function raising 100,000 distinct warnings")
_completes(
    "noisy-trace-print",
    "trace",
    "print",
    200_000,
    "a network printing 200,000 lines each time it is traced (the check, training, validation, evaluation)",
)
_completes("noisy-trace-fd", "trace", "fd", 100_000, "a network writing 100,000 lines to fds 1 and 2 when traced")
_completes("noisy-trace-logging", "trace", "logging", 100_000, "a network logging 100,000 warning records when traced")
_completes(
    "noisy-trace-huge-line",
    "trace",
    "huge-line",
    20_000_000,
    "a network writing one 20 MB line without its end to stdout and to fd 2 when traced",
    counted=False,
)
_completes(
    "noisy-trace-binary",
    "trace",
    "binary",
    50_000,
    "a network writing 50,000 lines of bytes that are not UTF-8 (sys.stdout.buffer, fd 2) when traced",
)
_completes(
    "noisy-trace-cr-ansi",
    "trace",
    "cr-ansi",
    50_000,
    "a network drawing a progress bar of 50,000 updates (carriage returns, colour escapes, no line end)",
)
_completes(
    "noisy-step-debug-print",
    "step",
    "print",
    20,
    "a network calling jax.debug.print 20 times per step and member (at run time)",
)
_completes(
    "noisy-step-callback",
    "step-callback",
    "print",
    2_000,
    "a network whose host callback prints 2,000 lines at each step (jax.debug.callback)",
)
_completes(
    "noisy-step-callback-logging",
    "step-callback",
    "logging",
    2_000,
    "a network whose host callback logs 2,000 warning records at each step",
)


def _predict(name: str, where: str, kind: str, lines: int, what: str) -> None:
    @case(PR, name, 0, what)
    def run(ctx: Ctx):
        env = _module(ctx)
        out = ctx.dir / "runs"
        trained = ctx.train(*NET, out=out, env={**env, **_noise("", kind, 0)}, timeout=300)
        images, output = ctx.dir / "x.npy", ctx.dir / "pred.npz"
        np.save(images, np.random.default_rng(1).integers(0, 256, (300, 28, 28, 1), np.uint8))
        args = ["-m", "flows.predict", "--images", str(images), "--run-dir", str(out / "r"), "--output", str(output)]
        proc = ctx.cli(args, env={**env, **_noise(where, kind, lines)}, timeout=300)
        ok, note = bounded([proc], f"noise-{kind}", lines)
        ok = ok and trained.rc == 0 and output.exists() and len(np.load(output)["ensemble_probs"]) == 300
        return proc, ok, f"{note}; {proc.seconds} s"


_predict(
    "noisy-predict-trace-print",
    "trace",
    "print",
    200_000,
    "flows.predict with a user's network printing 200,000 lines each time it is traced",
)
_predict(
    "noisy-predict-trace-fd",
    "trace",
    "fd",
    100_000,
    "flows.predict with a user's network writing 100,000 lines to fds 1 and 2 when traced",
)
_predict(
    "noisy-predict-step-print",
    "step",
    "print",
    20,
    "flows.predict with a user's network calling jax.debug.print 20 times per batch and member",
)


@case(T, "noisy-data-builder-print", 0, "a user's data.builder printing 200,000 lines while it generates examples")
def data_builder(ctx: Ctx):
    env = {**_module(ctx), **_noise("data", "print", 200_000)}
    out = ctx.dir / "runs"
    sets = ("--set", "data.builder=noisy_pkg.data:NoisyParts", "--set", "data.name=noisy_parts")
    sets += ("--set", f"data.data_dir={ctx.dir / 'data'}", "--set", "data.max_train_examples=null")
    proc = ctx.train(*sets, out=out, env=env, timeout=400)
    ok, note = bounded(ctx.procs, "noise-print", 200_000)
    return proc, ok and check_json(out / "r" / "report.json"), f"{note}; {proc.seconds} s"


# MARK: SIGTERM during the flood, then the rerun


def _stopped(name: str, where: str, kind: str, lines: int, what: str, *, inside_flow: bool = True) -> None:
    @case(T, name, 75, f"SIGTERM during {what}, then rerun the run name", cause=STOPPED)
    def run(ctx: Ctx):
        env = _module(ctx)
        out, mark = ctx.dir / "runs", ctx.dir / "mark.txt"
        p = ctx.start(ctx.train_args(*NET, out=out), env={**env, **_noise(where, kind, lines)})
        flow = ctx.wait_output(p, r"Beginning flow run", 240) if inside_flow else True
        before = mark.read_text().count(" start") if mark.exists() else 0
        deadline = time.monotonic() + 120
        while p.poll() is None and time.monotonic() < deadline:
            if mark.exists() and mark.read_text().count(" start") > before:
                break
            time.sleep(0.05)
        flooding = mark.exists() and mark.read_text().count(" start") > before
        time.sleep(0.5)  # half a second into the flood
        ctx.notes.append(f"signal sent {time.monotonic() - p.t0:.1f} s in (flow {flow}, flooding {flooding})")
        os.kill(p.pid, signal.SIGTERM)
        sent = time.monotonic()
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=60)
        stop_s = time.monotonic() - sent
        first = ctx.finish(p, 1)
        rerun = ctx.train(*NET, out=out, env={**env, **_noise(where, kind, lines // 10)}, timeout=400)
        done = rerun.rc == 0 and check_json(out / "r" / "report.json")
        ok, note = bounded(ctx.procs, f"noise-{kind}", 0, counted=False)
        ok = ok and done and flow and flooding and stop_s < STOP_S
        return first, ok, f"stopped {stop_s:.1f} s after SIGTERM; rerun rc {rerun.rc}; {note}"


_stopped(
    "noisy-sigterm-build-print",
    "build",
    "print",
    2_000_000,
    "a network function printing 2,000,000 lines (the command line's check, before the flow)",
    inside_flow=False,
)
_stopped(
    "noisy-sigterm-trace-print",
    "trace",
    "print",
    200_000,
    "a trace inside the flow of a network printing 200,000 lines each time it is traced",
)
_stopped(
    "noisy-sigterm-trace-fd",
    "trace",
    "fd",
    200_000,
    "a trace inside the flow of a network writing 200,000 lines to fds 1 and 2",
)
_stopped(
    "noisy-sigterm-step-callback",
    "step-callback",
    "print",
    5_000,
    "training steps whose host callback prints 5,000 lines each",
)
_stopped(
    "noisy-sigterm-import-logging",
    "import",
    "logging",
    2_000_000,
    "the import of a module logging 2,000,000 warning records (before the flow)",
    inside_flow=False,
)
