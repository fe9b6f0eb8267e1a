"""How every call of a ``TrackerClient`` reaches one of the tracker's replicas: the channels to
them, the one deadline of a call, failover to the next replica and the retry budget.

``membership.replicas`` decides (pure): which replica is asked, when a failure moves the client on
(its generation counter drops failures that arrive after another call already moved it), which
calls may be asked twice and how many retries the budget allows. This module carries those
decisions out over gRPC channels that follow certificate renewal (``membership.channel``);
``membership.tracker_client`` builds each call's request and reads its reply.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import grpc
import grpc.aio

from meshnet.core.errors import FailedPrecondition, MeshnetError, TrackerBusy, Unreachable
from meshnet.membership.channel import RenewingChannel
from meshnet.membership.replicas import (
    RETRIED_ON_NEXT_REPLICA,
    Failure,
    Position,
    ReplicaRing,
    RetryBudget,
    classify,
)
from meshnet.security.identity import TRACKER_NAME
from meshnet.wire import services
from meshnet.wire.status import error_from_rpc, status_and_code
from meshnet.wire.tls import LinkSecurity

logger = logging.getLogger(__name__)

StubT = TypeVar("StubT")


class Attempt(Protocol):
    """One try of a call at a replica, within what is left of its deadline (``TrackerFailover.failover``)."""

    async def __call__(self, at: Position, *, deadline: float, wait_for_ready: bool) -> Any: ...


DEFAULT_TIMEOUT_S = 5.0
RECONNECT_BACKOFF_MS = (100, 1000)
"""First and longest wait between attempts to reconnect to the tracker."""
KEEPALIVE_MS = (10_000, 5_000)
"""Ping every 10 s while a call is open, give up 5 s after an unanswered ping: a revocation watch
carries no data for hours and must still notice a tracker that vanished (the tracker's
``SERVER_OPTIONS`` accept these pings)."""

RETRY_FLOOR_S = 0.1
"""Below this much of its deadline left, a call lost with its replica is not asked again: the
next replica could not be dialled and answer in time."""

# gRPC retries a call transparently only under this policy. Only idempotent calls get one:
# ReportWork is keyed by request id, so a retry after a lost reply is stored once. UNAVAILABLE
# here can only be the transport, since the tracker answers UNAVAILABLE only to ChooseRoute.
# With several replicas the client fails over instead (``channel_options``): five attempts at a
# dead replica would spend a second before the next replica is asked.
_RETRY_POLICY = {
    "name": [
        {"service": services.TRACKER_SERVICE, "method": "ReportWork"},
        {"service": services.TRACKER_SERVICE, "method": "ListModels"},
        {"service": services.TRACKER_SERVICE, "method": "SuggestLayers"},
    ],
    "retryPolicy": {
        "maxAttempts": 5,
        "initialBackoff": "0.1s",
        "maxBackoff": "1s",
        "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"],
    },
}
_BASE_OPTIONS: list[tuple[str, Any]] = [
    # gRPC's default reconnect backoff grows toward 120 s; after a tracker restart every
    # worker must be back within a heartbeat or two, so retry the connection briskly.
    ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[0]),
    ("grpc.min_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[0]),
    ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[1]),
    ("grpc.keepalive_time_ms", KEEPALIVE_MS[0]),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_MS[1]),
    # Measured on grpc 1.85 with a frozen (SIGSTOPped) tracker under an open watch: by default
    # only 2 pings go out while no data flows (the watch then went unnoticed for 90 s and more),
    # and a ping waits ``ping_timeout_ms`` (60 s), not the keepalive timeout (69 s); with both
    # set, the watch ended 13 s after the freeze.
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.http2.ping_timeout_ms", KEEPALIVE_MS[1]),
]


def channel_options(replicas: int) -> list[tuple[str, Any]]:
    """The options of a channel to one of ``replicas`` replicas: gRPC's own retries only when
    there is no other replica to fail over to."""
    if replicas > 1:
        return [("grpc.enable_retries", 0), *_BASE_OPTIONS]
    config = json.dumps({"methodConfig": [_RETRY_POLICY]})
    return [("grpc.service_config", config), ("grpc.enable_retries", 1), *_BASE_OPTIONS]


class TrackerFailover:
    """The channels to one tracker's replicas, and how each call crosses them.

    ``address`` is one tracker (``host:port``) or its replicas (``a:7070,b:7070``,
    ``membership.replicas``), asked in the order ``client_key`` ranks them (None: as listed):
    calls go to the replica that last answered, and a call lost with its replica moves the
    client to the next one, where it is asked once more if that is safe
    (``RETRIED_ON_NEXT_REPLICA``) and the ``budget`` allows, within what is left of the call's
    one deadline (``timeout_s`` unless the call names its own). ``InvalidArgument`` for a
    malformed list; ``FailedPrecondition`` for a call after ``close``. ``clock`` (monotonic
    seconds) is injected by tests."""

    def __init__(
        self,
        address: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        security: LinkSecurity | None = None,
        budget: RetryBudget | None = None,
        clock: Callable[[], float] = time.monotonic,
        client_key: str | None = None,
    ) -> None:
        self._timeout_s = timeout_s
        self._security = security
        self._replicas = ReplicaRing(address, client_key=client_key)
        self._options = channel_options(len(self._replicas))
        self._budget = budget or RetryBudget()
        self._clock = clock
        self._closed = False
        # One channel per replica, opened when first asked: most clients never leave their first.
        self._channels: dict[int, RenewingChannel] = {}

    @property
    def address(self) -> str:
        """The replica asked now (the one that last answered)."""
        return self._replicas.addresses[self._replicas.current]

    @property
    def addresses(self) -> tuple[str, ...]:
        """Every replica, as listed."""
        return self._replicas.addresses

    @property
    def order(self) -> tuple[str, ...]:
        """Every replica, in the order this client tries them."""
        return tuple(self._replicas.addresses[index] for index in self._replicas.order)

    def position(self) -> Position:
        """The replica asked now and the ring's generation, for a call about to be sent there."""
        return self._replicas.position()

    def answered(self, at: Position) -> None:
        """A call at ``at`` got its answer (its replica's deadline strikes are forgiven)."""
        self._replicas.answered(at)

    def remaining(self, deadline: float) -> float:
        """Seconds left before ``deadline`` (never below zero)."""
        return max(deadline - self._clock(), 0.0)

    async def close(self) -> None:
        """Close every channel; any later call raises ``FailedPrecondition`` (never reopens one)."""
        self._closed = True
        channels, self._channels = list(self._channels.values()), {}
        await asyncio.gather(*(channel.close() for channel in channels))

    def channel(self, index: int) -> RenewingChannel:
        """The channel to replica ``index``, opened now if it never was."""
        if self._closed:
            raise FailedPrecondition(f"tracker client for {','.join(self.addresses)} is closed")
        channel = self._channels.get(index)
        if channel is None:
            address = self._replicas.addresses[index]
            channel = self._channels[index] = RenewingChannel(address, self._security, TRACKER_NAME, self._options)
        return channel

    def stub(self, index: int, make: Callable[[grpc.aio.Channel], StubT]) -> StubT:
        return self.channel(index).stub(make)

    async def call(
        self, make: Callable[[grpc.aio.Channel], Any], method: str, request: Any, timeout_s: float | None
    ) -> Any:
        """``method`` of the stub ``make`` builds, on the replica asked now; once more on the
        next replica when the first is gone, the call is safe to repeat, the retry budget has
        one and enough of the call's one deadline is left."""
        return await self.failover(
            method, functools.partial(self.attempt, make=make, method=method, request=request), timeout_s
        )

    async def failover(self, method: str, attempt: Attempt, timeout_s: float | None) -> Any:
        """``attempt`` at the replica asked now, then as ``call`` says at the next one."""
        deadline = self._clock() + (timeout_s or self._timeout_s)
        self._budget.earn()
        at = self._replicas.position()
        try:
            return await attempt(at, deadline=deadline, wait_for_ready=False)
        except AttemptFailed as failed:
            moved = self.failed(at, failed.failure, failed.error) or self._replicas.elsewhere(at)
            if not (moved and self._may_retry(method, failed.failure, deadline)):
                raise failed.error from failed.__cause__
        following = self._replicas.position()
        try:
            return await attempt(following, deadline=deadline, wait_for_ready=True)
        except AttemptFailed as failed:
            self.failed(following, failed.failure, failed.error)
            raise failed.error from failed.__cause__

    def _may_retry(self, method: str, failure: Failure, deadline: float) -> bool:
        return (
            failure is Failure.GONE
            and method in RETRIED_ON_NEXT_REPLICA
            and deadline - self._clock() >= RETRY_FLOOR_S
            and self._budget.spend()
        )

    async def attempt(
        self,
        at: Position,
        *,
        make: Callable[[grpc.aio.Channel], Any],
        method: str,
        request: Any,
        deadline: float,
        wait_for_ready: bool,
    ) -> Any:
        """One try at ``at``, within what is left of ``deadline``. A retry waits for its channel
        to connect (TCP and TLS to a replica not asked before) inside that time rather than
        failing at once on a channel still connecting."""
        channel = self.channel(at.index)
        call = getattr(channel.stub(make), method)
        try:
            reply = await call(request, timeout=self.remaining(deadline), wait_for_ready=wait_for_ready)
        except grpc.RpcError as rpc_error:
            error, failure = self.error(rpc_error, at.index)
            raise AttemptFailed(error, unreached(failure, channel, wait_for_ready)) from rpc_error
        self._replicas.answered(at)
        return reply

    def failed(self, at: Position, failure: Failure, error: MeshnetError) -> bool:
        """Note a failed call at ``at``; True when the client moved on (then the next replica's
        channel starts connecting now, before anything is asked of it)."""
        if not self._replicas.failed(at, failure):
            return False
        logger.warning(
            "tracker %s %s (%s); moving to %s",
            self._replicas.addresses[at.index],
            "lost" if failure is Failure.GONE else "too slow",
            error.message,
            self.address,
        )
        if not self._closed:
            self.channel(self._replicas.current).channel().get_state(try_to_connect=True)
        return True

    def error(self, rpc_error: grpc.RpcError, index: int) -> tuple[MeshnetError, Failure]:
        """The typed error ``rpc_error`` stands for, and what it says about replica ``index``."""
        error = error_from_rpc(rpc_error, unreachable=Unreachable)
        failure = classify(*status_and_code(rpc_error), error)
        return _with_context(error, f"tracker {self._replicas.addresses[index]}: {error.message}"), failure


def unreached(failure: Failure, channel: RenewingChannel, wait_for_ready: bool) -> Failure:
    """A retry that ran out of time never having reached its replica found it gone, not slow."""
    if failure is Failure.SLOW and wait_for_ready and channel.channel().get_state() != grpc.ChannelConnectivity.READY:
        return Failure.GONE
    return failure


class AttemptFailed(Exception):
    """One attempt's failure, judged: raised by an ``Attempt``, turned by ``TrackerFailover.failover``
    into ``error`` for the caller (it never leaves the tracker client)."""

    def __init__(self, error: MeshnetError, failure: Failure) -> None:
        super().__init__(error.message)
        self.error, self.failure = error, failure


def _with_context(error: MeshnetError, message: str) -> MeshnetError:
    if isinstance(error, TrackerBusy):  # keep the tracker's retry hint
        return TrackerBusy(message, error.retry_after_s)
    try:
        return type(error)(message)
    except TypeError:  # a subclass with a richer constructor: keep it as it is
        return error
