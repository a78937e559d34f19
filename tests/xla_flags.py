"""The XLA flags of every process the tests start (no JAX import: tests/conftest.py reads
this before JAX is imported).

``--xla_backend_optimization_level=1``: LLVM at -O1 instead of XLA:CPU's default -O3. The
tests' small programs are mostly compiling, and -O1 compiles them with about 40% less CPU
(measured on test_train.py, test_stateful_members.py and test_recorded_predictions.py
together: 205 against 331 CPU s). Every comparison with a reference holds at both levels;
-O0 would not (unfused multiply-adds put test_train.py's oracle 2e-5 apart). The default
run, the benchmarks and the full-disk save race of tests/test_full_disk.py compile at the
default level.
"""

from __future__ import annotations

COMPILE = "--xla_backend_optimization_level=1"


def xla_flags(devices: int = 8) -> str:
    """``XLA_FLAGS`` for a test process with ``devices`` simulated CPU devices."""
    return f"--xla_force_host_platform_device_count={devices} {COMPILE}"
