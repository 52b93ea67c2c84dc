"""Typed configs: dataclasses filled from YAML presets and `key=value` overrides, refusing typos.

Every section of a run's configuration is a dataclass with defaults. `from_dict` builds one from a
(possibly nested) mapping and rejects any key the dataclass does not declare, naming the closest
valid key; `apply_overrides` applies dotted `key=value` strings from the command line with the same
checks. Cross-field constraints live in each dataclass's `__post_init__`.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration problem, phrased for the user (one line, names the key)."""


def _nearest(key: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    return f"; did you mean '{close[0]}'?" if close else f"; valid keys: {', '.join(sorted(valid))}"


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Convert a YAML/JSON/CLI value to the declared field type, or raise ConfigError."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return from_dict(tp, value, where)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{where}: cannot use {value!r}")
    if origin is typing.Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise ConfigError(f"{where}: {value!r} is not one of {list(choices)}")
        return value
    if origin in (list, tuple):
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        (item_tp, *_) = typing.get_args(tp) or (Any,)
        items = [_coerce(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{where}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(float(value)) if float(value).is_integer() else int(value)
            except ValueError:
                pass
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    return value


def from_dict(cls: type[T], data: dict[str, Any], where: str = "config") -> T:
    """Build dataclass `cls` from `data`, rejecting unknown keys with the nearest valid one."""
    types_ = _field_types(cls)
    kwargs = {}
    for key, value in data.items():
        if key not in types_:
            name = f"{where}.{key}".replace("config.", "")
            if _retired(cls, key, value, name):
                continue
            if key in getattr(cls, "DATA_DECIDED", ()):
                raise ConfigError(f"'{name}' is decided by the data (saved as the checkpoint's data_spec), not set")
            raise ConfigError(f"unknown key '{name}'{_nearest(key, list(types_))}")
        kwargs[key] = _coerce(value, types_[key], f"{where}.{key}".replace("config.", ""))
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {e}") from None


def _retired(cls: type, key: str, value: Any, name: str) -> bool:
    """True for a removed option saved with the one behaviour left (an old checkpoint's config: dropped);
    a ConfigError for a removed option set to anything else; False for a key that never existed."""
    retired = getattr(cls, "RETIRED", {})
    if key not in retired:
        return False
    if retired[key] is None or value == retired[key]:
        return True
    raise ConfigError(
        f"'{name}' was removed (only {retired[key]!r} remains; docs/ablations.md says how to run commit 0c1a0cc)"
    )


def to_dict(cfg: Any) -> dict[str, Any]:
    """A JSON-able dict of a (nested) config dataclass."""
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


def _parse_scalar(text: str) -> Any:
    """Parse an override's right-hand side with YAML rules (so 3e-4, true, [1,2] all work)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_overrides(cfg: T, overrides: list[str]) -> T:
    """Return a copy of `cfg` with dotted `key=value` overrides applied (e.g. `model.n_layer=2`)."""
    data = to_dict(cfg)
    for item in overrides:
        item = item[2:] if item.startswith("--") else item
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not of the form key=value (e.g. train.steps=100)")
        dotted, text = item.split("=", 1)
        node, cls = data, type(cfg)
        parts = dotted.split(".")
        for depth, part in enumerate(parts):
            types_ = _field_types(cls)
            if depth == len(parts) - 1 and part in getattr(cls, "RETIRED", {}):
                node[part] = _parse_scalar(text)  # from_dict drops it or says it was removed
                break
            if part not in types_:
                prefix = ".".join(parts[:depth])
                name = f"{prefix}.{part}" if prefix else part
                if part in getattr(cls, "DATA_DECIDED", ()):
                    raise ConfigError(f"'{name}' is decided by the data (saved as the checkpoint's data_spec), not set")
                raise ConfigError(f"unknown key '{name}'{_nearest(part, list(types_))}")
            if depth == len(parts) - 1:  # `data.aux_key=` (or ="" in a shell) is the empty string, not null
                node[part] = "" if text in ("", '""', "''") and types_[part] is str else _parse_scalar(text)
            else:
                if not dataclasses.is_dataclass(types_[part]):
                    raise ConfigError(f"'{'.'.join(parts[: depth + 1])}' is not a section")
                node, cls = node[part], types_[part]
    return from_dict(type(cfg), data)


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping, with one clear error for a missing or malformed file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return data
