"""A node's current address as its relay attachment moves (``membership.reach``)."""

from __future__ import annotations

import asyncio

from meshnet.membership.reach import PrivateRetry, Reach

RELAYS = ("r1:7400", "r2:7400")


def test_a_declared_private_node_attaches_at_once_and_registers_where_its_relay_says() -> None:
    reach = Reach("10.0.0.5:7000", "private", RELAYS)
    assert reach.wants_relay and (reach.address, reach.declaring) == ("10.0.0.5:7000", "private")
    reach.moved("w-home@r1:7400")
    assert reach.changed.is_set() and reach.address == "w-home@r1:7400"
    reach.changed.clear()
    reach.moved("w-home@r1:7400")  # the same relay again: nothing to register
    assert not reach.changed.is_set()
    reach.moved(None)
    assert reach.changed.is_set() and reach.address == "10.0.0.5:7000"


def test_an_auto_node_attaches_only_once_the_tracker_found_it_private_and_then_stays_private() -> None:
    reach = Reach("10.0.0.5:7000", "auto", RELAYS)
    assert not reach.wants_relay and reach.declaring == "auto"
    reach.registered("public")
    assert not reach.wants_relay
    reach.registered("private")
    assert reach.wants_relay and reach.declaring == "private"  # its own address is not dialled again
    reach.moved("w-home@r1:7400")
    reach.registered("relayed")
    reach.moved(None)
    assert reach.wants_relay and reach.declaring == "private"


QUICK = PrivateRetry(first_s=0.01, max_s=0.04)


async def test_a_private_verdict_at_a_relayed_address_is_not_taken_for_nat_and_is_retried() -> None:
    reach = Reach("10.0.0.5:7000", "auto", RELAYS, QUICK)
    reach.moved("w-home@r1:7400")
    reach.changed.clear()
    reach.registered("private")  # the relay did not carry the dial-back in time: not about its own address
    assert not reach.wants_relay and not reach.changed.is_set()
    await asyncio.wait_for(reach.changed.wait(), 1.0)  # registers again through the same relay


async def test_without_relays_a_failed_dial_back_is_retried_until_the_node_is_public() -> None:
    reach = Reach("10.0.0.5:7000", "auto", (), QUICK)
    for _ in range(3):  # a loaded tracker's dial-back timed out, again and again
        reach.registered("private")
        assert reach.declaring == "auto" and not reach.wants_relay  # its address is still offered
        await asyncio.wait_for(reach.changed.wait(), 1.0)
        reach.changed.clear()
    reach.registered("public")
    await asyncio.sleep(0.1)
    assert not reach.changed.is_set()  # public at last: nothing more to register


async def test_a_retry_pending_when_the_node_registers_otherwise_or_closes_is_dropped() -> None:
    reach = Reach("10.0.0.5:7000", "public", RELAYS, PrivateRetry(first_s=0.05))
    reach.registered("private")
    assert not reach.wants_relay and reach.declaring == "public"  # declared public: never attaches
    reach.close()
    await asyncio.sleep(0.1)
    assert not reach.changed.is_set()


def test_a_node_private_by_its_own_word_is_not_retried() -> None:
    assert not Reach("10.0.0.5:7000", "private").wants_relay
    reach = Reach("10.0.0.5:7000", "private")
    reach.registered("private")  # no running loop needed: nothing is scheduled
    assert reach.declaring == "private"


def test_retry_waits_double_up_to_a_bound_with_jitter() -> None:
    retry = PrivateRetry(first_s=1.0, max_s=30.0)
    assert [retry.wait_s(n, lambda: 1.0) for n in (1, 2, 3, 6, 20)] == [1.0, 2.0, 4.0, 30.0, 30.0]
    assert retry.wait_s(3, lambda: 0.0) == 2.0


async def test_a_node_is_dialable_at_its_relay_or_nowhere_while_private() -> None:
    private = Reach("10.0.0.5:7000", "private", RELAYS, QUICK)
    assert private.dialable is None  # behind NAT by its word, no relay yet
    private.moved("w-home@r1:7400")
    assert private.dialable == "w-home@r1:7400"
    private.registered("private")  # the dial-back through the relay failed
    assert private.dialable is None
    private.registered("relayed")
    assert private.dialable == "w-home@r1:7400"
    auto = Reach("10.0.0.5:7000", "auto", (), QUICK)
    assert auto.dialable == "10.0.0.5:7000"  # until the tracker says otherwise
    auto.registered("private")
    assert auto.dialable is None
    auto.registered("public")
    assert auto.dialable == "10.0.0.5:7000"
    auto.close()
    private.close()
