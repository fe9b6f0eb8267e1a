"""A lazy grammar's trigger words survive the wire; too many or too long ones are refused."""

from __future__ import annotations

from dataclasses import replace

import pytest
from protocol_samples import decode_bytes, token_frame

from meshnet.core.errors import InvalidArgument
from meshnet.core.generation import SamplingParams
from meshnet.core.sampling_options import OutputConstraint
from meshnet.wire.shard_wire import frame_to_proto

LAZY = OutputConstraint('root ::= "<tool_call>" [a-z]*', "root", ("<tool_call>", '{"name"'))


def test_trigger_words_roundtrip() -> None:
    frame = replace(token_frame(), sampling=SamplingParams(constraint=LAZY))
    assert decode_bytes(frame_to_proto(frame).SerializeToString()).sampling.constraint == LAZY


def test_too_many_trigger_words_are_refused_on_decode() -> None:
    message = frame_to_proto(replace(token_frame(), sampling=SamplingParams(constraint=LAZY)))
    message.sampling.constraint.triggers.extend(["w"] * 9)
    with pytest.raises(InvalidArgument, match="trigger"):
        decode_bytes(message.SerializeToString())
    with pytest.raises(InvalidArgument, match="trigger"):
        OutputConstraint("root ::= [a-z]", triggers=("x" * 129,))
