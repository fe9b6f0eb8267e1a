from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ArtifactFetchRequest(_message.Message):
    __slots__ = ("artifact_sha256", "offset", "length", "max_chunk_bytes")
    ARTIFACT_SHA256_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    MAX_CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    artifact_sha256: str
    offset: int
    length: int
    max_chunk_bytes: int
    def __init__(self, artifact_sha256: _Optional[str] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ..., max_chunk_bytes: _Optional[int] = ...) -> None: ...

class ArtifactChunk(_message.Message):
    __slots__ = ("offset", "data", "crc32")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    CRC32_FIELD_NUMBER: _ClassVar[int]
    offset: int
    data: bytes
    crc32: int
    def __init__(self, offset: _Optional[int] = ..., data: _Optional[bytes] = ..., crc32: _Optional[int] = ...) -> None: ...

class ArtifactAdvertisement(_message.Message):
    __slots__ = ("holder_id", "address", "artifacts", "manifests")
    class HeldManifest(_message.Message):
        __slots__ = ("model_id", "manifest_sha256")
        MODEL_ID_FIELD_NUMBER: _ClassVar[int]
        MANIFEST_SHA256_FIELD_NUMBER: _ClassVar[int]
        model_id: str
        manifest_sha256: str
        def __init__(self, model_id: _Optional[str] = ..., manifest_sha256: _Optional[str] = ...) -> None: ...
    HOLDER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ARTIFACTS_FIELD_NUMBER: _ClassVar[int]
    MANIFESTS_FIELD_NUMBER: _ClassVar[int]
    holder_id: str
    address: str
    artifacts: _containers.RepeatedScalarFieldContainer[str]
    manifests: _containers.RepeatedCompositeFieldContainer[ArtifactAdvertisement.HeldManifest]
    def __init__(self, holder_id: _Optional[str] = ..., address: _Optional[str] = ..., artifacts: _Optional[_Iterable[str]] = ..., manifests: _Optional[_Iterable[_Union[ArtifactAdvertisement.HeldManifest, _Mapping]]] = ...) -> None: ...

class ArtifactAdvertisementAck(_message.Message):
    __slots__ = ("ttl_ms", "interval_ms")
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    ttl_ms: int
    interval_ms: int
    def __init__(self, ttl_ms: _Optional[int] = ..., interval_ms: _Optional[int] = ...) -> None: ...

class FindHoldersRequest(_message.Message):
    __slots__ = ("model_id", "artifacts")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    ARTIFACTS_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    artifacts: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, model_id: _Optional[str] = ..., artifacts: _Optional[_Iterable[str]] = ...) -> None: ...

class FindHoldersReply(_message.Message):
    __slots__ = ("holders", "manifest_sha256")
    class Holder(_message.Message):
        __slots__ = ("holder_id", "address", "artifacts")
        HOLDER_ID_FIELD_NUMBER: _ClassVar[int]
        ADDRESS_FIELD_NUMBER: _ClassVar[int]
        ARTIFACTS_FIELD_NUMBER: _ClassVar[int]
        holder_id: str
        address: str
        artifacts: _containers.RepeatedScalarFieldContainer[str]
        def __init__(self, holder_id: _Optional[str] = ..., address: _Optional[str] = ..., artifacts: _Optional[_Iterable[str]] = ...) -> None: ...
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_SHA256_FIELD_NUMBER: _ClassVar[int]
    holders: _containers.RepeatedCompositeFieldContainer[FindHoldersReply.Holder]
    manifest_sha256: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, holders: _Optional[_Iterable[_Union[FindHoldersReply.Holder, _Mapping]]] = ..., manifest_sha256: _Optional[_Iterable[str]] = ...) -> None: ...
