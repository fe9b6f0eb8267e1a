"""The OpenAI sampling options and logprobs survive the wire unchanged, and bad ones are refused."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from protocol_samples import decode_bytes, token_frame

from meshnet.core.errors import InvalidArgument
from meshnet.core.generation import SamplingParams
from meshnet.core.ids import SessionId
from meshnet.core.sampling_options import (
    LogitAdjustments,
    LogprobRequest,
    OutputConstraint,
    TokenLogprob,
    TokenLogprobs,
)
from meshnet.wire.frames import StepFrame, StepResult
from meshnet.wire.generated import shard_pb2 as pb
from meshnet.wire.shard_wire import frame_to_proto, result_from_proto, result_to_proto

FULL = SamplingParams(
    temperature=0.7,
    top_k=40,
    top_p=0.9,
    seed=11,
    adjustments=LogitAdjustments(0.5, -1.25, ((3, -100.0), (17, 2.5))),
    logprobs=LogprobRequest(5),
    constraint=OutputConstraint('root ::= "{" [a-z]* "}"', "root"),
)


def with_sampling(sampling: SamplingParams) -> StepFrame:
    return replace(token_frame(), sampling=sampling)


@pytest.mark.parametrize(
    "sampling",
    [
        FULL,
        SamplingParams(),
        SamplingParams(logprobs=LogprobRequest(0)),
        replace(FULL, constraint=None),
        replace(FULL, min_p=0.05, adjustments=LogitAdjustments(repetition_penalty=1.3)),
        SamplingParams(temperature=1.0, min_p=1.0, adjustments=LogitAdjustments(repetition_penalty=0.5)),
    ],
)
def test_sampling_options_roundtrip(sampling: SamplingParams) -> None:
    decoded = decode_bytes(frame_to_proto(with_sampling(sampling)).SerializeToString())
    assert decoded.sampling == sampling


def test_logprobs_roundtrip_bitwise() -> None:
    # float32 values: the wire carries exactly these bits.
    values = [float(np.float32(v)) for v in (-0.0123, -3.5, -7.25)]
    logprobs = TokenLogprobs(TokenLogprob(9, values[0]), (TokenLogprob(9, values[0]), TokenLogprob(2, values[1])))
    result = StepResult(SessionId("s"), 3, 10, 9, logprobs=logprobs)
    decoded = result_from_proto(pb.StepResponse.FromString(result_to_proto(result).SerializeToString()))
    assert decoded.logprobs == logprobs
    assert result_from_proto(result_to_proto(replace(result, logprobs=None))).logprobs is None


def test_logprobs_must_describe_the_sampled_token() -> None:
    with pytest.raises(InvalidArgument, match="sampled token"):
        StepResult(SessionId("s"), 3, 10, 9, logprobs=TokenLogprobs(TokenLogprob(8, -1.0)))


def _spec(**fields: object) -> pb.StepRequest:
    message = frame_to_proto(with_sampling(SamplingParams()))
    for path, value in fields.items():
        target = message.sampling
        *parents, leaf = path.split("__")
        for parent in parents:
            target = getattr(target, parent)
        setattr(target, leaf, value)
    return message


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"logprobs__top": 21}, "top_logprobs"),
        ({"adjustments__presence_penalty": 2.5}, "presence_penalty"),
        ({"adjustments__frequency_penalty": float("nan")}, "frequency_penalty"),
        ({"constraint__gbnf": "x" * (32 * 1024 + 1)}, "grammar"),
        ({"min_p": 1.5}, "min_p"),
        ({"adjustments__repetition_penalty": -1.0}, "repetition_penalty"),
        ({"adjustments__repetition_penalty": float("inf")}, "repetition_penalty"),
    ],
)
def test_bad_options_are_refused_on_decode(fields: dict[str, object], words: str) -> None:
    with pytest.raises(InvalidArgument, match=words):
        decode_bytes(_spec(**fields).SerializeToString())


def test_bad_logit_bias_is_refused_on_decode() -> None:
    message = _spec()
    message.sampling.adjustments.logit_bias.add(token_id=5, bias=101.0)
    with pytest.raises(InvalidArgument, match="logit_bias"):
        decode_bytes(message.SerializeToString())
    message = _spec()
    for token in (5, 5):
        message.sampling.adjustments.logit_bias.add(token_id=token, bias=1.0)
    with pytest.raises(InvalidArgument, match="sorted"):
        decode_bytes(message.SerializeToString())
    message = _spec()
    for token in range(301):
        message.sampling.adjustments.logit_bias.add(token_id=token, bias=1.0)
    with pytest.raises(InvalidArgument, match="at most 300"):
        decode_bytes(message.SerializeToString())


def test_too_many_top_logprobs_in_a_response_are_refused() -> None:
    message = result_to_proto(StepResult(SessionId("s"), 1, 2, 4))
    message.token.logprobs.logprob = -1.0
    for token in range(21):
        message.token.logprobs.top.add(token_id=token, logprob=-1.0)
    with pytest.raises(InvalidArgument, match="top logprobs"):
        result_from_proto(message)
