"""Helpers for the child processes the project starts: a free loopback port, and the
kernel's parent-death signal.

Standard library only, so that a process may import it before JAX or Prefect (the
temporary Prefect server's app factory does, and so does a JAX process of one program).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the kernel picks it).

    Another process may take it before the caller binds it; callers that start a server
    on it see that as a failed start and say so.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def die_with_parent(sig: signal.Signals, parent_pid: int | None = None) -> bool:
    """Ask the kernel to send this process ``sig`` when its parent dies (Linux
    ``prctl(PR_SET_PDEATHSIG)``, see ``man 2 prctl``), however the parent dies (SIGKILL,
    the OOM killer included).

    If the parent already died before the call (then the signal would never come), this
    process sends itself ``sig`` at once. A parent is judged gone when the process's
    parent is no longer ``parent_pid`` (its pid, passed down by the parent), or, without
    ``parent_pid``, when the process was re-parented to init (pid 1).

    Returns False, doing nothing, where ``prctl`` is not available (not Linux); the
    caller's other safeguards (an exit hook, a heartbeat timeout) then apply. Raises
    nothing.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        return False
    parent = os.getppid()
    if (parent != parent_pid) if parent_pid is not None else (parent == 1):
        os.kill(os.getpid(), sig)
    return True
