"""One-line error messages about config input: the error type and a short repr of a value.

Every refusal of a config is a :class:`~ensemble_core.errors.ConfigError` whose message is
one line (the CLI prints it as ``error: ...``) and ends with a fix; input values shown in it
are cut short, however huge, deep or self-referencing they are.
"""

from __future__ import annotations

import reprlib
from typing import Any

from ensemble_core.errors import ConfigError

# Everything str.splitlines() breaks on: a message stays one line whatever the input holds.
_ONE_LINE = str.maketrans(
    {c: c.encode("unicode_escape").decode("ascii") for c in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"}
)

_short = reprlib.Repr()
_short.maxlevel, _short.maxstring, _short.maxother = 2, 80, 80
_short.maxlist = _short.maxtuple = _short.maxdict = _short.maxset = 5


def config_error(problem: str, fix: str | None = None) -> ConfigError:
    """A :class:`ConfigError` of ``problem`` and ``fix`` with every line break escaped (a
    value the user typed may hold one)."""
    return ConfigError(problem.translate(_ONE_LINE), None if fix is None else fix.translate(_ONE_LINE))


def show(value: Any) -> str:
    """A short one-line repr of an input value (huge, deep or aliased values included); never raises."""
    try:
        return _short.repr(value)
    except ValueError:  # an int over Python's int-to-str digit limit
        return f"<int of {value.bit_length()} bits>" if isinstance(value, int) else f"<{type(value).__name__}>"
    except Exception:  # noqa: BLE001  (never let the report of an error raise)
        return f"<{type(value).__name__}>"
