"""The expert-row frame: round trip, every refusal of the design document, and a fuzzer.

The fuzzer mutates valid frames 6,000 times (byte flips, cuts, extensions, header fields
rewritten with the checksum recomputed so the deeper checks are reached) and requires every
outcome to be a typed refusal or a frame the reduction then checks: never another exception.
"""

from __future__ import annotations

import struct
import zlib
from collections import Counter

import numpy as np
import pytest

from meshnet.engine.bitwise import bit_identical
from meshnet.moe.frames import HEADER_BYTES, MAX_EXPERT_FRAME_BYTES, decode_slot_rows, encode_slot_rows
from meshnet.moe.ownership import (
    ExchangeGeometry,
    ExpertFrameInvalid,
    ExpertOwnership,
    ExpertRowsConflict,
    ExpertRowsIncomplete,
    SlotRows,
    local_rows,
    place_rows,
)

GEOMETRY = ExchangeGeometry(n_embd=8, n_expert=16, n_expert_used=4, n_layers=3, group_size=2)
_FIELDS = struct.Struct("<4sHHQIHHIHHIIII")


def _selected(rng: np.random.Generator, n_tokens: int) -> np.ndarray:
    return np.stack([rng.choice(16, 4, replace=False) for _ in range(n_tokens)]).astype(np.int32)


def _rows(sender: int, n_tokens: int = 5, seed: int = 0) -> tuple[SlotRows, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    selected = _selected(rng, n_tokens)
    weighted = rng.standard_normal((n_tokens, 4, 8)).astype(np.float32)
    return local_rows(9, 1, ExpertOwnership(sender, 2), selected, weighted), selected, weighted


def _rewrite(frame: bytes, index: int, value: int, fix_crc: bool = True) -> bytes:
    fields = list(_FIELDS.unpack_from(frame))
    fields[index] = value
    head = _FIELDS.pack(*fields)[: HEADER_BYTES - 4]
    body = frame[HEADER_BYTES:]
    crc = zlib.crc32(body, zlib.crc32(head)) if fix_crc else fields[-1]
    return head + struct.pack("<I", crc) + body


def _fault(frame: bytes, geometry: ExchangeGeometry = GEOMETRY) -> str:
    with pytest.raises(ExpertFrameInvalid) as caught:
        decode_slot_rows(frame, geometry)
    return caught.value.fault


def test_round_trip_and_placement_rebuild_the_whole_slots() -> None:
    mine, selected, weighted = _rows(0)
    theirs, _, _ = _rows(1)
    decoded = decode_slot_rows(encode_slot_rows(theirs, GEOMETRY), GEOMETRY)
    assert (decoded.sequence, decoded.layer, decoded.sender) == (9, 1, 1)
    assert bit_identical(decoded.rows, theirs.rows)
    target = weighted.copy()
    target[~ExpertOwnership(0, 2).owned_mask(selected)] = np.nan
    place_rows(ExpertOwnership(0, 2), selected, [decoded], target)
    assert bit_identical(target, weighted)
    assert mine.n_terms + theirs.n_terms == selected.size


def test_each_refusal_of_the_design_document() -> None:
    frame = encode_slot_rows(_rows(1)[0], GEOMETRY)
    assert _fault(b"XXXX" + frame[4:]) == "magic"
    assert _fault(_rewrite(frame, 1, 2)) == "version"
    assert _fault(_rewrite(frame, 10, 1 << 20)) == "dimension"  # n_embd out of bound
    assert _fault(_rewrite(frame, 12, 10_000)) == "term_count"
    assert _fault(_rewrite(frame, 10, 16)) in ("trailing_bytes", "truncated")  # width vs length
    assert _fault(frame + b"\0") == "trailing_bytes"
    assert _fault(frame[:-3]) == "truncated"
    assert _fault(b"\0" * (MAX_EXPERT_FRAME_BYTES + 1)) == "too_large"
    assert _fault(_rewrite(frame, 3, 10, fix_crc=False)) == "checksum"
    other = ExchangeGeometry(n_embd=8, n_expert=32, n_expert_used=4, n_layers=3, group_size=2)
    assert _fault(frame, other) == "geometry"
    assert _fault(_rewrite(frame, 4, 7)) == "geometry"  # layer beyond the receiver's model
    assert _fault(_rewrite(frame, 7, 4)) == "token_range"  # n_tokens shrunk below a term's token
    assert _fault(_rewrite(frame, 5, 0)) == "expert_range"  # sender 0 claims node 1's experts


def test_a_term_whose_width_disagrees_with_its_header() -> None:
    frame = bytearray(encode_slot_rows(_rows(1)[0], GEOMETRY))
    frame[HEADER_BYTES + 12 : HEADER_BYTES + 16] = struct.pack("<I", 7)
    body = bytes(frame[HEADER_BYTES:])
    frame[HEADER_BYTES - 4 : HEADER_BYTES] = struct.pack(
        "<I", zlib.crc32(body, zlib.crc32(bytes(frame[: -len(body) - 4])))
    )
    assert _fault(bytes(frame)) == "width"


def test_duplicates_and_incomplete_sets_are_refused_by_the_reduction() -> None:
    _, selected, weighted = _rows(0)
    theirs, _, _ = _rows(1)
    me = ExpertOwnership(0, 2)
    place_rows(me, selected, [theirs, theirs], weighted.copy())  # same bits twice: accepted
    changed = SlotRows(9, 1, 1, theirs.n_tokens, theirs.tokens, theirs.slots, theirs.experts, theirs.rows + 1)
    with pytest.raises(ExpertRowsConflict, match="different bits"):
        place_rows(me, selected, [theirs, changed], weighted.copy())
    partial = SlotRows(
        9, 1, 1, theirs.n_tokens, theirs.tokens[1:], theirs.slots[1:], theirs.experts[1:], theirs.rows[1:]
    )
    with pytest.raises(ExpertRowsIncomplete):
        place_rows(me, selected, [partial], weighted.copy())
    rerouted = SlotRows(9, 1, 1, theirs.n_tokens, theirs.tokens, theirs.slots, (theirs.experts + 2) % 16, theirs.rows)
    with pytest.raises(ExpertRowsConflict):
        place_rows(me, selected, [rerouted], weighted.copy())


def _mutate(rng: np.random.Generator, frame: bytes) -> bytes:
    kind = int(rng.integers(0, 6))
    data = bytearray(frame)
    if kind == 0:  # flip bytes anywhere
        for index in rng.integers(0, len(data), int(rng.integers(1, 4))):
            data[index] ^= int(rng.integers(1, 256))
        return bytes(data)
    if kind == 1:
        return bytes(data[: int(rng.integers(0, len(data)))])
    if kind == 2:
        return bytes(data) + rng.bytes(int(rng.integers(1, 64)))
    if kind == 3:  # a header field rewritten, checksum fixed so the deeper checks run
        index = int(rng.integers(1, 13))
        bits = [0, 16, 16, 64, 32, 16, 16, 32, 16, 16, 32, 32, 32][index]
        return _rewrite(frame, index, int(rng.integers(0, 1 << min(bits, 62))))
    if kind == 4:  # a term byte changed, checksum fixed
        index = int(rng.integers(HEADER_BYTES, len(data))) if len(data) > HEADER_BYTES else 0
        data[index] ^= int(rng.integers(1, 256))
        return _rewrite(bytes(data), 3, _FIELDS.unpack_from(data)[3])
    return rng.bytes(int(rng.integers(0, 400)))


def test_fuzzed_frames_never_crash() -> None:
    rng = np.random.default_rng(2024)
    me = ExpertOwnership(0, 2)
    _, selected, weighted = _rows(0)
    valid = encode_slot_rows(_rows(1)[0], GEOMETRY)
    outcomes: Counter[str] = Counter()
    for _ in range(6000):
        frame = _mutate(rng, valid)
        try:
            place_rows(me, selected, [decode_slot_rows(frame, GEOMETRY)], weighted.copy())
            outcomes["accepted"] += 1
        except ExpertFrameInvalid as error:
            outcomes[error.fault] += 1
        except (ExpertRowsConflict, ExpertRowsIncomplete) as error:
            outcomes[type(error).__name__] += 1
    refused = sum(count for name, count in outcomes.items() if name != "accepted")
    print(dict(outcomes))
    assert refused >= 5000, outcomes
    assert len(outcomes) >= 10, outcomes  # the mutations reach most checks, not only the checksum
