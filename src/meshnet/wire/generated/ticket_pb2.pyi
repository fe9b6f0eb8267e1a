from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RouteTicketBody(_message.Message):
    __slots__ = ("session_id", "request_id", "hops", "epoch", "fingerprint", "issued_at_unix_ms", "expires_at_unix_ms", "holder_node_id")
    class Hop(_message.Message):
        __slots__ = ("node_id", "address", "layer_start", "layer_stop")
        NODE_ID_FIELD_NUMBER: _ClassVar[int]
        ADDRESS_FIELD_NUMBER: _ClassVar[int]
        LAYER_START_FIELD_NUMBER: _ClassVar[int]
        LAYER_STOP_FIELD_NUMBER: _ClassVar[int]
        node_id: str
        address: str
        layer_start: int
        layer_stop: int
        def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., layer_start: _Optional[int] = ..., layer_stop: _Optional[int] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    HOPS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    ISSUED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    HOLDER_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    request_id: str
    hops: _containers.RepeatedCompositeFieldContainer[RouteTicketBody.Hop]
    epoch: int
    fingerprint: str
    issued_at_unix_ms: int
    expires_at_unix_ms: int
    holder_node_id: str
    def __init__(self, session_id: _Optional[str] = ..., request_id: _Optional[str] = ..., hops: _Optional[_Iterable[_Union[RouteTicketBody.Hop, _Mapping]]] = ..., epoch: _Optional[int] = ..., fingerprint: _Optional[str] = ..., issued_at_unix_ms: _Optional[int] = ..., expires_at_unix_ms: _Optional[int] = ..., holder_node_id: _Optional[str] = ...) -> None: ...

class RouteTicket(_message.Message):
    __slots__ = ("body", "signature", "signer_certificate")
    BODY_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    SIGNER_CERTIFICATE_FIELD_NUMBER: _ClassVar[int]
    body: bytes
    signature: bytes
    signer_certificate: bytes
    def __init__(self, body: _Optional[bytes] = ..., signature: _Optional[bytes] = ..., signer_certificate: _Optional[bytes] = ...) -> None: ...
