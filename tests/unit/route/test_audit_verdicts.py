"""The audit's pure decisions: which requests are sampled, which routes to try, whom to blame."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from meshnet.core.audit_evidence import AuditedRequest, AuditRun, QuarantineEvidence
from meshnet.core.ids import NodeId, RequestId
from meshnet.route.audit_verdicts import (
    Verdict,
    blame_across,
    evidence_blames,
    judge,
    next_exclusions,
    should_audit,
)

H1, H2, H3, T1, T2, T3 = (NodeId(name) for name in ("h1", "h2", "h3", "t1", "t2", "t3"))
RIGHT, WRONG = "right", "wrong"


def run(*nodes: NodeId, output: str = RIGHT) -> AuditRun:
    return AuditRun(nodes, output)


def test_sampling_is_a_deterministic_share_of_request_ids() -> None:
    ids = [f"req-{i:06x}" for i in range(4000)]
    assert not any(should_audit(rid, 0.0) for rid in ids)
    assert all(should_audit(rid, 1.0) for rid in ids)
    share = sum(should_audit(rid, 0.05) for rid in ids) / len(ids)
    assert 0.035 < share < 0.065
    assert [should_audit(rid, 0.3) for rid in ids] == [should_audit(rid, 0.3) for rid in ids]
    # A larger fraction samples a superset: raising it never un-audits a request.
    assert all(should_audit(rid, 0.5) for rid in ids if should_audit(rid, 0.1))


def test_agreeing_runs_are_clean() -> None:
    verdict = judge([run(H1, T1), run(H2, T2)])
    assert verdict.clean and verdict.culprit is None and verdict.kind == "clean"


def test_one_disagreeing_disjoint_replay_is_undecided_not_clean() -> None:
    verdict = judge([run(H1, T1, output=WRONG), run(H2, T2)])
    assert verdict.kind == "undecided" and verdict.reference is None and verdict.suspects == {H1, T1, H2, T2}


def test_a_head_honest_on_every_replay_is_never_answered_by_blaming_its_tail() -> None:
    # Issue 29: H1 lies on the user's request only. Every replay, through H1 or not, is right.
    runs = [run(H1, T1, output=WRONG), run(H2, T2), run(H3, T1), run(H1, T2)]
    verdict = judge(runs)
    assert verdict == Verdict("undecided", None, frozenset({H1, T1}), RIGHT, unreproducible=True)
    # The old rule named T1 here: the one node whose presence "explained" the agreements.
    # Every way of telling the two apart within this request is spent: the window across requests decides.
    assert next_exclusions(runs, verdict, [frozenset({H1, T1}), frozenset({H1}), frozenset({T1})]) == ()


def test_a_culprit_lying_on_every_run_is_isolated_by_one_request() -> None:
    runs = [run(H1, T1, output=WRONG), run(H2, T2), run(H3, T1), run(H1, T2, output=WRONG)]
    verdict = judge(runs)
    assert (verdict.kind, verdict.culprit, verdict.unreproducible) == ("caught", H1, True)


def test_a_culprit_off_the_original_route_is_named_and_the_original_stands() -> None:
    runs = [run(H1, T1), run(H2, T2, output=WRONG), run(H3, T2), run(H2, T1, output=WRONG)]
    verdict = judge(runs)
    assert (verdict.culprit, verdict.reference, verdict.unreproducible) == (H2, RIGHT, False)


def test_two_faults_that_contradict_each_other_blame_nobody() -> None:
    # Two disjoint pairs agree on different outputs: more than one node lies; no guessing.
    runs = [run(H1, T1, output=WRONG), run(H2, T2, output=WRONG), run(H3, T1), run(H1, T3)]
    verdict = judge(runs)
    assert verdict.kind == "undecided" and verdict.culprit is None


def test_across_requests_the_one_node_on_every_unreproducible_original_is_blamed() -> None:
    assert blame_across([frozenset({H1, T1})]) is None  # one request is never enough
    assert blame_across([frozenset({H1, T1}), frozenset({H1, T1})]) is None  # always together: undecided
    assert blame_across([frozenset({H1, T1}), frozenset({H1, T2})]) == H1
    assert blame_across([frozenset({H1, T1}), frozenset({H2, T2})]) is None  # two faults: nobody


def _replays(original: tuple[NodeId, ...]) -> list[tuple[NodeId, ...]]:
    return [(h, t) for h in (H1, H2, H3) for t in (T1, T2) if (h, t) != original]


def test_no_honest_node_is_ever_blamed_whatever_one_liar_does() -> None:
    # Every original route, every liar, every set of replays, every choice of runs it lies on.
    nodes = (H1, H2, H3, T1, T2)
    for original in [(h, t) for h in (H1, H2, H3) for t in (T1, T2)]:
        replays = _replays(original)
        for chosen in itertools.chain.from_iterable(itertools.combinations(replays, k) for k in range(1, 6)):
            routes = [original, *chosen]
            assert judge([run(*route) for route in routes]).clean  # an honest swarm: always clean
            for liar in nodes:
                through = [i for i, route in enumerate(routes) if liar in route]
                for lies in itertools.product((False, True), repeat=len(through)):
                    told = dict(zip(through, lies, strict=True))
                    runs = [run(*route, output=WRONG if told.get(i) else RIGHT) for i, route in enumerate(routes)]
                    verdict = judge(runs)
                    assert verdict.culprit in (None, liar), (routes, liar, lies)
                    if verdict.unreproducible:
                        assert liar in verdict.suspects


def test_the_tracker_rechecks_an_order_by_the_evidence_it_carries() -> None:
    caught = AuditedRequest(
        RequestId("req-1"), (run(H1, T1, output=WRONG), run(H2, T2), run(H3, T1), run(H1, T2, output=WRONG))
    )
    assert evidence_blames(QuarantineEvidence("one_request", (caught,))) == H1
    honest = AuditedRequest(RequestId("req-2"), (run(H1, T1), run(H2, T2)))
    assert evidence_blames(QuarantineEvidence("one_request", (honest,))) is None
    first = AuditedRequest(RequestId("req-3"), (run(H1, T1, output=WRONG), run(H2, T2), run(H3, T1), run(H1, T2)))
    second = AuditedRequest(RequestId("req-4"), (run(H1, T2, output=WRONG), run(H2, T1), run(H3, T2), run(H1, T1)))
    assert evidence_blames(QuarantineEvidence("across_requests", (first, second))) == H1
    assert evidence_blames(QuarantineEvidence("across_requests", (first, first))) is None  # {H1, T1} both times
    assert evidence_blames(QuarantineEvidence("across_requests", (first, honest))) is None


def test_next_exclusions_go_around_each_run_then_single_out_nodes() -> None:
    runs = [run(H1, T1, output=WRONG), run(H2, T2)]
    verdict = judge(runs)
    first = next_exclusions(runs, verdict, [frozenset({H1, T1})])
    assert first[:3] == (frozenset({H2, T2}), frozenset({H1}), frozenset({H2}))
    settled = Verdict("undecided", None, frozenset({H1, T1}), RIGHT, unreproducible=True)
    assert next_exclusions(runs, settled, [frozenset({H1})]) == (frozenset({T1}), frozenset({H1, T1}))


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
        async def plan(self, session: object, request: object) -> None:
            return None

        async def run(self, session: object, request: object, *, history: object = (), kv: object = None):  # type: ignore[no-untyped-def]
            seen_in_flight.append(admission.in_flight)
            yield TokenGenerated(5, 0, 1.0)
            yield TokenGenerated(6, 1, 1.0)

    config = AuditConfig(fraction=1.0, max_delay_s=0)
    auditor = Auditor(Tracker(), Driver(), config, slot=admission.spare_slot)  # type: ignore[arg-type]
    case = AuditCase(RequestId("req-1"), GenerationRequest((1, 2, 3), 2), route("h1"), (5, 6))
    user = await admission.acquire(1.0, lambda position: None)
    audit = asyncio.create_task(auditor.audit(case))
    await asyncio.sleep(0.02)
    assert seen_in_flight == []  # the user's request holds the only slot
    user.release()
    outcome = await audit
    assert seen_in_flight == [1] and admission.in_flight == 0
    assert outcome.verdict.clean
