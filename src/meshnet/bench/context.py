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


async def measure_context_scaling(
    prompts: dict[int, tuple[int, ...]], cached: CachedRunner, recompute: RecomputeLane, *,
    fast_lane: str, decode_tokens: int, deadline: float,
) -> dict[str, object]:
    points: dict[str, object] = {}
    for context, prompt in prompts.items():
        if time.monotonic() > deadline:
            points[str(context)] = {"context": context, "skipped": "the bench's time budget was spent"}
            continue
        record = await cached(prompt, decode_tokens + 1)
        trace = record.requests[0]
        gaps = token_gaps(trace)
        fast_ms = None if trace.error or not gaps else (median(gaps) or 0.0) * 1000.0
        slow = []
        first_slow = None
        for index in range(recompute_tokens_for(context)):
            if index and time.monotonic() > deadline:
                break
            begun = time.perf_counter()
            token = recompute.step(prompt)
            slow.append((time.perf_counter() - begun) * 1000.0)
            first_slow = token if first_slow is None else first_slow
        slow_ms = median(slow)
        points[str(context)] = {
            "context": context,
            "fast_ms_per_token": fast_ms,
            "fast_ttft_ms": (trace.token_times[0] - trace.started) * 1000.0 if trace.token_times else None,
            "fast_tokens_measured": len(gaps),
            "slow_ms_per_token": slow_ms,
            "slow_tokens_measured": len(slow),
            "speedup": slow_ms / fast_ms if slow_ms and fast_ms else None,
            "first_token_agrees": bool(trace.tokens) and trace.tokens[0] == first_slow,
            "error": trace.error,
        }
    return {"fast_lane": fast_lane, "slow_lane": "recompute", "points": points}
