"""A reader never touches what a writer owns (issue 43, class 1): opening a run's
checkpoints to read them (prediction, evaluation, the champion's re-evaluation, the
preflight) leaves every file under ``checkpoints/`` as it was, another process's save in
flight included."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from ensemble_core.errors import CheckpointError
from ensemble_core.runs.storage.checkpoint import STATE_FORMAT, EnsembleCheckpointer

ROOT = Path(__file__).resolve().parents[1]


def _tree(directory: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``directory`` with its size and mtime (ns)."""
    return {str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns) for p in directory.rglob("*")}


def test_a_reader_leaves_a_save_in_flight_and_every_file_as_it_was(tmp_path):
    ckpts = tmp_path / "run" / "checkpoints"
    state = {"w": jnp.arange(4.0)}
    with EnsembleCheckpointer(ckpts) as writer:
        writer.save(7, state, {"step": 7, "state_format": STATE_FORMAT})
    # another process's save of step 8, in flight: orbax's temporary directory
    in_flight = ckpts / "8.orbax-checkpoint-tmp-1764218400000000"
    (in_flight / "state").mkdir(parents=True)
    (in_flight / "state" / "part").write_bytes(b"x" * 64)
    before = _tree(ckpts)
    with EnsembleCheckpointer(ckpts, read_only=True) as reader:
        restored, meta = reader.restore({"w": jnp.zeros(4)})
        assert reader.latest_step() == 7 and meta == {"step": 7, "state_format": STATE_FORMAT}
        np.testing.assert_array_equal(np.asarray(restored["w"]), np.arange(4.0))
        with pytest.raises(CheckpointError, match="read-only"):
            reader.save(9, state, {})
        with pytest.raises(CheckpointError, match="read-only"):
            reader.restore_latest_valid({"w": jnp.zeros(4)})
    assert _tree(ckpts) == before  # the save in flight and every file untouched


def test_a_reader_of_a_run_without_checkpoints_creates_nothing(tmp_path):
    ckpts = tmp_path / "run" / "checkpoints"
    with EnsembleCheckpointer(ckpts, read_only=True) as reader:
        assert reader.latest_step() is None
        with pytest.raises(CheckpointError, match="no checkpoint"):
            reader.restore({"w": jnp.zeros(4)})
    assert not ckpts.exists()


WRITER = textwrap.dedent(
    """
    import sys, jax.numpy as jnp
    from ensemble_core.runs.storage.checkpoint import STATE_FORMAT, EnsembleCheckpointer
    state = {"w": jnp.ones((4, 1024, 1024))}  # 16 MB a save: each stays in flight a while
    with EnsembleCheckpointer(sys.argv[1], keep=3) as ckpt:
        for step in range(1, int(sys.argv[2]) + 1):
            ckpt.save(step, state, {"step": step})
            print("saving", step, flush=True)
    print("done", flush=True)
    """
)


@pytest.mark.slow  # two processes, a writer saving 16 MB checkpoints while this one reads: about 10 s
def test_readers_while_another_process_saves_leave_every_save_intact(tmp_path):
    """The real thing: a writer process saves checkpoint after checkpoint while this
    process opens the directory to read it again and again; every save completes."""
    ckpts = tmp_path / "checkpoints"
    steps = 12
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(ckpts), str(steps)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    reads = 0
    seen_in_flight = 0
    deadline = time.monotonic() + 120
    while writer.poll() is None and time.monotonic() < deadline:
        if ckpts.is_dir():
            seen_in_flight += any(".orbax-checkpoint-tmp" in p.name for p in ckpts.iterdir())
            with EnsembleCheckpointer(ckpts, read_only=True) as reader:
                if reader.latest_step() is not None:
                    reader.read_meta()
                    reads += 1
    out, err = writer.communicate(timeout=120)
    assert writer.returncode == 0, err[-2000:]
    assert out.strip().splitlines()[-1] == "done" and reads > 0
    assert seen_in_flight > 0  # the readers did open the directory while a save was in flight
    with EnsembleCheckpointer(ckpts, read_only=True) as reader:
        assert reader.all_steps() == [steps - 2, steps - 1, steps] and reader.read_meta() == {"step": steps}


def test_a_reader_whose_latest_step_a_writer_removed_reads_the_new_latest(tmp_path):
    """The reader listed the steps (latest 1); the writer then saved step 2 and its
    preservation policy (keep 1) removed step 1 before the reader read it: the reader lists
    again and reads step 2. It used to fail with "cannot be read" (a prediction slower than
    a run's checkpoint interval)."""
    ckpts = tmp_path / "run" / "checkpoints"
    with EnsembleCheckpointer(ckpts, keep=1) as writer:
        writer.save(1, {"w": jnp.full(4, 1.0)}, {"step": 1, "state_format": STATE_FORMAT})
        writer.wait()
        with EnsembleCheckpointer(ckpts, read_only=True) as reader:
            assert reader.latest_step() == 1
            writer.save(2, {"w": jnp.full(4, 2.0)}, {"step": 2, "state_format": STATE_FORMAT})
            writer.wait()
            assert not (ckpts / "1").exists() and reader.latest_step() == 1  # the reader's listing is stale
            assert reader.read_meta()["step"] == 2
            restored, meta = reader.restore({"w": jnp.zeros(4)})
    assert meta["step"] == 2
    np.testing.assert_array_equal(np.asarray(restored["w"]), np.full(4, 2.0))
