"""The lab's pure decisions: a free subnet, names that fit interfaces, shaping, spare ranges."""

from __future__ import annotations

import ipaddress

import pytest

from meshnet.core.errors import InvalidArgument
from meshnet.core.layers import LayerRange
from meshnet.deploy.lab.plan import LinkShape, check_tag, choose_subnet, object_tag, plan_lab, private_nodes
from meshnet.deploy.lab.swarm import choose_ranges


def net(text: str) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network(text)


def test_the_subnet_avoids_every_host_network() -> None:
    assert choose_subnet([net("192.0.2.0/24")]) == net("10.213.0.0/24")
    assert choose_subnet([net("10.213.0.0/24"), net("10.213.1.7/32")]) == net("10.213.2.0/24")
    with pytest.raises(InvalidArgument, match="in use"):
        choose_subnet([net("10.0.0.0/8")])


def test_names_fit_linux_interface_names_and_addresses_are_distinct() -> None:
    plan = plan_lab("abcdef", 3, 197, [], link=LinkShape(), memory_mb=160, cpus=2)
    assert all(len(node.host_link) <= 15 for node in plan.nodes) and len(plan.bridge) <= 15
    assert len({node.address for node in plan.nodes}) == 200
    assert plan.bridge_address not in {node.address for node in plan.nodes}
    assert [node.cpu for node in plan.nodes[:4]] == [0, 1, 0, 1]
    assert [node.spare for node in plan.nodes[2:4]] == [False, True]


@pytest.mark.parametrize("tag", ["", "too-long", "a b"])
def test_bad_tags_are_refused(tag: str) -> None:
    with pytest.raises(InvalidArgument):
        plan_lab(tag, 3, 0, [], link=LinkShape(), memory_mb=None, cpus=2)


def test_tbf_burst_holds_a_timer_tick() -> None:
    assert LinkShape().tbf_arguments() == []
    args = LinkShape(rate_mbit=1000).tbf_arguments()
    assert args[:2] == ["rate", "1000mbit"] and int(args[3]) == 500_000
    assert int(LinkShape(rate_mbit=1).tbf_arguments()[3]) == 16 * 1024


def test_the_first_spare_covers_the_middle() -> None:
    ranges = choose_ranges([LayerRange(0, 10), LayerRange(10, 20), LayerRange(20, 30)], 2)
    assert ranges[3] == LayerRange(10, 20) and ranges[4] == LayerRange(20, 30)


def test_every_name_a_plan_makes_parses_back_to_its_tag() -> None:
    for tag in ("a", "ab", "h1", "ah1", "abcdef", "9h9"):
        plan = plan_lab(tag, 3, 12, [], link=LinkShape(), memory_mb=None, cpus=2)
        names = [plan.bridge, plan.cgroup, *(n.namespace for n in plan.nodes), *(n.host_link for n in plan.nodes)]
        assert {object_tag(name) for name in names} == {tag}


def test_cleanup_matches_whole_tags() -> None:
    lab_a = ["mnlab-a-n0", "mnlabah0", "mnlababr", "mnlab-a"]
    lab_ab = ["mnlab-ab-n0", "mnlababh0", "mnlababbr", "mnlab-ab"]
    others = ["eth0", "mnlab", "mnlab-", "lo", "mnlabh0", "mnlab-\u00e9-n0"]
    assert [n for n in lab_a + lab_ab + others if object_tag(n) == "a"] == lab_a
    assert [n for n in lab_a + lab_ab + others if object_tag(n) == "ab"] == lab_ab
    assert [object_tag(n) for n in others] == [None] * len(others)


@pytest.mark.parametrize("tag", ["\u00e9", "a/b", "../x", ".build", "abcdefg", ""])
def test_a_tag_is_checked_before_it_names_anything(tag: str) -> None:
    with pytest.raises(InvalidArgument):
        check_tag(tag)


def test_private_nodes_are_the_middle_ones_first_and_never_node_0() -> None:
    assert private_nodes(3, 1) == [1]
    assert private_nodes(3, 2) == [1, 2]
    assert private_nodes(5, 3) == [2, 1, 3]
    assert private_nodes(4, 2) == [1, 2]
    assert private_nodes(3, 0) == []
    for nodes, private in ((3, 3), (1, 1), (3, -1)):
        with pytest.raises(InvalidArgument, match="--private"):
            private_nodes(nodes, private)


def test_a_private_node_sits_behind_a_router_that_takes_its_slot_on_the_bridge() -> None:
    plan = plan_lab("ab", 3, 1, [], link=LinkShape(), memory_mb=None, cpus=2, private=1, relays=2)
    public = plan_lab("ab", 3, 1, [], link=LinkShape(), memory_mb=None, cpus=2)
    middle = plan.nodes[1]
    assert middle.private and middle.router is not None and not plan.nodes[0].private
    # Its public address is the one the node would have had; the node itself is on its home network.
    assert middle.router.public_address == public.nodes[1].address
    assert middle.address == "192.168.1.2" and middle.router.home_address == "192.168.1.1"
    assert ipaddress.IPv4Address(middle.address) in middle.router.home_network
    assert not middle.router.home_network.overlaps(plan.subnet)
    assert object_tag(middle.router.namespace) == "ab" and middle.router.namespace != middle.namespace
    # Relay nodes come last, public; they run no worker.
    assert [n.index for n in plan.relays()] == [4, 5] and not any(n.private for n in plan.relays())
    assert [n.index for n in plan.workers()] == [0, 1, 2, 3] and [n.index for n in plan.serving()] == [0, 1, 2]
    assert [n.index for n in plan.private()] == [1]


def test_private_nodes_need_a_relay() -> None:
    with pytest.raises(InvalidArgument, match="relay"):
        plan_lab("ab", 3, 0, [], link=LinkShape(), memory_mb=None, cpus=2, private=1, relays=0)
