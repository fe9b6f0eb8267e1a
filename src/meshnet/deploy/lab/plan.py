"""Pure decisions of the lab: names, a free subnet, addresses, link shaping parameters, and
which nodes sit behind a NAT router of their own.

Everything here is computed from values passed in (the host's networks, the node count), so it
is tested without root; ``system.py`` carries the plan out.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

from meshnet.core.errors import InvalidArgument

PREFIX = "mnlab"
"""Every namespace, link and cgroup the lab makes starts with this, so cleanup finds them all."""
CANDIDATE_SUPERNET = ipaddress.IPv4Network("10.213.0.0/16")
FIRST_NODE_HOST = 10
SWEEP_DELAYS_MS = (0.0, 1.0, 5.0, 20.0)
"""The network sweep's one-way delays (``sweep.py``, ``relay_sweep.py``)."""
SWEEP_RATES_MBIT = (100.0, 1000.0)
"""The network sweep's link rates."""
HOME_SUPERNET = ipaddress.IPv4Network("192.168.0.0/16")
"""Where private nodes' home networks come from: 192.168.<node index>.0/24, router .1, node .2.
They exist only inside a router's and its node's namespaces (as every home's 192.168.x does), so
they never clash with the host; the lab's own subnet (10.213.x) never overlaps them."""

_TAG_TEXT = "[A-Za-z0-9]{1,6}"
"""ASCII only: a tag goes into interface names, lock file names and the cleanup patterns below."""
_TAG = re.compile(_TAG_TEXT)
_DASHED = re.compile(rf"^{PREFIX}-({_TAG_TEXT})(?:-|$)")
"""Namespaces (``mnlab-<tag>-n<i>``) and cgroups (``mnlab-<tag>``)."""
_LINK = re.compile(rf"^{PREFIX}({_TAG_TEXT}?)(?:br|h[0-9]+)$")
"""Bridges (``mnlab<tag>br``) and host veth ends (``mnlab<tag>h<i>``); the suffix is all
``br`` or all ``h`` + digits, so exactly one split of a name parses."""


def is_tag(text: str) -> bool:
    return _TAG.fullmatch(text) is not None


def check_tag(tag: str) -> str:
    """``tag`` if it may name a lab, else InvalidArgument (checked before anything uses it)."""
    if not is_tag(tag):
        raise InvalidArgument(f"lab tag {tag!r} must be 1-6 ASCII letters or digits (it goes into interface names)")
    return tag


def object_tag(name: str) -> str | None:
    """The tag of the lab that made the namespace, link or cgroup ``name``; None if no lab did.

    Cleanup matches whole tags, never prefixes: removing lab ``a`` must not touch lab ``ab``."""
    match = _DASHED.match(name) or _LINK.match(name)
    return match.group(1) if match else None


@dataclass(frozen=True)
class LinkShape:
    """What one node's link does to traffic: a one-way delay and a rate cap per direction."""

    delay_ms: float = 0.0
    rate_mbit: float | None = None

    def tbf_arguments(self) -> list[str]:
        """``tc qdisc ... tbf`` arguments; the burst must hold at least one timer tick of data."""
        if self.rate_mbit is None:
            return []
        rate_bytes = self.rate_mbit * 1e6 / 8
        burst = max(int(rate_bytes / 250), 16 * 1024)
        return ["rate", f"{self.rate_mbit:g}mbit", "burst", str(burst), "latency", "100ms"]


@dataclass(frozen=True)
class NatRouter:
    """A private node's home router: a namespace with one leg on the lab's bridge (the node's
    public address) and one on the node's home network; it masquerades what the node sends and
    forwards nothing inbound (no port forwarding), as a home router or carrier NAT does."""

    namespace: str
    public_address: str
    """The router's address on the bridge: what every other node sees the private node as."""
    home_network: ipaddress.IPv4Network
    home_address: str
    """The router's address on the home network: the private node's default gateway."""


@dataclass(frozen=True)
class LabNode:
    index: int
    namespace: str
    host_link: str
    """The veth end left in the host namespace, enslaved to the bridge (a private node's: its router's)."""
    address: str
    """Where the node's processes bind: on the bridge, or a private node's home network address."""
    cpu: int
    memory_mb: int | None
    spare: bool
    relay: bool = False
    """A public node that runs a ``meshnet relay`` instead of a worker."""
    router: NatRouter | None = None
    """Set for a private node: it sits behind this router, and nothing can dial it."""

    @property
    def private(self) -> bool:
        return self.router is not None


@dataclass(frozen=True)
class LabPlan:
    tag: str
    bridge: str
    subnet: ipaddress.IPv4Network
    bridge_address: str
    nodes: tuple[LabNode, ...]
    link: LinkShape

    @property
    def cgroup(self) -> str:
        return f"{PREFIX}-{self.tag}"

    def serving(self) -> tuple[LabNode, ...]:
        return tuple(node for node in self.nodes if not node.spare and not node.relay)

    def spares(self) -> tuple[LabNode, ...]:
        return tuple(node for node in self.nodes if node.spare)

    def workers(self) -> tuple[LabNode, ...]:
        """Every node that runs a worker: the serving nodes, then the spares."""
        return self.serving() + self.spares()

    def relays(self) -> tuple[LabNode, ...]:
        return tuple(node for node in self.nodes if node.relay)

    def private(self) -> tuple[LabNode, ...]:
        return tuple(node for node in self.nodes if node.private)


def choose_subnet(used: Iterable[ipaddress.IPv4Network]) -> ipaddress.IPv4Network:
    """The first /24 of the lab's supernet that overlaps no network the host already uses."""
    taken = list(used)
    for candidate in CANDIDATE_SUPERNET.subnets(new_prefix=24):
        if not any(candidate.overlaps(network) for network in taken):
            return candidate
    raise InvalidArgument(f"every /24 of {CANDIDATE_SUPERNET} is in use on this host; the lab needs one free")


def private_nodes(nodes: int, private: int) -> list[int]:
    """The serving nodes put behind a NAT: the middle ones first (with 3 nodes, node 1), never
    node 0, which runs the tracker and the gateway everyone must reach."""
    if private < 0 or private > nodes - 1:
        raise InvalidArgument(
            f"--private must be 0..{nodes - 1} with {nodes} node(s) (node 0 runs the tracker), not {private}"
        )
    middle = (nodes - 1) / 2
    return sorted(range(1, nodes), key=lambda index: (abs(index - middle), index))[:private]


def nat_router(tag: str, index: int, public_address: str) -> NatRouter:
    home = list(HOME_SUPERNET.subnets(new_prefix=24))[index]
    return NatRouter(f"{PREFIX}-{tag}-r{index}", public_address, home, str(home.network_address + 1))


def plan_lab(
    tag: str,
    nodes: int,
    spares: int,
    used_networks: Iterable[ipaddress.IPv4Network],
    *,
    link: LinkShape,
    memory_mb: int | None,
    cpus: int,
    private: int = 0,
    relays: int = 0,
) -> LabPlan:
    """The lab's nodes: ``nodes`` serving, ``spares`` spare, then ``relays`` public relay nodes;
    ``private`` serving nodes each behind a NAT router of its own (``private_nodes``)."""
    check_tag(tag)
    if nodes < 1 or spares < 0 or relays < 0 or nodes + spares + relays > 200:
        raise InvalidArgument(f"a lab needs 1..200 nodes in all, not {nodes} + {spares} spare + {relays} relay")
    if private > 0 and relays < 1:
        raise InvalidArgument("private nodes are reachable only through a relay: give --relays 1 or more")
    if cpus < 1:
        raise InvalidArgument("a lab needs at least one CPU to pin nodes to")
    behind_nat = set(private_nodes(nodes, private))
    subnet = choose_subnet(used_networks)
    hosts = list(subnet.hosts())
    members = []
    for index in range(nodes + spares + relays):
        slot = str(hosts[FIRST_NODE_HOST + index - 1])
        router = nat_router(tag, index, slot) if index in behind_nat else None
        members.append(
            LabNode(
                index=index,
                namespace=f"{PREFIX}-{tag}-n{index}",
                host_link=f"{PREFIX}{tag}h{index}",
                address=slot if router is None else str(router.home_network.network_address + 2),
                cpu=index % cpus,
                memory_mb=memory_mb,
                spare=nodes <= index < nodes + spares,
                relay=index >= nodes + spares,
                router=router,
            )
        )
    return LabPlan(
        tag=tag,
        bridge=f"{PREFIX}{tag}br",
        subnet=subnet,
        bridge_address=str(hosts[0]),
        nodes=tuple(members),
        link=link,
    )
