"""Error <-> gRPC status mapping, unit-level and over a real loopback Shard service."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import pytest
from protocol_samples import LIMITS, hidden_frame, token_frame

from meshnet.core.errors import (
    ArtifactError,
    CacheMiss,
    Cancelled,
    CertificationFailed,
    DeadlineExceeded,
    EngineError,
    FailedPrecondition,
    IntegrityError,
    InvalidArgument,
    MeshnetError,
    NoRoute,
    ResourceExhausted,
    RouteStale,
    StorageDamaged,
    StorageUnavailable,
    TrackerBusy,
    Unavailable,
    Unreachable,
    UnsupportedArchitecture,
)
from meshnet.core.ids import SessionId
from meshnet.wire.frames import StepResult
from meshnet.wire.generated import shard_pb2 as pb
from meshnet.wire.generated import shard_pb2_grpc as pb_grpc
from meshnet.wire.shard_wire import (
    frame_from_proto,
    frame_to_proto,
    result_from_proto,
    result_to_proto,
)
from meshnet.wire.status import (
    ERROR_CODE_KEY,
    RETRY_AFTER_KEY,
    RETRYABLE_KEY,
    abort_with,
    error_from_rpc,
    error_metadata,
    status_for,
)

S = grpc.StatusCode
CONTRACT = [
    (InvalidArgument, S.INVALID_ARGUMENT),
    (ArtifactError, S.INVALID_ARGUMENT),
    (UnsupportedArchitecture, S.INVALID_ARGUMENT),
    (IntegrityError, S.DATA_LOSS),
    (FailedPrecondition, S.FAILED_PRECONDITION),
    (RouteStale, S.FAILED_PRECONDITION),
    (ResourceExhausted, S.RESOURCE_EXHAUSTED),
    (CacheMiss, S.NOT_FOUND),
    (Unavailable, S.UNAVAILABLE),
    (NoRoute, S.UNAVAILABLE),
    (StorageUnavailable, S.UNAVAILABLE),  # a full disk is "retry", never a refusal (issue 29, #8)
    (StorageDamaged, S.DATA_LOSS),
    (DeadlineExceeded, S.DEADLINE_EXCEEDED),
    (Cancelled, S.CANCELLED),
    (CertificationFailed, S.INTERNAL),
    (EngineError, S.INTERNAL),
    (MeshnetError, S.INTERNAL),
]


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str, metadata: Any = ()) -> None:
        self._code, self._details, self._metadata = code, details, metadata

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> Any:
        return self._metadata


@pytest.mark.parametrize(("error_type", "status"), CONTRACT)
def test_status_contract_and_round_trip(error_type: type[MeshnetError], status: grpc.StatusCode) -> None:
    error = error_type("what went wrong")
    assert status_for(error) == status
    metadata = error_metadata(error)
    assert dict(metadata) == {ERROR_CODE_KEY: error.code, RETRYABLE_KEY: "true" if error.retryable else "false"}
    rebuilt = error_from_rpc(FakeRpcError(status, "what went wrong", metadata))
    assert type(rebuilt) is error_type
    assert rebuilt.message == "what went wrong"
    assert rebuilt.retryable == error.retryable


@pytest.mark.parametrize(
    ("status", "error_type"),
    [
        (S.DEADLINE_EXCEEDED, DeadlineExceeded),
        (S.UNAVAILABLE, Unavailable),
        # A peer that stops ends its calls CANCELLED: the caller lost it (its own cancel raises
        # asyncio.CancelledError instead; test_a_stopping_peer_is_a_lost_worker_...).
        (S.CANCELLED, Unavailable),
        (S.RESOURCE_EXHAUSTED, ResourceExhausted),
        (S.DATA_LOSS, IntegrityError),
        (S.UNKNOWN, MeshnetError),
        (S.UNIMPLEMENTED, MeshnetError),
    ],
)
def test_library_statuses_without_metadata(status: grpc.StatusCode, error_type: type[MeshnetError]) -> None:
    rebuilt = error_from_rpc(FakeRpcError(status, ""))
    assert type(rebuilt) is error_type
    assert status.name in rebuilt.message


def test_unknown_code_from_a_newer_peer_falls_back_to_the_status() -> None:
    metadata = ((ERROR_CODE_KEY, b"quantum_flux"), (RETRYABLE_KEY, b"true"))
    rebuilt = error_from_rpc(FakeRpcError(S.NOT_FOUND, "gone", metadata))
    assert type(rebuilt) is CacheMiss


def test_bare_rpc_error_becomes_a_meshnet_error() -> None:
    assert type(error_from_rpc(grpc.RpcError())) is MeshnetError


class RecordingContext:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    async def abort(self, code: grpc.StatusCode, details: str, trailing_metadata: Any = ()) -> None:
        self.calls.append((code, details, tuple(trailing_metadata)))
        raise grpc.aio.AbortError()


async def test_abort_with_sends_status_message_and_metadata() -> None:
    context = RecordingContext()
    with pytest.raises(grpc.aio.AbortError):
        await abort_with(context, RouteStale("epoch 3 < 4"))
    assert context.calls == [
        (S.FAILED_PRECONDITION, "epoch 3 < 4", ((ERROR_CODE_KEY, "route_stale"), (RETRYABLE_KEY, "true")))
    ]


# --- over a real loopback server ------------------------------------------------------------------


class EchoShard(pb_grpc.ShardServicer):
    """A thin servicer in the worker's style: decode, act, encode, abort with typed errors."""

    async def Session(
        self, request_iterator: AsyncIterator[pb.StepRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.StepResponse]:
        async for message in request_iterator:
            try:
                frame = frame_from_proto(message, LIMITS)
            except MeshnetError as error:
                await abort_with(context, error)
            token = int(frame.tokens[-1]) if frame.tokens is not None else 7
            yield result_to_proto(
                StepResult(frame.meta.session_id, frame.meta.step, frame.meta.position + frame.n_tokens, token)
            )

    async def Release(self, request: pb.ReleaseRequest, context: grpc.aio.ServicerContext) -> pb.ReleaseResponse:
        await asyncio.sleep(1.0)  # slow on purpose: the caller's deadline must fire first
        return pb.ReleaseResponse(freed=True)

    async def Cancel(self, request: pb.CancelRequest, context: grpc.aio.ServicerContext) -> pb.CancelResponse:
        await abort_with(context, CacheMiss(f"no session {request.session_id}"))


@pytest.fixture
async def shard_stub() -> AsyncIterator[pb_grpc.ShardStub]:
    options = [("grpc.max_receive_message_length", LIMITS.max_frame_bytes)]
    server = grpc.aio.server(options=options)
    pb_grpc.add_ShardServicer_to_server(EchoShard(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield pb_grpc.ShardStub(channel)
    finally:
        await channel.close()
        await server.stop(grace=None)


async def test_session_stream_answers_then_fails_with_a_typed_error(
    shard_stub: pb_grpc.ShardStub,
) -> None:
    call = shard_stub.Session()
    await call.write(frame_to_proto(token_frame((3, 4, 5))))
    result = result_from_proto(await call.read())
    assert (result.session_id, result.next_position, result.token_id) == (SessionId("s-1"), 3, 5)

    damaged = frame_to_proto(hidden_frame(opening=False, cache="continue", position=3, step=1))
    damaged.header.checksum ^= 0xFF
    await call.write(damaged)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call.read()
    assert caught.value.code() == S.DATA_LOSS
    error = error_from_rpc(caught.value)
    assert isinstance(error, IntegrityError) and "checksum" in error.message


async def test_frame_over_the_transport_limit_is_resource_exhausted(
    shard_stub: pb_grpc.ShardStub,
) -> None:
    message = frame_to_proto(hidden_frame())
    message.hidden.tensors[0].fragments.append(bytes(LIMITS.max_frame_bytes))
    call = shard_stub.Session()
    await call.write(message)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call.read()
    assert type(error_from_rpc(caught.value)) is ResourceExhausted


async def test_cache_miss_and_deadline_cross_the_wire(shard_stub: pb_grpc.ShardStub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await shard_stub.Cancel(pb.CancelRequest(session_id="s-404"))
    error = error_from_rpc(caught.value)
    assert type(error) is CacheMiss and error.retryable and "s-404" in error.message
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await shard_stub.Release(pb.ReleaseRequest(session_id="s-1"), timeout=0.05)
    assert type(error_from_rpc(caught.value)) is DeadlineExceeded


def test_a_control_plane_that_cannot_be_reached_is_unreachable_not_a_lost_worker() -> None:
    # The tracker client asks for Unreachable when the library itself says UNAVAILABLE (README:
    # an unreachable tracker is `[unreachable]`); what the tracker answers keeps its own type.
    refused = FakeRpcError(S.UNAVAILABLE, "failed to connect to all addresses")
    assert type(error_from_rpc(refused, unreachable=Unreachable)) is Unreachable
    assert type(error_from_rpc(refused)) is Unavailable  # a shard's peer: a lost worker
    for answered in (NoRoute("no route"), Unavailable("storage")):
        rebuilt = error_from_rpc(FakeRpcError(S.UNAVAILABLE, "x", error_metadata(answered)), unreachable=Unreachable)
        assert type(rebuilt) is type(answered)


async def test_only_our_own_cancel_is_a_cancellation() -> None:
    # The expert-parallel flake: a CANCELLED the peer ended a call with reached the client as a
    # cancellation it never asked for ([cancelled]) instead of a lost worker. grpc.aio raises
    # asyncio.CancelledError, never an RpcError, for a call our side cancelled, so an RpcError
    # CANCELLED without our metadata is always the peer's.
    server = grpc.aio.server()
    pb_grpc.add_ShardServicer_to_server(EchoShard(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            ours = pb_grpc.ShardStub(channel).Release(pb.ReleaseRequest(session_id="s-1"), timeout=5)
            await asyncio.sleep(0.05)
            ours.cancel()
            with pytest.raises(asyncio.CancelledError):
                await ours
    finally:
        await server.stop(grace=None)
    theirs = FakeRpcError(S.CANCELLED, "CANCELLED")
    assert type(error_from_rpc(theirs)) is Unavailable
    assert type(error_from_rpc(theirs, unreachable=Unreachable)) is Unreachable
    deliberate = FakeRpcError(S.CANCELLED, "client gone", error_metadata(Cancelled("client gone")))
    assert type(error_from_rpc(deliberate)) is Cancelled


def test_a_busy_tracker_s_retry_hint_crosses_the_wire_and_is_bounded() -> None:
    busy = TrackerBusy("shedding probes", retry_after_s=2.5)
    rebuilt = error_from_rpc(FakeRpcError(S.RESOURCE_EXHAUSTED, "shedding probes", error_metadata(busy)))
    assert type(rebuilt) is TrackerBusy and rebuilt.retry_after_s == 2.5 and rebuilt.retryable
    hostile = ((ERROR_CODE_KEY, b"tracker_busy"), (RETRY_AFTER_KEY, b"99999999"))
    assert error_from_rpc(FakeRpcError(S.RESOURCE_EXHAUSTED, "x", hostile)).retry_after_s == 60.0
    garbled = ((ERROR_CODE_KEY, b"tracker_busy"), (RETRY_AFTER_KEY, b"soon"))
    assert error_from_rpc(FakeRpcError(S.RESOURCE_EXHAUSTED, "x", garbled)).retry_after_s == 1.0
    # Without our metadata a RESOURCE_EXHAUSTED stays the generic refusal (a message over the limit).
    assert type(error_from_rpc(FakeRpcError(S.RESOURCE_EXHAUSTED, ""))) is ResourceExhausted
