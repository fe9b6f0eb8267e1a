from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ExpertRowsFrame(_message.Message):
    __slots__ = ("sender", "frame", "model_sha256")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    FRAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_SHA256_FIELD_NUMBER: _ClassVar[int]
    sender: int
    frame: bytes
    model_sha256: str
    def __init__(self, sender: _Optional[int] = ..., frame: _Optional[bytes] = ..., model_sha256: _Optional[str] = ...) -> None: ...

class ExpertStepInput(_message.Message):
    __slots__ = ("slot", "position", "tokens", "want_logits")
    SLOT_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    WANT_LOGITS_FIELD_NUMBER: _ClassVar[int]
    slot: int
    position: int
    tokens: _containers.RepeatedScalarFieldContainer[int]
    want_logits: str
    def __init__(self, slot: _Optional[int] = ..., position: _Optional[int] = ..., tokens: _Optional[_Iterable[int]] = ..., want_logits: _Optional[str] = ...) -> None: ...

class ExpertStepRequest(_message.Message):
    __slots__ = ("step", "inputs")
    STEP_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    step: int
    inputs: _containers.RepeatedCompositeFieldContainer[ExpertStepInput]
    def __init__(self, step: _Optional[int] = ..., inputs: _Optional[_Iterable[_Union[ExpertStepInput, _Mapping]]] = ...) -> None: ...

class ExpertStepLogits(_message.Message):
    __slots__ = ("slot", "rows", "logits", "crc32")
    SLOT_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    LOGITS_FIELD_NUMBER: _ClassVar[int]
    CRC32_FIELD_NUMBER: _ClassVar[int]
    slot: int
    rows: int
    logits: bytes
    crc32: int
    def __init__(self, slot: _Optional[int] = ..., rows: _Optional[int] = ..., logits: _Optional[bytes] = ..., crc32: _Optional[int] = ...) -> None: ...

class ExpertStepReply(_message.Message):
    __slots__ = ("step", "outputs")
    STEP_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    step: int
    outputs: _containers.RepeatedCompositeFieldContainer[ExpertStepLogits]
    def __init__(self, step: _Optional[int] = ..., outputs: _Optional[_Iterable[_Union[ExpertStepLogits, _Mapping]]] = ...) -> None: ...

class ExpertReleaseRequest(_message.Message):
    __slots__ = ("slot",)
    SLOT_FIELD_NUMBER: _ClassVar[int]
    slot: int
    def __init__(self, slot: _Optional[int] = ...) -> None: ...

class ExpertReleaseReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ExpertNodeQuery(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ExpertNodeInfo(_message.Message):
    __slots__ = ("index", "group_size", "model_sha256", "n_vocab", "n_expert", "n_expert_used", "max_sessions", "context", "peers_connected", "n_layers", "n_embd", "exchanges", "exchange_p50_us", "exchange_p95_us", "frame_bytes_sent", "released_expert_bytes", "next_step", "expert_cache_bytes", "expert_cache_hits", "expert_cache_misses", "expert_cache_bytes_read", "numerics")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    MODEL_SHA256_FIELD_NUMBER: _ClassVar[int]
    N_VOCAB_FIELD_NUMBER: _ClassVar[int]
    N_EXPERT_FIELD_NUMBER: _ClassVar[int]
    N_EXPERT_USED_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    PEERS_CONNECTED_FIELD_NUMBER: _ClassVar[int]
    N_LAYERS_FIELD_NUMBER: _ClassVar[int]
    N_EMBD_FIELD_NUMBER: _ClassVar[int]
    EXCHANGES_FIELD_NUMBER: _ClassVar[int]
    EXCHANGE_P50_US_FIELD_NUMBER: _ClassVar[int]
    EXCHANGE_P95_US_FIELD_NUMBER: _ClassVar[int]
    FRAME_BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    RELEASED_EXPERT_BYTES_FIELD_NUMBER: _ClassVar[int]
    NEXT_STEP_FIELD_NUMBER: _ClassVar[int]
    EXPERT_CACHE_BYTES_FIELD_NUMBER: _ClassVar[int]
    EXPERT_CACHE_HITS_FIELD_NUMBER: _ClassVar[int]
    EXPERT_CACHE_MISSES_FIELD_NUMBER: _ClassVar[int]
    EXPERT_CACHE_BYTES_READ_FIELD_NUMBER: _ClassVar[int]
    NUMERICS_FIELD_NUMBER: _ClassVar[int]
    index: int
    group_size: int
    model_sha256: str
    n_vocab: int
    n_expert: int
    n_expert_used: int
    max_sessions: int
    context: int
    peers_connected: int
    n_layers: int
    n_embd: int
    exchanges: int
    exchange_p50_us: float
    exchange_p95_us: float
    frame_bytes_sent: int
    released_expert_bytes: int
    next_step: int
    expert_cache_bytes: int
    expert_cache_hits: int
    expert_cache_misses: int
    expert_cache_bytes_read: int
    numerics: ExpertNumerics
    def __init__(self, index: _Optional[int] = ..., group_size: _Optional[int] = ..., model_sha256: _Optional[str] = ..., n_vocab: _Optional[int] = ..., n_expert: _Optional[int] = ..., n_expert_used: _Optional[int] = ..., max_sessions: _Optional[int] = ..., context: _Optional[int] = ..., peers_connected: _Optional[int] = ..., n_layers: _Optional[int] = ..., n_embd: _Optional[int] = ..., exchanges: _Optional[int] = ..., exchange_p50_us: _Optional[float] = ..., exchange_p95_us: _Optional[float] = ..., frame_bytes_sent: _Optional[int] = ..., released_expert_bytes: _Optional[int] = ..., next_step: _Optional[int] = ..., expert_cache_bytes: _Optional[int] = ..., expert_cache_hits: _Optional[int] = ..., expert_cache_misses: _Optional[int] = ..., expert_cache_bytes_read: _Optional[int] = ..., numerics: _Optional[_Union[ExpertNumerics, _Mapping]] = ...) -> None: ...

class ExpertNumerics(_message.Message):
    __slots__ = ("prefill_chunk", "flash_attn", "repack")
    PREFILL_CHUNK_FIELD_NUMBER: _ClassVar[int]
    FLASH_ATTN_FIELD_NUMBER: _ClassVar[int]
    REPACK_FIELD_NUMBER: _ClassVar[int]
    prefill_chunk: int
    flash_attn: bool
    repack: bool
    def __init__(self, prefill_chunk: _Optional[int] = ..., flash_attn: _Optional[bool] = ..., repack: _Optional[bool] = ...) -> None: ...
