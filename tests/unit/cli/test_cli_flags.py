"""Flags generated from a config dataclass: names, types, defaults, nesting, and what is left out."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, NoReturn

import pytest

from meshnet.cli.flags import add_config_arguments, config_from_arguments, given_arguments
from meshnet.core.config_flags import cli
from meshnet.core.errors import InvalidArgument
from meshnet.core.layers import LayerRange


@dataclass(frozen=True)
class Inner:
    size: int = 4
    """How big."""
    label: str = "x"
    """What it is called."""


@dataclass(frozen=True)
class Plain:
    depth: int = 2
    """How deep."""


@dataclass(frozen=True)
class Example:
    source: Path = field(metadata=cli(positional=True))
    """File to read."""
    layers: LayerRange
    """Range, A:B."""
    count: int = 3
    """How many."""
    ratio: float | None = None
    """Optional ratio; none disables it."""
    fast: bool = True
    """Go fast."""
    mode: Literal["a", "b"] = "a"
    """One of two modes."""
    sizes: tuple[int, ...] = (1, 2)
    """Sizes, comma-separated."""
    renamed_field: int = field(default=7, metadata=cli("short-name", short="s"))
    """A flag with another name."""
    inner: Inner | None = None
    """Built only when one of its flags is given."""
    plain: Plain = field(default_factory=Plain)
    """Always built; its flags are not prefixed."""
    internal: str = "kept"
    """Filled by the caller."""


class UsageError(Exception):
    pass


class RaisingParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def parser() -> argparse.ArgumentParser:
    built = RaisingParser(prog="example")
    add_config_arguments(built, Example, skip=("internal",))
    return built


def parse(*argv: str) -> Example:
    return config_from_arguments(Example, parser().parse_args(list(argv)), fixed={"internal": "given"})


def test_defaults_come_from_the_dataclass_and_only_given_flags_reach_it() -> None:
    config = parse("in.gguf", "--layers", "0:2")
    assert config == Example(Path("in.gguf"), LayerRange(0, 2), internal="given")
    assert given_arguments(Example, parser().parse_args(["in.gguf", "--layers", "0:2"])) == {
        "source": Path("in.gguf"),
        "layers": LayerRange(0, 2),
        "plain": Plain(),
    }


def test_every_kind_of_field_parses_to_its_type() -> None:
    config = parse(
        "in.gguf",
        "--layers=1:3",
        "--count=5",
        "--ratio=0.5",
        "--no-fast",
        "--mode=b",
        "--sizes=4, 8",
        "-s",
        "9",
        "--depth=6",
    )
    assert (config.count, config.ratio, config.fast, config.mode, config.sizes) == (5, 0.5, False, "b", (4, 8))
    assert (config.renamed_field, config.plain, config.inner) == (9, Plain(6), None)


def test_an_optional_nested_config_is_built_from_its_prefixed_flags() -> None:
    assert parse("in.gguf", "--layers=0:1", "--inner-label=y").inner == Inner(size=4, label="y")


def test_a_field_without_a_default_is_required_and_a_bad_value_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="--layers"):
        parser().parse_args(["in.gguf"])
    with pytest.raises(UsageError, match="must look like A:B"):
        parser().parse_args(["in.gguf", "--layers", "7"])
    with pytest.raises(UsageError, match="invalid choice"):
        parser().parse_args(["in.gguf", "--layers", "0:1", "--mode", "c"])


def test_help_shows_the_docstring_and_the_default_of_every_flag() -> None:
    text = " ".join(parser().format_help().split())
    for expected in (
        "How many. (default: 3)",
        "Optional ratio; none disables it. (default: none)",
        "Go fast. (default: on)",
        "Sizes, comma-separated. (default: 1,2)",
        "Range, A:B. (required)",
        "--short-name SHORT_NAME, -s SHORT_NAME",
        "How big. (default: 4, when any --inner-* flag is given)",
        "How deep. (default: 2)",
    ):
        assert expected in text
    assert "--internal" not in text


def test_a_field_without_a_docstring_is_refused() -> None:
    @dataclass(frozen=True)
    class Undocumented:
        knob: int = 1

    with pytest.raises(InvalidArgument, match=r"Undocumented\.knob has no docstring"):
        add_config_arguments(argparse.ArgumentParser(), Undocumented)


def test_computed_values_fill_only_what_the_user_left_out() -> None:
    calls: list[str] = []

    def count() -> int:
        calls.append("count")
        return 11

    args = parser().parse_args(["in.gguf", "--layers=0:1", "--count=2"])
    config = config_from_arguments(Example, args, computed={"count": count})
    assert config.count == 2 and calls == []
    args = parser().parse_args(["in.gguf", "--layers=0:1"])
    assert config_from_arguments(Example, args, computed={"count": count}).count == 11
