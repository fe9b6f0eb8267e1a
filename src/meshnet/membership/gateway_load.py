"""The load generator's gateway: routes for fresh sessions and the work records of routed
requests, each at its own rate, through the gateway's own ``TrackerClient`` (one client, one
gateway certificate, every tracker replica's address, as ``meshnet gateway --tracker a,b,c``).

So it fails over as the gateway does (``membership.replicas``): a call whose replica is gone
moves the client to the next replica and is asked there once more, within the retry budget. A
call that still fails is counted in ``Counts.failed_calls``: what a user of the gateway would
have seen. Retries are counted through the budget. Every record a tracker acknowledged is kept
by request id, so a run can look for each of them in the store afterwards (none may be lost).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from meshnet.core.addresses import TrackerOrder
from meshnet.core.errors import MeshnetError
from meshnet.core.ids import new_request_id, new_session_id
from meshnet.core.tracking import NodeWork, Route, WorkRecord
from meshnet.membership.replicas import RetryBudget
from meshnet.membership.simulated_nodes import MODEL, Counts
from meshnet.membership.tracker_client import TrackerClient
from meshnet.security.certificates import NodeCertificate
from meshnet.wire.status import status_for
from meshnet.wire.tls import LinkSecurity

GATEWAY_CALL_TIMEOUT_S = 5.0
"""The gateway's ``TrackerClient`` default: one deadline for a call and its retry."""


@dataclass
class CountedBudget(RetryBudget):
    """The gateway's retry budget (its defaults), counting each retry it grants."""

    counts: Counts = field(default_factory=Counts)

    def spend(self) -> bool:
        granted = super().spend()
        self.counts.retries += granted
        return granted


class GatewayLoad:
    """Routes and work records at their rates, over the tracker replicas ``trackers`` (asked in
    the gateway's own order, or as listed: ``order``)."""

    def __init__(
        self,
        trackers: tuple[str, ...],
        rates: tuple[float, float],
        certificate: NodeCertificate | None,
        counts: Counts,
        order: TrackerOrder = "spread",
    ) -> None:
        self._client = TrackerClient(
            ",".join(trackers),
            timeout_s=GATEWAY_CALL_TIMEOUT_S,
            security=None if certificate is None else LinkSecurity(certificate),
            budget=CountedBudget(counts=counts),
            order=order,
        )
        self._routes_per_s, self._records_per_s = rates
        self._counts = counts
        self._routed: deque[tuple[str, str, Route]] = deque(maxlen=1000)
        self._tasks: set[asyncio.Task[None]] = set()
        self.acknowledged: list[str] = []
        """Request ids of every work record a tracker acknowledged, in order."""

    def _failed(self, call: str, error: MeshnetError) -> None:
        # Keyed by gRPC status, as the nodes' errors are (and earlier results' gateway errors).
        self._counts.failed(call, status_for(error).name, f"{type(error).__name__}: {error.message}")
        self._counts.failed_calls[call] += 1

    async def _route(self) -> None:
        session, request = new_session_id(), new_request_id()
        started = time.perf_counter()
        try:
            route = await self._client.choose_route(MODEL, session_id=session, request_id=request)
        except MeshnetError as error:
            self._failed("choose_route", error)
            return
        self._counts.latency("choose_route", started)
        self._routed.append((session, request, route))

    async def _report(self) -> None:
        if not self._routed:
            self._counts.skipped_records += 1  # no route answered yet: nothing to report
            return
        session, request, route = self._routed.popleft()
        now = time.time()
        tokens = 96
        record = WorkRecord(
            request_id=request,  # type: ignore[arg-type]  # a RequestId made by new_request_id
            model=MODEL,
            status="completed",
            tokens_in=32,
            tokens_out=64,
            attribution=tuple(NodeWork(hop.node_id, hop.layers, tokens) for hop in route.hops),
            # Not the formula's units: simulated shards report no session counts, and a record the
            # formula bills would wait ``work_checks.COUNT_WAIT_S`` for them, in flight, pressing
            # the tracker's admission. Disputed at once instead (the same checks, no wait).
            billing_units=tokens / 1000,
            started_at=now - 2.0,
            finished_at=now,
            session_id=session,  # type: ignore[arg-type]
        )
        started = time.perf_counter()
        try:
            await self._client.report_work(record)
        except MeshnetError as error:
            self._failed("report_work", error)
            return
        self._counts.latency("report_work", started)
        self.acknowledged.append(request)

    async def _paced(self, rate: float, call: Callable[[], Coroutine[Any, Any, None]], stop: asyncio.Event) -> None:
        """Open loop: a call every 1/rate s whether or not the last one answered, as users arrive."""
        if rate <= 0:
            return
        due = time.monotonic()
        while not stop.is_set():
            task = asyncio.create_task(call())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            due += 1.0 / rate
            await asyncio.sleep(max(0.0, due - time.monotonic()))

    async def run(self, stop: asyncio.Event) -> None:
        await asyncio.gather(
            self._paced(self._routes_per_s, self._route, stop),
            self._paced(self._records_per_s, self._report, stop),
        )
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._client.close()
