"""Field documentation of typed configs, and the ``--help`` listing built from it.

Every config field is documented where it is declared, by a string literal right under
its annotated assignment (the attribute-docstring convention that tyro and CleanRL use)::

    @dataclass
    class PPOConfig:
        \"\"\"PPO hyper-parameters.\"\"\"

        num_steps: int = 24
        \"\"\"Env steps per env per rollout.\"\"\"

Python keeps no such string at run time, so :func:`field_docs` reads them from the class
source with :mod:`ast`. :func:`format_config_help` turns a config *instance* (defaults,
presets and overrides applied) into a listing, one line per field, grouped by section
(a nested dataclass)::

    ppo: PPO hyper-parameters.
      ppo.num_steps: int = 24  Env steps per env per rollout.

:func:`undocumented_fields` names the fields that still lack a doc.
"""

from __future__ import annotations

import ast
import collections.abc
import dataclasses
import functools
import inspect
import textwrap
import types
import typing
from typing import Any

__all__ = [
    "FieldHelp",
    "class_summary",
    "config_fields",
    "field_docs",
    "format_config_help",
    "format_type",
    "undocumented_fields",
]

HELP_WIDTH = 100  # wrap docs at this column
_MAX_DOC_COLUMN = 48  # a field whose "path: type = value" is longer puts its doc below
_MIN_DOC_WIDTH = 40


@dataclasses.dataclass(frozen=True)
class FieldHelp:
    """One leaf field of a config, as ``--help`` shows it."""

    path: str
    """Dotted path as set on the command line, e.g. ``ppo.num_steps``."""
    type: str
    """Readable type, e.g. ``float | None`` or ``{ddim,ddpm}``."""
    value: Any
    """The field's current value in the config instance."""
    doc: str
    """The field's attribute docstring as one paragraph; "" when it has none."""
    section: str = ""
    """Dotted path of the section (nested dataclass) holding the field; "" at the top."""


# ---------------------------------------------------------------------------- source docs
def _normalize(doc: str) -> str:
    return " ".join(doc.split())


def _string_constant(node: ast.stmt) -> str | None:
    if (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    ):
        return node.value.value
    return None


@functools.cache
def _own_docs(cls: type) -> tuple[str | None, tuple[tuple[str, str], ...]]:
    """(class docstring, ((field, doc), ...)) declared in ``cls``'s own body."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None, ()  # no source (REPL, exec, C extension): nothing to read
    node = next(
        (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__), None
    )
    if node is None:
        return None, ()
    docs: list[tuple[str, str]] = []
    body = node.body
    for i, stmt in enumerate(body):
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        doc = _string_constant(body[i + 1]) if i + 1 < len(body) else None
        if doc is not None:
            docs.append((stmt.target.id, _normalize(doc)))
    return ast.get_docstring(node), tuple(docs)


@functools.cache
def _field_docs(cls: type) -> tuple[tuple[str, str], ...]:
    merged: dict[str, str] = {}
    for base in reversed(cls.__mro__):  # a subclass's doc replaces its base's
        if base is object:
            continue
        for name, doc in _own_docs(base)[1]:
            if doc:
                merged[name] = doc
    return tuple((f.name, merged.get(f.name, "")) for f in dataclasses.fields(cls))


def field_docs(cls: type) -> dict[str, str]:
    """The doc of each field of the dataclass type ``cls``, in field order.

    A field's doc is the string literal statement right after its annotated assignment
    in the class body, whitespace joined into one paragraph; inherited fields keep the
    doc of the class that declares them (a redeclaration with its own doc replaces it).
    A field without a doc maps to "". Read from the source once per class.
    """
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"field_docs expects a dataclass type, got {cls!r}")
    return dict(_field_docs(cls))


def class_summary(cls: type) -> str:
    """The summary line of the class docstring: its first paragraph, in one line ("" when
    the class has none; the signature dataclasses writes into ``__doc__`` is none)."""
    doc, _ = _own_docs(cls)
    if doc is None:
        doc = cls.__dict__.get("__doc__") or ""
        if doc.startswith(cls.__name__ + "("):  # dataclasses' generated docstring
            doc = ""
    return _normalize(inspect.cleandoc(doc).strip().split("\n\n")[0])


# ---------------------------------------------------------------------------- types
def _type_name(tp: Any) -> str:
    if tp is type(None) or tp is None:
        return "None"
    if tp is Any:
        return "Any"
    if tp is Ellipsis:
        return "..."
    if isinstance(tp, str):
        return tp
    if isinstance(tp, typing.ForwardRef):
        return tp.__forward_arg__
    if isinstance(tp, typing.TypeVar):
        return tp.__name__
    if isinstance(tp, type):
        return tp.__qualname__ if tp.__module__ not in ("builtins",) else tp.__name__
    return str(tp).replace("typing.", "")


def format_type(tp: Any) -> str:
    """A short readable form of a type annotation.

    ``int``, ``float | None``, ``tuple[int, ...]``, ``dict[str, Any]``; a ``Literal``
    shows its choices as ``{a,b}``. String annotations (not resolvable) are shown as
    written.
    """
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is None:
        return _type_name(tp)
    if origin is typing.Literal:
        return "{" + ",".join(a if isinstance(a, str) else repr(a) for a in args) + "}"
    if origin in (typing.Union, types.UnionType):
        return " | ".join(format_type(a) for a in args)
    if origin is typing.ClassVar or origin is typing.Final:
        return format_type(args[0]) if args else _type_name(origin)
    if origin is typing.Annotated:
        return format_type(args[0])
    if origin is collections.abc.Callable:
        params, ret = args
        shown = "..." if params is Ellipsis else ", ".join(format_type(p) for p in params)
        return f"Callable[[{shown}], {format_type(ret)}]"
    name = _type_name(origin)
    if not args:
        return name
    return f"{name}[{', '.join(format_type(a) for a in args)}]"


def _annotations(cls: type) -> dict[str, Any]:
    """Resolved annotations of ``cls`` (``from __future__ import annotations`` makes
    them strings); the strings as written where they cannot be resolved."""
    try:
        return typing.get_type_hints(cls)
    except Exception:  # a name only the class's local scope knows, a typo, ...
        hints: dict[str, Any] = {}
        for base in reversed(cls.__mro__):
            hints.update(base.__dict__.get("__annotations__", {}))
        return hints


# ---------------------------------------------------------------------------- fields
def config_fields(cfg: Any) -> list[FieldHelp]:
    """Every leaf field of the dataclass instance ``cfg``, depth first in field order.

    A field whose value is a dataclass instance is a section: its fields follow with
    dotted paths (``ppo.num_steps``), recursively. Values are the instance's, so they
    show presets and overrides applied to it.
    """
    if not dataclasses.is_dataclass(cfg) or isinstance(cfg, type):
        raise TypeError(f"config_fields expects a dataclass instance, got {cfg!r}")
    out: list[FieldHelp] = []
    _collect(cfg, "", out)
    return out


def _collect(cfg: Any, prefix: str, out: list[FieldHelp]) -> None:
    cls = type(cfg)
    docs = field_docs(cls)
    hints = _annotations(cls)
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        path = prefix + f.name
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            _collect(value, path + ".", out)
            continue
        tp = hints.get(f.name, f.type)
        out.append(FieldHelp(path, format_type(tp), value, docs[f.name], prefix[:-1]))


def undocumented_fields(cfg: Any) -> list[str]:
    """Paths of the fields of ``cfg`` (recursively) that have no doc."""
    return [f.path for f in config_fields(cfg) if not f.doc]


# ---------------------------------------------------------------------------- rendering
def _format_value(value: Any) -> str:
    # repr keeps None / 'None' / '' apart; float repr is already the shortest form
    # that round-trips (0.0003, 1e-05)
    return repr(value)


def _heading(cfg: Any, section: str, title: str | None) -> str:
    """The section's path and its class's summary (else the doc of the field holding it)."""
    if not section:
        if title is not None:
            return title
        summary = class_summary(type(cfg))
        return f"{type(cfg).__name__}: {summary}" if summary else type(cfg).__name__
    parent, obj, doc = cfg, cfg, ""
    for name in section.split("."):
        parent, obj = obj, getattr(obj, name)
        doc = field_docs(type(parent)).get(name, "")
    summary = class_summary(type(obj)) or doc
    return f"{section}: {summary}" if summary else section


def format_config_help(cfg: Any, title: str | None = None) -> str:
    """A text listing of every field of the config instance ``cfg``.

    Grouped by section, each under a heading made of the section's path and the first
    line of its class docstring (the top level under ``title``, else the class's name
    and summary); one line per field, ``  path: type = value  doc``, the docs aligned in
    one column and wrapped at about 100 columns.
    """
    fields = config_fields(cfg)
    groups: dict[str, list[FieldHelp]] = {"": []}
    for f in fields:
        groups.setdefault(f.section, []).append(f)
    lefts = {f.path: f"  {f.path}: {f.type} = {_format_value(f.value)}" for f in fields}
    fitting = [len(s) for s in lefts.values() if len(s) + 2 <= _MAX_DOC_COLUMN]
    col = max(fitting, default=_MAX_DOC_COLUMN - 2) + 2
    width = max(HELP_WIDTH - col, _MIN_DOC_WIDTH)
    blocks: list[str] = []
    for section, members in groups.items():
        if not members and section:
            continue
        lines = [_heading(cfg, section, title)]
        for f in members:
            left = lefts[f.path]
            doc = textwrap.wrap(f.doc, width, break_long_words=False, break_on_hyphens=False)
            if not doc:
                lines.append(left)
                continue
            if len(left) + 2 <= col:
                lines.append(left.ljust(col) + doc[0])
                rest = doc[1:]
            else:
                lines.append(left)
                rest = doc
            lines += [" " * col + d for d in rest]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"
