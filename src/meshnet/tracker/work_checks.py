"""Work records the tracker can check: held to the routes it issued and to what their shards counted.

A gateway's record is what contributors are paid from, so a secured tracker stores it as the
gateway reported it only when it holds up (``check_record``): billing units are the documented
formula (``core.tracking.billing_units``) recomputed here, the tokens fit the route's context, every
node it pays was on a route this tracker issued for that session (to that gateway, for that
request), and no more tokens are claimed than the route's own shards computed
(``shard_problem``; each worker reports its sessions' counts as they end, ``node.session_counts``).
A record that does not hold up is stored ``disputed`` with its reason, never ``completed``.

The other way round, a request whose gateway died mid-stream has no record but its shards
counted it: once they have been quiet for a grace period, the tracker files the record itself,
``completed_by_shards`` (``record_from_shards``); so does a gateway's successor filing the
``unverified`` record its predecessor wrote ahead.

``WorkLedger`` keeps what this needs, bounded: the sessions routed lately (the routes issued for
each, its request and gateway) and their shards' counts. It is the tracker process's memory: a
record of a request started before the ledger remembers (routed by the tracker before a restart,
or forgotten past the bound) is held to the static checks only (formula, nodes ever registered).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from meshnet.core.ids import NodeId, RequestId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.tracking import NodeWork, Route, RouteQuery, SessionTokens, WorkRecord, WorkStatus, billing_units

MAX_SESSIONS = 16_384
"""Sessions remembered; the least recently routed are forgotten first."""
COUNT_WAIT_S = 2.0
"""How long a record claiming more than the shards counted waits for their late reports."""


@dataclass
class RoutedSession:
    """One session's routes as this tracker issued them, and what their shards counted."""

    session_id: SessionId
    request_id: RequestId | None
    """The user request (None: an audit replay, never billed)."""
    gateway: str | None
    """Node id of the gateway it was routed for (None on a plaintext tracker)."""
    model: str
    context_tokens: int
    issued_at: float
    """Wall-clock seconds when the first route was issued."""
    hops: dict[NodeId, LayerRange] = field(default_factory=dict)
    counts: dict[tuple[NodeId, int], SessionTokens] = field(default_factory=dict)
    last_count: float | None = None
    """Monotonic time of the latest shard report."""
    settled: bool = False
    """A record of it is stored (the gateway's, or the shards')."""
    by_shards: bool = False
    """That record is the one the tracker filed from the shards' counts."""
    pending: WorkRecord | None = None
    """A record disputed only because the shards' counts fell short: settled if they catch up."""


@dataclass(frozen=True)
class Tally:
    """What a session's shards computed: the most positions any held, and where sampling began."""

    positions: int
    prompt_tokens: int
    """0: no shard reported a sampled token."""

    @property
    def generated(self) -> int:
        """Tokens sampled: every position past the prompt was a token fed back, plus the last one."""
        return self.positions - self.prompt_tokens + 1 if self.prompt_tokens else 0

    @classmethod
    def of(cls, counts: Iterable[SessionTokens]) -> Tally | None:
        counted = list(counts)
        if not counted:
            return None
        prompts = [count.prompt_tokens for count in counted if count.prompt_tokens]
        return cls(max(count.positions for count in counted), min(prompts, default=0))


@dataclass(frozen=True)
class Verdict:
    """How a reported record is stored: its status, why (when not as reported), and the record."""

    status: WorkStatus
    record: WorkRecord
    reason: str = ""
    waiting: bool = False
    """Short of the shards' counts: their reports may still be on the way."""

    @property
    def judged(self) -> WorkRecord:
        """The record to store: the reported one under this verdict's status."""
        return self.record if self.record.status == self.status else replace(self.record, status=self.status)


def static_problem(record: WorkRecord, routed: RoutedSession | None, known: Callable[[NodeId], bool]) -> str | None:
    """What makes ``record`` inconsistent on its face or with the routes issued for it; None: nothing."""
    formula = billing_units(record.tokens_in, record.tokens_out)
    if not math.isclose(record.billing_units, formula, rel_tol=1e-9, abs_tol=1e-9):
        return (
            f"billing_units {record.billing_units:g} are not the formula's {formula:g} "
            f"(0.25 x {record.tokens_in} tokens in + {record.tokens_out} tokens out)"
        )
    unknown = sorted({share.node_id for share in record.attribution if not known(share.node_id)})
    if routed is None:
        return f"node(s) {', '.join(unknown)} unknown to this tracker" if unknown else None
    if routed.request_id is not None and record.request_id != routed.request_id:
        return f"session {routed.session_id} was routed for request {routed.request_id}, not {record.request_id}"
    if record.model != routed.model:
        return f"session {routed.session_id} was routed for model {routed.model}, not {record.model}"
    if record.tokens_in + record.tokens_out > routed.context_tokens:
        return (
            f"{record.tokens_in} + {record.tokens_out} tokens exceed the {routed.context_tokens}-token "
            "context of the route issued for it"
        )
    stray = sorted({share.node_id for share in record.attribution if share.node_id not in routed.hops})
    if stray:
        return f"node(s) {', '.join(stray)} were on no route issued for session {routed.session_id}"
    return None


def shard_problem(record: WorkRecord, tally: Tally | None) -> str | None:
    """Whether ``record`` claims more than the route's shards computed; None: it does not."""
    claimed = record.tokens_in + record.tokens_out
    if claimed == 0:
        return None
    if tally is None:
        return f"claims {claimed} tokens; the route's shards reported none for session {record.session_id}"
    if claimed > tally.positions + 1:
        return f"claims {claimed} tokens; the route's shards computed {tally.positions} positions"
    if tally.prompt_tokens and record.tokens_out > tally.generated:
        return f"claims {record.tokens_out} tokens out; the route's tail sampled {tally.generated}"
    return None


def record_from_shards(routed: RoutedSession, request_id: RequestId, tally: Tally, finished_at: float) -> WorkRecord:
    """The record of request ``request_id`` (routed as ``routed``), counted by its shards."""
    tokens_in, tokens_out = tally.prompt_tokens, tally.generated
    by_node: dict[NodeId, int] = {}
    for (node_id, _), count in routed.counts.items():
        by_node[node_id] = max(by_node.get(node_id, 0), count.positions)
    return WorkRecord(
        request_id=request_id,
        model=routed.model,
        status="completed_by_shards",
        tokens_in=tokens_in,
        tokens_out=tokens_out,
        attribution=tuple(NodeWork(node, routed.hops[node], tokens) for node, tokens in sorted(by_node.items())),
        billing_units=billing_units(tokens_in, tokens_out),
        started_at=min(routed.issued_at, finished_at),
        finished_at=finished_at,
        session_id=routed.session_id,
    )


class WorkLedger:
    """Routed sessions and their shards' counts, for judging records (one event loop owns it)."""

    def __init__(
        self,
        *,
        grace_s: float,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        limit: int = MAX_SESSIONS,
    ) -> None:
        self.grace_s = grace_s
        self._clock = clock
        self._wall_clock = wall_clock
        self._limit = limit
        self._sessions: OrderedDict[SessionId, RoutedSession] = OrderedDict()
        self._counted = asyncio.Event()
        self.remembered_since = wall_clock()
        """Records of requests started before this are held to the static checks only: they were
        routed by a predecessor tracker, or their sessions were forgotten (the ledger is bounded)."""

    def issue(self, query: RouteQuery, route: Route, gateway: str | None) -> None:
        """Remember the route handed out for ``query``'s session (a failover's joins the first)."""
        if query.session_id is None:
            return
        routed = self._sessions.get(query.session_id)
        if routed is not None and routed.gateway != gateway:
            return  # another gateway's session: its routes and record stay that gateway's
        if routed is None:
            routed = RoutedSession(
                query.session_id, query.request_id, gateway, route.model, route.context_tokens, self._wall_clock()
            )
            self._sessions[query.session_id] = routed
        self._sessions.move_to_end(query.session_id)
        routed.hops.update((hop.node_id, hop.layers) for hop in route.hops)
        routed.context_tokens = min(routed.context_tokens, route.context_tokens)
        while len(self._sessions) > self._limit:
            self._sessions.popitem(last=False)
            # What is left was routed since its oldest: a record started before was perhaps forgotten.
            oldest = next(iter(self._sessions.values()))
            self.remembered_since = max(self.remembered_since, oldest.issued_at)

    def count(self, node_id: NodeId, sessions: Iterable[SessionTokens]) -> tuple[int, list[WorkRecord]]:
        """Take a worker's counts (only for sessions routed through it): how many were taken, and
        the disputed records the counts now bear out (to be stored with their reported status)."""
        taken, borne_out = 0, []
        for tokens in sessions:
            routed = self._sessions.get(tokens.session_id)
            if routed is None or node_id not in routed.hops:
                continue
            routed.counts[(node_id, tokens.route_epoch)] = tokens
            routed.last_count = self._clock()
            taken += 1
            pending = routed.pending
            if pending is not None and shard_problem(pending, Tally.of(routed.counts.values())) is None:
                routed.pending = None
                borne_out.append(pending)
        if taken:
            self._counted.set()
            self._counted = asyncio.Event()
        return taken, borne_out

    def judge(self, record: WorkRecord, gateway: str | None, known: Callable[[NodeId], bool]) -> Verdict:
        """How ``record``, reported by ``gateway``, is to be stored now."""
        routed = self._sessions.get(record.session_id) if record.session_id is not None else None
        if routed is None and record.started_at >= self.remembered_since:
            return Verdict("disputed", record, f"no route was issued for session {record.session_id}")
        if routed is not None and routed.gateway != gateway and record.status != "unverified":
            # (A written-ahead record may come from the dead gateway's successor under another
            # certificate: its content is replaced by the shards' counts anyway.)
            return Verdict("disputed", record, f"session {routed.session_id} was routed for another gateway")
        problem = static_problem(record, routed, known)
        if problem is not None:
            return Verdict("disputed", record, problem)
        if routed is None:
            return Verdict(record.status, record)  # routed before this tracker remembers
        tally = Tally.of(routed.counts.values())
        if record.status == "unverified":
            # The written-ahead record of a gateway that died, filed by its successor: the
            # shards know what was computed.
            if tally is None or not tally.generated:
                return Verdict("unverified", record, waiting=True)
            counted = record_from_shards(routed, record.request_id, tally, self._wall_clock())
            return Verdict("completed_by_shards", counted)
        short = shard_problem(record, tally)
        if short is not None:
            return Verdict("disputed", record, short, waiting=True)
        return Verdict(record.status, record)

    async def judge_waiting(
        self, record: WorkRecord, gateway: str | None, known: Callable[[NodeId], bool], wait_s: float = COUNT_WAIT_S
    ) -> Verdict:
        """``judge``, giving the shards' reports up to ``wait_s`` to arrive when they fall short."""
        deadline = self._clock() + wait_s
        while True:
            verdict = self.judge(record, gateway, known)
            left = deadline - self._clock()
            if not verdict.waiting or left <= 0:
                return verdict
            try:
                await asyncio.wait_for(self._counted.wait(), left)
            except TimeoutError:
                continue

    def stored(self, verdict: Verdict) -> None:
        """``verdict``'s record is being stored: its session is settled (a record short of the
        shards' counts stays open to them). Another request's record settles nothing of it."""
        session_id = verdict.record.session_id
        routed = self._sessions.get(session_id) if session_id is not None else None
        if routed is None or routed.request_id not in (None, verdict.record.request_id):
            return
        routed.settled = True
        routed.by_shards = verdict.status == "completed_by_shards"
        if verdict.status == "disputed" and verdict.waiting:
            routed.pending = verdict.record

    def settled_by_shards(self, record: WorkRecord) -> bool:
        """Whether the tracker filed ``record``'s request from its shards already (the gateway's
        own record then arrives too late: the shards' counts stand)."""
        routed = self._sessions.get(record.session_id) if record.session_id is not None else None
        return routed is not None and routed.by_shards and routed.request_id == record.request_id

    def due(self) -> list[WorkRecord]:
        """Records to file from the shards: routed requests without a record whose shards have
        been quiet for the grace period. They count as settled from here (the caller stores them)."""
        now, records = self._clock(), []
        for routed in self._sessions.values():
            if routed.settled or routed.request_id is None or routed.last_count is None:
                continue
            if now - routed.last_count < self.grace_s:
                continue
            tally = Tally.of(routed.counts.values())
            if tally is None or not tally.generated:
                continue
            routed.settled = routed.by_shards = True
            records.append(record_from_shards(routed, routed.request_id, tally, self._wall_clock()))
        return records
