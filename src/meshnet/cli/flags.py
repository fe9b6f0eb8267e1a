"""The argparse side of the config flags: a parser's arguments from a config class, and the
config built back from what the user gave.

The naming rules and how each value is read and written live in ``core.config_flags`` (launchers
use them to render argv, ``deploy.launch``); this module is the only one that turns them into
argparse arguments. Flags the user does not give are left out of the namespace
(``argparse.SUPPRESS``), so the dataclass applies its own default and presets can tell "given"
from "defaulted".
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Callable, Collection, Mapping
from typing import Any, Literal, TypeVar

from meshnet.core.config_flags import (
    Flag,
    config_flags,
    flag_dest,
    flag_spec,
    is_nested,
    show_value,
    split_items,
    text_parser,
    unwrap_optional,
)
from meshnet.core.errors import MeshnetError

Config = TypeVar("Config")


def _help(flag: Flag) -> str:
    if flag.spec.shown_default is not None:
        tail = f"(default: {flag.spec.shown_default})"
    elif flag.default is dataclasses.MISSING:
        tail = "(required)"
    elif flag.optional_group:
        tail = f"(default: {show_value(flag.default)}, when any --{flag.prefix}* flag is given)"
    else:
        tail = f"(default: {show_value(flag.default)})"
    return f"{flag.doc} {tail}".replace("%", "%%")  # argparse %-formats help strings


def _parser_for(kind: Any) -> Callable[[str], Any]:
    """A ``type=`` callable for argparse; MeshnetError becomes argparse's own usage error."""
    parse = text_parser(kind)

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
        return tuple(parse_item(part) for part in split_items(text))

    convert.__name__ = "comma-separated list"
    return convert


def _add_flag(parser: argparse.ArgumentParser | argparse._ArgumentGroup, flag: Flag) -> None:
    kind, _ = unwrap_optional(flag.kind)
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
        kind, optional = unwrap_optional(hints[field.name])
        dest = flag_dest((*path, field.name))
        if flag_spec(field).hidden:
            continue
        if is_nested(kind):
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
