"""The lab's home routers for real: ``lab up --private`` puts a node behind a NAT router namespace
of its own (iptables MASQUERADE, nf_tables). Real namespaces and real TCP: the private node's
outbound connection reaches a public node, which sees the router's address; nothing dials the
private node, neither at its home address nor at its router's; teardown removes the routers and
their rules. The swarm through a relay is ``test_lab_relay.py``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from meshnet.deploy.lab import cgroups
from meshnet.deploy.lab.lab import Lab, LabConfig
from meshnet.deploy.lab.plan import PREFIX
from meshnet.deploy.lab.system import LabUnavailable, check_privileges, run
from meshnet.process.launcher import meshnet_command

TAG = "t33n"
PORT = 9700


def _lab_allowed() -> str | None:
    try:
        check_privileges(private=True)
        cgroups.detect_layout()
    except LabUnavailable as error:
        return error.message
    return None


needs_nat_lab = pytest.mark.skipif(_lab_allowed() is not None, reason=f"no NAT lab here: {_lab_allowed()}")

LISTEN = """
import socket, sys
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind((sys.argv[1], int(sys.argv[2])))
server.listen()
print("listening", flush=True)
server.settimeout(float(sys.argv[3]))
try:
    connection, peer = server.accept()
    print("peer", peer[0], flush=True)
except TimeoutError:
    print("nobody", flush=True)
"""

DIAL = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()
    print("connected")
except OSError as error:
    print("refused", type(error).__name__, error)
"""


def _listen(namespace: str, host: str, timeout_s: float) -> subprocess.Popen[str]:
    command = ["ip", "netns", "exec", namespace, sys.executable, "-c", LISTEN, host, str(PORT), str(timeout_s)]
    listener = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    if listener.stdout is None or listener.stdout.readline().strip() != "listening":
        listener.kill()
        raise AssertionError(f"the listener in {namespace} never listened")
    return listener


def _dial(namespace: str, host: str) -> str:
    command = ["ip", "netns", "exec", namespace, sys.executable, "-c", DIAL, host, str(PORT)]
    return subprocess.run(command, capture_output=True, text=True, timeout=30).stdout.strip()


def _heard(listener: subprocess.Popen[str]) -> str:
    out, _ = listener.communicate(timeout=30)
    return out.strip()


def _lab_names() -> list[str]:
    namespaces = [line.split()[0] for line in run(["ip", "netns", "list"]).stdout.splitlines() if line.strip()]
    links = run(["ip", "-o", "link"]).stdout
    found = [name for name in namespaces if name.startswith(f"{PREFIX}-{TAG}-")]
    found += [word.rstrip(":").split("@")[0] for word in links.split() if word.startswith(f"{PREFIX}{TAG}")]
    return found + [str(top) for top in cgroups.group_tops() if top.name == f"{PREFIX}-{TAG}"]


@needs_nat_lab
def test_a_private_node_dials_out_through_its_nat_and_nothing_dials_in(tmp_path: Path) -> None:
    host_nat_before = run(["iptables", "-t", "nat", "-S"]).stdout
    lab = Lab(LabConfig(model=tmp_path / "unused.gguf", data_dir=tmp_path, nodes=3, private=1, tag=TAG))
    try:
        plan = lab.build()
        head, middle, tail = plan.nodes[0], plan.nodes[1], plan.nodes[2]
        assert [node.index for node in plan.private()] == [1] and [n.index for n in plan.relays()] == [3]
        router = middle.router
        assert router is not None and not head.private and not tail.private and not plan.nodes[3].private
        # Out: the private node reaches a public node, which sees the router's address (MASQUERADE).
        listener = _listen(head.namespace, head.address, 10)
        assert _dial(middle.namespace, head.address) == "connected"
        assert _heard(listener) == f"peer {router.public_address}"
        # In: nothing reaches a listener on the private node, neither at its own (home) address,
        # to which no node has a route, nor at its router's public address (no port forwarding).
        listener = _listen(middle.namespace, "0.0.0.0", 8)
        at_home = _dial(tail.namespace, middle.address)
        at_router = _dial(tail.namespace, router.public_address)
        from_relay = _dial(plan.relays()[0].namespace, router.public_address)
        assert _heard(listener) == "nobody"
        assert at_home.startswith("refused") and at_router.startswith("refused") and from_relay.startswith("refused")
        # Public nodes still reach each other directly.
        listener = _listen(tail.namespace, tail.address, 10)
        assert _dial(head.namespace, tail.address) == "connected"
        assert _heard(listener) == f"peer {head.address}"
        # The router's rules are in its own namespace: masquerade out, inbound only for replies.
        rules = run(["ip", "netns", "exec", router.namespace, "iptables", "-S", "FORWARD"]).stdout
        assert "-P FORWARD DROP" in rules and "ESTABLISHED" in rules
        nat = run(["ip", "netns", "exec", router.namespace, "iptables", "-t", "nat", "-S"]).stdout
        assert "MASQUERADE" in nat and "DNAT" not in nat
    finally:
        lab.close()
    assert _lab_names() == []
    assert run(["iptables", "-t", "nat", "-S"]).stdout == host_nat_before


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2")
def test_private_nodes_without_iptables_are_refused_naming_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A PATH with the lab's other tools and no iptables, as on a host that lacks the package.
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("ip", "tc"):
        found = shutil.which(tool)
        if found is None:
            pytest.skip(f"no {tool} here")
        (tools / tool).symlink_to(found)
    monkeypatch.setenv("PATH", str(tools))
    with pytest.raises(LabUnavailable, match=r"--private .*`make iptables`"):
        check_privileges(private=True)
    check_privileges(private=False)  # a lab without private nodes needs no iptables


@needs_nat_lab
def test_lab_up_refuses_what_cannot_be_private_in_one_sentence(tmp_path: Path) -> None:
    """The CLI's --private and --relays reach the plan: node 0 (the tracker) is never private,
    and private nodes without a relay could be reached by nobody; nothing is left behind."""
    model = tmp_path / "model.gguf"  # never read: the plan refuses before anything starts
    for flags, words in (
        (("--nodes", "1", "--private", "1"), "--private must be 0..0"),
        (("--nodes", "3", "--private", "1", "--relays", "0"), "reachable only through a relay"),
    ):
        command = meshnet_command(tmp_path, "lab", "up", "--model", str(model), "--tag", TAG, *flags)
        refused = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert refused.returncode == 2 and "[invalid_argument]" in refused.stderr and words in refused.stderr
    assert _lab_names() == []
