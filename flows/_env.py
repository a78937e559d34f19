"""Process environment the flows need, applied before JAX is imported.

On CPU the project runs members in parallel on simulated host devices (one per member,
up to 8). A user's own ``XLA_FLAGS`` always wins: the device-count flag is only added
when ``XLA_FLAGS`` does not already set it.
"""

from __future__ import annotations

import os

HOST_DEVICES = 8
_FLAG = "--xla_force_host_platform_device_count"


def apply() -> None:
    flags = os.environ.get("XLA_FLAGS", "")
    if _FLAG not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {_FLAG}={HOST_DEVICES}".strip()
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


apply()
