"""Strict YAML: ruamel.yaml's safe loader, which refuses a key given twice in one mapping.

YAML itself keeps the last of two equal keys silently, so a config that sets ``train:``
twice would lose half its settings without a word. ruamel.yaml refuses that by default
(``allow_duplicate_keys=False``), at any depth, for equal keys however written (``1`` and
``1.0``, ``~`` and ``null``) and for a second merge key ``<<`` in one mapping; a key of the
mapping itself still overrides a merged one, as YAML specifies. This module only turns its
refusal into :class:`DuplicateKeyError`, which names the dotted key path and both lines.

Documents are read as YAML 1.1, as PyYAML read them before: ``yes``/``no``/``on``/``off`` are
booleans, ``017`` is octal and ``1:30`` is 90 (YAML 1.2 would read the first and last as
strings and ``017`` as 17, silently changing what a config means).
"""

from __future__ import annotations

import warnings
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.constructor import DuplicateKeyError as _RuamelDuplicateKeyError
from ruamel.yaml.error import MantissaNoDotYAML1_1Warning, ReusedAnchorWarning, YAMLError
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from ensemble_core.config.messages import show

__all__ = ["DuplicateKeyError", "UnreadableValueError", "YAMLError", "load_yaml"]


class DuplicateKeyError(YAMLError):
    """A YAML mapping holds the same key twice (YAML would silently keep the last).

    Attributes:
      key: the dotted path of the key (``train.epochs``; list items by index: ``a.1.b``).
      first_line, second_line: 1-based lines of its two occurrences.
    """

    def __init__(self, key: str, first_line: int, second_line: int) -> None:
        self.key, self.first_line, self.second_line = key, first_line, second_line
        super().__init__(f"duplicate key '{key}' ({self.lines})")

    @property
    def lines(self) -> str:
        """``lines 3 and 7``, or ``both on line 3``."""
        if self.first_line == self.second_line:
            return f"both on line {self.first_line}"
        return f"lines {self.first_line} and {self.second_line}"


class UnreadableValueError(YAMLError):
    """Valid YAML whose values Python cannot build: nesting deeper than the recursion limit,
    an int over Python's int-to-str digit limit, an impossible date, an unhashable key, an
    ``!!omap`` with a key twice.

    Attributes:
      reason: one short line, e.g. ``RecursionError: nesting too deep``.
    """

    def __init__(self, err: Exception) -> None:
        if isinstance(err, RecursionError):
            detail = "nesting too deep"
        elif isinstance(err, ValueError) and "digits" in str(err):
            detail = "a number with too many digits"
        else:
            detail = (str(err).splitlines() or ["invalid value"])[0][:200]
        self.reason = f"{type(err).__name__}: {detail}"
        super().__init__(self.reason)


#: Most values (scalars, mappings and sequences, counted with every alias expanded) a
#: document may hold. A config has a few hundred; an image folder's class list a few
#: thousand. A YAML alias bomb (an anchor of ten aliases of an anchor of ten aliases ...)
#: parses small, shares its nodes, and becomes billions of values once anything copies or
#: serialises it (pydantic, JSON for Prefect, a checkpoint's metadata).
MAX_VALUES = 1_000_000


def expanded_values(node: Node) -> int:
    """How many values the composed document ``node`` holds once its aliases are expanded
    (each mapping, sequence and scalar counts 1; a mapping's keys count). Aliases share
    nodes, so each node is sized once: linear in the document's text, however large the
    expansion."""
    sizes: dict[int, int] = {}
    stack: list[tuple[Node, bool]] = [(node, False)]
    while stack:  # post-order without recursion (a deep document must not hit the recursion limit)
        current, done = stack.pop()
        if id(current) in sizes:
            continue
        if done:
            children = _children(current)
            sizes[id(current)] = 1 + sum(sizes[id(c)] for c in children)
            continue
        stack.append((current, True))
        stack.extend((c, False) for c in _children(current) if id(c) not in sizes)
    return sizes[id(node)]


def _children(node: Node) -> list[Node]:
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, SequenceNode):
        return list(node.value)
    return []


def _yaml() -> YAML:
    """A fresh loader (a ``YAML`` instance keeps per-document state)."""
    yaml = YAML(typ="safe", pure=True)  # plain dicts, lists and scalars; no Python object tags
    yaml.version = (1, 1)  # as PyYAML read every config (module docstring)
    return yaml


def load_yaml(text: str) -> Any:
    """The value of one YAML document (``None`` for an empty one): dicts, lists, str, int,
    float, bool, None, dates (``!!binary``: bytes, ``!!set``: set).

    Raises:
      DuplicateKeyError: a mapping, at any depth, holds a key twice.
      UnreadableValueError: see there; or more than :data:`MAX_VALUES` values once its
        aliases are expanded (an alias bomb), refused before any value is built.
      YAMLError: not YAML (its ``problem_mark`` says where), more than one document, an
        anchor defined twice, or a tag outside YAML's safe ones (``!!python/tuple``).
    """
    # catch_warnings changes the process's warning filters for the duration: fine for a
    # config read once at start-up, not meant for concurrent loads in many threads.
    with warnings.catch_warnings():
        # ruamel.yaml reads 1e-3 as the float 0.001 and warns that YAML 1.1 wants a '.' in a
        # float's mantissa. A number is what a config means by it (PyYAML read the string
        # '1e-3', which pydantic parsed into the same float): the warning is noise.
        warnings.simplefilter("ignore", MantissaNoDotYAML1_1Warning)
        # An anchor defined twice: ruamel.yaml warns (several lines) and keeps the later one;
        # PyYAML refused it, and so do we.
        warnings.simplefilter("error", ReusedAnchorWarning)
        try:
            composed = _yaml().compose(text)
            if composed is not None and (count := expanded_values(composed)) > MAX_VALUES:
                raise UnreadableValueError(
                    ValueError(f"it expands to {count:,} values through its aliases (at most {MAX_VALUES:,})")
                )
            return _yaml().load(text)
        except UnreadableValueError:
            raise
        except _RuamelDuplicateKeyError as err:
            raise _locate(text, err) from None
        except ReusedAnchorWarning as err:
            raise YAMLError(next(line for line in [*str(err).splitlines(), "duplicate anchor"] if line)) from None
        except YAMLError:
            raise
        except Exception as err:  # noqa: BLE001  (ruamel.yaml failing on valid syntax: see UnreadableValueError)
            raise UnreadableValueError(err) from None


def describe(err: YAMLError) -> str:
    """One line saying what is wrong with the YAML and on which line, e.g. ``line 2:
    expected ',' or ']', but got '<stream end>'``."""
    mark, problem = getattr(err, "problem_mark", None), getattr(err, "problem", None)
    if mark is not None and problem:
        context = getattr(err, "context", None)
        return f"line {mark.line + 1}: {f'{context}, ' if context else ''}{problem}"
    return (str(err).splitlines() or [type(err).__name__])[0]


def _locate(text: str, err: _RuamelDuplicateKeyError) -> DuplicateKeyError:
    """Our :class:`DuplicateKeyError` for ruamel.yaml's, which gives only the position of the
    second key: compose the document (composing does not check keys), find that key node,
    its dotted path and the first key equal to it in the same mapping."""
    yaml = _yaml()
    at = (err.problem_mark.line, err.problem_mark.column)
    stack: list[tuple[Node, str]] = [(yaml.compose(text), "")]
    visited: set[int] = set()
    while stack:  # aliases: the first path that reaches a node names it
        node, path = stack.pop()
        if id(node) in visited:
            continue
        visited.add(id(node))
        if isinstance(node, MappingNode):
            for i, (key, _) in enumerate(node.value):
                if (key.start_mark.line, key.start_mark.column) == at:
                    first = next((k for k, _ in node.value[:i] if _same_key(yaml, k, key)), key)
                    name = _join(path, _name(yaml, key))
                    return DuplicateKeyError(name, first.start_mark.line + 1, key.start_mark.line + 1)
            stack.extend((v, _join(path, _name(yaml, k))) for k, v in reversed(node.value))
        elif isinstance(node, SequenceNode):
            stack.extend((v, _join(path, str(i))) for i, v in reversed(list(enumerate(node.value))))
    line = err.problem_mark.line + 1  # not found (should not happen): ruamel.yaml's own words
    return DuplicateKeyError(str(err.problem).removeprefix("found duplicate key "), line, line)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _name(yaml: YAML, key: Node) -> str:
    """A key as the error names it: a scalar as written, anything else as a short repr."""
    if isinstance(key, ScalarNode):
        return key.value
    try:
        return show(yaml.constructor.construct_object(key, deep=True))
    except Exception:  # noqa: BLE001  (only the name of a key in an error message)
        return "?"


def _same_key(yaml: YAML, a: Node, b: Node) -> bool:
    """Whether two key nodes build equal Python keys (``1`` and ``1.0``; two merge keys ``<<``)."""
    if a.tag == b.tag == "tag:yaml.org,2002:merge":
        return True
    try:
        return yaml.constructor.construct_object(a, deep=True) == yaml.constructor.construct_object(b, deep=True)
    except Exception:  # noqa: BLE001  (an unbuildable key: compare as written)
        return getattr(a, "value", None) == getattr(b, "value", None)
