"""A user's model module that imports a package this environment lacks (the refusal must
name that package, not the module)."""

import a_package_nobody_installed  # noqa: F401


def build(cfg, num_classes):  # pragma: no cover  (never reached)
    raise AssertionError
