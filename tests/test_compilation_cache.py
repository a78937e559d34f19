"""The bounded JAX persistent compilation cache that ``make test-fast`` keeps between runs
(``Makefile``: ``JAX_COMPILATION_CACHE_DIR`` under ``.cache/`` and
``JAX_COMPILATION_CACHE_MAX_SIZE``): with a size bound, JAX writes its entries only where
the ``filelock`` package is installed (the test extra's pin); without it every entry is
refused with a warning and each run compiles everything again."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

COMPILE = """
import jax, jax.numpy as jnp
print(float(jax.jit(lambda x: (x * 2.0 + 1.0).sum())(jnp.arange(5.0))))
"""


@pytest.mark.slow  # two interpreters importing JAX
def test_a_size_bounded_cache_keeps_the_programs_and_the_next_process_reads_them(tmp_path):
    cache = tmp_path / "jax-cache"
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    env.update(
        JAX_PLATFORMS="cpu",
        JAX_COMPILATION_CACHE_DIR=str(cache),
        JAX_COMPILATION_CACHE_MAX_SIZE=str(64 * 2**20),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )

    def run() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", COMPILE], cwd=ROOT, env=env, capture_output=True, text=True)

    first = run()
    assert first.returncode == 0, first.stderr[-2000:]
    assert float(first.stdout) == 25.0  # (0+1+2+3+4) * 2 + 5
    assert "filelock" not in first.stderr, first.stderr[-2000:]
    entries = sorted(p.name for p in cache.iterdir()) if cache.exists() else []
    assert entries, f"no cache entry written under the size bound: {first.stderr[-2000:]}"
    second = run()
    assert second.returncode == 0 and float(second.stdout) == 25.0, second.stderr[-2000:]
    # read, not rewritten: the same entries, none added
    assert sorted(p.name for p in cache.iterdir()) == entries
