"""The lab's delay line (``deploy.lab.delay_line``): a real process in front of a real TCP echo
server on loopback. Every byte arrives intact and in order, never earlier than the line's delay
in each direction; its ready line is the delay line's own (the word "relay" is the NAT relay's)."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

from meshnet.deploy.lab.delay_line import delay_line_command
from meshnet.deploy.launch.ready_lines import DelayLine
from meshnet.process.launcher import ChildProcess, LaunchSpec

DELAY_MS = 60.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _echo_server() -> tuple[socket.socket, int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def serve() -> None:
        connection, _ = server.accept()
        with connection:
            while data := connection.recv(65536):
                connection.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    return server, int(server.getsockname()[1])


def test_the_delay_line_delays_each_direction_and_keeps_every_byte(tmp_path: Path) -> None:
    server, target_port = _echo_server()
    listen = f"127.0.0.1:{_free_port()}"
    command = delay_line_command(listen, f"127.0.0.1:{target_port}", DELAY_MS)
    line = ChildProcess(LaunchSpec("delay", command, tmp_path / "delay.log", DelayLine.PREFIX))
    try:
        ready = DelayLine.read(line.await_ready(time.monotonic() + 30))
        assert ready == DelayLine(listen, f"127.0.0.1:{target_port}", DELAY_MS)
        payload = bytes(range(256)) * 1024
        host, _, port = listen.rpartition(":")
        with socket.create_connection((host, int(port)), timeout=10) as client:
            sent = time.monotonic()
            client.sendall(payload)
            echoed = b""
            while len(echoed) < len(payload):
                chunk = client.recv(65536)
                assert chunk, "the delay line closed the connection early"
                if not echoed:
                    first = time.monotonic() - sent
                echoed += chunk
        assert echoed == payload
        # Out through the line and back through it: two one-way delays at least (a lower bound).
        assert first >= 2 * DELAY_MS / 1000
    finally:
        line.stop()
        server.close()
