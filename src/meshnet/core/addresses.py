"""Network addresses given by users: checked once, refused with one sentence that says why."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from meshnet.core.errors import FailedPrecondition, InvalidArgument
from meshnet.core.ids import NodeId, check_node_id

RELAYED_SEPARATOR = "@"
"""``NODE@RELAY_HOST:PORT``: a node behind NAT, reached through the relay it keeps a link to."""


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


ADDRESS_LIST_SEPARATOR = ","
"""``--tracker a:7070,b:7070``: replicas of one service."""

TrackerOrder = Literal["spread", "listed"]
"""The order a client asks a tracker's replicas in: ``spread``, its own order ranked by its id
(``membership.replicas.replica_order``: a swarm's clients spread over the replicas), or
``listed``, the order given (first listed first: trackers that share no store, tests)."""


def parse_address_list(text: str, *, flag: str = "--tracker") -> tuple[str, ...]:
    """The ``host:port`` addresses of a comma-separated list, in order (one address is a list of one).

    ``InvalidArgument`` for an empty list or entry, an entry that is not host:port with a port
    from 1 to 65535, or an address given twice (a client would count one replica twice)."""
    addresses = tuple(part.strip() for part in text.split(ADDRESS_LIST_SEPARATOR))
    for address in addresses:
        host, separator, port_text = address.rpartition(":")
        if not (host.strip("[]") and separator and port_text.isdigit() and 1 <= int(port_text) <= 65535):
            raise InvalidArgument(
                f"{flag} {text!r}: every entry must be host:port with a port from 1 to 65535 (host:port,host:port...)"
            )
    repeated = sorted({address for address in addresses if addresses.count(address) > 1})
    if repeated:
        raise InvalidArgument(f"{flag} {text!r} names {', '.join(repeated)} more than once")
    return addresses


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
    # A flag may hold a list (``--tracker a:7070,b:7070``): every entry must be local.
    for address in (part.strip() for text in addresses for part in text.split(ADDRESS_LIST_SEPARATOR)):
        host = address.rpartition(":")[0] if ":" in address else address
        if not is_loopback_host(host):
            raise FailedPrecondition(
                f"{flag} is for loopback development only, and {address} is not loopback: "
                "run `meshnet swarm init` and join nodes with `meshnet swarm invite` tokens instead"
            )


DEFAULT_ROUTE_PROBE = {socket.AF_INET: "203.0.113.1", socket.AF_INET6: "2001:db8::1"}
"""Documentation addresses (RFC 5737, RFC 3849): off every LAN, so the route to them is the default one."""


def is_unspecified_host(host: str) -> bool:
    """True for a bind-everything wildcard (``0.0.0.0``, ``::``, or no host at all)."""
    host = host.strip().removeprefix("[").removesuffix("]")
    if not host:
        return True
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False  # a host name


def route_source_host(target: str, family: int) -> str:
    """The address of this machine's interface that routes toward ``target`` (an IP or a name).

    Connecting a UDP socket sends nothing: it only makes the kernel choose the route and so the
    source address, which is what peers on that route can dial back. Raises ``OSError`` when no
    route leads there."""
    infos = socket.getaddrinfo(target, 9, family, socket.SOCK_DGRAM)
    with socket.socket(infos[0][0], socket.SOCK_DGRAM) as probe:
        probe.connect(infos[0][4])
        return str(probe.getsockname()[0])


def dialable_address(
    bound: str,
    *,
    toward: str | None = None,
    flag: str = "--advertise",
    source_of: Callable[[str, int], str] = route_source_host,
) -> str:
    """``bound`` itself when its host can be dialled; for a wildcard bind, the same port on the
    address of the interface that routes toward ``toward`` (a ``host:port``, e.g. the tracker;
    of a list, its first), or toward the default route when there is none.

    A wildcard is where to listen, never where to connect: an invite or a registration carrying
    ``0.0.0.0`` sends every peer to its own machine. When no route gives an address, refuse with
    the fix (``flag HOST:PORT``) rather than hand out one nobody can reach."""
    host, _, port = bound.rpartition(":")
    if not is_unspecified_host(host):
        return bound
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    target = DEFAULT_ROUTE_PROBE[family] if toward is None else _first(toward).rpartition(":")[0].strip("[]")
    # ``::`` listens on IPv4 too (dual stack), so an IPv4 tracker is reached over IPv4 from it.
    asked = socket.AF_UNSPEC if family == socket.AF_INET6 and toward is not None else family
    try:
        derived = source_of(target, asked)
    except OSError as error:
        derived, reason = "", f"no route to {target} gives this machine an address ({error})"
    else:
        reason = f"the route to {target} leaves from a wildcard"
    if not derived or is_unspecified_host(derived):
        raise FailedPrecondition(
            f"{bound} binds every interface but is no address peers can dial, and {reason}: "
            f"give {flag} HOST:PORT with the name or IP peers reach this machine at"
        )
    return f"[{derived}]:{port}" if ":" in derived else f"{derived}:{port}"


def _first(addresses: str) -> str:
    return addresses.split(ADDRESS_LIST_SEPARATOR)[0].strip()


@dataclass(frozen=True)
class RelayedAddress:
    """Where a private node (behind NAT, nothing can dial in) is reached: through ``relay``.

    Written ``NODE@RELAY_HOST:PORT`` wherever an address goes (records, routes, status), so every
    reader that only passes addresses on keeps working; a dialer that meets one opens its channel
    through the relay (``meshnet.relay``) and pins ``node_id``'s TLS name end to end."""

    node_id: NodeId
    relay: str
    """The relay's own ``host:port``, as the relay advertises it."""

    def __post_init__(self) -> None:
        check_node_id(self.node_id)
        check_advertise_address(self.relay, flag="the relay address")

    def __str__(self) -> str:
        return f"{self.node_id}{RELAYED_SEPARATOR}{self.relay}"


def parse_relayed(address: str) -> RelayedAddress | None:
    """The relayed address ``address`` spells, or None for a direct ``host:port``.

    ``InvalidArgument`` when it has the separator but is not ``NODE@HOST:PORT``."""
    node, separator, relay = address.strip().partition(RELAYED_SEPARATOR)
    if not separator:
        return None
    try:
        return RelayedAddress(check_node_id(node), relay)
    except InvalidArgument as error:
        raise InvalidArgument(f"relayed address {address!r} must be NODE_ID@RELAY_HOST:PORT: {error.message}") from None


def is_relayed(address: str) -> bool:
    """True for ``NODE@RELAY_HOST:PORT`` (checked), False for a direct ``host:port``."""
    return parse_relayed(address) is not None
