"""Command-line flags of a frozen config dataclass: one definition of every knob, read and written.

Each field becomes one flag named after it (``max_sessions`` -> ``--max-sessions``) whose help
is the docstring written under the field and whose shown default is the field's own default, so
a default is never typed twice. Rules:
- a field without a default is a required flag; ``bool`` is ``--x/--no-x``; ``X | None`` takes
  an X; ``tuple[X, ...]`` takes comma-separated Xs; ``Literal`` values are choices; a class with
  a ``parse(text)`` classmethod (``LayerRange``) is parsed by it and written by ``str``;
- a nested config is flattened; an optional nested config (``fake: FakeModel | None``) gets
  prefixed flags (``--fake-n-vocab``) and is built only when one of them is given;
- ``cli(...)`` field metadata renames a flag, makes it positional or describes a computed default.

This module holds the naming rules and both directions of a value's text: ``config_flags`` lists
the flags a config class has (``cli.flags`` turns them into an argparse parser), and
``render_arguments`` writes a config instance back as the arguments that parse to it (launchers
start components from their typed configs with it, ``deploy.launch``). No argparse here.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import textwrap
import types
import typing
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, Literal

from meshnet.core.errors import InvalidArgument, MeshnetError

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


def flag_spec(field: dataclasses.Field[Any]) -> FlagSpec:
    """The field's ``cli(...)`` metadata, or the plain rules."""
    spec = field.metadata.get(_METADATA_KEY, FlagSpec())
    return spec if isinstance(spec, FlagSpec) else FlagSpec()


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
        return flag_dest(self.path)

    @property
    def option(self) -> str:
        name = self.spec.name or self.path[-1].replace("_", "-")
        return f"{self.prefix}{name}" if self.spec.positional else f"--{self.prefix}{name}"

    @property
    def negation(self) -> str:
        """The ``--no-x`` form of a ``bool`` flag (argparse's ``BooleanOptionalAction`` naming)."""
        return "--no-" + self.option.removeprefix("--")


def flag_dest(path: tuple[str, ...]) -> str:
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


def unwrap_optional(kind: Any) -> tuple[Any, bool]:
    """``X | None`` -> ``(X, True)``; anything else -> ``(kind, False)``."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        members = [m for m in typing.get_args(kind) if m is not type(None)]
        if len(members) == 1 and len(members) < len(typing.get_args(kind)):
            return members[0], True
    return kind, False


def is_nested(kind: Any) -> bool:
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
        kind, optional = unwrap_optional(hints[field.name])
        spec = flag_spec(field)
        if spec.hidden:
            continue
        if is_nested(kind):
            nested_prefix = prefix + (f"{spec.name or field.name.replace('_', '-')}-" if optional else "")
            nested = config_flags(kind, path=(*path, field.name), prefix=nested_prefix)
            flags.extend(dataclasses.replace(f, optional_group=f.optional_group or optional) for f in nested)
            continue
        doc = docs.get(field.name)
        if doc is None:
            raise InvalidArgument(f"{cls.__name__}.{field.name} has no docstring to show as its --help")
        flags.append(Flag((*path, field.name), hints[field.name], _default_of(field), doc, spec, prefix, False))
    return flags


def show_value(value: Any) -> str:
    """A default as ``--help`` shows it."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ",".join(show_value(item) for item in value) or "(empty)"
    return str(value)


def text_parser(kind: Any) -> Callable[[str], Any]:
    """How one value of type ``kind`` is read from its text (raises ``MeshnetError`` on bad text)."""
    if typing.get_origin(kind) is Literal:
        return str
    if kind in (int, float, str, Path):
        return kind
    if callable(getattr(kind, "parse", None)):
        return kind.parse
    raise InvalidArgument(f"no command-line parser for fields of type {kind!r}")


def split_items(text: str) -> list[str]:
    """The items of a comma-separated flag value (blank items are dropped)."""
    return [part.strip() for part in text.split(",") if part.strip()]


# -- writing a config back as arguments -----------------------------------------------------------


def render_arguments(config: object, *, skip: Collection[str] = ()) -> list[str]:
    """The arguments that parse back to ``config`` (``skip``: top-level fields the caller passes
    otherwise, such as ``data_dir`` as the global ``--data-dir``).

    Only fields that differ from their default are written, so the child applies its own
    defaults (a field whose default the CLI computes, ``shown_default``, and leaves at its
    dataclass default is computed again, as its ``--help`` says). An optional nested config
    that is set writes at least one of its flags, so the parser builds it. A value that would
    not read back as itself (a tuple item with a comma, NaN, an API-only field set) is refused.
    """
    cls = type(config)
    _refuse_hidden_changes(config)
    options: list[str] = []
    positionals: list[str] = []
    written_groups: set[str] = set()
    pending_groups: dict[str, Flag] = {}
    for flag in config_flags(cls, skip=skip):
        present, value = _value_at(config, flag.path)
        if not present:
            continue  # inside an optional nested config that is not set
        if flag.spec.positional:
            if value is not None:
                positionals.append(_positional_text(flag, value))
            continue
        if value == flag.default:
            if flag.optional_group:
                pending_groups.setdefault(flag.prefix, flag)
            continue
        if flag.default is dataclasses.MISSING and value is None:
            continue  # a computed default (``shown_default``) the child fills in itself
        options += _option_words(flag, value)
        written_groups.add(flag.prefix)
    for prefix, flag in pending_groups.items():
        if prefix not in written_groups:
            options += _option_words(flag, _value_at(config, flag.path)[1])
    return [*options, *positionals]


def _refuse_hidden_changes(config: object) -> None:
    for field in dataclasses.fields(config):  # type: ignore[arg-type]
        value = getattr(config, field.name)
        if flag_spec(field).hidden and value != _default_of(field):
            raise InvalidArgument(f"{type(config).__name__}.{field.name} has no flag: it cannot be set by arguments")
        if dataclasses.is_dataclass(value) and is_nested(type(value)):
            _refuse_hidden_changes(value)


def _value_at(config: object, path: tuple[str, ...]) -> tuple[bool, Any]:
    value = config
    for name in path:
        if value is None:
            return False, None
        value = getattr(value, name)
    return True, value


def _option_words(flag: Flag, value: Any) -> list[str]:
    kind, _ = unwrap_optional(flag.kind)
    if kind is bool:
        return [flag.option if value else flag.negation]
    if value is None:
        raise InvalidArgument(f"{flag.option} defaults to {show_value(flag.default)}: none cannot be written")
    text = _text(flag, kind, value)
    if text == "--":
        # argparse reads "--" as the end of options even after "=" and drops it from the value.
        raise InvalidArgument(f"{flag.option}: the value '--' cannot be passed on a command line")
    # A value that starts with a dash would read as a flag of its own.
    return [f"{flag.option}={text}"] if text.startswith("-") else [flag.option, text]


def _positional_text(flag: Flag, value: Any) -> str:
    text = _text(flag, unwrap_optional(flag.kind)[0], value)
    if text.startswith("-"):
        raise InvalidArgument(f"{flag.option} {text!r} would read as a flag")
    return text


def _text(flag: Flag, kind: Any, value: Any) -> str:
    """The value's text, checked to read back as the same value."""
    if typing.get_origin(kind) is tuple:
        item_kind = typing.get_args(kind)[0]
        items = [_item_text(flag, item_kind, item) for item in value]
        if any(split_items(item) != [item] for item in items):
            raise InvalidArgument(f"{flag.option}: an item of {value!r} cannot be written comma-separated")
        return ",".join(items)
    return _item_text(flag, kind, value)


def _item_text(flag: Flag, kind: Any, value: Any) -> str:
    text = str(value)
    try:
        same = text_parser(kind)(text) == value
    except (MeshnetError, ValueError):
        same = False
    if not same:
        raise InvalidArgument(f"{flag.option}: {value!r} does not read back from its text {text!r}")
    return text
