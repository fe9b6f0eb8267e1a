"""A userspace delay line for one node's inbound link (this kernel has no ``netem``).

Every byte that reaches the listening address is delivered to the target ``delay`` seconds
after it arrived, and every reply byte likewise: a connection through the line sees the link's
one-way delay in each direction. Bytes keep their order and are never held longer than the
delay, so the link's bandwidth stays what ``tbf`` makes it.

The lab starts it as ``python -m meshnet.deploy.lab.delay_line LISTEN_HOST:PORT TARGET_HOST:PORT
DELAY_MS`` (``delay_line_command`` writes that argv, ``main`` reads it), not as a ``meshnet``
subcommand: it is the lab's own link, not an operator's command, and one runs per node, so it
starts without the CLI's parser and imports nothing beyond asyncio and its ready line.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Sequence

from meshnet.deploy.launch.ready_lines import DelayLine, announce
from meshnet.process.lifeline import watch_lifeline

CHUNK = 64 * 1024
MODULE = "meshnet.deploy.lab.delay_line"


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Copy reader to writer, each chunk released ``delay`` after it was read."""
    line: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def release() -> None:
        while True:
            due, data = await line.get()
            if not data:
                break
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()

    releaser = asyncio.create_task(release())
    try:
        while data := await reader.read(CHUNK):
            line.put_nowait((time.monotonic() + delay, data))
    except (ConnectionError, OSError):
        pass
    finally:
        line.put_nowait((0.0, b""))
        with contextlib.suppress(ConnectionError, OSError):
            await releaser
        with contextlib.suppress(ConnectionError, OSError, RuntimeError):
            writer.write_eof()


async def _connection(
    client_reader: asyncio.StreamReader,
    client_writer: asyncio.StreamWriter,
    target: tuple[str, int],
    delay: float,
) -> None:
    try:
        target_reader, target_writer = await asyncio.open_connection(*target)
    except OSError:
        client_writer.close()
        return
    try:
        await asyncio.gather(
            _pump(client_reader, target_writer, delay),
            _pump(target_reader, client_writer, delay),
        )
    finally:
        for writer in (client_writer, target_writer):
            writer.close()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def serve(listen: tuple[str, int], target: tuple[str, int], delay_ms: float) -> None:
    delay = delay_ms / 1000.0

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _connection(reader, writer, target, delay)

    server = await asyncio.start_server(accept, *listen)
    announce(DelayLine(f"{listen[0]}:{listen[1]}", f"{target[0]}:{target[1]}", delay_ms))
    async with server:
        await server.serve_forever()


def delay_line_command(listen: str, target: str, delay_ms: float) -> tuple[str, ...]:
    """The argv that runs a delay line from ``listen`` (host:port) to ``target`` with ``delay_ms``."""
    return (sys.executable, "-m", MODULE, listen, target, f"{delay_ms:g}")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 3:
        print(f"usage: python -m {MODULE} LISTEN_HOST:PORT TARGET_HOST:PORT DELAY_MS", file=sys.stderr)
        return 2
    watch_lifeline(os.environ)  # the delay line is the lab's link: it ends with the lab
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(_address(args[0]), _address(args[1]), float(args[2])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
