"""``meshnet publish | seed | fetch``: the artifact plane's commands."""

from __future__ import annotations

import argparse
import sys

from meshnet.cli.arguments import PublishArguments
from meshnet.cli.common import Command, progress_printer, stderr_progress
from meshnet.cli.flags import config_from_arguments


def cmd_publish(args: argparse.Namespace) -> int:
    from meshnet.artifact.gguf_split import first_part
    from meshnet.artifact.model_id import served_model_id
    from meshnet.artifact.publish import PublishOptions, publish
    from meshnet.security.signing import load_or_create_key

    command = config_from_arguments(PublishArguments, args)
    model_id = served_model_id(first_part(command.source), command.name)  # a set's directory: its first part
    key_path = command.key or args.data_dir / "keys" / "publisher.key"
    key, created = load_or_create_key(key_path)
    if created:
        print(f"new publisher key {key_path} (mode 0600)")
    options = PublishOptions(model_id, command.license, repo=command.repo, revision=command.revision)
    manifest = publish(command.source, command.out, options, key, progress=progress_printer())
    total = sum(entry.size for entry in manifest.artifacts)
    where = command.out / "manifest.json"
    print(f"{where}: model {manifest.model_id}, {len(manifest.artifacts)} artifacts, {total / 1e6:.1f} MB")
    print(f"publisher {key.fingerprint}")
    return 0


def cmd_seed(args: argparse.Namespace) -> int:
    import asyncio
    import signal

    from meshnet.artifact.holdings import Holdings
    from meshnet.cli.commands.swarm import node_security
    from meshnet.core.swarm_options import SecurityOptions
    from meshnet.deploy.launch.ready_lines import SeedLine, announce
    from meshnet.node.artifact_server import SeedConfig, serve_seeder

    config = config_from_arguments(SeedConfig, args)
    # A seeder joins as a worker-role node: holders are dialled as any worker of the swarm.
    options = config_from_arguments(SecurityOptions, args)
    security = node_security(options, args.data_dir, "seed", (config.host, config.advertise, config.tracker))

    def ready(address: str, holdings: Holdings) -> None:
        models = ",".join(model_id for model_id, _ in holdings.manifests)
        announce(SeedLine(address, len(holdings.artifacts), models))

    async def run() -> None:
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await serve_seeder(config, stop, ready, security)

    asyncio.run(run())
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    import asyncio

    from meshnet.cli.commands.swarm import node_security
    from meshnet.core.swarm_options import SecurityOptions
    from meshnet.fetch.fetcher import FetchConfig, fetch_range

    config = config_from_arguments(FetchConfig, args, fixed={"data_dir": args.data_dir})
    options = config_from_arguments(SecurityOptions, args)
    security = node_security(options, args.data_dir, "worker", (config.tracker,))
    fetched = asyncio.run(fetch_range(config, stderr_progress("fetch"), security))
    print(
        f"{fetched.files.slice}: layers {config.layers} of {fetched.manifest.model_id}, fetched "
        f"{fetched.fetched_bytes / 1e6:.1f} MB for {fetched.needed_bytes / 1e6:.1f} MB of artifacts "
        f"(source {fetched.manifest.source.size / 1e6:.1f} MB) in {fetched.seconds:.1f} s; "
        f"publisher {fetched.manifest.publisher}"
    )
    for holder in fetched.bad_holders:
        print(f"refused bad pieces from {holder}", file=sys.stderr)
    return 0


def artifact_commands() -> dict[str, Command]:
    from meshnet.core.swarm_options import SecurityOptions
    from meshnet.fetch.fetcher import FetchConfig
    from meshnet.node.artifact_server import SeedConfig

    return {
        "publish": Command(
            cmd_publish, "cut a GGUF into signed, content-addressed per-block artifacts", (PublishArguments,)
        ),
        "seed": Command(
            cmd_seed, "serve a published model's artifacts and announce them", (SeedConfig, SecurityOptions)
        ),
        "fetch": Command(
            cmd_fetch, "fetch and verify only the artifacts a layer range needs", (FetchConfig, SecurityOptions)
        ),
    }
