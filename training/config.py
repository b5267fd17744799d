"""Typed configs and command-line overrides.

Every field of a nested dataclass config can be set from the command line as
`section.field=value` (e.g. `ppo.lr=3e-4 policy.actor_hidden=64,64`). Values are
parsed by the field's type; an unknown field or a value of the wrong type is an
error that names the field.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import types
import typing
from typing import Any


class ConfigError(ValueError):
    """A config field that does not exist, or a value that does not fit it."""


def _field_paths(cfg: Any, prefix: str = "") -> list[str]:
    out = []
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        path = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(v):
            out += _field_paths(v, path + ".")
        else:
            out.append(path)
    return out


def _parse(value: str, tp: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value.lower() in ("none", "null") and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _parse(value, a, path)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{path}: cannot parse {value!r} as {tp}")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{path} must be one of {list(args)}, got {value!r}")
        return value
    if origin in (tuple, list):
        items = [s for s in value.replace("(", "").replace(")", "").split(",") if s.strip()]
        inner = args[0] if args else str
        parsed = [_parse(s.strip(), inner, path) for s in items]
        return tuple(parsed) if origin is tuple else parsed
    if origin is dict:
        try:
            v = json.loads(value)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path} expects a JSON object, got {value!r}") from e
        if not isinstance(v, dict):
            raise ConfigError(f"{path} expects a JSON object, got {value!r}")
        return v
    if tp is bool:
        if value.lower() in ("1", "true", "yes", "on"):
            return True
        if value.lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{path} expects true/false, got {value!r}")
    if tp is int:
        try:
            f = float(value)
        except ValueError:
            raise ConfigError(f"{path} expects an integer, got {value!r}") from None
        if not f.is_integer():
            raise ConfigError(f"{path} expects an integer, got {value!r}")
        return int(f)
    if tp is float:
        try:
            return float(value)
        except ValueError:
            raise ConfigError(f"{path} expects a number, got {value!r}") from None
    if tp is str or tp is Any:
        return value
    raise ConfigError(f"{path}: fields of type {tp} cannot be set from the command line")


def set_field(cfg: Any, path: str, value: Any, _prefix: str = "") -> Any:
    """Return a copy of `cfg` with the dotted field `path` set (strings are parsed)."""
    head, _, rest = path.partition(".")
    full = _prefix + path
    names = {f.name: f for f in dataclasses.fields(cfg)}
    if head not in names:
        renamed = getattr(type(cfg), "RENAMED", {}).get(head)
        if renamed is not None:
            raise ConfigError(f"config field {full!r} is now called {_prefix + renamed!r}")
        known = [_prefix + p for p in _field_paths(cfg)]
        close = difflib.get_close_matches(full, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"unknown config field {full!r}{hint}")
    current = getattr(cfg, head)
    if rest:
        if not dataclasses.is_dataclass(current):
            raise ConfigError(f"config field {_prefix + head!r} has no sub-field {rest!r}")
        return dataclasses.replace(
            cfg, **{head: set_field(current, rest, value, f"{_prefix}{head}.")}
        )
    if dataclasses.is_dataclass(current):
        example = f"{full}.{_field_paths(current)[0]}"
        raise ConfigError(f"{full!r} is a section; set one of its fields, e.g. {example!r}")
    hints = typing.get_type_hints(type(cfg))
    if isinstance(value, str):
        value = _parse(value, hints[head], full)
    try:
        return dataclasses.replace(cfg, **{head: value})
    except (ValueError, TypeError) as e:  # the dataclass's own validation
        raise ConfigError(f"{full}={value!r}: {e}") from e


def apply_overrides(cfg: Any, overrides: list[str] | dict[str, Any]) -> Any:
    items = overrides.items() if isinstance(overrides, dict) else [_split(o) for o in overrides]
    for path, value in items:
        cfg = set_field(cfg, path, value)
    return cfg


def _split(item: str) -> tuple[str, str]:
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like section.field=value")
    k, v = item.split("=", 1)
    return k.strip().lstrip("-"), v.strip()


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def from_dict(cls: type, data: dict[str, Any]) -> Any:
    """Rebuild a nested dataclass config from `to_dict` output (e.g. from a checkpoint)."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    # a config saved before a field was renamed (class attribute RENAMED: old -> new)
    for old, new in getattr(cls, "RENAMED", {}).items():
        if old in data and new not in data:
            data = {**data, new: data[old]}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        v = data[f.name]
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp) and isinstance(v, dict):
            v = from_dict(tp, v)
        elif typing.get_origin(tp) is tuple and isinstance(v, list):
            v = tuple(v)
        elif isinstance(v, list) and typing.get_origin(tp) in (typing.Union, types.UnionType):
            if any(typing.get_origin(a) is tuple for a in typing.get_args(tp)):
                v = tuple(v)
        kwargs[f.name] = v
    return cls(**kwargs)


def config_hash(cfg: Any) -> str:
    blob = json.dumps(to_dict(cfg), sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


class FieldChecks:
    """Validation of a config's fields in ``__post_init__``, with errors that name them.

    ``FieldChecks(self).ints("num_steps", "num_epochs")`` raises ``ValueError("PPOConfig.
    num_steps must be an integer >= 1, got 0")``; every learner's config checks its
    fields with the same words.
    """

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self.owner = type(cfg).__name__

    def fail(self, name: str, why: str) -> ValueError:
        return ValueError(f"{self.owner}.{name} {why}, got {getattr(self.cfg, name)!r}")

    def _each(self, names: tuple[str, ...]):
        return ((n, getattr(self.cfg, n)) for n in names)

    def ints(self, *names: str, low: int = 1) -> FieldChecks:
        for n, v in self._each(names):
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise self.fail(n, f"must be an integer >= {low}")
        return self

    def finite(self, *names: str) -> FieldChecks:
        for n, v in self._each(names):
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise self.fail(n, "must be a finite number")
        return self

    def within(self, low: float, high: float, *names: str) -> FieldChecks:
        for n, v in self._each(names):
            if not low <= v <= high:
                raise self.fail(n, f"must be in [{low:g}, {high:g}]")
        return self

    def positive(self, *names: str) -> FieldChecks:
        for n, v in self._each(names):
            if not v > 0:
                raise self.fail(n, "must be > 0")
        return self

    def nonnegative(self, *names: str) -> FieldChecks:
        for n, v in self._each(names):
            if v < 0:
                raise self.fail(n, "must be >= 0")
        return self

    def positive_or_none(self, *names: str) -> FieldChecks:
        for n, v in self._each(names):
            if v is not None and not (
                isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0
            ):
                raise self.fail(n, "must be None or a positive number")
        return self

    def one_of(self, name: str, choices: Any) -> FieldChecks:
        if getattr(self.cfg, name) not in choices:
            raise self.fail(name, f"must be one of {sorted(choices)}")
        return self
