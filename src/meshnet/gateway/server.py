"""Running the gateway app under uvicorn, programmatically, with graceful shutdown.

``GatewayServer`` binds its own socket so port 0 works and the bound port is known (tests,
ephemeral deployments); ``serve_gateway`` runs until SIGINT/SIGTERM or task cancellation and
lets in-flight requests finish within the grace period before closing connections.

Signals are ours, not uvicorn's: uvicorn re-raises a captured SIGTERM once ``serve()`` returns,
which kills the process before the caller's shutdown path (flushing work records) can run.
With ``handle_signals`` the server only stops on a signal, and ``wait`` returns normally.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from meshnet.core.errors import Unavailable

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Server(uvicorn.Server):
    """uvicorn without its signal capture (see the module docstring)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class GatewayServer:
    """One uvicorn server for one app, started and stopped explicitly."""

    def __init__(
        self,
        app: FastAPI,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        *,
        shutdown_grace_seconds: float = 10.0,
        handle_signals: bool = False,
        tls_cert: Path | None = None,
        tls_key: Path | None = None,
    ) -> None:
        self._handle_signals = handle_signals
        self._grammars = getattr(app.state, "grammars", None)
        """The app's grammar child (``gateway.grammars``), stopped with the server."""
        self._config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            lifespan="off",
            timeout_graceful_shutdown=max(1, round(shutdown_grace_seconds)),
            ssl_certfile=None if tls_cert is None else str(tls_cert),
            ssl_keyfile=None if tls_key is None else str(tls_key),
        )
        if tls_cert is not None:
            self._config.load()  # reads the certificate now: a bad file fails here, not per connection
        self._server = _Server(self._config)
        self._task: asyncio.Task[None] | None = None
        self._socket: socket.socket | None = None

    @property
    def port(self) -> int:
        if self._socket is None:
            raise Unavailable("the gateway server is not started")
        return int(self._socket.getsockname()[1])

    async def start(self) -> int:
        """Bind, start serving, and return the bound port once the server accepts connections."""
        family = socket.AF_INET6 if ":" in self._config.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self._config.host, self._config.port))
        self._socket = sock
        if self._handle_signals:
            loop = asyncio.get_running_loop()
            for sig in STOP_SIGNALS:
                loop.add_signal_handler(sig, self._on_signal)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        try:
            while not self._server.started:
                if self._task.done():
                    self._task.result()  # re-raises the startup error
                    raise Unavailable("the gateway server exited during startup")
                await asyncio.sleep(0.005)
        except BaseException:
            # Cancelled or failed mid-startup: the socket may already be serving, so stop it.
            await asyncio.shield(self.stop())
            raise
        return self.port

    def _on_signal(self) -> None:
        # A second signal while stopping skips the grace period, as uvicorn's own handler does.
        if self._server.should_exit:
            self._server.force_exit = True
        self._server.should_exit = True

    async def wait(self) -> None:
        """Return when the server stops by itself (e.g. after SIGTERM)."""
        if self._task is not None:
            await asyncio.shield(self._task)

    async def stop(self) -> None:
        """Stop accepting, let in-flight requests finish within the grace period, then close."""
        task, self._task = self._task, None
        if task is None:
            return
        self._server.should_exit = True
        try:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        finally:
            if self._grammars is not None:
                await self._grammars.close()
            if self._socket is not None:
                self._socket.close()
            if self._handle_signals:
                for sig in STOP_SIGNALS:
                    asyncio.get_running_loop().remove_signal_handler(sig)


async def serve_gateway(
    app: FastAPI,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    *,
    shutdown_grace_seconds: float = 10.0,
) -> None:
    """Serve ``app`` until a signal or cancellation, then shut down gracefully."""
    server = GatewayServer(app, host, port, shutdown_grace_seconds=shutdown_grace_seconds, handle_signals=True)
    try:
        await server.start()
        await server.wait()
    finally:
        await asyncio.shield(server.stop())
