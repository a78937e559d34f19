"""The shared child-process helpers: the parent-death signal and the free port."""

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

from ensemble_core.processutil import free_port

# A middle process starts a grandchild that asks for SIGKILL at its parent's death and then
# sleeps (printing 'ready' first, on the stdout it shares with the middle process); the
# middle process prints the grandchild's pid and waits to be killed.
_MIDDLE = textwrap.dedent(
    """
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1]])
    print(child.pid, flush=True)
    time.sleep(600)
    """
)
_GRANDCHILD = (
    "import signal, time; from ensemble_core.processutil import die_with_parent; "
    "die_with_parent(signal.SIGKILL); print('ready', flush=True); time.sleep(600)"
)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_a_child_dies_when_its_parent_is_killed():
    middle = subprocess.Popen([sys.executable, "-c", _MIDDLE, _GRANDCHILD], stdout=subprocess.PIPE, text=True)
    grandchild = int(middle.stdout.readline())
    assert middle.stdout.readline().strip() == "ready"  # the grandchild called the helper
    assert _alive(grandchild)
    middle.kill()
    middle.wait()
    deadline = time.monotonic() + 10
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild), "the grandchild outlived its killed parent"


def test_a_child_whose_parent_is_already_gone_signals_itself_at_once():
    # parent_pid names a process that is not this child's parent: as if the parent had died
    # before the call (the kernel would then never send the signal)
    code = (
        "import signal, time; from ensemble_core.processutil import die_with_parent; "
        f"die_with_parent(signal.SIGTERM, parent_pid={os.getpid() + 10**6}); time.sleep(60)"
    )
    proc = subprocess.run([sys.executable, "-c", code], timeout=60)
    assert proc.returncode == -signal.SIGTERM


def test_free_port_can_be_bound():
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
