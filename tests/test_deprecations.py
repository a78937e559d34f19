"""The suite's warning filters (pyproject.toml, ``filterwarnings``) make deprecations errors.

Deprecation warnings are attributed to a module by their ``stacklevel``: JAX's
``jax.x is deprecated`` names the caller's module, so the filters must catch both the
libraries' own modules and ours. Each case runs code under a module name of its own
(``exec`` with that ``__name__``, or ``warn_explicit``'s ``module``), as ``warnings``
sees it; none imports a library.
"""

from __future__ import annotations

import warnings

import pytest

# A deprecated name as JAX serves it (jax._src.deprecations.deprecation_getattr): warned
# with stacklevel=2, i.e. attributed to whoever looked the name up. The message names no
# library, so only the filters on our modules can catch it.
_LIBRARY = """
import warnings

def lookup():
    warnings.warn("old_api is deprecated; use new_api instead.", DeprecationWarning, stacklevel=2)
"""


def _module(name: str, source: str, **names) -> dict:
    namespace = {"__name__": name, **names}
    exec(compile(source, f"<{name}>", "exec"), namespace)
    return namespace


@pytest.mark.parametrize("caller", ["ensemble_core.train", "flows.train_ensemble", "tasks.train", "tests.probe"])
def test_a_jax_deprecation_reached_from_our_code_is_an_error(caller):
    library = _module("jax._probe", _LIBRARY)
    ours = _module(caller, "def call():\n    lookup()\n", lookup=library["lookup"])
    with pytest.raises(DeprecationWarning, match="old_api is deprecated"):
        ours["call"]()


@pytest.mark.parametrize(
    "module", ["jax", "jax._src.api", "jaxlib.xla_client", "flax.linen", "optax", "orbax.checkpoint"]
)
@pytest.mark.parametrize("category", [DeprecationWarning, PendingDeprecationWarning, FutureWarning])
def test_deprecations_inside_the_libraries_are_errors(module, category):
    with pytest.raises(category):
        warnings.warn_explicit("an old code path", category, "<probe>", 1, module=module)


def test_a_deprecation_naming_a_library_is_an_error_wherever_it_is_attributed():
    with pytest.raises(DeprecationWarning):
        warnings.warn_explicit(
            "`with mesh:` is deprecated; use jax.set_mesh", DeprecationWarning, "<probe>", 1, "contextlib"
        )


def test_other_packages_deprecations_are_not_errors():
    """The filters are specific: a third party's own deprecation (or a module merely named
    like one of the four) is reported or ignored, never raised."""
    for module in ("prefect.utilities", "tensorflow_datasets.core", "jaxtyping", "flaxen"):
        with warnings.catch_warnings(record=True):
            warnings.warn_explicit("an old code path", DeprecationWarning, "<probe>", 1, module=module)
