"""Run the gateway process: load the model's codec (from a local GGUF, or the tokenizer artifact
fetched by model id), connect to the tracker, serve HTTP.

Work records not yet acknowledged live in an outbox under the data directory (its depth and
age are on ``/metrics``): those an earlier process left are replayed before serving, and on
SIGTERM/SIGINT the server stops, in-flight requests finish within the grace period, and queued
records get a last chance to reach the tracker before the process exits (the rest wait in the
outbox).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from functools import partial
from pathlib import Path

from fastapi import FastAPI

from meshnet.artifact.describe import ModelDescription, describe_model
from meshnet.artifact.model_id import served_model_id
from meshnet.core.errors import InvalidArgument
from meshnet.engine.tokenizer import Tokenizer
from meshnet.fetch.fetcher import ManifestWanted
from meshnet.fetch.tokenizer import fetch_tokenizer
from meshnet.gateway.app import create_app, new_admission
from meshnet.gateway.config import GatewayProcessConfig
from meshnet.gateway.keys import ApiKeyStore, store_path
from meshnet.gateway.server import GatewayServer
from meshnet.gateway.swarm_adapter import SwarmGenerator
from meshnet.membership.join import renew_forever
from meshnet.membership.tracker_client import TrackerClient
from meshnet.route.audit import AuditConfig, Auditor
from meshnet.route.driver import RouteDriver
from meshnet.route.outbox import WorkOutbox
from meshnet.route.shard_stream import ChannelPool
from meshnet.route.swarm import SwarmClient, SwarmConfig
from meshnet.route.work_reports import ReportPolicy
from meshnet.wire.tls import LinkSecurity

log = logging.getLogger(__name__)


def outbox_path(data_dir: Path) -> Path:
    return data_dir / "gateway" / "outbox.sqlite3"


def _http_server(app: FastAPI, config: GatewayProcessConfig) -> GatewayServer:
    http = config.http
    return GatewayServer(
        app,
        http.host,
        http.port,
        shutdown_grace_seconds=http.shutdown_grace_seconds,
        handle_signals=True,
        tls_cert=http.tls_cert,
        tls_key=http.tls_key,
    )


async def _served_model(config: GatewayProcessConfig, security: LinkSecurity | None) -> tuple[ModelDescription, str]:
    """The file the tokenizer loads from and the model's served name: a local ``--model``, or
    the verified tokenizer artifact of ``--model-id`` (no weights), named as it was published."""
    if config.model is not None:
        description = await asyncio.to_thread(describe_model, config.model)
        return description, served_model_id(description.path, config.model_name)  # a set: its first part
    if config.model_id is None:
        raise InvalidArgument("the gateway needs --model or --model-id")
    wanted = ManifestWanted(config.model_id, config.data_dir, config.trust_publisher)
    fetched = await fetch_tokenizer(wanted, config.tracker, security)
    log.info("tokenizer of %s: %s (%d bytes fetched)", config.model_id, fetched.path, fetched.fetched_bytes)
    description = await asyncio.to_thread(describe_model, fetched.path)
    return description, served_model_id(fetched.path, config.model_name or fetched.manifest.model_id)


async def run_gateway(
    config: GatewayProcessConfig,
    *,
    on_ready: Callable[[str, str], None] | None = None,
    security: LinkSecurity | None = None,
) -> None:
    description, name = await _served_model(config, security)
    template = None if config.chat_template is None else config.chat_template.read_text()
    tokenizer = await asyncio.to_thread(partial(Tokenizer, description, chat_template=template))
    outbox = WorkOutbox(outbox_path(config.data_dir))
    tracker = TrackerClient(config.tracker, security=security, order=config.tracker_order)
    pool = ChannelPool(config.max_frame_bytes, security)
    driver = RouteDriver(pool, max_frame_bytes=config.max_frame_bytes)
    admission = new_admission(config.http)
    audit_config = AuditConfig(fraction=config.audit_fraction, queue_limit=config.audit_queue)
    auditor = Auditor(tracker, driver, audit_config, slot=admission.spare_slot)
    reports = ReportPolicy(outbox_limit=config.outbox_limit)
    swarm_config = SwarmConfig(reports=reports, warm_turns=config.warm_turns)
    swarm = SwarmClient(tracker, pool, driver, swarm_config, outbox=outbox, auditor=auditor)
    generator = SwarmGenerator(swarm, {name: tokenizer}, {name: description})
    keys = None if config.allow_anonymous else ApiKeyStore(store_path(config.data_dir))
    if keys is None:
        log.warning("serving /v1 WITHOUT API keys (--allow-anonymous)")
    app = create_app(
        generator,
        {name: tokenizer},
        config.http,
        api_keys=keys,
        extra_figures=lambda: {
            **{f"audits_{kind}_total": float(count) for kind, count in auditor.counts.items()},
            **swarm.reports.figures(),
        },
        view=generator,
        admission=admission,
    )
    server = _http_server(app, config)
    stop_renewing = asyncio.Event()
    renewal = None if security is None else asyncio.create_task(renew_forever(tracker, security, stop_renewing))
    try:
        swarm.reports.replay()
        auditor.start()
        port = await server.start()
        scheme = "http" if config.http.tls_cert is None else "https"
        log.info("gateway serving %s on %s://%s:%d", name, scheme, config.http.host, port)
        if on_ready is not None:
            on_ready(f"{scheme}://{config.http.host}:{port}", name)
        await server.wait()
    finally:
        stop_renewing.set()
        if renewal is not None:
            await renewal
        await server.stop()
        await auditor.stop()
        await swarm.drain_reports()
        await tracker.close()
        await pool.close()
        outbox.close()
