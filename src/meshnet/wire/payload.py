"""Payload codec: token ids and hidden-state bundles to and from protobuf, with crc32 checksums.

Used only by ``convert`` (the single conversion module). Decoding treats every message as hostile:
each size is checked against ``FrameLimits`` before any array is built, the checksum is verified
before the values are looked at, and hidden states are built zero-copy over the received bytes.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

import numpy as np

from meshnet.core.errors import IntegrityError, InvalidArgument, ResourceExhausted
from meshnet.wire.frames import BUNDLE_VERSION, HIDDEN_TENSOR, FrameLimits
from meshnet.wire.generated import shard_pb2 as pb

MAX_FRAGMENTS = 1024
"""More pieces than this is no longer a convenience for the sender but work for the receiver."""

_DTYPE_NAMES = {
    pb.DTYPE_FLOAT32: "float32",
    pb.DTYPE_FLOAT16: "float16",
    pb.DTYPE_BFLOAT16: "bfloat16",
    pb.DTYPE_INT32: "int32",
}
_FLOAT32_BY_ORDER = {pb.BYTE_ORDER_LITTLE: np.dtype("<f4"), pb.BYTE_ORDER_BIG: np.dtype(">f4")}
_LITTLE_INT32 = np.dtype("<i4")
_LITTLE_FLOAT32 = np.dtype("<f4")


def checksum(data: bytes | memoryview) -> int:
    """crc32 (zlib) of a payload's bytes: what FrameHeader.checksum carries."""
    return zlib.crc32(data)


def encode_tokens(tokens: np.ndarray) -> tuple[pb.TokenIds, int]:
    """Token ids -> (TokenIds, crc32 of their little-endian int32 bytes)."""
    # tokens: [n_tokens] int32
    little = np.ascontiguousarray(tokens, dtype=_LITTLE_INT32)
    return pb.TokenIds(ids=little.tolist()), zlib.crc32(little.data)


def decode_tokens(message: pb.TokenIds, limits: FrameLimits, expected_crc: int) -> np.ndarray:
    """TokenIds -> int32 ``[n_tokens]``, checked for count, checksum and range."""
    ids = message.ids
    count = len(ids)
    if count == 0:
        raise InvalidArgument("the frame holds no tokens")
    if count > limits.max_tokens_per_frame:
        raise InvalidArgument(
            f"the frame holds {count} tokens; at most {limits.max_tokens_per_frame} are allowed "
            "per frame (split the prefill into chunks)"
        )
    tokens = np.array(ids, dtype=_LITTLE_INT32)
    actual = zlib.crc32(tokens.data)
    if actual != expected_crc:
        raise IntegrityError(f"token checksum mismatch: header says {expected_crc:#010x}, payload is {actual:#010x}")
    low, high = int(tokens.min()), int(tokens.max())
    if low < 0:
        raise InvalidArgument(f"token id {low} is negative")
    if limits.vocab_size is not None and high >= limits.vocab_size:
        raise InvalidArgument(f"token id {high} is outside the vocabulary of {limits.vocab_size}")
    # Native int32 from here on (a no-op view on little-endian hosts).
    return tokens.astype(np.int32, copy=False)


def encode_hidden(hidden: np.ndarray) -> tuple[pb.TensorBundle, int]:
    """float32 ``[n_tokens, n_embd]`` -> (one-tensor bundle, crc32 of its bytes); one copy."""
    bundle = pb.TensorBundle()
    return bundle, write_hidden(bundle, hidden)


def write_hidden(bundle: pb.TensorBundle, hidden: np.ndarray) -> int:
    """Fill an empty ``bundle`` (a field of the frame being built) with float32 ``[n_tokens,
    n_embd]``; returns the crc32 of its bytes. In place: no bundle built apart and copied in."""
    little = np.ascontiguousarray(hidden, dtype=_LITTLE_FLOAT32)
    data = little.tobytes()
    bundle.bundle_version = BUNDLE_VERSION
    tensor = bundle.tensors.add()
    tensor.name = HIDDEN_TENSOR
    tensor.shape.extend(little.shape)
    tensor.dtype = pb.DTYPE_FLOAT32
    tensor.byte_order = pb.BYTE_ORDER_LITTLE
    tensor.fragments.append(data)
    return zlib.crc32(data)


def decode_hidden(bundle: pb.TensorBundle, limits: FrameLimits, expected_crc: int) -> np.ndarray:
    """A hidden-state bundle -> read-only float32 ``[n_tokens, n_embd]`` over the received bytes."""
    if bundle.bundle_version != BUNDLE_VERSION:
        raise InvalidArgument(
            f"tensor bundle version {bundle.bundle_version} is not supported; this node reads version {BUNDLE_VERSION}"
        )
    if len(bundle.tensors) != 1:
        raise InvalidArgument(f"a hidden-state bundle holds exactly one tensor, got {len(bundle.tensors)}")
    tensor = bundle.tensors[0]
    if tensor.name != HIDDEN_TENSOR:
        raise InvalidArgument(f"expected tensor {HIDDEN_TENSOR!r}, got {tensor.name[:40]!r}")
    element = _hidden_element_type(tensor)
    n_tokens, n_embd = _hidden_shape(tensor.shape, limits)
    fragments = list(tensor.fragments)
    data = _join_checked(fragments, n_tokens * n_embd * element.itemsize, limits, expected_crc)
    # hidden: [n_tokens, n_embd]; a view over `data`, no copy for little-endian senders.
    hidden = np.frombuffer(data, dtype=element).reshape(n_tokens, n_embd)
    if element.byteorder == ">":
        hidden = hidden.astype(np.float32)
    # A float64 sum of finite float32 values cannot overflow, and any NaN/Inf makes it non-finite:
    # one pass, no [n, n_embd] boolean temporary.
    if not math.isfinite(float(hidden.sum(dtype=np.float64))):
        raise InvalidArgument("the hidden state holds NaN or Inf values")
    return hidden


def _hidden_element_type(tensor: pb.NamedTensor) -> np.dtype:
    name = _DTYPE_NAMES.get(tensor.dtype)
    if name is None:
        raise InvalidArgument(f"unknown tensor dtype value {tensor.dtype}")
    if tensor.dtype != pb.DTYPE_FLOAT32:
        raise InvalidArgument(f"the hidden state must be float32, got {name}")
    element = _FLOAT32_BY_ORDER.get(tensor.byte_order)
    if element is None:
        raise InvalidArgument(f"unknown or unspecified byte order value {tensor.byte_order}")
    return element


def _hidden_shape(shape: Sequence[int], limits: FrameLimits) -> tuple[int, int]:
    if len(shape) != 2:
        raise InvalidArgument(f"the hidden state must have shape [n_tokens, n_embd], got rank {len(shape)}")
    n_tokens, n_embd = int(shape[0]), int(shape[1])
    if n_embd != limits.n_embd:
        raise InvalidArgument(f"hidden width {n_embd} does not match this model's n_embd {limits.n_embd}")
    if n_tokens == 0:
        raise InvalidArgument("the hidden state holds no tokens")
    if n_tokens > limits.max_tokens_per_frame:
        raise InvalidArgument(
            f"the hidden state holds {n_tokens} tokens; at most {limits.max_tokens_per_frame} "
            "are allowed per frame (split the prefill into chunks)"
        )
    return n_tokens, n_embd


def _join_checked(fragments: list[bytes], expected_bytes: int, limits: FrameLimits, expected_crc: int) -> bytes:
    """Check count, total size and checksum of the fragments, then join them (no copy for one)."""
    if not fragments:
        raise InvalidArgument("the tensor has no data fragments")
    if len(fragments) > MAX_FRAGMENTS:
        raise InvalidArgument(
            f"the tensor is split into {len(fragments)} fragments; at most {MAX_FRAGMENTS} are allowed"
        )
    total = sum(len(fragment) for fragment in fragments)
    if total > limits.max_payload_bytes:
        raise ResourceExhausted(
            f"the tensor payload is {total} bytes; a frame may carry at most {limits.max_payload_bytes}"
        )
    if total != expected_bytes:
        raise InvalidArgument(f"the tensor data is {total} bytes but its shape and dtype need {expected_bytes}")
    crc = 0
    for fragment in fragments:
        crc = zlib.crc32(fragment, crc)
    if crc != expected_crc:
        raise IntegrityError(f"tensor checksum mismatch: header says {expected_crc:#010x}, payload is {crc:#010x}")
    return fragments[0] if len(fragments) == 1 else b"".join(fragments)
