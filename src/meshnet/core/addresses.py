"""Network addresses given by users: checked once, refused with one sentence that says why."""

from __future__ import annotations

import ipaddress

from meshnet.core.errors import FailedPrecondition, InvalidArgument


def check_advertise_address(address: str, *, flag: str = "advertise") -> None:
    """Refuse an address peers could not dial: it needs a routable host and a port in 1-65535.

    ``0.0.0.0`` (or ``::``) is a bind-everything wildcard, not an address anyone can connect to,
    and a missing or zero port would make every peer's first hop fail much later and less clearly.
    """
    host, separator, port_text = address.strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not separator or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise InvalidArgument(f"{flag} {address!r} must be host:port with a port from 1 to 65535")
    if not host:
        raise InvalidArgument(f"{flag} {address!r} has no host: give the name or IP peers reach this worker at")
    try:
        unspecified = ipaddress.ip_address(host).is_unspecified
    except ValueError:
        unspecified = False  # a host name: resolvable only at dial time
    if unspecified:
        raise InvalidArgument(f"{flag} {address!r} is a wildcard, not routable: give the IP or name peers reach")


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and every 127.0.0.0/8 or ::1 address; a name or wildcard is not."""
    host = host.strip().removeprefix("[").removesuffix("]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def require_loopback(addresses: tuple[str, ...], *, flag: str = "--insecure") -> None:
    """Refuse plaintext anywhere something off this machine could reach it or be reached."""
    for address in addresses:
        host = address.rpartition(":")[0] if ":" in address else address
        if not is_loopback_host(host):
            raise FailedPrecondition(
                f"{flag} is for loopback development only, and {address} is not loopback: "
                "run `meshnet swarm init` and join nodes with `meshnet swarm invite` tokens instead"
            )
