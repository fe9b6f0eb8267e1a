from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Recipe(_message.Message):
    __slots__ = ("model_sha256", "architecture", "adapter_version", "weight_quantization", "activation_dtype", "kv_dtype", "backend", "backend_version", "n_layers", "n_embd", "boundary_schema", "device_class")
    MODEL_SHA256_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_QUANTIZATION_FIELD_NUMBER: _ClassVar[int]
    ACTIVATION_DTYPE_FIELD_NUMBER: _ClassVar[int]
    KV_DTYPE_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    BACKEND_VERSION_FIELD_NUMBER: _ClassVar[int]
    N_LAYERS_FIELD_NUMBER: _ClassVar[int]
    N_EMBD_FIELD_NUMBER: _ClassVar[int]
    BOUNDARY_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    DEVICE_CLASS_FIELD_NUMBER: _ClassVar[int]
    model_sha256: str
    architecture: str
    adapter_version: str
    weight_quantization: str
    activation_dtype: str
    kv_dtype: str
    backend: str
    backend_version: str
    n_layers: int
    n_embd: int
    boundary_schema: str
    device_class: str
    def __init__(self, model_sha256: _Optional[str] = ..., architecture: _Optional[str] = ..., adapter_version: _Optional[str] = ..., weight_quantization: _Optional[str] = ..., activation_dtype: _Optional[str] = ..., kv_dtype: _Optional[str] = ..., backend: _Optional[str] = ..., backend_version: _Optional[str] = ..., n_layers: _Optional[int] = ..., n_embd: _Optional[int] = ..., boundary_schema: _Optional[str] = ..., device_class: _Optional[str] = ...) -> None: ...

class Hardware(_message.Message):
    __slots__ = ("cpu_count", "memory_bytes")
    CPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    cpu_count: int
    memory_bytes: int
    def __init__(self, cpu_count: _Optional[int] = ..., memory_bytes: _Optional[int] = ...) -> None: ...

class NodeCapability(_message.Message):
    __slots__ = ("n_ctx_per_session", "prefill_chunk_tokens", "max_tokens_per_frame", "max_frame_bytes", "n_embd", "max_sessions", "device", "prefill_tokens_per_s", "decode_tokens_per_s", "device_name", "device_memory_total", "device_memory_free", "drift", "prefix_cache_bytes", "features")
    N_CTX_PER_SESSION_FIELD_NUMBER: _ClassVar[int]
    PREFILL_CHUNK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_PER_FRAME_FIELD_NUMBER: _ClassVar[int]
    MAX_FRAME_BYTES_FIELD_NUMBER: _ClassVar[int]
    N_EMBD_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    DECODE_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    DEVICE_NAME_FIELD_NUMBER: _ClassVar[int]
    DEVICE_MEMORY_TOTAL_FIELD_NUMBER: _ClassVar[int]
    DEVICE_MEMORY_FREE_FIELD_NUMBER: _ClassVar[int]
    DRIFT_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_BYTES_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    n_ctx_per_session: int
    prefill_chunk_tokens: int
    max_tokens_per_frame: int
    max_frame_bytes: int
    n_embd: int
    max_sessions: int
    device: str
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    device_name: str
    device_memory_total: int
    device_memory_free: int
    drift: DeviceDrift
    prefix_cache_bytes: int
    features: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, n_ctx_per_session: _Optional[int] = ..., prefill_chunk_tokens: _Optional[int] = ..., max_tokens_per_frame: _Optional[int] = ..., max_frame_bytes: _Optional[int] = ..., n_embd: _Optional[int] = ..., max_sessions: _Optional[int] = ..., device: _Optional[str] = ..., prefill_tokens_per_s: _Optional[float] = ..., decode_tokens_per_s: _Optional[float] = ..., device_name: _Optional[str] = ..., device_memory_total: _Optional[int] = ..., device_memory_free: _Optional[int] = ..., drift: _Optional[_Union[DeviceDrift, _Mapping]] = ..., prefix_cache_bytes: _Optional[int] = ..., features: _Optional[_Iterable[str]] = ...) -> None: ...

class DeviceDrift(_message.Message):
    __slots__ = ("top1_agreement", "max_abs_logit_diff", "positions")
    TOP1_AGREEMENT_FIELD_NUMBER: _ClassVar[int]
    MAX_ABS_LOGIT_DIFF_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    top1_agreement: float
    max_abs_logit_diff: float
    positions: int
    def __init__(self, top1_agreement: _Optional[float] = ..., max_abs_logit_diff: _Optional[float] = ..., positions: _Optional[int] = ...) -> None: ...

class Certification(_message.Message):
    __slots__ = ("fingerprint", "backend_version", "checks", "whole_sha256", "split_sha256", "digest")
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    BACKEND_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    WHOLE_SHA256_FIELD_NUMBER: _ClassVar[int]
    SPLIT_SHA256_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    fingerprint: str
    backend_version: str
    checks: _containers.RepeatedScalarFieldContainer[str]
    whole_sha256: str
    split_sha256: str
    digest: str
    def __init__(self, fingerprint: _Optional[str] = ..., backend_version: _Optional[str] = ..., checks: _Optional[_Iterable[str]] = ..., whole_sha256: _Optional[str] = ..., split_sha256: _Optional[str] = ..., digest: _Optional[str] = ...) -> None: ...

class NodeRecord(_message.Message):
    __slots__ = ("address", "recipe", "fingerprint", "model", "quantization", "layer_start", "layer_stop", "hardware", "capability", "certification", "expert_group_nodes")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    RECIPE_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    QUANTIZATION_FIELD_NUMBER: _ClassVar[int]
    LAYER_START_FIELD_NUMBER: _ClassVar[int]
    LAYER_STOP_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATION_FIELD_NUMBER: _ClassVar[int]
    EXPERT_GROUP_NODES_FIELD_NUMBER: _ClassVar[int]
    address: str
    recipe: Recipe
    fingerprint: str
    model: str
    quantization: str
    layer_start: int
    layer_stop: int
    hardware: Hardware
    capability: NodeCapability
    certification: Certification
    expert_group_nodes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, address: _Optional[str] = ..., recipe: _Optional[_Union[Recipe, _Mapping]] = ..., fingerprint: _Optional[str] = ..., model: _Optional[str] = ..., quantization: _Optional[str] = ..., layer_start: _Optional[int] = ..., layer_stop: _Optional[int] = ..., hardware: _Optional[_Union[Hardware, _Mapping]] = ..., capability: _Optional[_Union[NodeCapability, _Mapping]] = ..., certification: _Optional[_Union[Certification, _Mapping]] = ..., expert_group_nodes: _Optional[_Iterable[str]] = ...) -> None: ...
