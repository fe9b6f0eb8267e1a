"""The OpenAI parameters the tail honours, with the official ``openai`` client, on real swarms.

One fixed set of requests (logprobs and top_logprobs, streamed too; presence / frequency
penalties; logit_bias; min_p and repetition_penalty (``extra_body``); ``n`` > 1;
``response_format`` json_object and json_schema) runs against three live swarms of the same
synthetic GGUF: the whole model on one worker, two shards and three shards (each a tracker,
real llama.cpp worker processes and a gateway). Every answer, logprobs included, must be
identical bit for bit across the three splits, and equal the in-process whole model where a
greedy reference exists.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import openai
import pytest
from swarm_harness import MODEL_NAME, PROMPT, Reference, Swarm

from meshnet.core.generation import SamplingParams
from meshnet.core.sampling_options import LogitAdjustments
from meshnet.core.tracking import PREFILL_WEIGHT, billing_units

pytestmark = pytest.mark.timeout(300)

SPLITS = {"whole": ("0:6",), "two": ("0:3", "3:6"), "three": ("0:2", "2:4", "4:6")}
MAX_TOKENS = 16
MIN_P = 0.1
REPETITION_PENALTY = 1.3
TEXT_PROMPT = "the house and a dog"
MESSAGES: list[Any] = [{"role": "user", "content": PROMPT}]
PREFILLED: list[Any] = [*MESSAGES, {"role": "assistant", "content": "Once upon a"}]
SCHEMA = {
    "type": "object",
    "properties": {"count": {"type": "integer"}},
    "required": ["count"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def greedy_tokens(reference: Reference) -> list[int]:
    return reference.generate(reference.chat_tokens(PROMPT), MAX_TOKENS)


def _closers(reference: Reference) -> dict[str, float]:
    """A bias that makes the random tiny model close its JSON and stop soon: '}' and EOS."""
    closing = reference.tokenizer.encode("}", add_special=False)[-1]
    return {str(closing): 30.0, **{str(eos): 40.0 for eos in reference.tokenizer.eos_token_ids}}


def _plain(reply: Any) -> Any:
    """The reply as JSON, without what differs between any two calls (id, creation time)."""
    dumped = reply.model_dump(exclude={"id", "created"})
    return dumped


def _streamed(chunks: Any) -> dict[str, Any]:
    """A stream as each choice's chunks in order, and the usage chunks: choices of ``n`` > 1
    interleave as their routes answer, so only each choice's own order is fixed."""
    per_choice: dict[int, list[Any]] = {}
    usage: list[Any] = []
    for chunk in chunks:
        dumped = chunk.model_dump(exclude={"id", "created"})
        for choice in dumped["choices"]:
            per_choice.setdefault(choice["index"], []).append(choice)
        if dumped["usage"] is not None:
            usage.append(dumped["usage"])
    return {"choices": per_choice, "usage": usage}


def _refusal(call: Any) -> dict[str, Any]:
    """The OpenAI error a request that must be refused gets, as status, code and parameter."""
    with pytest.raises(openai.BadRequestError) as refused:
        call()
    error = refused.value.body
    assert isinstance(error, dict)
    return {"status": refused.value.status_code, "code": error.get("code"), "message": error.get("message")}


def _run_requests(client: openai.OpenAI, banned: int, closers: dict[str, float]) -> dict[str, Any]:
    chat = client.chat.completions.create
    common: dict[str, Any] = {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": MAX_TOKENS}
    text_common: dict[str, Any] = {"model": MODEL_NAME, "prompt": TEXT_PROMPT, "max_tokens": MAX_TOKENS}
    sampled: dict[str, Any] = {"temperature": 0.9, "seed": 7}
    return {
        "chat_logprobs": _plain(chat(**common, temperature=0, logprobs=True, top_logprobs=5)),
        "chat_logprobs_stream": _streamed(chat(**common, temperature=0, logprobs=True, top_logprobs=5, stream=True)),
        "text_logprobs": _plain(client.completions.create(**text_common, **sampled, logprobs=3)),
        "text_logprobs_stream": _streamed(client.completions.create(**text_common, **sampled, logprobs=3, stream=True)),
        "plain": _plain(chat(**common, temperature=0)),
        "penalised": _plain(chat(**common, temperature=0, frequency_penalty=1.5, presence_penalty=0.5)),
        "banned": _plain(chat(**common, temperature=0, logit_bias={str(banned): -100})),
        "min_p": _plain(chat(**common, **sampled, top_p=0.95, extra_body={"min_p": MIN_P})),
        "repetition": _plain(chat(**common, temperature=0, extra_body={"repetition_penalty": REPETITION_PENALTY})),
        "prefill": _plain(chat(**{**common, "messages": PREFILLED}, temperature=0)),
        "prefill_alone": _refusal(lambda: chat(**{**common, "messages": PREFILLED[-1:]}, temperature=0)),
        "both_text": _plain(
            client.completions.create(
                **text_common, **sampled, extra_body={"min_p": MIN_P, "repetition_penalty": REPETITION_PENALTY}
            )
        ),
        "sampled_one": _plain(chat(**common, **sampled)),
        "sampled_three": _plain(chat(**common, **sampled, n=3)),
        "sampled_two_stream": _streamed(
            chat(**common, **sampled, n=2, stream=True, stream_options={"include_usage": True})
        ),
        "json_object": _plain(
            chat(**{**common, "max_tokens": 64}, **sampled, logit_bias=closers, response_format={"type": "json_object"})
        ),
        "json_schema": _plain(
            chat(
                **{**common, "max_tokens": 64},
                temperature=0,
                logit_bias=closers,
                response_format={"type": "json_schema", "json_schema": {"name": "count", "schema": SCHEMA}},
            )
        ),
    }


@pytest.fixture(scope="module")
def answers(
    tmp_path_factory: pytest.TempPathFactory, model: Path, reference: Reference, greedy_tokens: list[int]
) -> dict[str, dict[str, Any]]:
    """The same requests against each split, one swarm after the other."""
    results: dict[str, dict[str, Any]] = {}
    for name, ranges in SPLITS.items():
        with Swarm(tmp_path_factory.mktemp(f"swarm-{name}"), model) as swarm:
            swarm.start_tracker()
            swarm.start_workers(*ranges)
            base_url = swarm.start_gateway()
            swarm.wait_routable(nodes=len(ranges))
            with openai.OpenAI(base_url=f"{base_url}/v1", api_key=swarm.api_key, max_retries=0, timeout=60.0) as client:
                results[name] = _run_requests(client, greedy_tokens[0], _closers(reference))
    return results


def test_every_answer_is_identical_across_splits(answers: dict[str, dict[str, Any]]) -> None:
    whole = answers["whole"]
    for name in ("two", "three"):
        for key, value in whole.items():
            assert answers[name][key] == value, f"{key} differs between the whole model and {name} shards"


def test_chat_logprobs_have_openai_shape_and_match_the_reference(
    answers: dict[str, dict[str, Any]], reference: Reference, greedy_tokens: list[int]
) -> None:
    reply = answers["three"]["chat_logprobs"]
    choice = reply["choices"][0]
    assert choice["message"]["content"] == reference.text(greedy_tokens)
    content = choice["logprobs"]["content"]
    assert len(content) == MAX_TOKENS
    for entry, token in zip(content, greedy_tokens, strict=True):
        assert bytes(entry["bytes"]) == reference.tokenizer.token_bytes(token)
        assert entry["logprob"] <= 0.0 and len(entry["top_logprobs"]) == 5
        # Greedy: the chosen token is the most likely one, so it heads the alternatives.
        assert entry["top_logprobs"][0]["logprob"] == entry["logprob"]
        assert entry["top_logprobs"][0]["bytes"] == entry["bytes"]
        values = [alt["logprob"] for alt in entry["top_logprobs"]]
        assert values == sorted(values, reverse=True)
        assert math.fsum(math.exp(v) for v in values) <= 1.0 + 1e-6


def test_streamed_logprobs_equal_the_whole_reply(answers: dict[str, dict[str, Any]]) -> None:
    three = answers["three"]
    streamed = [
        entry
        for choice in three["chat_logprobs_stream"]["choices"][0]
        if choice["logprobs"] is not None
        for entry in choice["logprobs"]["content"]
    ]
    assert streamed == three["chat_logprobs"]["choices"][0]["logprobs"]["content"]
    text_tokens = [
        token
        for choice in three["text_logprobs_stream"]["choices"][0]
        if choice["logprobs"] is not None
        for token in choice["logprobs"]["tokens"]
    ]
    whole_text = three["text_logprobs"]["choices"][0]
    assert text_tokens == whole_text["logprobs"]["tokens"]
    logprobs = whole_text["logprobs"]
    assert len(logprobs["token_logprobs"]) == len(logprobs["top_logprobs"]) == len(logprobs["text_offset"])
    assert all(len(top) <= 3 for top in logprobs["top_logprobs"])
    assert logprobs["text_offset"][0] == 0 and logprobs["text_offset"] == sorted(logprobs["text_offset"])


def test_penalties_and_logit_bias_change_the_greedy_answer_as_in_the_oracle(
    answers: dict[str, dict[str, Any]], reference: Reference, greedy_tokens: list[int]
) -> None:
    """The in-process whole model samples with the tail's own sampler, so it is the oracle of
    penalised and biased answers too, not just of plain ones."""
    three = answers["three"]
    plain = three["plain"]["choices"][0]["message"]["content"]
    assert plain == reference.text(greedy_tokens)
    prompt = reference.chat_tokens(PROMPT)
    penalties = LogitAdjustments(presence_penalty=0.5, frequency_penalty=1.5)
    penalised = reference.text(reference.generate(prompt, MAX_TOKENS, SamplingParams(adjustments=penalties)))
    assert penalised != plain  # else a swarm ignoring penalties would pass
    assert three["penalised"]["choices"][0]["message"]["content"] == penalised
    ban = LogitAdjustments(logit_bias=((greedy_tokens[0], -100.0),))
    banned = reference.text(reference.generate(prompt, MAX_TOKENS, SamplingParams(adjustments=ban)))
    assert not banned.startswith(reference.text(greedy_tokens[:1])) and banned != plain
    assert three["banned"]["choices"][0]["message"]["content"] == banned


def test_min_p_and_repetition_penalty_change_the_answer_as_in_the_oracle(
    answers: dict[str, dict[str, Any]], reference: Reference, greedy_tokens: list[int]
) -> None:
    """min-p and the repetition penalty are honoured, not ignored: each answer is the in-process
    whole model's under the same sampler, and differs from the answer without the parameter."""
    three = answers["three"]
    prompt = reference.chat_tokens(PROMPT)
    free = SamplingParams(temperature=0.9, seed=7, top_p=0.95)
    trimmed = reference.text(reference.generate(prompt, MAX_TOKENS, replace(free, min_p=MIN_P)))
    assert trimmed != reference.text(reference.generate(prompt, MAX_TOKENS, free))
    assert three["min_p"]["choices"][0]["message"]["content"] == trimmed
    penalty = LogitAdjustments(repetition_penalty=REPETITION_PENALTY)
    unrepeated = reference.text(reference.generate(prompt, MAX_TOKENS, SamplingParams(adjustments=penalty)))
    assert unrepeated != reference.text(greedy_tokens)
    assert three["repetition"]["choices"][0]["message"]["content"] == unrepeated
    both = SamplingParams(temperature=0.9, seed=7, min_p=MIN_P, adjustments=penalty)
    text_prompt = reference.text_tokens(TEXT_PROMPT)
    assert three["both_text"]["choices"][0]["text"] == reference.text(reference.generate(text_prompt, MAX_TOKENS, both))


def test_a_trailing_assistant_message_is_continued(
    answers: dict[str, dict[str, Any]], reference: Reference, greedy_tokens: list[int]
) -> None:
    """Assistant prefill: the prompt ends inside the assistant turn (no end of turn, no new
    turn), and the reply holds only the continuation."""
    prompt = reference.tokenizer.encode_chat_continuation(PREFILLED)
    rendered = reference.tokenizer.decode(prompt)
    assert rendered.endswith("<|assistant|>Once upon a")
    assert rendered == reference.tokenizer.decode(reference.chat_tokens(PROMPT)) + "Once upon a"
    continued = reference.text(reference.generate(prompt, MAX_TOKENS))
    reply = answers["three"]["prefill"]
    assert reply["choices"][0]["message"]["content"] == continued
    assert continued != reference.text(greedy_tokens)  # else a new turn would pass
    assert reply["usage"]["prompt_tokens"] == len(prompt)
    # A template that cannot place the continuation (here: no turn before it) is a typed 400.
    refused = answers["three"]["prefill_alone"]
    assert refused["status"] == 400 and refused["code"] == "invalid_argument"
    assert "continued" in refused["message"]


def test_seeded_answers_equal_the_oracle(answers: dict[str, dict[str, Any]], reference: Reference) -> None:
    sampled = SamplingParams(temperature=0.9, seed=7)
    expected = reference.text(reference.generate(reference.chat_tokens(PROMPT), MAX_TOKENS, sampled))
    assert answers["three"]["sampled_one"]["choices"][0]["message"]["content"] == expected


def test_n_choices_are_independent_seeded_sessions(answers: dict[str, dict[str, Any]]) -> None:
    three = answers["three"]
    one, many = three["sampled_one"], three["sampled_three"]
    texts = [choice["message"]["content"] for choice in many["choices"]]
    assert [choice["index"] for choice in many["choices"]] == [0, 1, 2]
    assert texts[0] == one["choices"][0]["message"]["content"]  # choice 0 keeps the request's seed
    assert len(set(texts)) == 3
    assert many["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"]
    # Each choice ends at EOS or MAX_TOKENS; each is a session that prefilled the prompt itself.
    usage = many["usage"]
    assert one["usage"]["completion_tokens"] <= usage["completion_tokens"] <= 3 * MAX_TOKENS
    # The prompt is billed once per request, as usage counts it (n=1 and n=3 alike).
    assert usage["billing_units"] == PREFILL_WEIGHT * usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["billing_units"] == billing_units(usage["prompt_tokens"], usage["completion_tokens"])
    assert one["usage"]["billing_units"] == billing_units(
        one["usage"]["prompt_tokens"], one["usage"]["completion_tokens"]
    )
    streamed = three["sampled_two_stream"]
    per_choice = {
        index: "".join(choice["delta"]["content"] or "" for choice in chunks)
        for index, chunks in streamed["choices"].items()
    }
    assert per_choice == {0: texts[0], 1: texts[1]}
    streamed_usage = streamed["usage"]
    assert len(streamed_usage) == 1 and streamed_usage[0]["billing_units"] > 0


def test_json_modes_parse(answers: dict[str, dict[str, Any]]) -> None:
    for name in SPLITS:
        obj = answers[name]["json_object"]["choices"][0]
        assert obj["finish_reason"] == "stop"
        assert isinstance(json.loads(obj["message"]["content"]), dict)
        shaped = answers[name]["json_schema"]["choices"][0]
        assert shaped["finish_reason"] == "stop"
        parsed = json.loads(shaped["message"]["content"])
        assert set(parsed) == {"count"} and isinstance(parsed["count"], int)
