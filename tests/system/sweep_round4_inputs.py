"""Sweep cases of issue 43 (round four) that a hostile or careless input gives before any
compute: special files where a file is expected (class 2), YAML that would expand,
recurse or grow without end (class 2), a user's module that ends the process (class 3),
configs at the size limits (class 4), and run names or output directories that collide
with the output directory's own files or are not one line (class 5). Each must end
(short timeouts: a hang is ``hang``) in one line, with nothing written."""

from __future__ import annotations

import json
import os
import socket
import stat
from pathlib import Path

import numpy as np

from tests.system.sweep import TINY, Ctx, case_table, check_json, error_lines, listing, nothing_under, refused

T, PR = "train CLI", "predict CLI"
CASES, case = case_table()
QUICK = 60  # seconds: every case here is refused before Prefect starts, in about 5 s


def _special(path: Path, kind: str) -> Path:
    """A FIFO, a unix socket or a symlink to a FIFO at ``path``; ``/dev/zero`` as it is."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(path))  # the socket file stays after close
    elif kind == "link-to-fifo":
        os.mkfifo(path.with_name("pipe"))
        path.symlink_to(path.with_name("pipe"))
    else:
        return Path("/dev/zero")
    return path


def _still(path: Path, kind: str) -> bool:
    """``path`` is still the special file it was (nothing opened it for writing, replaced it)."""
    mode = os.stat(path).st_mode
    return (
        stat.S_ISSOCK(mode) if kind == "socket" else stat.S_ISCHR(mode) if kind == "dev-zero" else stat.S_ISFIFO(mode)
    )


# MARK: class 2: special files

# the cause a line must name for each kind of special file where a regular one is expected
SPECIAL_CAUSES = {
    "fifo": r"a FIFO|named pipe|not a regular file",
    "link-to-fifo": r"a FIFO|named pipe|not a regular file",
    "socket": r"a socket|not a regular file",
    "dev-zero": r"character device|device file|not a regular file",
}


def _config_special(kind: str, cause: str) -> None:
    @case(
        T,
        f"config-{kind}",
        2,
        f"--config naming a special file: {kind.replace('-', ' ')} (a FIFO used to hang)",
        cause=cause,
    )
    def run(ctx: Ctx):
        path = _special(ctx.dir / "cfg.yaml", kind)
        out = ctx.dir / "runs"
        proc = ctx.cli(ctx.train_args(out=out, config=str(path)), timeout=QUICK)
        return proc, nothing_under(out) and _still(path, kind), ""


for _kind in ("fifo", "dev-zero", "socket", "link-to-fifo"):
    _config_special(_kind, SPECIAL_CAUSES[_kind])


def _images_special(kind: str, cause: str) -> None:
    @case(PR, f"images-{kind}", 2, f"--images naming {kind.replace('-', ' ')}", cause=cause)
    def run(ctx: Ctx):
        path, out = _special(ctx.dir / "x.npy", kind), ctx.dir / "pred.npz"
        proc = ctx.predict(
            "--images", str(path), "--run-dir", str(ctx.base / "base"), "--output", str(out), timeout=QUICK
        )
        return proc, not out.exists() and _still(path, kind), ""


for _kind in ("fifo", "dev-zero"):
    _images_special(_kind, SPECIAL_CAUSES[_kind])


@case(T, "data-dir-fifo", 2, "data.data_dir naming a FIFO", cause=r"a FIFO|named pipe|not a directory")
def data_dir_fifo(ctx: Ctx):
    fifo = _special(ctx.dir / "data", "fifo")
    proc, ok, note = refused(ctx, "--set", f"data.data_dir={fifo}", timeout=QUICK)
    return proc, ok and _still(fifo, "fifo"), note


def _train_npz(path: Path, n: int = 200) -> None:
    rng = np.random.default_rng(2)
    np.savez(path, image=rng.integers(0, 256, (n, 28, 28, 1), np.uint8), label=np.arange(n) % 10)


ARRAYS = {
    # name: (the file that is a FIFO ("": data.path itself), what, the cause its line must name)
    "arrays-train-fifo": (
        "train.npz",
        "an arrays source whose train.npz is a FIFO",
        r"train\.npz.*(a FIFO|named pipe|not a regular file)",
    ),
    "arrays-test-fifo": (
        "test.npz",
        "an arrays source whose test.npz is a FIFO (train.npz good)",
        r"test\.npz.*(a FIFO|named pipe|not a regular file)",
    ),
    "arrays-path-fifo": ("", "data.path of an arrays source naming a FIFO", r"a FIFO|named pipe|not a directory"),
}


def _arrays_special(name: str, file: str, what: str, cause: str) -> None:
    @case(T, name, 2, what, cause=cause)
    def run(ctx: Ctx):
        root = ctx.dir / "parts"
        if file:
            root.mkdir()
            _train_npz(root / "train.npz")
            (root / file).unlink(missing_ok=True)
        fifo = _special(root / file if file else root, "fifo")
        sets = (
            "--set",
            "data.source=arrays",
            "--set",
            f"data.path={root}",
            "--set",
            f"data.data_dir={ctx.dir / 'data'}",
        )
        proc, ok, note = refused(ctx, *sets, timeout=QUICK)
        return proc, ok and _still(fifo, "fifo"), note


for _name, (_file, _what, _cause) in ARRAYS.items():
    _arrays_special(_name, _file, _what, _cause)


@case(T, "image-folder-with-fifo", 0, "an image folder with a FIFO among a class's images: left out like a dot file")
def folder_fifo(ctx: Ctx):
    from PIL import Image

    root, rng = ctx.dir / "parts", np.random.default_rng(3)
    for c in ("a", "b"):
        (root / "train" / c).mkdir(parents=True)
        for i in range(40):
            Image.fromarray(rng.integers(0, 256, (28, 28), np.uint8)).save(root / "train" / c / f"{i:03d}.png")
    fifo = _special(root / "train" / "a" / "050.png", "fifo")
    sets = ("--set", "data.source=image_folder", "--set", f"data.path={root}", "--set", "train.batch_size=16")
    proc = ctx.train(*sets, "--set", f"data.data_dir={ctx.dir / 'data'}", out=ctx.dir / "runs", timeout=300)
    snap = ctx.dir / "runs" / "r" / "data_snapshot.json"
    files = json.loads(snap.read_text()).get("file_count") if check_json(snap) else None
    return proc, files == 80 and _still(fifo, "fifo"), f"{files} image files prepared"


# MARK: class 2: YAML that expands, recurses or grows


def _bomb_lines(levels: int = 8, leaf: str = "[x, x, x, x, x, x, x, x, x, x]") -> list[str]:
    """An anchor of ten aliases of an anchor of ten aliases ...: about 10**(levels + 1) values."""
    lines = [f"a0: &a0 {leaf}"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels + 1)]
    return lines


def _indented(lines: list[str], spaces: int) -> str:
    return "".join(" " * spaces + line + "\n" for line in lines)


MAPPING = "{k0: 1, k1: 1, k2: 1, k3: 1, k4: 1, k5: 1, k6: 1, k7: 1, k8: 1, k9: 1}"
# the causes a line must name: values an alias bomb expands to, nesting, a number's digits
BOMB, DEEP, DIGITS = (
    r"aliases|alias bomb|expands to",
    r"too deep|recursion|depth",
    r"digits|number.*too (large|long|big)",
)
YAML_FILES = {
    "alias-bomb-model-options": (
        "model:\n  options:\n" + _indented(_bomb_lines(), 4),
        "a YAML alias bomb (10**9 values) inside model.options, a free-form mapping",
        BOMB,
    ),
    "alias-bomb-top-level": (
        "\n".join(_bomb_lines()) + "\n",
        "a YAML alias bomb at the top level (unknown keys)",
        BOMB,
    ),
    "alias-bomb-of-mappings": (
        "eval:\n  evaluators:\n" + _indented(_bomb_lines(leaf=MAPPING), 4),
        "an alias bomb of mappings inside eval.evaluators",
        BOMB,
    ),
    "yaml-deep-nesting": (
        "model:\n  options:\n    deep: " + "[" * 100_000 + "]" * 100_000 + "\n",
        "100,000 nested lists",
        DEEP,
    ),
    "yaml-huge-integer": ("seed: " + "9" * 100_000 + "\n", "a seed of 100,000 digits", DIGITS),
}


def _yaml_file(name: str, text: str, what: str, cause: str) -> None:
    @case(T, name, 2, what, cause=cause)
    def run(ctx: Ctx):
        path = ctx.dir / "cfg.yaml"
        path.write_text(text)  # on its own: the config's other values are the defaults
        out = ctx.dir / "runs"
        return ctx.cli(ctx.train_args(out=out, config=str(path)), timeout=QUICK), nothing_under(out), ""


for _name, (_text, _what, _cause) in YAML_FILES.items():
    _yaml_file(_name, _text, _what, _cause)

SETS = {
    "alias-bomb-in-set": (
        "model.options={" + ", ".join(_bomb_lines()) + "}",
        "--set model.options={...}: an alias bomb in an override's value",
        BOMB,
    ),
    "set-deep-nesting": (
        "model.options={a: " + "[" * 60_000 + "]" * 60_000 + "}",
        "--set value of 60,000 nested lists",
        DEEP,
    ),
    "set-huge-integer": ("seed=" + "9" * 100_000, "--set seed= a number of 100,000 digits", DIGITS),
}


def _bad_value(name: str, assignment: str, what: str, cause: str) -> None:
    @case(T, name, 2, what, cause=cause)
    def run(ctx: Ctx):
        return refused(ctx, "--set", assignment, timeout=QUICK)


for _name, (_assignment, _what, _cause) in SETS.items():
    _bad_value(_name, _assignment, _what, _cause)


# MARK: class 3: a user's module that ends the process

NET = """import flax.linen as nn


class Net(nn.Module):
    num_classes: int = 10

    @nn.compact
    def __call__(self, x, train: bool = False):
        return nn.Dense(self.num_classes)(x.reshape((x.shape[0], -1)))
"""


def _exits(code: int) -> str:
    """The cause of a user's code that ends the process with ``code``."""
    return rf"sys\.exit\({code}\)|SystemExit\({code}\)|exit(ed|s)? with (code |status )?{code}\b"


INTERRUPT = r"KeyboardInterrupt|Ctrl-C"  # the code raised it: no signal was sent, so not "stopped by SIGINT"
MODULES = {
    # name: (what model.name / data.builder names, the module's text, what, the cause its line must name)
    "model-module-exit-0": (
        "model",
        NET + "import sys\nsys.exit(0)\n",
        "a network module calling sys.exit(0) at import",
        _exits(0),
    ),
    "model-module-exit-3": (
        "model",
        NET + "raise SystemExit(3)\n",
        "a network module calling sys.exit(3) at import",
        _exits(3),
    ),
    "model-module-interrupt": (
        "model",
        NET + "raise KeyboardInterrupt\n",
        "a network module raising Ctrl-C at import",
        INTERRUPT,
    ),
    "builder-module-exit-0": (
        "builder",
        "import sys\nsys.exit(0)\n",
        "a data.builder module calling sys.exit(0)",
        _exits(0),
    ),
    "builder-module-interrupt": (
        "builder",
        "raise KeyboardInterrupt\n",
        "a data.builder module raising Ctrl-C",
        INTERRUPT,
    ),
    "model-forward-exit-0": (
        "model",
        NET.replace("        return nn.Dense", "        import sys\n\n        sys.exit(0)\n        return nn.Dense"),
        "a network whose forward pass (traced by the preflight) calls sys.exit(0)",
        _exits(0),
    ),
    "model-function-exit-0": (
        "function",
        "def build(cfg, num_classes):\n    import sys\n    sys.exit(0)\n",
        "a network function (not the import) calling sys.exit(0)",
        _exits(0),
    ),
    "model-function-exit-3": (
        "function",
        "def build(cfg, num_classes):\n    raise SystemExit(3)\n",
        "a network function calling sys.exit(3)",
        _exits(3),
    ),
    "model-function-interrupt": (
        "function",
        "def build(cfg, num_classes):\n    raise KeyboardInterrupt\n",
        "a network function raising KeyboardInterrupt (no signal was sent)",
        INTERRUPT,
    ),
}


def _user_module(name: str, kind: str, text: str, what: str, cause: str) -> None:
    @case(T, name, 2, what, cause=cause)
    def run(ctx: Ctx):
        module = name.replace("-", "_")
        (ctx.dir / f"{module}.py").write_text(text)
        if kind == "builder":
            sets = ("--set", f"data.builder={module}:Builder", "--set", "data.name=my_parts")
            sets += ("--set", f"data.data_dir={ctx.dir / 'data'}")
        else:
            sets = ("--set", f"model.name={module}:{'build' if kind == 'function' else 'Net'}")
        out = ctx.dir / "runs"
        proc = ctx.cli(ctx.train_args(*sets, out=out), env={"PYTHONPATH": str(ctx.dir)}, timeout=180)
        line = (error_lines(proc.err, "err") or [""])[0]
        named = module in line  # the line names the module (or its function)
        return proc, nothing_under(out) and named, "" if named else "the line does not name the module"


for _name, (_kind, _text, _what, _cause) in MODULES.items():
    _user_module(_name, _kind, _text, _what, _cause)


@case(T, "model-module-prints-5000-lines", 0, "a network module printing 5,000 lines at import; the run completes")
def chatty(ctx: Ctx):
    (ctx.dir / "chatty_net.py").write_text(NET + "for i in range(5000):\n    print('noise line', i)\n")
    out = ctx.dir / "runs"
    sets = ("--set", "model.name=chatty_net:Net")
    proc = ctx.cli(ctx.train_args(*sets, out=out), env={"PYTHONPATH": str(ctx.dir)}, timeout=300)
    last = proc.out.strip().splitlines()[-1:] == [str(out / "r")]
    noisy = [line for line in (proc.out + proc.err).splitlines() if "noise line" in line]
    quiet = len(noisy) <= 1 and "noise line" not in proc.out  # logged as one line at most
    ok = last and quiet and check_json(out / "r" / "report.json")
    return proc, ok, f"last line is the run dir: {last}, the noise logged as one line: {quiet}"


# MARK: class 4: sizes at the limits


def _tiny_with(ctx: Ctx, extra: str, options: str = "") -> Path:
    text = Path(TINY).read_text()
    if options:
        text = text.replace("model:\n", f'model:\n  options: {{note: "{options}"}}\n')
    path = ctx.dir / "cfg.yaml"
    path.write_text(text + extra)
    return path


def _sized(name: str, expect: int, what: str, make, *sets: str, cause: str | None = None) -> None:
    @case(T, name, expect, what, cause=cause)
    def run(ctx: Ctx):
        out = ctx.dir / "runs"
        proc = ctx.cli(ctx.train_args(*sets, out=out, config=str(make(ctx))), timeout=300 if expect == 0 else 120)
        ok = check_json(out / "r" / "report.json") if expect == 0 else nothing_under(out)
        return proc, ok, f"config {os.path.getsize(ctx.dir / 'cfg.yaml'):,} bytes"


COMMENT = "# " + "c" * 98 + "\n"
# the config (as a run's parameters) is larger than a flow run's parameters may be
TOO_BIG = r"bytes.*(more|larger) than|too (large|big)|exceeds.*(limit|bytes)"
_sized(
    "config-590kb-options",
    2,
    "a valid 590 KB config (model.options)",
    lambda c: _tiny_with(c, "", "x" * 590_000),
    cause=TOO_BIG,
)
_sized("config-590kb-comments", 0, "a 590 KB config that is mostly comments", lambda c: _tiny_with(c, COMMENT * 5_900))
_sized(
    "config-over-1mib",
    2,
    "a config file just over 1 MiB",
    lambda c: _tiny_with(c, COMMENT * 10_500),
    cause=r"(larger|more|bigger) than [0-9,.]+ ?(bytes|MiB)|too (large|big)|exceeds [0-9,.]+ ?(bytes|MiB)",
)
_sized(
    "set-pushes-config-over-limit",
    2,
    "a 450 KB config plus a 120 KB --set value: over the limit together",
    lambda c: _tiny_with(c, "", "x" * 450_000),
    "--set",
    "model.options.more=" + "y" * 120_000,
    cause=TOO_BIG,
)


# MARK: class 5: names of the output directory's own


def _reserved(name: str, run: str, what: str, cause: str) -> None:
    @case(T, name, 2, what, cause=cause)
    def run_(ctx: Ctx):
        out = ctx.copy_base()
        (out / "notes.txt").write_text("the user's own file\n")
        before = {p: (out / p).read_bytes() if (out / p).is_file() else b"" for p in listing(out)}
        proc = ctx.cli([*ctx.train_args(out=out, run=None), f"--run-name={run}"], timeout=120)
        after = {p: (out / p).read_bytes() if (out / p).is_file() else b"" for p in listing(out)}
        changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
        return proc, not changed, f"changed {changed[:3]}" if changed else "the output dir as it was"


# the causes a line must name: a name the output directory keeps for its own files (the
# run name itself is in every line, so it cannot be the cause), or a name outside the rule
OWN = r"reserved|uses (it )?for itself|(output directory's|its) own"
ONE_NAME = r"not a single directory name"
RESERVED = {
    "run-name-champion-json": ("champion.json", "--run-name champion.json (the output dir's champion file)", OWN),
    "run-name-history-jsonl": ("history.jsonl", "--run-name history.jsonl", OWN),
    "run-name-corrupt-state": ("corrupt-state", "--run-name corrupt-state (the quarantine directory)", OWN),
    "run-name-champion-upper": ("CHAMPION.JSON", "--run-name CHAMPION.JSON (case-insensitive file systems)", OWN),
    "run-name-dot": (".", "--run-name .", ONE_NAME + r"|current directory"),
    "run-name-newline": ("a\nb", "a run name with a newline", ONE_NAME + r"|a newline|control character"),
    "run-name-non-ascii": (
        "caf\u00e9",
        "a run name with a non-ASCII letter",
        ONE_NAME + r"|non-ASCII (letter|character)|not ASCII|only ASCII",
    ),
    "run-name-existing-file": (
        "notes.txt",
        "--run-name of a file the user keeps in the output dir",
        r"is a file|is taken|already exists",
    ),
}
for _name, (_run, _what, _cause) in RESERVED.items():
    _reserved(_name, _run, _what, _cause)


def _bad_output_dir(name: str, part: str, what: str, cause: str) -> None:
    @case(T, name, 2, what, cause=cause)
    def run(ctx: Ctx):
        proc = ctx.cli(ctx.train_args(out=ctx.dir / part), timeout=120)
        made = sorted(p.name for p in ctx.dir.iterdir() if not p.name.startswith("cmd"))
        return proc, not made, f"created {made}" if made else "nothing created"


_bad_output_dir(
    "output-dir-newline",
    "runs\nfake",
    "an output dir whose path has a newline",
    r"control character|a newline|line break",
)
_bad_output_dir("output-dir-tab", "a\tb", "an output dir whose path has a tab", r"control character|a tab\b")
