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
import os
import types
import typing
from pathlib import Path
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
        # 64,64 or (64, 64) or [64, 64]: what a shell user, a Python user and YAML write
        bare = value.strip().removeprefix("[").removesuffix("]").replace("(", "").replace(")", "")
        items = [s for s in bare.split(",") if s.strip()]
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
        raise ConfigError(f"unknown config field {full!r}{_suggestion(cfg, head, _prefix)}")
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
    value = (
        _parse(value, hints[head], full)
        if isinstance(value, str)
        else _coerce(value, hints[head], full)
    )
    try:
        return dataclasses.replace(cfg, **{head: value})
    except (ValueError, TypeError) as e:  # the dataclass's own validation
        raise ConfigError(f"{full}={value!r}: {e}") from e


# the names other RL libraries give our fields (stable-baselines3, CleanRL, rsl_rl)
SYNONYMS = {
    "learning_rate": "lr",
    "n_steps": "num_steps",
    "num_steps_per_env": "num_steps",
    "n_epochs": "num_epochs",
    "num_learning_epochs": "num_epochs",
    "update_epochs": "num_epochs",
    "num_mini_batches": "num_minibatches",
    "gae_lambda": "lam",
    "clip_range": "clip",
    "clip_param": "clip",
    "clip_coef": "clip",
    "ent_coef": "entropy_coef",
    "vf_coef": "value_coef",
    "value_loss_coef": "value_coef",
    "n_envs": "num_envs",
    "total_timesteps": "total_steps",
}


def _suggestion(cfg: Any, head: str, prefix: str) -> str:
    """'; did you mean ...?' for an unknown field: another library's name for it, or the
    closest field name in this section, or in the whole config."""
    names = [f.name for f in dataclasses.fields(cfg)]
    if SYNONYMS.get(head) in names:
        return f"; did you mean {prefix + SYNONYMS[head]!r}?"
    close = difflib.get_close_matches(head, names, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {prefix + close[0]!r}?"
    known = [prefix + p for p in _field_paths(cfg)]
    close = difflib.get_close_matches(prefix + head, known, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _coerce(value: Any, tp: Any, path: str) -> Any:
    """A typed value (from a config file or Python) checked against the field's type:
    lists become tuples, ints may stand for floats, anything else must match."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, path)
            except ConfigError:
                continue
        raise ConfigError(f"{path}: {value!r} does not fit {tp}")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{path} must be one of {list(args)}, got {value!r}")
        return value
    if origin in (tuple, list):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{path} expects a list, got {value!r}")
        inner = args[0] if args else Any
        items = [_coerce(v, inner, path) for v in value]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path} expects a mapping, got {value!r}")
        return value
    if tp is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if tp is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if tp is Any or (
        isinstance(tp, type)
        and isinstance(value, tp)
        and not (tp is int and isinstance(value, bool))
    ):
        return value
    raise ConfigError(f"{path} expects {getattr(tp, '__name__', tp)}, got {value!r}")


def overrides_from_mapping(cfg: Any, mapping: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted overrides from a nested mapping (a YAML config file): sections are nested
    mappings, a field's value is taken whole (env.task_args stays a mapping)."""
    if not isinstance(mapping, dict):
        raise ConfigError(f"{prefix or 'the config'} must be a mapping of fields, got {mapping!r}")
    out: dict[str, Any] = {}
    names = {f.name for f in dataclasses.fields(cfg)}
    for key, value in mapping.items():
        if key not in names:
            raise ConfigError(
                f"unknown config field {prefix + str(key)!r}{_suggestion(cfg, key, prefix)}"
            )
        current = getattr(cfg, key)
        if dataclasses.is_dataclass(current):
            out.update(overrides_from_mapping(current, value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def read_config_file(path: str | os.PathLike) -> dict[str, Any]:
    """The nested mapping of a YAML (or JSON) config file, for overrides_from_mapping."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist")
    try:
        mapping = yaml.safe_load(path.read_text()) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not a YAML file ({e})") from None
    if not isinstance(mapping, dict):
        raise ConfigError(f"{path}: must hold a mapping of sections and fields")
    return mapping


def dump_config(cfg: Any) -> str:
    """The config as YAML, readable by :func:`load_config_file` (tuples as lists)."""
    import yaml

    def plain(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [plain(x) for x in v]
        return v

    return yaml.safe_dump(plain(to_dict(cfg)), sort_keys=False)


def apply_overrides(cfg: Any, overrides: list[str] | dict[str, Any]) -> Any:
    """`cfg` with the overrides set, the last value of a field winning. Each field is
    checked as it is set, so one that is valid only beside another (``policy.horizon=1``
    needs ``policy.act_steps=1``) waits for the others and is set again after them; the
    error of an override that no order makes valid is raised as it is."""
    items = overrides.items() if isinstance(overrides, dict) else [parse_override(o) for o in overrides]
    pending = list(dict(items).items())  # one entry per field, its last value
    while pending:
        failed: list[tuple[str, Any]] = []
        first_error: ConfigError | None = None
        for path, value in pending:
            try:
                cfg = set_field(cfg, path, value)
            except ConfigError as e:
                failed.append((path, value))
                first_error = first_error or e
        if first_error is not None and len(failed) == len(pending):
            raise first_error
        pending = failed
    return cfg


def parse_override(item: str) -> tuple[str, str]:
    """``section.field=value`` -> (path, value text)."""
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
    # a config saved before a field existed (class attribute ADDED: field -> the value
    # that reproduces how such configs behaved, which need not be today's default)
    for name, before in getattr(cls, "ADDED", {}).items():
        if name not in data:
            data = {**data, name: before}
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
                isinstance(v, int | float)
                and not isinstance(v, bool)
                and math.isfinite(v)
                and v > 0
            ):
                raise self.fail(n, "must be None or a positive number")
        return self

    def one_of(self, name: str, choices: Any) -> FieldChecks:
        if getattr(self.cfg, name) not in choices:
            raise self.fail(name, f"must be one of {sorted(choices)}")
        return self
