"""Fixed ports checked before anything starts, so a busy one fails at once and says so."""

from __future__ import annotations

import contextlib
import errno
import socket
from typing import ClassVar

from meshnet.core.errors import MeshnetError


class PortInUse(MeshnetError):
    """A port a component must listen on is already taken."""

    code: ClassVar[str] = "port_in_use"


def ensure_port_free(host: str, port: int, what: str) -> None:
    """Raise ``PortInUse`` if ``host:port`` cannot be bound now (port 0 is always free).

    SO_REUSEADDR as the servers set it: a port left in TIME_WAIT by a stopped server counts as
    free, a listening one does not.
    """
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with contextlib.closing(socket.socket(family, socket.SOCK_STREAM)) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            if error.errno in (errno.EADDRINUSE, errno.EACCES):
                raise PortInUse(f"{what} port {host}:{port} is already in use ({error.strerror})") from None
            raise
