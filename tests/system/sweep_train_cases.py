"""Sweep cases of the training command line: bad config, run names, output directories
and the run's own state (refused before compute: nothing written)."""

from __future__ import annotations

import shutil
import subprocess

from ensemble_core.processutil import free_port
from tests.system.sweep import Ctx, case_table, listing, nothing_under, refused, rerun_base

T = "train CLI"
CASES, case = case_table()


def _sets(*pairs: str) -> list[str]:
    return [a for p in pairs for a in ("--set", p)]


BAD_SETS = {
    # name: (the --set, what is wrong, the cause its line must name)
    "set-unknown-key": ("train.lr=0.1", "an unknown key (typo of learning_rate)", r"unknown config key 'train\.lr'"),
    "set-wrong-type": ("ensemble.size=four", "a word for an integer", r"ensemble\.size.*(integer|int\b)"),
    "set-nan-lr": ("train.learning_rate=.nan", "NaN learning rate", r"learning_rate.*(nan|finite)"),
    "set-no-equals": ("trainepochs", "--set without '='", r"no '='|without '='|missing '='"),
    "set-seed-huge": (
        "seed=99999999999",
        "a seed over 2**32",
        r"seed.*(4294967295|2\*\*32|less than or equal|at most|too (large|big))",
    ),
    "set-epochs-zero": (
        "train.epochs=0",
        "0 epochs",
        r"train\.epochs.*(greater than or equal to 1|at least 1|>= ?1|positive)",
    ),
    "set-batch-huge": (
        "train.batch_size=100000",
        "batch larger than the training split",
        r"batch_size.*(larger|more|greater) than.*(training|examples)|batch_size.*exceeds",
    ),
    "set-width-huge": (
        "model.hidden_sizes=[100000000]",
        "an MLP layer of 1e8 units",
        r"hidden_sizes.*(65536|less than or equal|at most|too (large|big|wide))",
    ),
    "set-model-missing": (
        "model.name=resnet9000",
        "a model name that does not exist",
        r"unknown model|resnet9000.*(not one of|not found|does not exist)",
    ),
    "set-model-import-missing": (
        "model.name=nowhere.nets:build",
        "package.module:function that does not import",
        r"cannot import|no module named",
    ),
    "set-dataset-unknown": (
        "data.name=no_such_set",
        "a dataset name that does not exist",
        r"unknown dataset|no_such_set.*(not found|does not exist)",
    ),
    "set-mesh-too-big": (
        "mesh.ensemble=16",
        "a mesh larger than the 8 devices",
        r"needs 16 devices|only 8 (devices )?exist|more devices than",
    ),
    "set-memory-huge": (
        "ensemble.size=1024",
        "1024 members of 2 x 4096 units: more memory than the host",
        r"GiB of memory|memory.*(available|host)|out of memory",
    ),
}


def _bad_set(name: str, assignment: str, what: str, cause: str) -> None:
    extra = ["--set", "model.hidden_sizes=[4096,4096]"] if name == "set-memory-huge" else []

    @case(T, name, 2, f"--set {assignment}: {what}", cause=cause)
    def run(ctx: Ctx):
        return refused(ctx, *extra, "--set", assignment)


for _name, (_assignment, _what, _cause) in BAD_SETS.items():
    _bad_set(_name, _assignment, _what, _cause)


def _user_model(name: str, module: str, body: str, what: str, cause: str) -> None:
    @case(T, name, 2, f"model.name=module:function {what}", cause=cause)
    def run(ctx: Ctx):
        (ctx.dir / f"{module}.py").write_text(f"def build(cfg, num_classes):\n    {body}\n")
        out = ctx.dir / "runs"
        proc = ctx.cli(ctx.train_args("--set", f"model.name={module}:build", out=out), env={"PYTHONPATH": str(ctx.dir)})
        return proc, nothing_under(out), ""


_user_model(
    "model-function-raises",
    "sweep_nets",
    "raise ValueError('no such width')",
    "whose function raises",
    r"raised ValueError|ValueError: no such width",
)
_user_model(
    "model-returns-dict",
    "sweep_nets2",
    "return {'w': 1}",
    "returning a dict, not a Flax module",
    r"returned a dict|dict.*not a .*module",
)


@case(T, "data-dir-is-file", 2, "data.data_dir names a regular file", cause=r"is a file|not a directory")
def data_dir_file(ctx: Ctx):
    (ctx.dir / "f").write_text("x")
    return refused(ctx, "--set", f"data.data_dir={ctx.dir / 'f'}")


CONFIGS = {
    # name: (the file's content, what is wrong, the cause its line must name)
    "config-missing": (None, "--config naming no file", r"no such file|does not exist|not found"),
    "config-directory": ("DIR", "--config naming a directory", r"is a directory"),
    "config-binary": (
        b"\x00\x01\x02\x89PNG\r\n",
        "--config of binary bytes",
        r"not text|NUL byte|is binary|binary (file|data|bytes)",
    ),
    "config-list": (b"- train\n- epochs\n", "YAML that is a list, not a mapping", r"mapping.*list|not a mapping"),
    "config-bad-yaml": (
        b"train: [1, 2\n",
        "YAML with an unclosed bracket",
        r"not valid YAML|YAML syntax|while parsing",
    ),
    "config-wrong-file": (
        None,
        "a .npy file passed as --config (the user's wrong file)",
        r"not text|NUL byte|is binary|binary (file|data|bytes)|NumPy|\.npy file",
    ),
}


def _bad_config(name: str, content, what: str, cause: str) -> None:
    @case(T, name, 2, what, cause=cause)
    def run(ctx: Ctx):
        path = ctx.dir / "cfg.yaml"
        if content == "DIR":
            path.mkdir()
        elif isinstance(content, bytes):
            path.write_bytes(content)
        elif name == "config-wrong-file":
            import numpy as np

            np.save(ctx.dir / "cfg.npy", np.zeros((2, 28, 28, 1), np.uint8))
            path = ctx.dir / "cfg.npy"
        out = ctx.dir / "runs"
        proc = ctx.cli(ctx.train_args(out=out, config=str(path)), timeout=120)
        return proc, nothing_under(out), ""


for _name, (_content, _what, _cause) in CONFIGS.items():
    _bad_config(_name, _content, _what, _cause)


ONE_NAME = r"not a single directory name"  # the run name's rule: one name of letters, digits, '-', '_', '.'
RUN_NAMES = {
    # name: (the run name, what is wrong, the cause its line must name)
    "run-name-slash": ("a/b", "a run name with '/'", ONE_NAME + r"|a '/'|a slash|path separator"),
    "run-name-dotdot": ("..", "run name '..'", ONE_NAME + r"|parent directory"),
    "run-name-space": ("my run", "a run name with a space", ONE_NAME + r"|(a|has) space|whitespace"),
    "run-name-long": (
        "x" * 300,
        "a 300-character run name",
        r"300 bytes|(longer|more) than (the )?255|too long|NAME_MAX",
    ),
}


def _bad_name(name: str, run: str, what: str, cause: str) -> None:
    @case(T, name, 2, what, cause=cause)
    def run_(ctx: Ctx):
        argv = [*ctx.train_args(out=ctx.dir / "runs", run=None), f"--run-name={run}"]
        proc = ctx.cli(argv, timeout=120)
        escaped = any(p.name == "escape" for p in ctx.dir.iterdir())
        return proc, nothing_under(ctx.dir / "runs") and not escaped, ""


for _name, (_run, _what, _cause) in RUN_NAMES.items():
    _bad_name(_name, _run, _what, _cause)


@case(T, "output-dir-is-file", 2, "--output-dir names a regular file", cause=r"is a file|not a directory")
def out_file(ctx: Ctx):
    (ctx.dir / "runs").write_text("not a dir")
    proc = ctx.train(out=ctx.dir / "runs", timeout=120)
    return proc, (ctx.dir / "runs").read_text() == "not a dir", ""


@case(
    T,
    "output-dir-readonly",
    2,
    "--output-dir on a read-only tmpfs",
    cause=r"not writable|is read-only|read-only file system|permission denied",
)
def out_ro(ctx: Ctx):
    out = ctx.mount_tmpfs(ctx.dir / "runs", "ro,size=1m")
    return ctx.train(out=out, timeout=120), nothing_under(out), ""


@case(
    T,
    "output-disk-full-at-start",
    2,
    "--output-dir on a tmpfs already full (64 KiB, filled)",
    cause=r"no space left|disk (is )?full",
)
def out_full(ctx: Ctx):
    out = ctx.mount_tmpfs(ctx.dir / "runs", "size=64k")
    subprocess.run(["dd", "if=/dev/zero", f"of={out / 'filler'}", "bs=4k"], capture_output=True)
    proc = ctx.train(out=out, timeout=240)
    left = [p for p in listing(out) if p != "filler" and "orbax-checkpoint-tmp" in p]
    return proc, not left, f"left {left[:2]}" if left else ""


@case(
    T,
    "output-disk-fills-in-training",
    2,
    "--output-dir on a 3 MiB tmpfs that fills while checkpointing",
    cause=r"no space left|disk (is )?full",
)
def out_fills(ctx: Ctx):
    out = ctx.mount_tmpfs(ctx.dir / "runs", "size=3m")
    proc = ctx.train("--set", "train.epochs=30", "--set", "checkpoint.keep=100", out=out, timeout=300)
    tmp_left = [p for p in listing(out) if "orbax-checkpoint-tmp" in p]
    return proc, not tmp_left, f"orbax temporaries left: {tmp_left[:2]}" if tmp_left else ""


@case(
    T,
    "run-dir-locked",
    2,
    "the run directory's lock held by another live process",
    cause=r"in use by another|is locked|lock (is )?held|holds? (its|the) lock",
)
def locked(ctx: Ctx):
    out = ctx.copy_base()
    code = "import sys,time; from ensemble_core.runs.storage.lock import run_lock\nwith run_lock(sys.argv[1]):\n"
    code += "    print('held', flush=True); time.sleep(600)\n"
    holder = ctx.start(["-c", code, str(out / "base")])
    ctx.wait_output(holder, "held", 120)
    before = listing(out)
    proc = ctx.train(out=out, run="base", timeout=180)
    ctx.finish(holder, 0)
    ctx.procs.pop()  # the holder was killed on purpose
    return proc, listing(out) == before, ""


@case(
    T,
    "resume-changed-config",
    2,
    "rerun a finished run's name with another learning rate",
    cause=r"(another|different|changed) config.*learning_rate|learning_rate.*(->|changed|differs)",
)
def resume_changed(ctx: Ctx):
    return rerun_base(ctx, "train.learning_rate=0.05")


@case(
    T,
    "resume-fewer-epochs",
    2,
    "rerun a finished 2-epoch run with train.epochs=1",
    cause=r"already trained 2 epochs|fewer epochs than",
)
def resume_fewer(ctx: Ctx):
    return rerun_base(ctx, "train.epochs=1")


@case(
    T,
    "server-unreachable",
    2,
    "PREFECT_API_URL naming a port where nothing listens",
    cause=r"does not answer|is unreachable|not reachable|connection refused|cannot connect",
)
def server_down(ctx: Ctx):
    out = ctx.dir / "runs"
    proc = ctx.cli(ctx.train_args(out=out), env={"PREFECT_API_URL": f"http://127.0.0.1:{free_port()}/api"})
    return proc, nothing_under(out), ""


@case(
    T,
    "dataset-shard-truncated",
    2,
    "a prepared dataset's shard truncated to half (copied data dir)",
    cause=r"(is|was) (damaged|truncated|corrupt)|truncated or corrupt|corrupted",
)
def shard(ctx: Ctx):
    data = ctx.dir / "data"
    shutil.copytree(ctx.data, data, symlinks=True)
    shard = sorted(p for p in data.glob("snapshots/mnist5k/*/mnist5k/*/*-train.*-of-*"))[0]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    out = ctx.dir / "runs"
    proc = ctx.train("--set", f"data.data_dir={data}", out=out)
    return proc, nothing_under(out), ""
