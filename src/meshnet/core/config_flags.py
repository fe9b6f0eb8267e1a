"""Command-line flags generated from a frozen config dataclass: one definition of every knob.

Each field becomes one flag named after it (``max_sessions`` -> ``--max-sessions``) whose help
is the docstring written under the field and whose shown default is the field's own default, so
a default is never typed twice. Rules:
- a field without a default is a required flag; ``bool`` is ``--x/--no-x``; ``X | None`` takes
  an X; ``tuple[X, ...]`` takes comma-separated Xs; ``Literal`` values are choices; a class with
  a ``parse(text)`` classmethod (``LayerRange``) is parsed by it;
- a nested config is flattened; an optional nested config (``fake: FakeModel | None``) gets
  prefixed flags (``--fake-n-vocab``) and is built only when one of them is given;
- ``cli(...)`` field metadata renames a flag, makes it positional or describes a computed default.
Flags the user does not give are left out of the namespace (``argparse.SUPPRESS``), so the
dataclass applies its own default and presets can tell "given" from "defaulted".
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import itertools
import textwrap
import types
import typing
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

from meshnet.core.errors import InvalidArgument, MeshnetError

Config = TypeVar("Config")
_METADATA_KEY = "meshnet.cli"
PROVISIONED_MODEL = "the provisioned model"
"""Shown as the default of every ``--model``: the CLI resolves it under ``--data-dir``."""


@dataclasses.dataclass(frozen=True)
class FlagSpec:
    """How one field appears on the command line (see ``cli``)."""

    name: str | None = None
    """Flag name without dashes, when it differs from the field name."""
    positional: bool = False
    """A positional argument instead of a ``--flag`` (required unless the field has a default)."""
    shown_default: str | None = None
    """Text shown as the default when the caller computes it at run time (``DATA_DIR/...``); the
    flag is then optional even if the field has no default."""
    short: str | None = None
    """A one-letter alias (``o`` for ``-o``)."""
    hidden: bool = False
    """No flag at all: the field keeps its default on the command line (API-only options)."""


def cli(
    name: str | None = None,
    *,
    positional: bool = False,
    shown_default: str | None = None,
    short: str | None = None,
    hidden: bool = False,
) -> dict[str, Any]:
    """Field metadata: ``x: int = field(default=1, metadata=cli("other-name"))``."""
    return {_METADATA_KEY: FlagSpec(name, positional, shown_default, short, hidden)}


@dataclasses.dataclass(frozen=True)
class Flag:
    """One generated flag: the field it sets and how it is shown."""

    path: tuple[str, ...]
    """Field names from the top config down to this field (the namespace dest is built from it)."""
    kind: Any
    """The field's type hint, optional or not."""
    default: Any
    """The field's default, or ``dataclasses.MISSING``."""
    doc: str
    """The field's docstring on one line: the flag's help."""
    spec: FlagSpec
    """The field's ``cli(...)`` metadata."""
    prefix: str
    """Prefix of an optional nested config's flags (``fake-``), empty otherwise."""
    optional_group: bool
    """Whether the flag belongs to an optional nested config (built only when one is given)."""

    @property
    def dest(self) -> str:
        return _dest(self.path)

    @property
    def option(self) -> str:
        name = self.spec.name or self.path[-1].replace("_", "-")
        return f"{self.prefix}{name}" if self.spec.positional else f"--{self.prefix}{name}"


def _dest(path: tuple[str, ...]) -> str:
    # A prefix of its own, so a generated dest never collides with a hand-made flag's (``--model``).
    return "config." + ".".join(path)


def field_docs(cls: type) -> dict[str, str]:
    """The docstring written under each field of ``cls`` (and its bases), joined to one line."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__[:-1]):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue  # no source (a frozen build): flags then carry their names only
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for statement, following in itertools.pairwise(body):
            if (
                isinstance(statement, ast.AnnAssign)
                and isinstance(statement.target, ast.Name)
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                docs[statement.target.id] = " ".join(following.value.value.split())
    return docs


def _unwrap_optional(kind: Any) -> tuple[Any, bool]:
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        members = [m for m in typing.get_args(kind) if m is not type(None)]
        if len(members) == 1 and len(members) < len(typing.get_args(kind)):
            return members[0], True
    return kind, False


def _is_nested(kind: Any) -> bool:
    """A config inside a config: its fields become flags. A value type that parses itself from
    one string (``LayerRange.parse``) is one flag instead."""
    return dataclasses.is_dataclass(kind) and isinstance(kind, type) and not callable(getattr(kind, "parse", None))


def _default_of(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def config_flags(cls: type, *, skip: Collection[str] = (), path: tuple[str, ...] = (), prefix: str = "") -> list[Flag]:
    """Every flag ``cls`` generates, nested configs expanded; ``skip`` names top-level fields left out."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    flags: list[Flag] = []
    for field in dataclasses.fields(cls):
        if field.name in skip or not field.init:
            continue
        kind, optional = _unwrap_optional(hints[field.name])
        spec = field.metadata.get(_METADATA_KEY, FlagSpec())
        if spec.hidden:
            continue
        if _is_nested(kind):
            nested_prefix = prefix + (f"{spec.name or field.name.replace('_', '-')}-" if optional else "")
            nested = config_flags(kind, path=(*path, field.name), prefix=nested_prefix)
            flags.extend(dataclasses.replace(f, optional_group=f.optional_group or optional) for f in nested)
            continue
        doc = docs.get(field.name)
        if doc is None:
            raise InvalidArgument(f"{cls.__name__}.{field.name} has no docstring to show as its --help")
        flags.append(Flag((*path, field.name), hints[field.name], _default_of(field), doc, spec, prefix, False))
    return flags


def _show(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ",".join(_show(item) for item in value) or "(empty)"
    return str(value)


def _help(flag: Flag) -> str:
    if flag.spec.shown_default is not None:
        tail = f"(default: {flag.spec.shown_default})"
    elif flag.default is dataclasses.MISSING:
        tail = "(required)"
    elif flag.optional_group:
        tail = f"(default: {_show(flag.default)}, when any --{flag.prefix}* flag is given)"
    else:
        tail = f"(default: {_show(flag.default)})"
    return f"{flag.doc} {tail}".replace("%", "%%")  # argparse %-formats help strings


def _parser_for(kind: Any) -> Callable[[str], Any]:
    """A ``type=`` callable for argparse; MeshnetError becomes argparse's own usage error."""
    if typing.get_origin(kind) is Literal:
        return str
    parse: Callable[[str], Any]
    if kind in (int, float, str, Path):
        parse = kind
    elif callable(getattr(kind, "parse", None)):
        parse = kind.parse
    else:
        raise InvalidArgument(f"no command-line parser for fields of type {kind!r}")

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except MeshnetError as error:
            raise argparse.ArgumentTypeError(error.message) from None

    convert.__name__ = getattr(kind, "__name__", "value")  # argparse names the type in its errors
    return convert


def _tuple_parser(item: Any) -> Callable[[str], tuple[Any, ...]]:
    parse_item = _parser_for(item)

    def convert(text: str) -> tuple[Any, ...]:
        return tuple(parse_item(part.strip()) for part in text.split(",") if part.strip())

    convert.__name__ = "comma-separated list"
    return convert


def _add_flag(parser: argparse.ArgumentParser | argparse._ArgumentGroup, flag: Flag) -> None:
    kind, _ = _unwrap_optional(flag.kind)
    options: dict[str, Any] = {"help": _help(flag), "default": argparse.SUPPRESS}
    required = flag.default is dataclasses.MISSING and flag.spec.shown_default is None
    if flag.spec.positional:
        if not required:
            options["nargs"] = "?"
        parser.add_argument(flag.dest, metavar=flag.option.upper(), type=_parser_for(kind), **options)
        return
    names = [flag.option, *([f"-{flag.spec.short}"] if flag.spec.short else [])]
    options["dest"] = flag.dest
    options["required"] = required
    if kind is bool:
        parser.add_argument(*names, action=argparse.BooleanOptionalAction, **options)
        return
    metavar: str | None = flag.option.removeprefix("--").upper().replace("-", "_")
    if typing.get_origin(kind) is tuple:
        options["type"] = _tuple_parser(typing.get_args(kind)[0])
        metavar = f"{metavar}[,...]"
    else:
        options["type"] = _parser_for(kind)
    if typing.get_origin(kind) is Literal:
        options["choices"] = typing.get_args(kind)
        metavar = None
    parser.add_argument(*names, metavar=metavar, **options)


def add_config_arguments(parser: argparse.ArgumentParser, cls: type, *, skip: Collection[str] = ()) -> None:
    """Add one flag per field of ``cls`` (nested configs expanded; ``skip`` names fields the caller fills)."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for flag in config_flags(cls, skip=skip):
        target: argparse.ArgumentParser | argparse._ArgumentGroup = parser
        if flag.optional_group:
            title = flag.path[0].replace("_", " ")
            target = groups.setdefault(title, parser.add_argument_group(title))
        _add_flag(target, flag)


def given_arguments(cls: type, args: argparse.Namespace, *, path: tuple[str, ...] = ()) -> dict[str, Any]:
    """The fields of ``cls`` the user gave on the command line, nested configs built from theirs."""
    hints = typing.get_type_hints(cls)
    given: dict[str, Any] = {}
    values: Mapping[str, Any] = vars(args)
    for field in dataclasses.fields(cls):
        kind, optional = _unwrap_optional(hints[field.name])
        dest = _dest((*path, field.name))
        if field.metadata.get(_METADATA_KEY, FlagSpec()).hidden:
            continue
        if _is_nested(kind):
            nested = given_arguments(kind, args, path=(*path, field.name))
            if nested or not optional:
                given[field.name] = kind(**nested)
        elif dest in values:
            given[field.name] = values[dest]
    return given


def config_from_arguments(
    cls: type[Config],
    args: argparse.Namespace,
    fixed: Mapping[str, Any] | None = None,
    computed: Mapping[str, Callable[[], Any]] | None = None,
) -> Config:
    """Build ``cls`` from the parsed flags. ``fixed`` fills fields that have no flag; ``computed``
    fills a field the user left out, called only then (resolving it may fail or cost)."""
    values = given_arguments(cls, args)
    for name, compute in (computed or {}).items():
        if name not in values:
            values[name] = compute()
    return cls(**{**values, **(fixed or {})})
