"""Configuration: frozen dataclasses, loaded from TOML, overridden with ``key=value``.

A config is a (possibly nested) frozen dataclass whose leaves are bool, int, float, str,
lists of those, or ``None``. ``load(cls, path, overrides)`` reads a TOML file (tables
for nested sections), applies overrides such as ``optim.lr=3e-4`` or
``checkpoints=[100,200]`` (values parsed as TOML, bare words as strings), checks every
key and type, and returns the dataclass. ``to_toml`` writes it back, so every run can
save its fully resolved config. Every mistake is a ``UserError`` naming the key.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import tomllib
import types
import typing
from pathlib import Path
from typing import Any

from .errors import UserError


def load(cls, path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()):
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.exists():
            raise UserError(f"config file not found: {path}")
        if path.is_dir():
            raise UserError(f"config file {path} is a folder, not a TOML file")
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8-sig"))
        except UnicodeDecodeError:
            raise UserError(f"{path}: not a text file (not UTF-8); expected a TOML config") from None
        except OSError as exc:
            raise UserError(f"cannot read config file {path}: {exc.strerror or exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise UserError(f"{path}: invalid TOML: {exc}") from None
    for item in overrides:
        key, value = parse_override(item)
        _set_dotted(data, key, value)
    return from_dict(cls, data)


def parse_override(item: str) -> tuple[str, Any]:
    if "=" not in item:
        raise UserError(f"override {item!r} is not of the form key=value")
    key, text = (s.strip() for s in item.split("=", 1))
    if not key:
        raise UserError(f"override {item!r} has an empty key")
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        value = text  # a bare word: a string
    return key, value


def _set_dotted(data: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise UserError(f"override {key}: {part!r} is not a section")
    node[parts[-1]] = value


def from_dict(cls, data: dict, prefix: str = ""):
    if not isinstance(data, dict):
        raise UserError(f"{prefix.rstrip('.') or 'config'}: expected a table")
    data = renamed(cls, data, prefix)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise UserError(f"unknown config key {prefix + unknown[0]!r}; valid keys here: {', '.join(fields)}")
    kwargs = {}
    for name, value in data.items():
        kwargs[name] = _coerce(hints[name], value, prefix + name)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise UserError(f"invalid config{' section ' + prefix.rstrip('.') if prefix else ''}: {exc}") from None


def renamed(cls, data: dict, prefix: str = "") -> dict:
    """``data`` with the old names of keys (a config class's ``ALIASES``, old → new, in any
    section) replaced by the new ones, so that configs saved before a rename still load
    and compare equal."""
    hints = typing.get_type_hints(cls)
    out = {}
    for key, value in data.items():
        key = getattr(cls, "ALIASES", {}).get(key, key)
        if key in out:
            raise UserError(f"config key {prefix + key!r} is given twice (once under its old name)")
        hint = hints.get(key)
        out[key] = renamed(hint, value, f"{prefix}{key}.") if dataclasses.is_dataclass(hint) and \
            isinstance(value, dict) else value
    return out


def _coerce(hint, value, key: str):
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, key + ".")
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(option, value, key)
            except UserError as exc:
                errors.append(str(exc))
        raise UserError(errors[0] if errors else f"config key {key!r}: bad value {value!r}")
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise UserError(f"config key {key!r}: expected a list, got {value!r}")
        (item,) = typing.get_args(hint)[:1] or (Any,)
        items = [_coerce(item, v, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if hint is Any:
        return value
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is float and isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"config key {key!r}: expected a finite number, got {value!r}")
    if hint is bool and not isinstance(value, bool):
        raise UserError(f"config key {key!r}: expected true or false, got {value!r}")
    if hint in (int, float, str) and (not isinstance(value, hint) or isinstance(value, bool) and hint is not bool):
        raise UserError(f"config key {key!r}: expected {hint.__name__}, got {value!r}")
    if origin is typing.Literal:
        if value not in typing.get_args(hint):
            choices = ", ".join(map(str, typing.get_args(hint)))
            raise UserError(f"config key {key!r}: {value!r} is not one of {choices}")
    return value


def flatten(data: dict, prefix: str = "") -> dict:
    """A nested config dict as ``{"dotted.key": value}``, lists as tuples (comparable)."""
    out = {}
    for k, v in data.items():
        if isinstance(v, dict):
            out.update(flatten(v, prefix + k + "."))
        else:
            out[prefix + k] = tuple(v) if isinstance(v, list) else v
    return out


def to_dict(config) -> dict:
    """``dataclasses.asdict``, less the empty fields marked ``omit_empty`` (an extension's table,
    ``PretrainConfig.objectives``: a config without one reads as it did before it existed)."""
    out = dataclasses.asdict(config)
    for f in dataclasses.fields(config):
        if f.metadata.get("omit_empty") and not out[f.name]:
            del out[f.name]
    return out


def to_toml(config) -> str:
    """TOML text of a config. TOML has no null: a ``None`` value is shown as a comment
    line ``# key = None (unset)``, so every key is listed and the text loads back as the
    same config."""
    return dict_to_toml(to_dict(config))


def dict_to_toml(data: dict) -> str:
    """TOML text of a config's nested dict (``to_toml``; a tracker shows it as text).

    Ours, not ``tomli-w``: a config's unset keys (``None``) are written as comment lines so
    that ``--print-config`` and every run's ``config.toml`` list every key; ``tomli-w``
    refuses ``None`` (TOML has no null), so using it would mean dropping those keys or
    post-editing its text. The values written are only bools, numbers, strings and lists
    of them (``_toml_value``), read back by ``tomllib`` in the tests."""
    lines: list[str] = []
    _emit(data, [], lines)
    return "\n".join(lines).strip() + "\n"


def _emit(data: dict, path: list[str], lines: list[str]) -> None:
    tables = {k: v for k, v in data.items() if isinstance(v, dict)}
    if path and any(not isinstance(v, dict) for v in data.values()):
        lines.append(f"\n[{'.'.join(path)}]")
    for key, value in data.items():
        if isinstance(value, dict):
            continue
        if value is None:
            lines.append(f"# {key} = None (unset)")
            continue
        lines.append(f"{key} = {_toml_value(value)}")
    for key, value in tables.items():
        _emit(value, path + [key], lines)


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def int_at_least(minimum: int):
    """An argparse type: an integer >= minimum, with a one-line error otherwise (every
    command's counts and seeds)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}")
        return value
    return parse


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0 (nan, inf and negatives are usage errors)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value
