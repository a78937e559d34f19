"""Strict YAML: safe tags only, and a key given twice in one mapping is an error.

YAML itself keeps the last of two equal keys silently; a config that sets ``train:`` twice
would lose half its settings without a word.
"""

from __future__ import annotations

from typing import Any

import yaml

from ensemble_core.config.messages import show

_MERGE_TAG = "tag:yaml.org,2002:merge"


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A YAML mapping holds the same key twice (YAML would silently keep the last)."""

    def __init__(self, key: str, first_line: int, second_line: int) -> None:
        self.key, self.first_line, self.second_line = key, first_line, second_line
        super().__init__(None, None, f"duplicate key '{key}' ({self.lines})", None)

    @property
    def lines(self) -> str:
        """``lines 3 and 7``, or ``both on line 3``."""
        if self.first_line == self.second_line:
            return f"both on line {self.first_line}"
        return f"lines {self.first_line} and {self.second_line}"


class StrictLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader that refuses a key given twice in one mapping, at any depth.

    Merge keys (``<<: *anchor``) still work: a key of the mapping itself overrides a
    merged one, as YAML specifies; only keys written twice in one mapping are refused.
    """

    def construct_document(self, node: yaml.Node) -> Any:
        self._key_paths: dict[int, str] = {}
        self._checked: set[int] = set()
        stack = [(node, "")]
        while stack:  # dotted path of every mapping, for the error message (aliases: first path)
            n, path = stack.pop()
            if id(n) in self._key_paths:
                continue
            if isinstance(n, yaml.MappingNode):
                self._key_paths[id(n)] = path
                for k, v in n.value:
                    name = k.value if isinstance(k, yaml.ScalarNode) else "?"
                    stack.append((v, f"{path}.{name}" if path else name))
            elif isinstance(n, yaml.SequenceNode):
                self._key_paths[id(n)] = path
                stack.extend((v, f"{path}.{i}" if path else str(i)) for i, v in enumerate(n.value))
        return super().construct_document(node)

    def _check_unique(self, node: yaml.MappingNode) -> None:
        if id(node) in self._checked:  # once, before flatten_mapping merges keys into node.value
            return
        self._checked.add(id(node))
        prefix = getattr(self, "_key_paths", {}).get(id(node), "")
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key in seen:
                    name = key_node.value if isinstance(key_node, yaml.ScalarNode) else show(key)
                    raise DuplicateKeyError(f"{prefix}.{name}" if prefix else str(name), seen[key], line)
                seen[key] = line
            except TypeError:  # an unhashable key: SafeConstructor reports it
                continue

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        self._check_unique(node)
        super().flatten_mapping(node)

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            self._check_unique(node)
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """``yaml.load`` with :class:`StrictLoader`: safe tags only, no duplicate keys."""
    return yaml.load(text, Loader=StrictLoader)  # noqa: S506  (StrictLoader is a SafeLoader)
