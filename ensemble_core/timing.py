"""Where a run's wall time goes: a nested stopwatch for a stage and its parts.

A stage that reports its parts opens :func:`measure` around its work; code anywhere below
it (an evaluator generating a shifted set, a forward pass) marks its own share with
:func:`part`, which records into the innermost open span of this thread's context and
costs nothing when no span is open. The spans become ``report.json -> timing.stages``
(:func:`Span.to_json`; docs/benchmarks.md, "Where a run's time goes").

Times are wall-clock seconds from :func:`time.perf_counter`. A part entered several
times (the forward passes of one evaluator) accumulates; a part is counted where it is
entered, so a cached value computed for one evaluator and reused by the next is timed in
the first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Iterator
from contextvars import ContextVar

__all__ = ["OTHER", "Span", "measure", "part", "process_seconds"]

#: The name of the remainder :meth:`Span.to_json` adds: a span's seconds not covered by its parts.
OTHER = "other"

_ACTIVE: ContextVar[Span | None] = ContextVar("ensemble_core_timing_span", default=None)
_IMPORTED_AT = time.perf_counter()  # process_seconds' fallback where /proc is not available


def process_seconds() -> float:
    """Wall-clock seconds since this process started (the interpreter's own start and every
    import included): on Linux, ``/proc/uptime`` minus the process's start time, field 22 of
    ``/proc/self/stat`` in clock ticks (``man 5 proc``; resolution ``1/SC_CLK_TCK``, 10 ms);
    elsewhere the seconds since this module was imported (an underestimate). Raises nothing."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        with open("/proc/uptime", "rb") as f:
            uptime = float(f.read().split()[0])
        # the command name (field 2) may hold spaces and parentheses: fields resume after the last ')'
        start_ticks = int(stat[stat.rindex(b")") + 2 :].split()[19])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - _IMPORTED_AT


@dataclasses.dataclass
class Span:
    """The wall time of one stage or part, and of its named parts (nested).

    Attributes:
      seconds: wall-clock seconds spent in it (summed over every entry).
      parts: its parts by name, in the order they were first entered.
    """

    seconds: float = 0.0
    parts: dict[str, Span] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict:
        """``{"seconds": s}``, with ``"parts"`` when it has any: each part's own
        :meth:`to_json`, plus :data:`OTHER`, the seconds no part covers (clipped at 0), so the
        parts of a span add up to its seconds."""
        out: dict = {"seconds": self.seconds}
        if self.parts:
            parts = {name: span.to_json() for name, span in self.parts.items()}
            covered = sum(span.seconds for span in self.parts.values())
            parts[OTHER] = {"seconds": max(0.0, self.seconds - covered)}
            out["parts"] = parts
        return out


@contextlib.contextmanager
def measure() -> Iterator[Span]:
    """Open a new root span for the block (parts entered inside it are recorded under it,
    not under any span open outside); its ``seconds`` is the block's wall time."""
    span = Span()
    token = _ACTIVE.set(span)
    t0 = time.perf_counter()
    try:
        yield span
    finally:
        span.seconds += time.perf_counter() - t0
        _ACTIVE.reset(token)


@contextlib.contextmanager
def part(name: str) -> Iterator[None]:
    """Time the block as part ``name`` of the innermost open span (accumulating over
    entries); parts entered inside the block nest under it. A no-op outside :func:`measure`.

    Raises:
      ValueError: ``name`` is :data:`OTHER` (the remainder's name).
    """
    parent = _ACTIVE.get()
    if parent is None:
        yield
        return
    if name == OTHER:
        raise ValueError(f"timing part name {OTHER!r} is reserved for the remainder; fix: name the part otherwise")
    span = parent.parts.setdefault(name, Span())
    token = _ACTIVE.set(span)
    t0 = time.perf_counter()
    try:
        yield
    finally:
        span.seconds += time.perf_counter() - t0
        _ACTIVE.reset(token)
