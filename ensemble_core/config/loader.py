"""Loading a config: read the file, parse it as strict YAML, apply ``dotted.key=value``
overrides and validate, every refusal a one-line :class:`~ensemble_core.errors.ConfigError`
that names the key (or file, line) and the fix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ensemble_core.config.base import Section
from ensemble_core.config.limits import MAX_CONFIG_BYTES, MAX_CONFIG_JSON_BYTES, PREFECT_MAX_PARAMETER_BYTES
from ensemble_core.config.messages import config_error, show
from ensemble_core.config.pipeline import PipelineConfig
from ensemble_core.config.strict_yaml import DuplicateKeyError, UnreadableValueError, YAMLError, describe, load_yaml
from ensemble_core.special_files import special_kind

#: At most this many invalid values are described; the rest are counted.
_MAX_ERRORS = 8


def _describe(err: ValidationError) -> str:
    errors = err.errors()
    parts = []
    for e in errors[:_MAX_ERRORS]:
        key = ".".join(str(p) for p in e["loc"]) or "<root>"
        if not e["loc"] and e["type"] == "value_error":  # a check across sections: its message says it all
            parts.append(e["msg"].removeprefix("Value error, "))
        elif e["type"] == "extra_forbidden":
            parts.append(
                f"unknown config key '{key}'; fix: remove it or check its spelling "
                f"(known keys are listed in configs/default.yaml)"
            )
        else:
            parts.append(f"config key '{key}': {e['msg']} (got {show(e.get('input'))}); fix: set a valid '{key}'")
    if len(errors) > _MAX_ERRORS:
        parts.append(f"and {len(errors) - _MAX_ERRORS} more invalid value(s)")
    return "; ".join(parts)


def validate(raw: dict[str, Any]) -> PipelineConfig:
    """Validate a nested dict into a :class:`PipelineConfig`.

    Raises:
      ConfigError: naming every offending key and what to do about it; or a config larger
        than :data:`~ensemble_core.config.limits.MAX_CONFIG_JSON_BYTES` as JSON (what a flow
        run's parameters can hold).
    """
    try:
        cfg = PipelineConfig.model_validate(raw)
    except ValidationError as err:
        raise config_error(_describe(err)) from None
    except RecursionError:
        raise config_error("config nests too deeply", fix="use the layout of configs/default.yaml") from None
    size = len(json.dumps(cfg.model_dump(mode="json"), separators=(",", ":")).encode())
    if size > MAX_CONFIG_JSON_BYTES:
        raise config_error(
            f"the config is {size:,} bytes as JSON, more than the {MAX_CONFIG_JSON_BYTES:,} a run's parameters may "
            f"hold (Prefect stores at most {PREFECT_MAX_PARAMETER_BYTES:,} bytes of a flow run's parameters)",
            fix="shorten its largest values (model.options, data.class_names, eval.evaluators)",
        )
    return cfg


# Kept by hand: the libraries that set a dotted key (OmegaConf.from_dotlist, glom.assign,
# pydash.set_) parse values with their own grammar or none, do not refuse a duplicate key in a
# value, and replace a scalar in the way silently instead of naming it.
def _set_dotted(raw: dict[str, Any], assignment: str) -> None:
    """Apply one ``dotted.key=value`` override to ``raw`` in place; the value is parsed as YAML
    (text that is not YAML is taken as a string, an empty value as null) and absent or empty
    sections on the way are created.

    Raises:
      ConfigError: no ``=``, an empty key part, a non-mapping on the path, a key twice in the
        value, or a value Python cannot build.
    """
    if "=" not in assignment:
        raise config_error(f"override '{assignment}' has no '='", fix="write it as dotted.key=value")
    key, text = assignment.split("=", 1)
    key = key.strip()
    *sections, last = parts = key.split(".")
    if not all(parts):
        raise config_error(f"override key '{key}' is malformed", fix="e.g. train.epochs=3")
    node = raw
    for depth, p in enumerate(sections):
        if node.get(p) is None:  # absent, or an empty section ('train:' in a file)
            node[p] = {}
        if not isinstance(node[p], dict):
            section = ".".join(parts[: depth + 1])
            raise config_error(
                f"config key '{section}' is not a section (got {show(node[p])}), so '{key}' cannot be set; "
                f"fix: make '{section}' a mapping of keys or drop the override '{key}'"
            )
        node = node[p]
    try:
        value = load_yaml(text) if text.strip() else None
    except DuplicateKeyError as err:
        raise config_error(
            f"override '{key}' has key '{err.key}' twice", fix=f"give each key of '{key}' once"
        ) from None
    except UnreadableValueError as err:
        raise config_error(
            f"config key '{key}': override value cannot be read ({err.reason})", fix=f"set a valid '{key}'"
        ) from None
    except YAMLError:
        value = text
    if isinstance(value, dict) and isinstance(node.get(last), dict) and _is_section(parts):
        # A mapping for a section changes the keys it names and keeps the others (a dotted
        # override changes one key): '--set train={epochs: 1}' must not drop train's other
        # settings from the file. A free-form mapping (model.options, eval.evaluators) is a
        # value: the override replaces it.
        node[last] = _merged(node[last], value)
    else:
        node[last] = value


def _is_section(parts: list[str]) -> bool:
    """Whether the dotted key ``parts`` names a config section (a :class:`Section` field of
    :class:`PipelineConfig`, at any depth), as opposed to a value or a free-form mapping."""
    model: Any = PipelineConfig
    for part in parts:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return False
        model = field.annotation
    return isinstance(model, type) and issubclass(model, Section)


def _merged(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``old`` with ``new``'s keys set (sub-mappings merged the same way)."""
    out = dict(old)
    for key, value in new.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _read_text(p: Path) -> str:
    """The text of config file ``p``: at most MAX_CONFIG_BYTES of UTF-8.

    Raises:
      ConfigError: missing, unreadable, a directory, too large, binary or not UTF-8.
    """
    fix = "fix: pass a readable YAML text file (UTF-8, like configs/default.yaml) to config_path"
    kind = special_kind(p)
    if kind is not None:  # opening a FIFO would block, a device read without end
        raise config_error(f"config file '{p}' is {kind}, not a file; {fix}")
    try:
        with p.open("rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except IsADirectoryError:
        raise config_error(f"config file '{p}' is a directory, not a file; {fix}") from None
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise config_error(
            f"cannot read config file '{p}': {reason}", fix="pass an existing readable YAML file to config_path"
        ) from None
    except ValueError as err:  # e.g. a NUL byte in the path
        raise config_error(f"cannot read config file '{p}': {err}; {fix}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise config_error(f"config file '{p}' is larger than {MAX_CONFIG_BYTES} bytes, so it is not a config; {fix}")
    if b"\x00" in data:
        raise config_error(f"config file '{p}' is binary, not text (NUL byte at offset {data.index(0)}); {fix}")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        bad = data[err.start]
        raise config_error(
            f"config file '{p}' is not UTF-8 text (byte 0x{bad:02x} at offset {err.start}); {fix}"
        ) from None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> PipelineConfig:
    """Read a YAML config (or the built-in defaults) and apply ``dotted.key=value`` overrides.

    Args:
      path: a YAML file whose top level is a mapping of the config sections; None means
        the defaults of :class:`PipelineConfig` (identical to ``configs/default.yaml``).
      overrides: ``["train.epochs=3", "ensemble.size=4"]``; values are parsed as YAML.

    Raises:
      ConfigError: unreadable, binary, non-UTF-8 or oversized file, not YAML, a key given
        twice, not a mapping, or any invalid key/value. The message is one line.
    """
    raw: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        text = _read_text(p)
        try:
            loaded = load_yaml(text)
        except DuplicateKeyError as err:
            raise config_error(
                f"config file '{p}' has key '{err.key}' twice ({err.lines}); "
                f"fix: keep only one '{err.key}' (YAML would silently use the last one)"
            ) from None
        except UnreadableValueError as err:
            raise config_error(
                f"config file '{p}' cannot be read as a config ({err.reason}); "
                f"fix: use the layout of configs/default.yaml"
            ) from None
        except YAMLError as err:
            raise config_error(
                f"config file '{p}' is not valid YAML ({describe(err)})", fix="correct the syntax"
            ) from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise config_error(
                f"config file '{p}' must hold a mapping of sections, not {type(loaded).__name__}",
                fix="see configs/default.yaml",
            )
        raw = loaded
    for assignment in overrides or []:
        _set_dotted(raw, assignment)
    return validate(raw)
