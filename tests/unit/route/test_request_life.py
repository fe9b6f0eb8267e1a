"""The one finish decision of a request (route.life): every way it ends, what the client is shown,
and the usage and bill the work record carries, without a model or a network.

Text comes from a one-token-per-character plug over the gateway's own stop matcher, so a stop
string that straddles tokens is found the way a served request finds it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from meshnet.core.errors import Cancelled, DeadlineExceeded, MeshnetError, Unavailable
from meshnet.core.events import DecodeStarted, RouteHealth, TokenGenerated
from meshnet.core.generation import GenerationRequest
from meshnet.core.tracking import PREFILL_WEIGHT, billing_units
from meshnet.gateway.stops import StopMatcher
from meshnet.route.life import (
    Failure,
    LifeItem,
    NoText,
    Outcome,
    RequestLife,
    TextPiece,
    TokenText,
    Usage,
    finish_for,
    lifetime,
)

EOS, OFFSET = 1, 2
PROMPT = (0, 5, 6, 7)


class CharText:
    """One token per ASCII character (id = code + OFFSET), stop strings found by the gateway's matcher."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = StopMatcher(stops)

    def push(self, token_id: int) -> TextPiece:
        scan = self._stops.push(chr(token_id - OFFSET))
        return TextPiece(scan.emit, scan.stopped)

    def flush(self) -> str:
        return self._stops.flush()


class Items(list[LifeItem]):
    def put(self, item: LifeItem) -> None:
        self.append(item)


def request(max_tokens: int = 16, timeout_s: float | None = None) -> GenerationRequest:
    return GenerationRequest(PROMPT, max_tokens, stop_tokens=frozenset({EOS}), timeout_s=timeout_s)


def life_for(request: GenerationRequest, stops: tuple[str, ...] = ()) -> tuple[RequestLife, Items]:
    items = Items()
    return RequestLife(request, CharText(stops), items), items


def feed(life: RequestLife, text: str, *, eos: bool = False) -> list[bool]:
    """The tokens of ``text`` (then EOS) as the driver reports them; what ``observe`` answered."""
    tokens = [*(ord(char) + OFFSET for char in text), *([EOS] if eos else [])]
    start = len(life.tokens)
    return [life.observe(TokenGenerated(token, start + i, 5.0)) for i, token in enumerate(tokens)]


def shown(items: list[Any]) -> str:
    return "".join(item.text for item in items if isinstance(item, TokenText))


def test_a_stop_token_ends_it_and_is_counted_but_never_text() -> None:
    life, items = life_for(request())
    answers = feed(life, "hi", eos=True)
    life.close()
    assert answers == [False, False, False]  # the driver ends by itself at a stop token
    assert (life.ending, life.status) == ("stop_token", "completed")
    assert shown(items) == "hi"
    assert [item.generated for item in items if isinstance(item, TokenText)] == [1, 2]
    assert items[-1] == Outcome("stop", Usage(4, 3, billing_units(4, 3)))


def test_a_stop_string_straddling_tokens_ends_it_as_a_completed_stop() -> None:
    life, items = life_for(request(), stops=("o w", "zzz"))
    answers = feed(life, "hello world")
    # "o w" is complete at the 7th token: stop reading there (the route cannot see text).
    assert answers == [False] * 6 + [True] + [True] * 4
    assert (life.ending, life.status, len(life.tokens)) == ("stop_string", "completed", 7)
    life.close()
    assert shown(items) == "hell"
    assert items[-1] == Outcome("stop", Usage.of(len(PROMPT), 7))
    assert not [item for item in items[:-1] if isinstance(item, Outcome | Failure)]


def test_text_held_back_for_a_stop_string_that_never_comes_is_released_at_the_end() -> None:
    life, items = life_for(request(max_tokens=4), stops=("abX",))
    feed(life, "zzab")
    life.close()
    assert (life.ending, shown(items)) == ("length", "zzab")
    assert [item.text for item in items if isinstance(item, TokenText)] == ["z", "z", "", "", "ab"]


def test_the_budget_ends_it_as_length() -> None:
    life, items = life_for(request(max_tokens=3))
    assert feed(life, "abc") == [False, False, False]
    life.close()
    assert (life.ending, life.status, shown(items)) == ("length", "completed", "abc")
    assert items[-1] == Outcome("length", Usage.of(4, 3))


def test_a_stop_string_on_the_last_allowed_token_is_a_stop() -> None:
    life, items = life_for(request(max_tokens=3), stops=("bc",))
    feed(life, "abc")
    life.close()
    assert (life.ending, shown(items)) == ("stop_string", "a")
    assert isinstance(items[-1], Outcome) and items[-1].finish_reason == "stop"


def test_finish_for_ranks_stop_token_then_stop_string_then_budget() -> None:
    req = request(max_tokens=2)
    assert finish_for(req, 1, OFFSET) is None
    assert finish_for(req, 2, OFFSET) == "length"
    assert finish_for(req, 2, OFFSET, stop_string=True) == "stop_string"
    assert finish_for(req, 2, EOS, stop_string=True) == "stop_token"


def test_billing_weighs_prompt_tokens_by_the_prefill_weight() -> None:
    assert billing_units(8, 3) == PREFILL_WEIGHT * 8 + 3
    # Two choices of one request: the prompt is billed once, as usage counts it.
    assert Usage.of(8, 3) + Usage.of(8, 2) == Usage(8, 5, PREFILL_WEIGHT * 8 + 5)
    assert Usage.of(8, 3) + Usage.of(8, 2) + Usage.of(8, 4) == Usage.of(8, 9)


def test_notes_pass_through_until_the_end_and_nothing_after_it() -> None:
    life, items = life_for(request(max_tokens=1))
    assert life.observe(DecodeStarted()) is False
    feed(life, "a")
    assert life.observe(RouteHealth("failover", "late")) is True  # anything after the end: stop reading
    assert life.observe(TokenGenerated(OFFSET, 1, 1.0)) is True
    life.close()
    life.close()  # the end is pushed once
    assert [type(item).__name__ for item in items] == ["DecodeStarted", "TokenText", "Outcome"]
    assert life.tokens == [OFFSET + ord("a")]


async def test_a_cancelled_request_is_recorded_cancelled_with_its_tokens() -> None:
    life, items = life_for(request())

    async def serve() -> None:
        async with lifetime(life):
            feed(life, "ab")
            await asyncio.Event().wait()

    task = asyncio.create_task(serve())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (life.ending, life.status, life.usage) == ("cancelled", "cancelled", Usage.of(4, 2))
    assert isinstance(items[-1], Failure) and isinstance(items[-1].error, Cancelled)


@pytest.mark.parametrize(
    ("error", "expected"),
    [(Unavailable("node-b lost"), Unavailable), (RuntimeError("a bug"), RuntimeError)],
)
async def test_a_failure_is_recorded_failed_and_pushed_never_raised(error: Exception, expected: type) -> None:
    life, items = life_for(request())
    async with lifetime(life):
        feed(life, "a")
        raise error
    assert (life.ending, life.status) == ("failed", "failed")
    assert isinstance(items[-1], Failure) and type(items[-1].error) is expected


async def test_the_deadline_is_one_timer_around_the_whole_request() -> None:
    life, items = life_for(request(timeout_s=0.05))
    async with lifetime(life):
        feed(life, "a")
        await asyncio.sleep(5)
    assert life.status == "failed"
    assert isinstance(items[-1], Failure) and isinstance(items[-1].error, DeadlineExceeded)


async def test_a_route_that_ends_before_the_request_finished_is_a_failure() -> None:
    life, items = life_for(request())
    async with lifetime(life):
        feed(life, "ab")
    assert life.status == "failed"
    assert isinstance(items[-1], Failure) and type(items[-1].error) is MeshnetError


def test_without_text_only_tokens_and_the_outcome_are_pushed() -> None:
    items = Items()
    life = RequestLife(request(max_tokens=2), NoText(), items)
    feed(life, "ab")
    life.close()
    assert shown(items) == "" and items[-1] == Outcome("length", Usage.of(4, 2))
