"""Carry a lab plan out with the kernel's own isolation (``ip``, ``tc``, ``iptables`` for the
NAT routers of private nodes), and undo it.

Every object made is named with the lab prefix, so ``remove_leftovers`` finds what an earlier
lab left behind even when the process that made it was SIGKILLed.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import shutil
import subprocess
from collections.abc import Sequence

from meshnet.core.errors import MeshnetError
from meshnet.deploy.lab.plan import PREFIX, LabNode, LabPlan, NatRouter, object_tag

log = logging.getLogger(__name__)


class LabUnavailable(MeshnetError):
    """This machine or user cannot make namespaces, links or cgroups."""

    code = "lab_unavailable"


def run(command: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(command), capture_output=True, text=True, timeout=30, check=False)
    if check and result.returncode != 0:
        raise LabUnavailable(f"`{' '.join(command)}` failed: {result.stderr.strip() or result.returncode}")
    return result


def check_privileges(private: bool = False) -> None:
    """Raise one clear sentence unless this process can build a lab (with NAT routers if ``private``)."""
    if os.geteuid() != 0:
        raise LabUnavailable("the lab needs root (network namespaces, veth links and cgroups)")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise LabUnavailable(f"the lab needs the `{tool}` command (Debian package iproute2)")
    if private and shutil.which("iptables") is None:
        raise LabUnavailable(
            "the lab's --private nodes sit behind NAT routers made with `iptables` (nf_tables), which is "
            "not installed: `make iptables` (or `apt-get install iptables`) installs it"
        )
    probe = f"{PREFIX}-probe-{os.getpid()}"
    made = run(["ip", "netns", "add", probe], check=False)
    if made.returncode != 0:
        raise LabUnavailable(f"this machine does not allow network namespaces: {made.stderr.strip()}")
    run(["ip", "netns", "del", probe], check=False)


def host_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network the host has an address or a route in."""
    networks: list[ipaddress.IPv4Network] = []
    for entry in json.loads(run(["ip", "-j", "-4", "addr"]).stdout or "[]"):
        for info in entry.get("addr_info", []):
            networks.append(ipaddress.IPv4Network(f"{info['local']}/{info['prefixlen']}", strict=False))
    for route in json.loads(run(["ip", "-j", "-4", "route"]).stdout or "[]"):
        destination = route.get("dst", "default")
        if destination != "default":
            networks.append(ipaddress.IPv4Network(destination if "/" in destination else f"{destination}/32"))
    return networks


def build_network(plan: LabPlan) -> None:
    """Bridge in the host namespace, one namespace per node joined to it by a shaped veth pair.

    Nodes get no default route: a node can reach the other nodes and nothing else.
    """
    prefix = plan.subnet.prefixlen
    run(["ip", "link", "add", plan.bridge, "type", "bridge"])
    run(["ip", "addr", "add", f"{plan.bridge_address}/{prefix}", "dev", plan.bridge])
    run(["ip", "link", "set", plan.bridge, "up"])
    for node in plan.nodes:
        _build_node(plan, node, prefix)


def _build_node(plan: LabPlan, node: LabNode, prefix: int) -> None:
    # A private node's slot on the bridge is its router's: the router gets the bridge leg.
    site = node.namespace if node.router is None else node.router.namespace
    address = node.address if node.router is None else node.router.public_address
    inside = f"{node.host_link}n"[:15]
    run(["ip", "netns", "add", node.namespace])
    if node.router is not None:
        run(["ip", "netns", "add", node.router.namespace])
    run(["ip", "link", "add", node.host_link, "type", "veth", "peer", "name", inside])
    run(["ip", "link", "set", inside, "netns", site])
    run(["ip", "link", "set", node.host_link, "master", plan.bridge])
    run(["ip", "link", "set", node.host_link, "up"])
    in_site = ["ip", "netns", "exec", site]
    run([*in_site, "ip", "link", "set", inside, "name", "eth0"])
    run([*in_site, "ip", "addr", "add", f"{address}/{prefix}", "dev", "eth0"])
    run([*in_site, "ip", "link", "set", "eth0", "up"])
    run([*in_site, "ip", "link", "set", "lo", "up"])
    shape = plan.link.tbf_arguments()
    if shape:
        # Both directions: the host end shapes what reaches the site, the site's end what it sends.
        run(["tc", "qdisc", "add", "dev", node.host_link, "root", "tbf", *shape])
        run([*in_site, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", *shape])
    if node.router is not None:
        _build_home(node, node.router)


def _build_home(node: LabNode, router: NatRouter) -> None:
    """The private node's home network: a veth from the router (``lan0``) to the node (``eth0``),
    the node's default route via the router, and the router masquerading what leaves on its
    bridge leg. Nothing is forwarded inbound: no DNAT, no route to the home network on the
    bridge, so a connection to the node can only be one the node opened."""
    home = router.home_network.prefixlen
    in_router = ["ip", "netns", "exec", router.namespace]
    in_node = ["ip", "netns", "exec", node.namespace]
    run([*in_router, "ip", "link", "add", "lan0", "type", "veth", "peer", "name", "eth0", "netns", node.namespace])
    run([*in_router, "ip", "addr", "add", f"{router.home_address}/{home}", "dev", "lan0"])
    run([*in_router, "ip", "link", "set", "lan0", "up"])
    run([*in_node, "ip", "addr", "add", f"{node.address}/{home}", "dev", "eth0"])
    run([*in_node, "ip", "link", "set", "eth0", "up"])
    run([*in_node, "ip", "link", "set", "lo", "up"])
    run([*in_node, "ip", "route", "add", "default", "via", router.home_address])
    run([*in_router, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])
    # The rules live in the router's namespace and go with it (``remove_leftovers``).
    run([*in_router, "iptables", "-t", "nat", "-A", "POSTROUTING", "-o", "eth0", "-j", "MASQUERADE"])
    run([*in_router, "iptables", "-P", "FORWARD", "DROP"])
    run([*in_router, "iptables", "-A", "FORWARD", "-i", "lan0", "-o", "eth0", "-j", "ACCEPT"])
    established = ["-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"]
    run([*in_router, "iptables", "-A", "FORWARD", "-i", "eth0", "-o", "lan0", *established])


def set_link(node: LabNode, up: bool) -> None:
    """Take a node's link down (or back up) without touching its processes."""
    run(["ip", "link", "set", node.host_link, "up" if up else "down"])


def namespace_pids(namespace: str) -> list[int]:
    found = run(["ip", "netns", "pids", namespace], check=False)
    return [int(pid) for pid in found.stdout.split() if pid.isdigit()]


def _namespaces() -> list[str]:
    return [line.split()[0] for line in run(["ip", "netns", "list"], check=False).stdout.splitlines() if line.strip()]


def _links() -> list[str]:
    return [entry.get("ifname", "") for entry in json.loads(run(["ip", "-j", "link"], check=False).stdout or "[]")]


def object_tags() -> frozenset[str]:
    """The tags of every lab that has a namespace or a link on this host now."""
    return frozenset(tag for tag in map(object_tag, _namespaces() + _links()) if tag is not None)


def remove_leftovers(tag: str) -> list[str]:
    """Remove the namespaces and links of lab ``tag`` (whole-tag matches only); return what was removed."""
    removed: list[str] = []
    for name in _namespaces():
        if object_tag(name) == tag:
            for pid in namespace_pids(name):
                kill_pid(pid)
            run(["ip", "netns", "del", name], check=False)
            removed.append(f"namespace {name}")
    for name in _links():
        if object_tag(name) == tag:
            run(["ip", "link", "del", name], check=False)
            removed.append(f"link {name}")
    return removed


def kill_pid(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, 9)
