"""Simulated hosts for the multi-host tests: Linux network namespaces joined by a bridge.

Each host is a network namespace with its own loopback and one address on a private
link-local segment (``169.254.77.0/24``, which exists only inside this machine): a veth
pair joins it to a bridge in the test's own namespace, which holds ``169.254.77.1`` (the
"client host"). Processes started on a host (:meth:`Cluster.start`) see only that host's
network, their own host name (a UTS namespace) and an ``/etc/hosts`` that resolves every
host's name (a mount namespace with that file bound over it: gloo, JAX's CPU collectives,
resolves its own host name). The rest of the file system is shared by every host, as a
cluster shares its run directory over NFS.

Everything is named ``ensh<pid in hex>x<serial>...`` and removed on exit, also when the test
fails; :func:`leaks` lists what is left of any earlier cluster (for the tests to assert
none). What a killed test process could not remove (its namespaces, veths and bridge,
whose address every cluster uses) is removed when the next cluster starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

PREFIX = "ensh"
_serial = itertools.count()
SUBNET = "169.254.77"
CLIENT_ADDRESS = f"{SUBNET}.1"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def unavailable() -> str | None:
    """Why simulated hosts cannot be made here (one line), or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "the ip and unshare commands (iproute2, util-linux) are not installed"
    probe = f"{PREFIX}probe{os.getpid()}"
    try:
        made = _ip("netns", "add", probe, check=False)
        if made.returncode != 0:
            return f"the kernel refuses a network namespace: {made.stderr.strip()}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


@dataclasses.dataclass
class Host:
    name: str
    namespace: str
    address: str
    link: str  # the veth end in the client's namespace: set it down to cut the host off


@dataclasses.dataclass
class Cluster:
    tag: str  # the prefix of its namespaces and links
    hosts: dict[str, Host]
    hosts_file: Path
    processes: list[subprocess.Popen] = dataclasses.field(default_factory=list)

    def start(
        self, host: str, argv: Sequence[str], *, env: dict | None = None, log: Path | None = None
    ) -> subprocess.Popen:
        """Start ``argv`` on ``host``: its network namespace, a UTS namespace whose host name
        is the host's name, and a mount namespace whose ``/etc/hosts`` resolves every host
        of the cluster (as a cluster's DNS does); stdout and stderr to ``log`` (or discarded)."""
        h = self.hosts[host]
        script = 'hostname "$0" && mount --bind "$1" /etc/hosts && shift && exec "$@"'
        cmd = ["ip", "netns", "exec", h.namespace, "unshare", "--uts", "--mount", "sh", "-c", script]
        out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115  (closed with the process)
        p = subprocess.Popen([*cmd, h.name, str(self.hosts_file), *argv], env=env, stdout=out, stderr=subprocess.STDOUT)
        self.processes.append(p)
        return p

    def cut(self, host: str) -> None:
        """Cut ``host`` off the network (its link down), as a pulled cable or a dead switch port."""
        _ip("link", "set", self.hosts[host].link, "down")


def _pids(namespace: str) -> list[int]:
    out = _ip("netns", "pids", namespace, check=False).stdout
    return [int(p) for p in out.split()]


@contextlib.contextmanager
def cluster(names: Sequence[str]) -> Iterator[Cluster]:
    """Hosts ``names`` (at ``169.254.77.10``, ``.11``, ...), torn down on exit: every
    process started on them killed, namespaces, veths and the bridge deleted."""
    # Unique per cluster (several may be up at once in one process, e.g. a module's and a
    # test's own), and at most 15 characters with the suffixes below (Linux's IFNAMSIZ).
    # The pid in hex (at most 6 digits: Linux's pid_max is 2**22) identifies the owner, so
    # that a cluster left by a killed process can be told from a live one.
    tag = f"{PREFIX}{os.getpid():x}x{next(_serial) % 256:02x}"
    remove_stale()
    bridge = f"{tag}br"
    made = Cluster(tag=tag, hosts={}, hosts_file=Path(tempfile.mkdtemp(prefix=tag)) / "hosts")
    bridge_made = False
    try:
        _ip("link", "add", bridge, "type", "bridge")
        bridge_made = True
        _ip("addr", "add", f"{CLIENT_ADDRESS}/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for i, name in enumerate(names):
            ns, outer, inner = f"{tag}-{name}", f"{tag}v{i}", f"{tag}p{i}"
            _ip("netns", "add", ns)
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            _ip("link", "set", inner, "netns", ns)
            _ip("link", "set", outer, "master", bridge, "up")
            address = f"{SUBNET}.{10 + i}"
            _ip("netns", "exec", ns, "ip", "addr", "add", f"{address}/24", "dev", inner)
            _ip("netns", "exec", ns, "ip", "link", "set", inner, "up")
            _ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
            made.hosts[name] = Host(name=name, namespace=ns, address=address, link=outer)
        names = [f"{h.address} {h.name}" for h in made.hosts.values()]
        lines = ["127.0.0.1 localhost", f"{CLIENT_ADDRESS} client", *names]
        made.hosts_file.write_text("\n".join(lines) + "\n")
        yield made
    finally:
        for p in made.processes:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGKILL)
        for h in made.hosts.values():  # anything a host's processes started in turn
            for pid in _pids(h.namespace):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for p in made.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)
        deadline = time.monotonic() + 10
        for h in made.hosts.values():
            while _pids(h.namespace) and time.monotonic() < deadline:
                time.sleep(0.05)
            _ip("netns", "del", h.namespace, check=False)
            # A namespace lives on (with its veth) while anything holds it; deleting our end
            # of the pair removes both ends at once.
            _ip("link", "del", h.link, check=False)
        if bridge_made:  # never another cluster's
            _ip("link", "del", bridge, check=False)
        shutil.rmtree(made.hosts_file.parent, ignore_errors=True)


def _namespaces() -> list[str]:
    return [line.split()[0] for line in _ip("netns", "list", check=False).stdout.splitlines() if line]


def _owner(name: str) -> int | None:
    m = re.match(rf"{PREFIX}([0-9a-f]+)x[0-9a-f]{{2}}", name)
    return int(m.group(1), 16) if m else None


def remove_stale() -> list[str]:
    """Remove what clusters of processes that no longer exist left behind (a test process
    killed with SIGKILL never reaches :func:`cluster`'s teardown, and its bridge holds the
    address every cluster uses): their processes killed, namespaces and links deleted.
    Returns the names removed."""
    stale = []
    for name in leaks():
        owner = _owner(name)
        if owner is None:
            continue
        try:
            os.kill(owner, 0)
        except ProcessLookupError:
            stale.append(name)
        except PermissionError:
            pass  # alive, another user's
    namespaces = set(_namespaces())
    for name in stale:
        if name in namespaces:
            for pid in _pids(name):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            _ip("netns", "del", name, check=False)
        else:
            _ip("link", "del", name, check=False)
    return stale


def leaks(prefix: str = PREFIX) -> list[str]:
    """Namespaces and links whose names start with ``prefix`` (default: any cluster's; a
    :attr:`Cluster.tag`: that cluster's) that exist now."""
    namespaces = _namespaces()
    links = [line.split(":")[1].strip().split("@")[0] for line in _ip("-o", "link", check=False).stdout.splitlines()]
    return [n for n in [*namespaces, *links] if n.startswith(prefix)]
