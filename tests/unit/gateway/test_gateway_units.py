"""Pure parts of the gateway: stop-sequence matching, progress throttle, config checks, the
error-to-status table and the SSE framing that OpenAI clients must not see."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai._streaming import SSEDecoder

from meshnet.core.errors import (
    CacheMiss,
    Cancelled,
    CertificationFailed,
    DeadlineExceeded,
    IntegrityError,
    InvalidArgument,
    MeshnetError,
    NoRoute,
    ResourceExhausted,
    UnsupportedArchitecture,
)
from meshnet.core.ids import RequestId
from meshnet.gateway.choice_view import progress_due
from meshnet.gateway.config import GatewayConfig
from meshnet.gateway.errors import http_error_for, http_status_for
from meshnet.gateway.sse import DONE, telemetry_comment
from meshnet.gateway.stops import StopMatcher
from meshnet.gateway.telemetry_hub import TelemetryEvent


def run_matcher(sequences: tuple[str, ...], pieces: list[str]) -> tuple[str, bool]:
    matcher = StopMatcher(sequences)
    shown, stopped = [], False
    for piece in pieces:
        scan = matcher.push(piece)
        shown.append(scan.emit)
        stopped = scan.stopped
        if stopped:
            break
    if not stopped:
        shown.append(matcher.flush())
    return "".join(shown), stopped


def test_stop_straddling_pieces_is_found_and_removed() -> None:
    assert run_matcher(("END",), ["abc E", "N", "D more"]) == ("abc ", True)


def test_partial_stop_prefix_is_released_when_it_cannot_match() -> None:
    matcher = StopMatcher(("END",))
    assert matcher.push("abcE").emit == "abc"  # "E" may start "END": held back
    assert matcher.push("x").emit == "Ex"
    assert matcher.flush() == ""


def test_earliest_of_several_stops_wins() -> None:
    assert run_matcher(("world", "lo"), ["hello world"]) == ("hel", True)


@settings(max_examples=200, derandomize=True, deadline=None)
@given(
    text=st.text(alphabet="abcE ND", max_size=40),
    cuts=st.lists(st.integers(0, 40), max_size=6),
    stop=st.text(alphabet="abcEND", min_size=1, max_size=4),
)
def test_matcher_agrees_with_whole_text_search(text: str, cuts: list[int], stop: str) -> None:
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    pieces = [text[a:b] for a, b in itertools.pairwise(bounds)]
    index = text.find(stop)
    expected = (text, False) if index < 0 else (text[:index], True)
    assert run_matcher((stop,), pieces) == expected


def test_progress_throttle_by_count_and_by_time() -> None:
    config = GatewayConfig(progress_every_tokens=8, progress_interval_seconds=0.25)
    assert not progress_due(3, 0, now=0.1, last_at=0.0, config=config)
    assert progress_due(8, 0, now=0.1, last_at=0.0, config=config)
    assert progress_due(3, 0, now=0.3, last_at=0.0, config=config)
    assert not progress_due(8, 8, now=9.0, last_at=0.0, config=config)  # nothing new to tell


@pytest.mark.parametrize(
    "overrides",
    [
        {"max_in_flight": 0},
        {"default_max_tokens": 10, "max_tokens_limit": 5},
        {"request_timeout_seconds": 0},
        {"telemetry_max_requests": 4, "max_in_flight": 4, "max_queue": 0},
        {"telemetry_max_requests": 10, "max_in_flight": 4, "max_queue": 6},
        {"max_queue": -1},
        {"queue_timeout_seconds": 0},
        {"port": 70000},
        {"retry_after_seconds": -1},
    ],
)
def test_config_rejects_inconsistent_values(overrides: dict[str, object]) -> None:
    with pytest.raises(InvalidArgument):
        GatewayConfig(**overrides)  # type: ignore[arg-type]


def test_config_defaults_bind_loopback() -> None:
    assert GatewayConfig().host == "127.0.0.1"


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (UnsupportedArchitecture("x"), 400),
        (NoRoute("x"), 503),
        (ResourceExhausted("x"), 503),
        (CacheMiss("x"), 503),
        (CertificationFailed("x"), 503),
        (DeadlineExceeded("x"), 504),
        (IntegrityError("x"), 502),
        (Cancelled("x"), 499),
        (MeshnetError("x"), 500),
    ],
)
def test_status_contract(error: MeshnetError, status: int) -> None:
    assert http_status_for(error) == status
    mapped = http_error_for(error, retry_after_seconds=3)
    assert (mapped.retry_after == 3) == (status == 503)
    assert mapped.body()["error"]["code"] == error.code


def test_openai_decoder_ignores_telemetry_comments_but_raw_lines_carry_them() -> None:
    event = TelemetryEvent(RequestId("req-1"), 0, "progress", 0.5, {"generated_tokens": 4})
    frame = telemetry_comment(event)
    decoder = SSEDecoder()
    lines = (frame + b'data: {"x":1}\n\n' + DONE).decode().splitlines()
    decoded = [sse for sse in map(decoder.decode, lines) if sse is not None]
    assert [sse.data for sse in decoded] == ['{"x":1}', "[DONE]"]
    assert all(sse.event is None for sse in decoded)
    raw = frame.decode().split("\n")[0]
    assert json.loads(raw.removeprefix(": telemetry "))["generated_tokens"] == 4
