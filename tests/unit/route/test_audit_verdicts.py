"""The audit's pure decisions: which requests are sampled, which routes to try, whom to blame."""

from __future__ import annotations

import asyncio

import pytest

from meshnet.core.ids import NodeId
from meshnet.route.audit_verdicts import Trial, Verdict, judge, next_exclusions, should_audit

H1, H2, H3, T1, T2, T3 = (NodeId(name) for name in ("h1", "h2", "h3", "t1", "t2", "t3"))


def trial(*nodes: NodeId, agreed: bool) -> Trial:
    return Trial(frozenset(nodes), agreed)


def test_sampling_is_a_deterministic_share_of_request_ids() -> None:
    ids = [f"req-{i:06x}" for i in range(4000)]
    assert not any(should_audit(rid, 0.0) for rid in ids)
    assert all(should_audit(rid, 1.0) for rid in ids)
    share = sum(should_audit(rid, 0.05) for rid in ids) / len(ids)
    assert 0.035 < share < 0.065
    assert [should_audit(rid, 0.3) for rid in ids] == [should_audit(rid, 0.3) for rid in ids]
    # A larger fraction samples a superset: raising it never un-audits a request.
    assert all(should_audit(rid, 0.5) for rid in ids if should_audit(rid, 0.1))


def test_agreeing_replays_are_clean() -> None:
    verdict = judge(frozenset({H1, T1}), [trial(H2, T2, agreed=True)])
    assert verdict.clean and verdict.culprit is None


def test_one_disagreeing_disjoint_replay_leaves_every_node_a_suspect() -> None:
    verdict = judge(frozenset({H1, T1}), [trial(H2, T2, agreed=False)])
    assert verdict.culprit is None and verdict.suspects == {H1, T1, H2, T2}


def test_a_culprit_on_the_original_route_is_named_with_a_third_opinion() -> None:
    original = frozenset({H1, T1})  # H1 lies
    trials = [trial(H2, T2, agreed=False), trial(H2, T1, agreed=False)]
    assert judge(original, trials).suspects == {H1, H2}  # H1 vs H2: two nodes, no majority yet
    trials.append(trial(H3, T1, agreed=False))
    assert judge(original, trials) == Verdict(culprit=H1, suspects=frozenset({H1}))


def test_a_culprit_on_an_audit_route_is_named_and_the_original_cleared() -> None:
    original = frozenset({H1, T1})  # the original is honest; H2 lies
    trials = [trial(H2, T2, agreed=False), trial(H2, T1, agreed=False), trial(H3, T1, agreed=True)]
    verdict = judge(original, trials)
    assert verdict.culprit == H2 and H2 not in original


def test_two_disagreeing_replicas_stay_undecided_until_a_third_sides_with_one() -> None:
    original = frozenset({H1, T1})  # T1 lies
    trials = [trial(H2, T2, agreed=False), trial(H1, T2, agreed=False), trial(H2, T1, agreed=True)]
    # The heads are cleared, but T1 against T2 is one word against another.
    assert judge(original, trials) == Verdict(suspects=frozenset({T1, T2}))
    trials.append(trial(H1, T3, agreed=False))
    assert judge(original, trials).culprit == T1


def test_next_exclusions_single_out_each_node_then_pairs_of_suspects() -> None:
    original = frozenset({H1, T1})
    first = next_exclusions(original, Verdict(), [original])
    assert first == (frozenset({H1}), frozenset({T1}))
    suspects = Verdict(suspects=frozenset({H1, H2}))
    after = next_exclusions(original, suspects, [original, frozenset({H1})])
    assert after == (frozenset({H2}), frozenset({H1, H2}))
    assert next_exclusions(original, suspects, [frozenset({H1}), frozenset({H2}), frozenset({H1, H2})]) == ()


@pytest.mark.parametrize("fraction", [-0.1, 1.5])
def test_bad_fractions_are_refused(fraction: float) -> None:
    from meshnet.core.errors import InvalidArgument
    from meshnet.route.audit import AuditConfig

    with pytest.raises(InvalidArgument):
        AuditConfig(fraction=fraction)


async def test_the_audit_queue_is_bounded_and_submitting_never_blocks() -> None:
    from meshnet.core.events import RouteHop
    from meshnet.core.generation import GenerationRequest
    from meshnet.core.ids import RequestId
    from meshnet.core.layers import LayerRange
    from meshnet.core.node_record import NodeCapability
    from meshnet.core.tracking import Route
    from meshnet.membership.tracker_client import TrackerClient
    from meshnet.route.audit import AuditCase, AuditConfig, Auditor
    from meshnet.route.driver import RouteDriver
    from meshnet.route.shard_stream import ChannelPool

    hop = RouteHop(NodeId("h1"), "127.0.0.1:1", LayerRange(0, 4), NodeCapability(64, 8, 64, 1 << 20, 8, 1))
    route = Route(hops=(hop,), epoch=1, model="m", quantization="Q8_0", fingerprint="rcp-1", n_layers=4, ms_per_token=1)
    request = GenerationRequest((1, 2, 3), 4)
    pool = ChannelPool(1 << 20)
    tracker = TrackerClient("127.0.0.1:1")  # never called: nothing is started
    try:
        auditor = Auditor(tracker, RouteDriver(pool, max_frame_bytes=1 << 20), AuditConfig(fraction=1.0, queue_limit=2))
        cases = [AuditCase(RequestId(f"req-{i}"), request, route, (5, 6)) for i in range(3)]
        assert [auditor.submit(case) for case in cases] == [True, True, False]
        assert auditor.counts == {"sampled": 2, "dropped": 1}
        assert not auditor.submit(AuditCase(RequestId("req-empty"), request, route, ()))  # nothing to compare
        unsampled = Auditor(tracker, RouteDriver(pool, max_frame_bytes=1 << 20), AuditConfig(fraction=0.0))
        assert not unsampled.submit(cases[0]) and not unsampled.counts
    finally:
        await tracker.close()
        await pool.close()


async def test_an_audit_replay_holds_a_gateway_slot_and_waits_for_one() -> None:
    # On nodes with one KV slot an uncounted replay turns the next user away as "shard full":
    # a replay runs only inside a slot of the gateway's admission, and only when none waits.
    import random

    from meshnet.core.events import RouteHop, TokenGenerated
    from meshnet.core.generation import GenerationRequest
    from meshnet.core.ids import RequestId
    from meshnet.core.layers import LayerRange
    from meshnet.core.node_record import NodeCapability
    from meshnet.core.tracking import Route
    from meshnet.gateway.admission import Admission
    from meshnet.route.audit import AuditCase, AuditConfig, Auditor

    def route(node: str) -> Route:
        hop = RouteHop(NodeId(node), "127.0.0.1:1", LayerRange(0, 4), NodeCapability(64, 8, 64, 1 << 20, 8, 1))
        return Route(
            hops=(hop,), epoch=1, model="m", quantization="Q8_0", fingerprint="rcp-1", n_layers=4, ms_per_token=1
        )

    admission = Admission(1, 2, clock=asyncio.get_running_loop().time, rng=random.Random(0))
    seen_in_flight: list[int] = []

    class Tracker:
        async def choose_route(self, model: str, **_: object) -> Route:
            return route("h2")

    class Driver:
        async def run(self, session: object, request: object, *, history: object = ()):  # type: ignore[no-untyped-def]
            seen_in_flight.append(admission.in_flight)
            yield TokenGenerated(6, 1, 1.0)

    auditor = Auditor(Tracker(), Driver(), AuditConfig(fraction=1.0), slot=admission.spare_slot)  # type: ignore[arg-type]
    case = AuditCase(RequestId("req-1"), GenerationRequest((1, 2, 3), 2), route("h1"), (5, 6))
    user = await admission.acquire(1.0, lambda position: None)
    audit = asyncio.create_task(auditor.audit(case))
    await asyncio.sleep(0.02)
    assert seen_in_flight == []  # the user's request holds the only slot
    user.release()
    outcome = await audit
    assert seen_in_flight == [1] and admission.in_flight == 0
    assert outcome.verdict.clean
