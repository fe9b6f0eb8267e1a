from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AttachHello(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class RelayEvent(_message.Message):
    __slots__ = ("attached", "open")
    ATTACHED_FIELD_NUMBER: _ClassVar[int]
    OPEN_FIELD_NUMBER: _ClassVar[int]
    attached: Attached
    open: ConnectionOpen
    def __init__(self, attached: _Optional[_Union[Attached, _Mapping]] = ..., open: _Optional[_Union[ConnectionOpen, _Mapping]] = ...) -> None: ...

class Attached(_message.Message):
    __slots__ = ("address",)
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    address: str
    def __init__(self, address: _Optional[str] = ...) -> None: ...

class ConnectionOpen(_message.Message):
    __slots__ = ("connection", "dialer_node_id")
    CONNECTION_FIELD_NUMBER: _ClassVar[int]
    DIALER_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    connection: int
    dialer_node_id: str
    def __init__(self, connection: _Optional[int] = ..., dialer_node_id: _Optional[str] = ...) -> None: ...

class RelayChunk(_message.Message):
    __slots__ = ("data", "target", "connection")
    DATA_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    CONNECTION_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    target: str
    connection: int
    def __init__(self, data: _Optional[bytes] = ..., target: _Optional[str] = ..., connection: _Optional[int] = ...) -> None: ...

class RelayLoadRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RelayLoad(_message.Message):
    __slots__ = ("attached_nodes", "open_connections", "bytes_to_nodes", "bytes_from_nodes", "refused")
    ATTACHED_NODES_FIELD_NUMBER: _ClassVar[int]
    OPEN_CONNECTIONS_FIELD_NUMBER: _ClassVar[int]
    BYTES_TO_NODES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FROM_NODES_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    attached_nodes: int
    open_connections: int
    bytes_to_nodes: int
    bytes_from_nodes: int
    refused: int
    def __init__(self, attached_nodes: _Optional[int] = ..., open_connections: _Optional[int] = ..., bytes_to_nodes: _Optional[int] = ..., bytes_from_nodes: _Optional[int] = ..., refused: _Optional[int] = ...) -> None: ...
