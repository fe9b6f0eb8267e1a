"""The binary frame of one node's slot rows for one MoE layer, and its strict decoder.

Layout (little-endian), carried as the ``frame`` bytes of ``meshnet.v1.ExpertRowsFrame``:

    header  magic "MNXR" | version u16 | flags u16 (0) | sequence u64 | layer u32 |
            sender u16 | group_size u16 | n_tokens u32 | k u16 | reserved u16 (0) |
            n_embd u32 | n_expert u32 | n_terms u32 | crc32 u32 (of every other byte)
    term    token u32 | slot u32 | expert u32 | width u32 | width x float32

What the decoder refuses, before it trusts anything (the design document's list): a wrong magic
or version, a dimension or term count outside its bound, a term whose width disagrees with its
header, a token (or slot, or expert) outside the declared range, trailing or missing bytes, a
frame over 64 MB, a damaged checksum, a geometry that disagrees with the receiver's, and a
sender claiming an expert it does not own. Duplicates and incomplete sets are the reduction's to
refuse (``core.experts.place_rows``), since only it sees every sender's frame.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

from meshnet.moe.ownership import ExchangeGeometry, ExpertFrameInvalid, FrameFault, SlotRows

MAGIC = b"MNXR"
VERSION = 1
MAX_EXPERT_FRAME_BYTES = 64 * 1024 * 1024
MAX_EMBD = 1 << 16
MAX_EXPERTS = 1 << 12
MAX_EXPERT_USED = 256
MAX_TOKENS = 1 << 16
MAX_GROUP = 256
MAX_LAYERS = 1 << 12
_HEADER = struct.Struct("<4sHHQIHHIHHIIII")
HEADER_BYTES = _HEADER.size
_CRC_AT = HEADER_BYTES - 4
TERM_HEADER_BYTES = 16


def _term_dtype(n_embd: int) -> np.dtype:
    return np.dtype([("token", "<u4"), ("slot", "<u4"), ("expert", "<u4"), ("width", "<u4"), ("row", "<f4", (n_embd,))])


def encode_slot_rows(rows: SlotRows, geometry: ExchangeGeometry) -> bytes:
    """The frame for ``rows`` (checked against ``geometry`` first: we never send what we would refuse)."""
    terms = np.zeros(rows.n_terms, _term_dtype(geometry.n_embd))
    terms["token"], terms["slot"], terms["expert"] = rows.tokens, rows.slots, rows.experts
    terms["width"] = geometry.n_embd
    terms["row"] = rows.rows
    header = [MAGIC, VERSION, 0, rows.sequence, rows.layer, rows.sender, geometry.group_size, rows.n_tokens]
    header += [geometry.n_expert_used, 0, geometry.n_embd, geometry.n_expert, rows.n_terms, 0]
    body = terms.tobytes()
    unsigned = _HEADER.pack(*header)[:_CRC_AT]
    frame = unsigned + struct.pack("<I", zlib.crc32(body, zlib.crc32(unsigned))) + body
    decode_slot_rows(frame, geometry)
    return frame


def _refuse(fault: FrameFault, message: str) -> ExpertFrameInvalid:
    return ExpertFrameInvalid(fault, message)


def decode_slot_rows(frame: bytes, geometry: ExchangeGeometry) -> SlotRows:
    """The rows in ``frame``, or ``ExpertFrameInvalid`` naming the first refusal."""
    if len(frame) > MAX_EXPERT_FRAME_BYTES:
        raise _refuse("too_large", f"{len(frame)} bytes exceed the {MAX_EXPERT_FRAME_BYTES}-byte limit")
    if len(frame) < HEADER_BYTES:
        raise _refuse("truncated", f"{len(frame)} bytes cannot hold the {HEADER_BYTES}-byte header")
    magic, version, flags, sequence, layer, sender, group, n_tokens, k, reserved, n_embd, n_expert, n_terms, crc = (
        _HEADER.unpack_from(frame)
    )
    if magic != MAGIC:
        raise _refuse("magic", f"magic {magic!r} is not {MAGIC!r}")
    if version != VERSION:
        raise _refuse("version", f"version {version} is not the supported {VERSION}")
    _check_bounds(flags, reserved, layer, sender, group, n_tokens, k, n_embd, n_expert, n_terms)
    term_bytes = TERM_HEADER_BYTES + 4 * n_embd
    expected = HEADER_BYTES + n_terms * term_bytes
    if len(frame) != expected:
        fault: FrameFault = "trailing_bytes" if len(frame) > expected else "truncated"
        raise _refuse(fault, f"{n_terms} terms of width {n_embd} need {expected} bytes, the frame has {len(frame)}")
    if zlib.crc32(frame[HEADER_BYTES:], zlib.crc32(frame[:_CRC_AT])) != crc:
        raise _refuse("checksum", "crc32 does not match: the frame was damaged")
    declared = (n_embd, n_expert, k, group)
    receiver = (geometry.n_embd, geometry.n_expert, geometry.n_expert_used, geometry.group_size)
    if declared != receiver or layer >= geometry.n_layers:
        raise _refuse(
            "geometry", f"frame (n_embd, n_expert, k, group) = {declared}, layer {layer}; receiver {receiver}"
        )
    terms = np.frombuffer(frame, _term_dtype(n_embd), count=n_terms, offset=HEADER_BYTES)
    _check_terms(terms, n_embd, n_tokens, k, n_expert, sender, group)
    return SlotRows(
        sequence,
        layer,
        sender,
        n_tokens,
        terms["token"].astype(np.int32),
        terms["slot"].astype(np.int32),
        terms["expert"].astype(np.int32),
        np.ascontiguousarray(terms["row"], dtype=np.float32),
    )


def _check_bounds(
    flags: int,
    reserved: int,
    layer: int,
    sender: int,
    group: int,
    n_tokens: int,
    k: int,
    n_embd: int,
    n_expert: int,
    n_terms: int,
) -> None:
    if flags or reserved:
        raise _refuse("version", f"flags {flags} / reserved {reserved} are set: a newer frame layout")
    dims = {"n_embd": (n_embd, MAX_EMBD), "n_expert": (n_expert, MAX_EXPERTS), "k": (k, MAX_EXPERT_USED)}
    dims |= {"n_tokens": (n_tokens, MAX_TOKENS), "group_size": (group, MAX_GROUP), "layer": (layer + 1, MAX_LAYERS)}
    for name, (value, bound) in dims.items():
        if not (0 < value <= bound) and not (name == "n_tokens" and value == 0):
            raise _refuse("dimension", f"{name} {value} is outside 1..{bound}")
    if k > n_expert or group > n_expert or sender >= group:
        raise _refuse("dimension", f"k {k}, group {group}, sender {sender} do not fit {n_expert} experts")
    if n_terms > n_tokens * k:
        raise _refuse("term_count", f"{n_terms} terms exceed {n_tokens} tokens x {k} slots")


def _check_terms(terms: np.ndarray, n_embd: int, n_tokens: int, k: int, n_expert: int, sender: int, group: int) -> None:
    if terms.size == 0:
        return
    if (terms["width"] != n_embd).any():
        raise _refuse("width", f"a term's width disagrees with the header's n_embd {n_embd}")
    if int(terms["token"].max()) >= n_tokens:
        raise _refuse("token_range", f"a term's token lies outside the declared range 0..{n_tokens - 1}")
    if int(terms["slot"].max()) >= k:
        raise _refuse("slot_range", f"a term's slot lies outside 0..{k - 1}")
    experts = terms["expert"]
    if int(experts.max()) >= n_expert or ((experts % group) != sender).any():
        raise _refuse("expert_range", f"node {sender} of {group} sent a row of an expert it does not own")
