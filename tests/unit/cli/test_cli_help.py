"""Every subcommand's --help shows a default for every option (or says it is required), and every
field of every component config can be set from the command line."""

from __future__ import annotations

import argparse
import dataclasses
import typing

import pytest

from meshnet.cli import main as cli
from meshnet.core.config_flags import config_flags

FIELDS_WITHOUT_A_FLAG = {
    "data_dir": "the global --data-dir, accepted before or after the subcommand",
    "command": "meshnet bench records its own command line",
}


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    chooser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(chooser.choices)


def documented_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not isinstance(a, argparse._HelpAction | argparse._VersionAction)]


def test_every_command_is_walked() -> None:
    assert set(subcommands()) == set(cli._commands())


@pytest.mark.parametrize("name", sorted(cli._commands()))
def test_every_option_shows_its_default_or_says_it_is_required(name: str) -> None:
    parser = subcommands()[name]
    for action in documented_actions(parser):
        label = "/".join(action.option_strings) or action.dest
        assert action.help, f"meshnet {name} {label} has no help"
        assert "(default: " in action.help or "(required)" in action.help, f"meshnet {name} {label}: {action.help}"
        if action.required:
            assert "(required)" in action.help, f"meshnet {name} {label} is required but its help hides it"
    text = parser.format_help()  # formatting also %-expands every help string: it must not fail
    assert f"meshnet {name}" in text


@pytest.mark.parametrize("name", sorted(cli._commands()))
def test_every_config_field_is_reachable_from_the_command_line(name: str) -> None:
    command = cli._commands()[name]
    options = {option for action in subcommands()[name]._actions for option in action.option_strings}
    positionals = {action.dest for action in subcommands()[name]._actions if not action.option_strings}
    for config in command.configs:
        flags = config_flags(config, skip=command.skip)
        for flag in flags:
            assert flag.option in options or flag.dest in positionals, f"{config.__name__}.{flag.dest}"
        reached = {flag.path[0] for flag in flags}
        for field in dataclasses.fields(config):
            if field.name not in reached:
                assert field.name in FIELDS_WITHOUT_A_FLAG, f"{config.__name__}.{field.name} has no flag"


def test_the_worker_reaches_the_knobs_it_once_could_not() -> None:
    options = {option for action in subcommands()["worker"]._actions for option in action.option_strings}
    for knob in ("--flash-attn", "--no-flash-attn", "--max-queue", "--evict-idle-after", "--session-ttl"):
        assert knob in options
    gateway = {option for action in subcommands()["gateway"]._actions for option in action.option_strings}
    from meshnet.gateway.config import GatewayConfig

    assert len(gateway) >= len(dataclasses.fields(GatewayConfig))


def test_no_config_field_is_typed_twice_with_another_default() -> None:
    """The derived configs carry no defaults of their own (flash_attn aside: a recipe constant;
    use_mmap too: how weights are loaded, not arithmetic, turned off only by a worker's --no-mmap;
    repack: llama.cpp's own default, part of the recipe like flash_attn, off only by --no-repack;
    device and gpu_layers: the CPU with nothing offloaded, what every CPU recipe computes on, set
    only from a --device the caller resolved; kv_type: f16, what every recipe stored before
    --kv-type, set from a worker's or generate's --kv-type; split_small_decode_batches: how a
    small decode batch is cut into llama_decode calls, not its arithmetic, turned off only by
    start-up certification; lm_head_batch_from: None, measured at start-up, set only by tests and
    scripts)."""
    from meshnet.engine.llama_config import LlamaConfig
    from meshnet.session.admission import AdmissionPolicy

    for derived in (LlamaConfig, AdmissionPolicy):
        with_defaults = [f.name for f in dataclasses.fields(derived) if f.default is not dataclasses.MISSING]
        expected = [
            *("flash_attn", "use_mmap", "repack", "device", "gpu_layers", "kv_type"),
            *("split_small_decode_batches", "lm_head_batch_from"),
        ]
        assert with_defaults in ([], expected), derived
    assert typing.get_type_hints(LlamaConfig)["flash_attn"] is bool
