"""Context scaling: per-token decode latency at growing contexts, KV-cached lane vs recompute.

At context C the cached lane (a meshnet route of worker processes, or an in-process split) pays
one decode step per token; recompute pays a whole C-token forward pass per token. Both get KV
room for the longest context (one session each), so neither is measured in a geometry the
other did not have. Recompute at long contexts is slow by design: it measures one to three
tokens per context and stops starting new contexts once the phase's deadline has passed.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence

from meshnet.bench.inprocess import RecomputeLane
from meshnet.bench.results import ContextPoint, ContextScaling, SkippedContext
from meshnet.bench.stats import RunRecord, median, token_gaps

CachedRunner = Callable[[tuple[int, ...], int], Awaitable[RunRecord]]
"""(prompt, tokens to generate) -> one run of the cached lane at concurrency 1."""


def recompute_tokens_for(context: int) -> int:
    """Tokens recompute measures at a context: enough for a median, few enough to stay bounded."""
    return 3 if context <= 512 else 2 if context <= 2048 else 1


def clamp_contexts(contexts: Sequence[int], limit: int, decode_tokens: int) -> list[int]:
    """Contexts that fit ``limit`` positions with room for the decoded tokens (duplicates dropped)."""
    fitted: list[int] = []
    for context in contexts:
        value = max(1, min(context, limit - decode_tokens - 2))
        if value not in fitted:
            fitted.append(value)
    return fitted


GROWTH_EXPONENT = 1.75
"""How a context's prefill time is extrapolated from the previous one: between linear (weights)
and quadratic (attention); measured on SmolLM2 from 2,048 to 8,000 tokens."""


def estimate_seconds(previous: tuple[int, float] | None, context: int) -> float:
    """Expected prefill seconds at ``context`` from the last measured (context, seconds)."""
    if previous is None:
        return 0.0
    return previous[1] * (context / previous[0]) ** GROWTH_EXPONENT


async def measure_context_scaling(
    prompts: dict[int, tuple[int, ...]],
    cached: CachedRunner,
    recompute: RecomputeLane,
    *,
    fast_lane: str,
    decode_tokens: int,
    deadline: float,
    max_recompute_step_s: float,
) -> ContextScaling:
    """Contexts in ascending order; each is skipped when its estimated cost would pass ``deadline``."""
    points: dict[int, SkippedContext | ContextPoint] = {}
    previous: tuple[int, float] | None = None
    for context, prompt in sorted(prompts.items()):
        expected = estimate_seconds(previous, context)
        if time.monotonic() + expected > deadline:
            points[context] = SkippedContext(
                context, f"the time budget has no room (about {expected:.0f} s of prefill)"
            )
            continue
        record = await cached(prompt, decode_tokens + 1)
        trace = record.requests[0]
        gaps = token_gaps(trace)
        fast_ms = None if trace.error or not gaps else (median(gaps) or 0.0) * 1000.0
        prefill_s = trace.token_times[0] - trace.started if trace.token_times else None
        if prefill_s is not None:
            previous = (context, prefill_s)
        slow, first_slow = _recompute(recompute, prompt, context, prefill_s, deadline, max_recompute_step_s)
        if slow:
            slow_ms, source = median(slow), f"in-process recompute, {len(slow)} token(s)"
        else:
            # One recompute step is a prefill of the whole context through every shard: the
            # route's own time to first token is that step, measured over the network.
            slow_ms, source = (None if prefill_s is None else prefill_s * 1000.0), f"{fast_lane} prefill of the context"
        points[context] = ContextPoint(
            context=context,
            fast_ms_per_token=fast_ms,
            fast_ttft_ms=None if prefill_s is None else prefill_s * 1000.0,
            fast_tokens_measured=len(gaps),
            slow_ms_per_token=slow_ms,
            slow_tokens_measured=len(slow),
            slow_source=source,
            speedup=slow_ms / fast_ms if slow_ms and fast_ms else None,
            first_token_agrees=None if first_slow is None else bool(trace.tokens) and trace.tokens[0] == first_slow,
            error=trace.error,
        )
    return ContextScaling(fast_lane, points)


def _recompute(
    lane: RecomputeLane,
    prompt: tuple[int, ...],
    context: int,
    step_estimate_s: float | None,
    deadline: float,
    max_step_s: float,
) -> tuple[list[float], int | None]:
    """Per-token milliseconds of in-process recompute at this context, within the bounds."""
    if step_estimate_s is None or step_estimate_s > max_step_s:
        return [], None
    slow: list[float] = []
    first = None
    for _ in range(recompute_tokens_for(context)):
        if time.monotonic() + step_estimate_s > deadline:
            break
        begun = time.perf_counter()
        token = lane.step(prompt)
        slow.append((time.perf_counter() - begun) * 1000.0)
        first = token if first is None else first
    return slow, first
