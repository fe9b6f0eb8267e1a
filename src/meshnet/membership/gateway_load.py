"""The load generator's gateway: routes for fresh sessions and the work records of routed
requests, each at its own rate, over one gateway certificate and channel (as one gateway sends
them).

Like the gateway's ``TrackerClient`` over replicas (``membership.replicas``), a call whose
replica is gone (UNAVAILABLE, CANCELLED, ``StorageUnavailable``) moves the gateway to the next
replica and is asked there once more; a call that still fails, or fails otherwise, is counted as
failed (``Counts.failed_calls``): that is what a user of the gateway would have seen. Every
record the tracker acknowledged is kept by request id, so a run can look for each of them in the
store afterwards (none may be lost).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import grpc

from meshnet.core.ids import new_request_id, new_session_id
from meshnet.core.tracking import NodeWork, Route, RouteQuery, WorkRecord
from meshnet.membership.replicas import Failure, classify
from meshnet.membership.simulated_nodes import MODEL, Counts, tracker_channel
from meshnet.security.certificates import NodeCertificate
from meshnet.wire import services
from meshnet.wire.status import error_from_rpc, status_and_code
from meshnet.wire.tls import LinkSecurity
from meshnet.wire.tracker_wire import route_from_proto, route_query_to_proto
from meshnet.wire.work_wire import work_to_proto

GATEWAY_CALL_TIMEOUT_S = 5.0
Send = Callable[[services.TrackerStub], Awaitable[Any]]


class GatewayLoad:
    """Routes and work records at their rates, over the tracker replicas in ``trackers`` order."""

    def __init__(
        self,
        trackers: tuple[str, ...],
        rates: tuple[float, float],
        certificate: NodeCertificate | None,
        counts: Counts,
    ) -> None:
        self._trackers = trackers
        self._routes_per_s, self._records_per_s = rates
        self._security = None if certificate is None else LinkSecurity(certificate)
        self._tracker_index = 0
        self._channels = [tracker_channel(trackers[0], self._security)]
        self._stub = services.TrackerStub(self._channels[-1])
        self._counts = counts
        self._routed: deque[tuple[str, str, Route]] = deque(maxlen=1000)
        self._tasks: set[asyncio.Task[None]] = set()
        self.acknowledged: list[str] = []
        """Request ids of every work record a tracker acknowledged, in order."""

    def _move_on(self, stub: services.TrackerStub) -> bool:
        """To the next replica, unless there is none or another call already moved on from ``stub``.
        Calls in flight on the old channel finish there; it is closed at the end of the run."""
        if len(self._trackers) == 1 or stub is not self._stub:
            return stub is not self._stub
        self._tracker_index = (self._tracker_index + 1) % len(self._trackers)
        self._channels.append(tracker_channel(self._trackers[self._tracker_index], self._security))
        self._stub = services.TrackerStub(self._channels[-1])
        return True

    async def _call(self, call: str, send: Send) -> Any | None:
        """``send`` on the replica asked now; once more on the next one if that replica is gone.
        The reply, or None when the call failed for good (counted in ``failed_calls``)."""
        started = time.perf_counter()
        for attempt in range(2):
            stub = self._stub
            try:
                reply = await send(stub)
            except grpc.aio.AioRpcError as error:
                self._counts.error(call, error)
                gone = classify(*status_and_code(error), error_from_rpc(error)) is Failure.GONE
                if attempt == 0 and gone and self._move_on(stub):
                    self._counts.retried_calls[call] += 1
                    continue
                self._counts.failed_calls[call] += 1
                return None
            self._counts.latency(call, started)
            return reply
        return None  # not reached: the second attempt returns either way

    async def _route(self) -> None:
        session, request = new_session_id(), new_request_id()
        query = route_query_to_proto(RouteQuery(MODEL, session_id=session, request_id=request))
        reply = await self._call("choose_route", lambda stub: stub.ChooseRoute(query, timeout=GATEWAY_CALL_TIMEOUT_S))
        if reply is not None:
            self._routed.append((session, request, route_from_proto(reply)))

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
            billing_units=tokens / 1000,
            started_at=now - 2.0,
            finished_at=now,
            session_id=session,  # type: ignore[arg-type]
        )
        message = work_to_proto(record)
        reply = await self._call("report_work", lambda stub: stub.ReportWork(message, timeout=GATEWAY_CALL_TIMEOUT_S))
        if reply is not None:
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
        await asyncio.gather(*(channel.close() for channel in self._channels))
