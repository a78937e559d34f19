"""Process environment the flows need, applied before JAX is imported.

On CPU the project runs members in parallel on simulated host devices (one per member,
up to 8). A user's own ``XLA_FLAGS`` always wins: the device-count flag is only added
when ``XLA_FLAGS`` does not already set it. The same goes for the JAX compilation
cache variables below: set them yourself to move or disable the cache.

The project's loggers (``ensemble_core``, INFO and up) go to the flow run's logs in
Prefect: through ``PREFECT_LOGGING_EXTRA_LOGGERS`` when Prefect is imported after this
module (a command line), else attached to Prefect's handlers when a flow starts
(:func:`attach_project_logger`; a deployment's flow-run process imports Prefect before the
flow's module, and prefect.yaml sets the variable there too).

TFDS's own output while a dataset is prepared (its progress bars, and its warnings that
a variant folder has no ``dataset_info.json``, which it logs each time it checks whether a
dataset not yet prepared is prepared) is off in the flows' processes
(:func:`quiet_tfds`); set ``ENSEMBLE_TFDS_VERBOSE=1`` to see it.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path

__all__ = ["TFDS_VERBOSE_ENV", "apply", "attach_project_logger", "quiet_tfds"]
_FLAG = "--xla_force_host_platform_device_count"
PROJECT_LOGGER = "ensemble_core"
#: Set to ``1`` to see TFDS's progress bars and variant-folder warnings (:func:`quiet_tfds`).
TFDS_VERBOSE_ENV = "ENSEMBLE_TFDS_VERBOSE"


def apply() -> None:
    flags = os.environ.get("XLA_FLAGS", "")
    if _FLAG not in flags:
        # Imported here: a process started with the flag set (the temporary server, a
        # command's children) does not import the config's models for it (0.3 s).
        from ensemble_core.config import HOST_DEVICES  # pydantic and numpy, no JAX

        os.environ["XLA_FLAGS"] = f"{flags} {_FLAG}={HOST_DEVICES}".strip()
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # Prefect warns at import (two lines) when it cannot create PREFECT_HOME; the commands
    # report what that stops, the temporary server's database, in one line
    # (flows.server_check.temporary_database_unwritable), and nothing else needs the directory.
    warnings.filterwarnings("ignore", message="Failed to create the Prefect home directory", category=UserWarning)
    # Member groups on Dask: the scheduler's and workers' own INFO lines stay out of the run's log.
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")
    # Warnings of ensemble_core (a damaged checkpoint or champion pointer set aside, files
    # skipped) go to the flow run's logs too ...
    _send_project_logs_to_prefect()
    # ... and its progress lines (INFO: images decoded, corrupted sets generated, snapshots
    # written, runs pruned): Prefect gives the extra loggers its handlers but not a level,
    # so they would inherit the root logger's WARNING.
    logging.getLogger(PROJECT_LOGGER).setLevel(logging.INFO)
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


def _send_project_logs_to_prefect() -> None:
    """``ensemble_core`` among Prefect's extra loggers (``PREFECT_LOGGING_EXTRA_LOGGERS``,
    added to the user's list if it has one), which Prefect reads from the environment when
    it is imported; and, if Prefect's logging is set up already, attached to its handlers
    now (:func:`attach_project_logger`)."""
    names = [n.strip() for n in os.environ.get("PREFECT_LOGGING_EXTRA_LOGGERS", "").split(",") if n.strip()]
    if PROJECT_LOGGER not in names:
        os.environ["PREFECT_LOGGING_EXTRA_LOGGERS"] = ",".join([*names, PROJECT_LOGGER])
    attach_project_logger()


def attach_project_logger() -> None:
    """Give ``ensemble_core`` Prefect's API log handler, the one Prefect gives its extra
    loggers (``prefect.extra``), as ``PREFECT_LOGGING_EXTRA_LOGGERS`` would have; nothing
    before Prefect has set up its logging. Idempotent.

    The variable only works when it is set before Prefect is imported: Prefect reads its
    settings at import and sets up its logging from them later. A deployment's flow-run
    process imports Prefect before the flow's module (this one), so there the variable
    came too late unless the deployment set it (prefect.yaml does); a flow calls this when
    it starts (:class:`flows.prefect_services.PrefectServices`), so its logs reach the flow run
    however it was started."""
    from prefect.logging.handlers import APILogHandler

    project = logging.getLogger(PROJECT_LOGGER)
    # The API handler only: the console is the root logger's (the project's loggers
    # propagate), and anything else on prefect.extra is not Prefect's (pytest's capture
    # handlers end up there under a test harness, and would then see each record twice).
    for handler in logging.getLogger("prefect.extra").handlers:
        if isinstance(handler, APILogHandler) and handler not in project.handlers:
            project.addHandler(handler)


class _TfdsVariantLines(logging.Filter):
    """Drops TFDS's ``Variant folder ... has no dataset_info.json`` (or ``features.json``, or
    ``has invalid version``) and ``Skipping invalid variant directory`` warnings: TFDS logs
    them whenever it checks whether a dataset not yet prepared is prepared (three times
    for each dataset prepared), and they read like damage. A damaged prepared dataset is
    reported by the project itself, in one line naming the fix
    (:func:`ensemble_core.data.verify_prepared`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        return not (
            "tensorflow_datasets" in (record.pathname or "")
            and msg.startswith(("Variant folder ", "Skipping invalid variant directory"))
        )


_TFDS_FILTER = _TfdsVariantLines()


def quiet_tfds() -> None:
    """TFDS's progress bars (``tfds.display_progress_bar``) and its variant-folder warnings
    (absl logging, :class:`_TfdsVariantLines`) off in this process, unless
    ``ENSEMBLE_TFDS_VERBOSE=1``: the flows log the preparation themselves (``decoding
    train: N/N images``, the files skipped, the snapshot prepared), in the console and in
    the flow run's logs, where a progress bar is a screenful of carriage returns.

    Called by a flow's module once its imports have imported TFDS (:mod:`ensemble_core.data`
    does; :func:`apply` runs earlier, before JAX is imported, and imports neither).
    Idempotent. TFDS's own two lines around a preparation (``Downloading and preparing dataset ...``,
    ``Dataset ... downloaded and prepared``) are plain prints TFDS has no switch for; they stay.
    """
    if os.environ.get(TFDS_VERBOSE_ENV, "").strip().lower() in ("1", "true", "yes", "on"):
        return
    import tensorflow_datasets as tfds
    from absl import logging as absl_logging

    tfds.display_progress_bar(False)
    absl = absl_logging.get_absl_logger()
    if _TFDS_FILTER not in absl.filters:
        absl.addFilter(_TFDS_FILTER)


apply()
