"""One request's life on the route: its tokens, the one decision that ends it, its usage and bill.

Every way a request ends is decided here and nowhere else: a stop token (EOS), a stop string,
the length budget (``max_tokens``), a cancellation (the client went away) or a failure (a typed
error). The route client owns a ``RequestLife`` per request; it feeds it the driver's events and
the life pushes what the caller should see into a ``LifeSink``: route notes (accepted, prefill,
decode, health), the text of each token, and once the route is released, the ``Outcome`` (finish
reason and usage) or the ``Failure``. The work record's status and billing are read from the same
state, so the client, the tracker's record and the audit always agree on how a request ended.

Stop strings need text, which the route does not have: the caller lends a ``TextPlug`` (the
gateway builds one from its tokenizer's incremental decoder and its stop matcher) that turns each
token into the text to show and says whether a stop string was hit. The plug only answers; the
decision is taken and recorded here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal, Protocol

from meshnet.core.errors import Cancelled, DeadlineExceeded, MeshnetError
from meshnet.core.events import (
    DecodeStarted,
    GenerationEvent,
    HopLatency,
    PrefillCompleted,
    PrefillProgress,
    PrefillStarted,
    RouteAccepted,
    RouteHealth,
    TokenGenerated,
)
from meshnet.core.generation import GenerationRequest
from meshnet.core.sampling_options import TokenLogprobs
from meshnet.core.tracking import WorkStatus, billing_units

log = logging.getLogger(__name__)

FinishReason = Literal["stop", "length"]
"""What the client is told (OpenAI's ``finish_reason``)."""
Ending = Literal["stop_token", "stop_string", "length", "cancelled", "failed"]
"""Every way a request ends."""

_FINISH_REASONS: dict[Ending, FinishReason] = {"stop_token": "stop", "stop_string": "stop", "length": "length"}
_STATUSES: dict[Ending, WorkStatus] = {
    "stop_token": "completed",
    "stop_string": "completed",
    "length": "completed",
    "cancelled": "cancelled",
    "failed": "failed",
}


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    """Every generated token, the stop token included: each was computed on the route."""
    billing_units: float
    cached_tokens: int = 0
    """Prompt tokens whose KV the route restored instead of computing (OpenAI's
    ``prompt_tokens_details.cached_tokens``)."""

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> Usage:
        return cls(prompt_tokens, completion_tokens, billing_units(prompt_tokens, completion_tokens), cached_tokens)

    def __add__(self, other: Usage) -> Usage:
        """Two choices of one request: the prompt once (in the tokens and in the billing, as
        usage counts it), the completions summed; the prompt cached as far as every choice found
        it so. Each choice's work record still bills its own session's prefill to the nodes."""
        completion_tokens = self.completion_tokens + other.completion_tokens
        return Usage(
            self.prompt_tokens,
            completion_tokens,
            billing_units(self.prompt_tokens, completion_tokens),
            min(self.cached_tokens, other.cached_tokens),
        )


@dataclass(frozen=True)
class TextPiece:
    """What one token adds to the visible text, and whether it completed a stop string."""

    text: str
    stopped: bool = False


class TextPlug(Protocol):
    """Turns tokens into text for one request; lent by the caller (the route has no tokenizer)."""

    def push(self, token_id: int) -> TextPiece:
        """Add one (non-stop) token: the text safe to show now, and whether a stop string matched."""
        ...

    def flush(self) -> str:
        """Text still held back, once no more tokens come."""
        ...


class NoText:
    """A ``TextPlug`` for callers that want tokens only: no text, no stop strings."""

    def push(self, token_id: int) -> TextPiece:
        return TextPiece("")

    def flush(self) -> str:
        return ""


@dataclass(frozen=True)
class TokenText:
    """One generated token as the client sees it (a stop token never becomes one)."""

    text: str
    """May be empty: a character can need more than one token, a stop string is held back."""
    logprobs: TokenLogprobs | None
    generated: int
    """Tokens of text so far, this one included."""
    tokens_per_second: float
    hops: tuple[HopLatency, ...] = ()
    """Each hop's time for the step that produced this token, on a sample of the steps."""


@dataclass(frozen=True)
class Outcome:
    """How a completed request finished, pushed once its route was released."""

    finish_reason: FinishReason
    usage: Usage


@dataclass(frozen=True)
class Failure:
    """How a request that did not complete ended: a typed ``MeshnetError`` (``Cancelled`` when the
    caller went away), or, for a bug, the untyped exception itself."""

    error: Exception


RouteNote = RouteAccepted | PrefillStarted | PrefillProgress | PrefillCompleted | DecodeStarted | RouteHealth
LifeItem = RouteNote | TokenText | Outcome | Failure


class LifeSink(Protocol):
    """Where a request's items go, in order; ``put`` never blocks (the route does not wait on it)."""

    def put(self, item: LifeItem) -> None: ...


def finish_for(request: GenerationRequest, produced: int, token: int, *, stop_string: bool = False) -> Ending | None:
    """Whether the ``produced``-th generated token, ``token``, ends ``request``, and how.

    A stop token ends it first (it is not text, so it cannot complete a stop string); a stop
    string outranks the budget when the last allowed token completes one, as OpenAI reports it.
    """
    if token in request.stop_tokens:
        return "stop_token"
    if stop_string:
        return "stop_string"
    if produced >= request.max_tokens:
        return "length"
    return None


class RequestLife:
    """The state of one request across its routes; synchronous, so each event is handled whole."""

    def __init__(self, request: GenerationRequest, text: TextPlug, sink: LifeSink) -> None:
        self.request = request
        self.tokens: list[int] = []
        """Every generated token so far, stop token included: what a failover replays."""
        self.ending: Ending | None = None
        self.error: Exception | None = None
        self._text = text
        self._sink = sink
        self._text_tokens = 0
        self._closed = False
        self._cached = 0

    @property
    def finished(self) -> bool:
        return self.ending is not None

    @property
    def usage(self) -> Usage:
        return Usage.of(len(self.request.prompt_tokens), len(self.tokens), self._cached)

    @property
    def status(self) -> WorkStatus:
        """The work record's status; a life that never ended (its task died) counts as failed."""
        return "failed" if self.ending is None else _STATUSES[self.ending]

    def note(self, event: RouteNote) -> None:
        if not self.finished:
            self._sink.put(event)

    def observe(self, event: GenerationEvent) -> bool:
        """Take one driver event; True when the caller must stop reading the route now.

        That is after a stop string (the route cannot see text, so it would decode on) or when
        the route sends anything after the end. A stop token or the budget ends the driver by
        itself (it asks the same ``finish_for``), so the route sees a normal finish.
        """
        if isinstance(event, TokenGenerated):
            return self._token(event)
        if isinstance(event, PrefillStarted):
            self._cached = event.cached_tokens  # the route that serves the request now
        self.note(event)
        return self.finished

    def _token(self, event: TokenGenerated) -> bool:
        if self.finished:
            return True
        token = event.token_id
        self.tokens.append(token)
        stopped = False
        if token not in self.request.stop_tokens:  # a stop token is not text
            piece = self._text.push(token)
            self._text_tokens += 1
            self._sink.put(
                TokenText(piece.text, event.logprobs, self._text_tokens, event.tokens_per_second, event.hops)
            )
            stopped = piece.stopped
        self.ending = finish_for(self.request, len(self.tokens), token, stop_string=stopped)
        if self.ending is not None:
            tail = self._text.flush()
            if tail:
                self._sink.put(TokenText(tail, None, self._text_tokens, event.tokens_per_second))
        return self.ending == "stop_string"

    def fail(self, error: Exception) -> None:
        if not self.finished:
            self.ending, self.error = "failed", error

    def cancel(self) -> None:
        if not self.finished:
            self.ending = "cancelled"
            self.error = Cancelled("the request was cancelled (client gone or stream closed)")

    def close(self) -> None:
        """Push the request's end into the sink, once; called after its route was released."""
        if self._closed:
            return
        self._closed = True
        if self.ending is None:
            self.fail(MeshnetError("the route ended before the request finished"))
        if self.ending in _FINISH_REASONS:
            self._sink.put(Outcome(_FINISH_REASONS[self.ending], self.usage))
        else:
            self._sink.put(Failure(self.error or MeshnetError(f"the request ended: {self.ending}")))


@contextlib.asynccontextmanager
async def lifetime(life: RequestLife) -> AsyncIterator[None]:
    """Run the body under the request's one deadline; record how it ended and push that end.

    The body drives the route; whatever leaves it -- a normal end, a typed error, a bug, the
    deadline, a cancellation -- becomes the life's ending, and ``close`` hands it to the sink
    after the body's own cleanup (closing the route) has run.
    """
    timer = asyncio.timeout(life.request.timeout_s)
    try:
        async with timer:
            yield
    except TimeoutError as error:
        # Only a deadline that was set can expire; any other TimeoutError is a bug below.
        late = DeadlineExceeded(f"the request exceeded its deadline of {life.request.timeout_s or 0:g} s")
        life.fail(late if timer.expired() else error)
    except MeshnetError as error:
        life.fail(error)
    except asyncio.CancelledError:
        life.cancel()
        raise
    except Exception as error:  # a bug: the caller still gets a failure, never a hang
        log.exception("serving the request failed")
        life.fail(error)
    finally:
        life.close()
