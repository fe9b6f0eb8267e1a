"""Pure decisions of the lab: names, a free subnet, addresses, link shaping parameters.

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
class LabNode:
    index: int
    namespace: str
    host_link: str
    """The veth end left in the host namespace, enslaved to the bridge."""
    address: str
    cpu: int
    memory_mb: int | None
    spare: bool


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
        return tuple(node for node in self.nodes if not node.spare)

    def spares(self) -> tuple[LabNode, ...]:
        return tuple(node for node in self.nodes if node.spare)


def choose_subnet(used: Iterable[ipaddress.IPv4Network]) -> ipaddress.IPv4Network:
    """The first /24 of the lab's supernet that overlaps no network the host already uses."""
    taken = list(used)
    for candidate in CANDIDATE_SUPERNET.subnets(new_prefix=24):
        if not any(candidate.overlaps(network) for network in taken):
            return candidate
    raise InvalidArgument(f"every /24 of {CANDIDATE_SUPERNET} is in use on this host; the lab needs one free")


def plan_lab(
    tag: str,
    nodes: int,
    spares: int,
    used_networks: Iterable[ipaddress.IPv4Network],
    *,
    link: LinkShape,
    memory_mb: int | None,
    cpus: int,
) -> LabPlan:
    check_tag(tag)
    if nodes < 1 or spares < 0 or nodes + spares > 200:
        raise InvalidArgument(f"a lab needs 1..200 nodes in all, not {nodes} + {spares} spare")
    if cpus < 1:
        raise InvalidArgument("a lab needs at least one CPU to pin nodes to")
    subnet = choose_subnet(used_networks)
    hosts = list(subnet.hosts())
    members = tuple(
        LabNode(
            index=index,
            namespace=f"{PREFIX}-{tag}-n{index}",
            host_link=f"{PREFIX}{tag}h{index}",
            address=str(hosts[FIRST_NODE_HOST + index - 1]),
            cpu=index % cpus,
            memory_mb=memory_mb,
            spare=index >= nodes,
        )
        for index in range(nodes + spares)
    )
    return LabPlan(
        tag=tag,
        bridge=f"{PREFIX}{tag}br",
        subnet=subnet,
        bridge_address=str(hosts[0]),
        nodes=members,
        link=link,
    )
