"""Tests run on 8 simulated CPU devices (set before JAX is imported)."""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest

pytest_plugins = ["tests.suite_report"]  # ENSEMBLE_SUITE_REPORT: each test's wall and CPU seconds


@pytest.fixture(scope="session")
def tfds_dir(tmp_path_factory):
    """A TFDS data dir with the embedded mnist5k prepared once for the session."""
    from ensemble_core import data

    d = tmp_path_factory.mktemp("tfds")
    data.prepare(data.EMBEDDED, str(d))
    return str(d)


@pytest.fixture(scope="session")
def embedded_dir(tfds_dir):
    """The TFDS data dir of the embedded dataset's snapshot in ``tfds_dir`` (what
    ``data.load_split`` takes)."""
    from ensemble_core import data

    return data.prepare(data.EMBEDDED, tfds_dir).tfds_data_dir


@pytest.fixture(scope="session")
def mnist_train(embedded_dir):
    from ensemble_core import data

    return data.load_split(data.EMBEDDED, "train", embedded_dir)


@pytest.fixture(scope="session")
def mnist_test(embedded_dir):
    from ensemble_core import data

    return data.load_split(data.EMBEDDED, "test", embedded_dir)


# The modules that mostly wait on real processes (a Prefect stack's heartbeats, timeouts
# and scheduler; trainings killed and resumed) start first: under `make test`'s two
# pytest-xdist workers, the other worker runs the CPU-bound modules during those waits.
_WAITING_FIRST = ("test_deployment_faults.py", "test_deployment.py", "test_flow.py")


def pytest_collection_modifyitems(items):
    def rank(item) -> int:
        name = item.path.name
        return _WAITING_FIRST.index(name) if name in _WAITING_FIRST else len(_WAITING_FIRST)

    items.sort(key=rank)
