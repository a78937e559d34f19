"""Process environment the flows need, applied before JAX is imported.

On CPU the project runs members in parallel on simulated host devices (one per member,
up to 8). A user's own ``XLA_FLAGS`` always wins: the device-count flag is only added
when ``XLA_FLAGS`` does not already set it. The same goes for the JAX compilation
cache variables below: set them yourself to move or disable the cache.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path

from ensemble_core.config import HOST_DEVICES  # pydantic and numpy, no JAX

__all__ = ["apply"]
_FLAG = "--xla_force_host_platform_device_count"


def apply() -> None:
    flags = os.environ.get("XLA_FLAGS", "")
    if _FLAG not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {_FLAG}={HOST_DEVICES}".strip()
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # Prefect warns at import (two lines) when it cannot create PREFECT_HOME; the commands
    # report what that stops, the temporary server's database, in one line
    # (flows._server.temporary_database_unwritable), and nothing else needs the directory.
    warnings.filterwarnings("ignore", message="Failed to create the Prefect home directory", category=UserWarning)
    # Member groups on Dask: the scheduler's and workers' own INFO lines stay out of the run's log.
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")
    # Warnings of ensemble_core (a damaged checkpoint or champion pointer set aside) go to
    # the flow run's logs too (effective when Prefect is imported after this module).
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "ensemble_core")
    # ... and its progress lines (INFO: corrupted sets generated, snapshots written, runs
    # pruned): Prefect gives the extra loggers its handlers but not a level, so they would
    # inherit the root logger's WARNING.
    logging.getLogger("ensemble_core").setLevel(logging.INFO)
    # JAX's persistent compilation cache, shared by every run of this user: a nightly
    # rerun of the same config loads its programs instead of compiling them again.
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(Path.home() / ".cache" / "ensemble-pipeline" / "jax"))
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
    if "jax" in sys.modules:  # imported before us (e.g. by a Prefect engine): JAX read its env already
        import jax

        jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
        jax.config.update(
            "jax_persistent_cache_min_compile_time_secs",
            float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]),
        )
        jax.config.update(
            "jax_persistent_cache_min_entry_size_bytes", int(os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"])
        )


apply()
