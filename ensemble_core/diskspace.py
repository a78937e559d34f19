"""Full disks and file systems that accept no files, as one-line errors with their fix.

A run writes checkpoints, evaluator arrays, plots and reports; any of them can hit a full
disk (``ENOSPC``), a used-up quota (``EDQUOT``) or a read-only file system (``EROFS``).
Each stage that writes is wrapped in :func:`output_errors`, which turns those ``OSError``
into :class:`~ensemble_core.errors.DiskFullError` / :class:`~ensemble_core.errors.OutputError`
naming the path, the free space on its file system and the fix, instead of a traceback.
Every file is written atomically (:mod:`ensemble_core.atomic`, orbax's temporary
directories), so a failed write leaves the files as they were and a rerun with the same
run name resumes.

:func:`probe_writable` is preflight's check that a directory really takes a file (create,
write, fsync, remove): ``os.access`` says yes on ``/proc``, ``/sys`` and their like as root.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import inspect
import os
import re
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import ParamSpec, TypeVar

from ensemble_core.errors import DiskFullError, OutputError

NO_SPACE = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded"}
PROBE_BYTES = 4096  # what preflight's probe writes (one page: a full disk refuses it)

P = ParamSpec("P")
T = TypeVar("T")


def nearest_existing(path: str | Path) -> Path:
    """``path`` (absolute) or its nearest ancestor that exists."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def mount_point(path: str | Path) -> Path:
    """The mount point of the file system holding ``path`` (or its nearest existing ancestor)."""
    path = nearest_existing(path)
    dev = path.stat().st_dev
    while path != path.parent and path.parent.stat().st_dev == dev:
        path = path.parent
    return path


def free_bytes(path: str | Path) -> int | None:
    """Bytes an unprivileged writer may still use on ``path``'s file system (None: unknown)."""
    try:
        st = os.statvfs(nearest_existing(path))
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def human(n: int | None) -> str:
    """``n`` bytes as ``1.5 MiB`` (``unknown`` for None)."""
    if n is None:
        return "unknown"
    size, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            break
        size /= 1024
    return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"


RESUME = "rerun with the same run_name to resume"


def disk_full(
    path: str | Path,
    code: int = errno.ENOSPC,
    needed: int | None = None,
    done: str = "",
    setting: str = "output_dir",
    rerun: str = RESUME,
) -> DiskFullError:
    """The one-line error for a full disk (``code`` ENOSPC) or quota (EDQUOT) at ``path``.

    ``needed``: the bytes the write needs, when known; ``done``: what is kept, e.g. "the
    finished checkpoints [7] are intact; "; ``setting``: the config key or parameter that
    moves the files elsewhere; ``rerun``: what to do once there is space.
    """
    mount, free = _where(path)
    need = f", needs about {human(needed)}" if needed is not None else ""
    return DiskFullError(
        f"{NO_SPACE.get(code, os.strerror(code))} writing '{path}' ({human(free)} free on {mount}{need}); {done}"
        f"fix: free space on {mount} and {rerun}, or set {setting} to a directory "
        f"on another file system"
    )


def _where(path: str | Path) -> tuple[Path | str, int | None]:
    try:
        return mount_point(path), free_bytes(path)
    except OSError:
        return Path(path).anchor or "its file system", None


def as_output_error(
    err: OSError, path: str | Path, setting: str = "output_dir", rerun: str = RESUME
) -> OutputError | None:
    """``err`` as the project's one-line error if it is a full disk, a used-up quota or a
    read-only file system (``path``: where the stage writes, when ``err`` names no file;
    ``setting``, ``rerun``: as :func:`disk_full`'s); None for any other OSError."""
    where = err.filename if isinstance(err.filename, str | bytes | os.PathLike) else path
    where = os.fsdecode(where)
    if err.errno in NO_SPACE:
        return disk_full(where, err.errno, setting=setting, rerun=rerun)
    if err.errno == errno.EROFS:
        return OutputError(
            f"'{where}' is on a read-only file system ({_where(where)[0]})",
            fix=f"set {setting} to a directory on a writable file system, or remount it read-write",
        )
    return None


def output_errors(
    where: str | Callable[..., str | Path], setting: str = "output_dir"
) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """Decorate a stage that writes files: a full disk, quota or read-only file system
    (``OSError`` ENOSPC, EDQUOT, EROFS) escaping it is raised as one-line
    :class:`~ensemble_core.errors.DiskFullError` / :class:`~ensemble_core.errors.OutputError`.

    Args:
      where: the stage's parameter naming the directory it writes in (``"run_dir"``,
        ``"output_dir"``), or a function of the stage's arguments that returns it; named
        when the ``OSError`` names no file (a ``write()`` that filled the disk).
      setting: the config key or parameter that moves those files elsewhere (the fix).
    """

    def decorate(fn: Callable[P, T]) -> Callable[P, T]:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def stage(*args: P.args, **kwargs: P.kwargs) -> T:
            try:
                return fn(*args, **kwargs)
            except OSError as err:
                if callable(where):
                    path = where(*args, **kwargs)
                else:
                    path = signature.bind_partial(*args, **kwargs).arguments.get(where, ".")
                mapped = as_output_error(err, path, setting)
                if mapped is None:
                    raise
                raise mapped from None

        return stage

    return decorate


# tensorstore (orbax's writer) reports the OS error of a failed write in its message.
_TENSORSTORE_OS_ERROR = re.compile(r"os_error_code='?(\d+)")


def errno_of(err: BaseException) -> int | None:
    """The OS error code behind ``err``: its own ``errno``, its cause's or context's, or the
    code tensorstore writes in the message of the ``ValueError`` it raises."""
    for e in (err, err.__cause__, err.__context__):
        if isinstance(e, OSError) and e.errno:
            return e.errno
    match = _TENSORSTORE_OS_ERROR.search(str(err))
    return int(match.group(1)) if match else None


def probe_writable(directory: str | Path, setting: str = "output_dir") -> None:
    """Check that ``directory`` (or, if it does not exist yet, the nearest existing
    directory it would be created in; ``setting``: the config key or parameter that names
    it) takes a file: create, write :data:`PROBE_BYTES`,
    fsync and remove a hidden probe file. ``os.access`` cannot tell: as root it says yes
    on ``/proc`` and ``/sys``, which accept no files, and on a full disk.

    Raises:
      DiskFullError: no space left or the quota used up there.
      OutputError: the file cannot be created or written (a special or read-only file
        system, missing permissions).
    """
    target = nearest_existing(directory)
    probe = target / f".ensemble-write-probe-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            if os.write(fd, b"\0" * PROBE_BYTES) < PROBE_BYTES:  # a short write: the last free bytes
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as err:
        if err.errno in NO_SPACE:
            raise disk_full(directory, err.errno, PROBE_BYTES, setting=setting) from None
        raise OutputError(
            f"'{directory}' ({setting}) does not take files: writing a file in '{target}' failed "
            f"([{errno.errorcode.get(err.errno or 0, err.errno)}] {err.strerror or err})",
            fix=f"set {setting} to a directory on a disk file system you can write to",
        ) from None
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
