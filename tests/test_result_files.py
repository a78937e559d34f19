"""The committed result files (``benchmarks/results/*.json``) hold no machine's paths: a
temporary directory, a home or a checkout's location means nothing on another machine
(a run directory is recorded as the command line made it, ``runs/...``; a temporary one as
``<tmp>/...``)."""

from __future__ import annotations

import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
#: A directory under /tmp, /root, /home or /work, as the start of a path (not a segment of
#: another path such as ``<tmp>/case/home/.prefect``, and not a bare example such as
#: ``PREFECT_HOME=/tmp/prefect`` in a fix's text).
MACHINE_PATH = re.compile(r"(?<![\w>.-])/(?:tmp|root|home|work)/[\w.-]+/")


def machine_paths(text: str) -> list[str]:
    return MACHINE_PATH.findall(text)


def test_the_pattern_finds_machine_paths_and_spares_the_rest():
    assert machine_paths('"run": "/tmp/fm/runs/fm-conformal"') == ["/tmp/fm/"]
    assert machine_paths('"config": "/work/main/configs/default.yaml"') == ["/work/main/"]
    assert machine_paths('"cmd": "--out /root/out/gpu.json"') == ["/root/out/"]
    assert machine_paths('"db": "<tmp>/sweep0/cases/x-home/home/.prefect/prefect.db"') == []
    assert machine_paths('"fix": "export PREFECT_HOME=/tmp/prefect)"') == []
    assert machine_paths('"run": "runs/fm-conformal"') == []


def test_no_result_file_holds_a_machine_path():
    found = {path.name: machine_paths(path.read_text()) for path in sorted(RESULTS.glob("*.json"))}
    assert {name: paths for name, paths in found.items() if paths} == {}
    assert len(found) > 20  # the results directory was read, not an empty pass
