"""A failed orbax save reported once, as the project's one-line error.

When a checkpoint save fails in orbax's writer threads (a disk that filled up while it
wrote), :class:`~ensemble_core.runs.storage.checkpoint.EnsembleCheckpointer` raises the failure
as one :class:`~ensemble_core.errors.DiskFullError` or
:class:`~ensemble_core.errors.CheckpointError` naming the fix. Two other reports of the same
failure printed tracebacks around that line (29 and more in a training run):

- orbax logs the failure from each thread it went through (``absl`` logger, ``exc_info``):
  the line stays, its traceback goes (:class:`_NoTracebackFromOrbax`).
- orbax runs each save's writes on an event loop of its own and closes it when the first
  write fails; tensorstore's other writes still pending then complete and call
  ``loop.call_soon_threadsafe`` on the closed loop, each raising ``RuntimeError: Event
  loop is closed`` that Python prints as an unraisable exception: those are dropped
  (:func:`_closed_loop`), any other unraisable exception is printed as before.
- the writes of a failed save that fail after it (the disk is still full) end orbax's
  write tasks with the same error, which nothing awaits any more; when such a task is
  collected asyncio logs "Task exception was never retrieved" with its traceback: those
  records are dropped (:class:`_NoUnretrievedOrbaxTasks`), others are logged as before.
- a read of a damaged checkpoint fails in one of orbax's coroutines and the others are
  closed unfinished, each printed as "Exception ignored in: <coroutine ...>": dropped
  (:func:`_orbax_coroutine`); the failure reaches the caller, which sets the step aside.

The checkpointer refuses a save that cannot fit before it starts, so these only show when
the disk fills up during a save (another writer); installed on import. No upstream orbax
issue reports the closed loop (searched 2026-11-25, orbax-checkpoint as pinned in
requirements.lock); remove the hook when orbax awaits its pending writes before closing.
"""

from __future__ import annotations

import logging
import sys
from typing import Any


def _in_orbax(filename: str) -> bool:
    """Whether ``filename`` is a source file of the orbax package."""
    return "/orbax/" in filename.replace("\\", "/")


class _NoTracebackFromOrbax(logging.Filter):
    """Drops the traceback of a record orbax logged with ``exc_info`` (the line stays):
    the exception reaches orbax's caller, which reports it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and _in_orbax(record.pathname):
            record.exc_info, record.exc_text = None, None
        return True


class _NoUnretrievedOrbaxTasks(logging.Filter):
    """Drops asyncio's "Task exception was never retrieved" for a task whose exception was
    raised in orbax's code (a write of a save that had already failed: the failure reached
    orbax's caller, which reports it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("Task exception was never retrieved") or not record.exc_info:
            return True
        tb = record.exc_info[2]
        while tb is not None:
            if _in_orbax(tb.tb_frame.f_code.co_filename):
                return False
            tb = tb.tb_next
        return True


class _NoReadOnlyNotices(logging.Filter):
    """Drops orbax's warnings that a manager was opened read-only (``Given directory is
    read only=...``, ``CheckpointManagerOptions.read_only=True, setting ...``): every
    reader of a run opens its checkpoints so, on purpose (``EnsembleCheckpointer(...,
    read_only=True)``), and the warnings would fill the output of every prediction."""

    NOTICES = ("Given directory is read only", "CheckpointManagerOptions.read_only=True")

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.NOTICES)


def _closed_loop(unraisable: Any) -> bool:
    """Whether ``unraisable`` is a pending write completing on the closed event loop of a
    failed orbax save: ``RuntimeError('Event loop is closed')`` from asyncio's
    ``call_soon_threadsafe``, raised in a callback of tensorstore's (no object)."""
    if unraisable.exc_type is not RuntimeError or unraisable.object is not None:
        return False
    if str(unraisable.exc_value) != "Event loop is closed":
        return False
    names, tb = [], unraisable.exc_traceback
    while tb is not None:
        names.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    return names[-2:] == ["call_soon_threadsafe", "_check_closed"]


def _orbax_coroutine(unraisable: Any) -> bool:
    """Whether ``unraisable`` comes from an orbax coroutine closed unfinished after a read
    of a damaged checkpoint failed (``Exception ignored in: <coroutine
    _read_array_index_and_device_put>``): the failure itself reached the caller, which set
    the checkpoint aside."""
    code = getattr(unraisable.object, "cr_code", None)
    return code is not None and _in_orbax(code.co_filename)


def install() -> None:
    """Install them (once per process): the ``absl`` and ``asyncio`` loggers' filters and the unraisable
    hook, which hands every other exception to the hook it replaces."""
    absl = logging.getLogger("absl")
    if any(isinstance(f, _NoTracebackFromOrbax) for f in absl.filters):
        return
    absl.addFilter(_NoTracebackFromOrbax())
    absl.addFilter(_NoReadOnlyNotices())
    logging.getLogger("asyncio").addFilter(_NoUnretrievedOrbaxTasks())
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if not (_closed_loop(unraisable) or _orbax_coroutine(unraisable)):
            previous(unraisable)

    sys.unraisablehook = hook


install()
