"""Python's cyclic garbage collector, paused while a command imports its modules.

Importing a command's modules (JAX, Flax, optax, orbax, TFDS, Prefect, pydantic and the
project: hundreds of thousands of objects, next to none of them garbage) set off
collection after collection, each walking the objects allocated so far: about a quarter
of the import time (docs/benchmarks.md, "The fixed cost of a run", with the tiny
command's before and after from ``python -m benchmarks.fixed_cost``). A
command started as ``python -m`` pauses the collector before its first heavy import
(:func:`pause`: ``flows/__init__.py`` for a flow's command and the temporary Prefect
server, ``ensemble_core/__init__.py`` for a JAX process of one program) and resumes it as
its ``main`` starts (:func:`resume`; the server: once its app is built), after moving what the
imports made into the permanent generation (``gc.freeze``), which later collections
do not walk either (Python's ``gc`` documentation, ``gc.freeze``:
https://docs.python.org/3/library/gc.html#gc.freeze). A deployment's flow-run process
(``python -m prefect.engine``, started by Prefect's process worker) imports Prefect first;
``flows/__init__.py`` pauses the collector as the engine loads one of the package's flow
modules from the deployment's entrypoint (not when a user's own flow module imports the
package), and the flow's first statement resumes it.

Standard library only: it is imported before anything else.
"""

from __future__ import annotations

import gc

__all__ = ["freeze_survivors", "pause", "paused", "resume"]

_paused = False  # pause() turned the collector off and resume() has not turned it on yet
_froze_imports = False  # resume() froze what the imports made: a command's process


def pause() -> None:
    """Turn the cyclic collector off until :func:`resume`; nothing when it is off
    already (the caller's choice, left alone)."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def paused() -> bool:
    """Whether :func:`pause` turned the collector off and :func:`resume` has not yet
    turned it on."""
    return _paused


def resume(freeze: bool = True) -> None:
    """After :func:`pause`: with ``freeze``, move every object now tracked into the
    permanent generation (``gc.freeze``: the imported modules' objects, never walked
    again), then turn the collector back on. Without a pause before it, nothing
    (idempotent).

    ``freeze=False`` for a process that goes on to allocate much more that lives long (a
    test session tracing hundreds of programs): CPython (3.11, 3.12) runs a full
    collection only when the objects that survived since the last one exceed a quarter of
    the long-lived generation, and frozen objects no longer count in it, so full
    collections came more often (measured: 3 test modules 3% slower frozen, 4% faster not;
    a command's run 7% slower not frozen)."""
    global _paused, _froze_imports
    if _paused:
        _paused = False
        if freeze:
            gc.freeze()
            _froze_imports = True
        gc.enable()


def freeze_survivors() -> bool:
    """In a command's or a deployment's flow-run process (one whose :func:`resume` froze its imports), move every
    object now tracked into the permanent generation too: called between a run's stages
    (:func:`ensemble_core.runs.run`), where what the stages before built (the dataset's
    builder, the compiled programs, the members' parameters, Prefect's records) lives until
    the command exits, and every full collection after walked it again, 0.2-0.5 s each in
    the default run (docs/benchmarks.md, "The fixed cost of a run"). A reference cycle
    already unreachable is frozen too and freed only at exit: the command ends after its
    run, and at the default run's stage boundaries a full collection found 0 to 26,500 such
    objects and freed no resident memory (no large array among them). Elsewhere (a test
    session, a notebook, a Dask worker, where the objects of one run do not live as long)
    nothing.

    Returns whether it froze them. (It does not count them: ``gc.get_freeze_count()`` walks
    every frozen object, 0.05-0.1 s each call in a command.)"""
    if not _froze_imports or not gc.isenabled():
        return False
    gc.freeze()
    return True
