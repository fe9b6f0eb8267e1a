"""Run the gateway process: load the model's codec, connect to the tracker, serve HTTP.

Work records not yet acknowledged live in an outbox under the data directory: those an
earlier process left are replayed before serving, and on SIGTERM/SIGINT the server stops,
in-flight requests finish within the grace period, and queued records get a last chance to
reach the tracker before the process exits (the rest wait in the outbox).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from functools import partial
from pathlib import Path

from meshnet.artifact.describe import describe_model
from meshnet.client.outbox import WorkOutbox
from meshnet.client.route_driver import RouteDriver
from meshnet.client.shard_stream import ChannelPool
from meshnet.client.swarm import SwarmClient, SwarmConfig
from meshnet.client.tracker_client import TrackerClient
from meshnet.engine.tokenizer import Tokenizer
from meshnet.gateway.app import create_app
from meshnet.gateway.config import GatewayProcessConfig
from meshnet.gateway.server import GatewayServer
from meshnet.gateway.swarm_adapter import SwarmGenerator

log = logging.getLogger(__name__)


def outbox_path(data_dir: Path) -> Path:
    return data_dir / "gateway" / "outbox.sqlite3"


async def run_gateway(config: GatewayProcessConfig, *, on_ready: Callable[[str, str], None] | None = None) -> None:
    description = describe_model(config.model)
    name = config.model_name or description.name
    template = None if config.chat_template is None else config.chat_template.read_text()
    tokenizer = await asyncio.to_thread(partial(Tokenizer, description, chat_template=template))
    outbox = WorkOutbox(outbox_path(config.data_dir))
    tracker = TrackerClient(config.tracker)
    pool = ChannelPool(config.max_frame_bytes)
    driver = RouteDriver(pool, max_frame_bytes=config.max_frame_bytes)
    swarm = SwarmClient(tracker, pool, driver, SwarmConfig(), outbox=outbox)
    generator = SwarmGenerator(swarm, {name: tokenizer}, {name: description})
    app = create_app(generator, {name: tokenizer}, config.http, view=generator)
    server = GatewayServer(
        app,
        config.http.host,
        config.http.port,
        shutdown_grace_seconds=config.http.shutdown_grace_seconds,
        handle_signals=True,
    )
    try:
        swarm.reports.replay()
        port = await server.start()
        log.info("gateway serving %s on http://%s:%d", name, config.http.host, port)
        if on_ready is not None:
            on_ready(f"{config.http.host}:{port}", name)
        await server.wait()
    finally:
        await server.stop()
        await swarm.drain_reports()
        await tracker.close()
        await pool.close()
        outbox.close()
