"""Pure scheduling: which pending work the engine runs in its next tick.

Policy, and why:
- every ready one-token decode step runs in the tick, batched into one llama.cpp call
  (batched decode is bit-identical to solo decode and raises aggregate throughput);
- at most one prefill chunk runs per tick, oldest first, so a long prompt never holds the
  decode steps of other sessions for more than one chunk, and decode never starves prefill
  (a waiting chunk runs in every tick);
- work past its deadline is failed before it runs, so it never appends KV;
- a route's head runs its decoding sessions as waves of neighbouring slots, a complete wave
  before a partial one (``slot_waves``, ``next_wave``): one llama.cpp graph per wave;
- a shard that is a whole route by itself (``gathers``) waits briefly (``gather_wait``) for the
  steps of its other decoding sessions, which its own last batch answered and which come back
  one by one, so batches stay full; a shard of a longer route never waits: a step that is ready
  runs in the next tick (work-conserving). On a pipeline a waiting shard idles the route: a
  paired A/B on the 3-shard SmolLM2 route (2 cores) measured the window and a per-head batch
  cap at 0.87x whole-model at concurrency 8 and 0.70x at 2, and no window 1.06x and 1.09x.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PendingWork:
    ticket: int
    n_tokens: int
    """Tokens of the next chunk this work would run (1 for a decode step)."""
    enqueued_at: float
    deadline: float | None
    slot: int = -1
    """The session's KV slot (its llama.cpp sequence id); -1 where unknown."""


@dataclass(frozen=True)
class TickPlan:
    run: tuple[int, ...]
    """Tickets to run now: decode steps first, then at most one prefill chunk."""
    expired: tuple[int, ...]


def plan_tick(
    pending: Sequence[PendingWork],
    *,
    now: float,
    max_decode_batch: int,
    waves: Sequence[Sequence[int]] = (),
    hold_s: float = 0.0,
) -> TickPlan:
    """``waves``: the slots of each decode wave (``slot_waves``) on a route's head, with the
    longest a partial wave's step is passed over (``next_wave``); no waves: a tick runs every
    ready decode step, oldest first, up to ``max_decode_batch``."""
    expired = tuple(w.ticket for w in pending if w.deadline is not None and w.deadline <= now)
    live = [w for w in pending if w.ticket not in expired]
    live.sort(key=lambda w: (w.enqueued_at, w.ticket))
    ready = [w for w in live if w.n_tokens == 1]
    decode = [w.ticket for w in next_wave(ready, waves, now=now, hold_s=hold_s)][:max_decode_batch]
    prefill = [w.ticket for w in live if w.n_tokens > 1][:1]
    return TickPlan(tuple(decode + prefill), expired)


def slot_waves(decoding_slots: Collection[int], size: int) -> tuple[tuple[int, ...], ...]:
    """The decoding sessions' slots, ascending, cut into waves of ``size``.

    llama.cpp runs a call's rows as one graph (one pass over the weights) only where their
    sequence ids are consecutive (``engine.batching.decode_calls``), and a session table hands
    out the lowest free slot, so waves of neighbouring slots are the waves llama.cpp batches.
    Waves made of whichever steps were ready (the head's rule before) mixed slots at random:
    measured on SmolLM2 pinned meshnet-2 at 8 sessions, the head's 3-row calls ran as 2-3 graphs
    and the tail ran 78% of its rows one per call (``bench/results/v5/waves43``)."""
    ordered = sorted(decoding_slots)
    return tuple(tuple(ordered[start : start + size]) for start in range(0, len(ordered), size))


def next_wave(
    decode: Sequence[PendingWork], waves: Sequence[Sequence[int]], *, now: float, hold_s: float
) -> list[PendingWork]:
    """The ready decode steps (oldest first) of the wave a head runs next: the oldest wave whose
    members are all ready, else the ready members of the oldest step's wave; and that one at
    once when its oldest step has waited ``hold_s``.

    Running a complete wave first lets a wave split by a join or a leave come together again:
    its early part waits while another wave runs, and its late part, a wave behind, catches up.
    The hold bounds the wait where a member does not come (a session between two turns of a
    conversation): the engine passes two of its decode calls. A slot outside every wave (a
    session that just started decoding) is a wave of its own."""
    if not waves or not decode:
        return list(decode)
    wave_of = {slot: index for index, members in enumerate(waves) for slot in members}
    ready: dict[tuple[int, int], list[PendingWork]] = {}
    for work in decode:
        key = (wave_of[work.slot], -1) if work.slot in wave_of else (-1, work.ticket)
        ready.setdefault(key, []).append(work)
    oldest = next(iter(ready.values()))  # insertion order: the oldest step's wave first
    if now - oldest[0].enqueued_at >= hold_s:
        return oldest
    for (index, _), works in ready.items():
        if index < 0 or len(works) == len(waves[index]):
            return works
    return oldest


@dataclass(frozen=True)
class GatherPolicy:
    """How long a tick may wait for the decode steps of other sessions to arrive.

    A shard's sessions reach it one by one (each from its own stream), so a tick that runs the
    moment one step is ready batches ~2 of 8 sessions. Waiting briefly lets the steps of the
    other sessions that are due (``expected_sessions``) join the same llama.cpp call; a single
    stream never waits (nothing else is expected), and nothing waits past its deadline.
    """

    window_s: float = 0.0015
    """Shortest window, counted from the arrival of the oldest ready decode step."""
    max_window_s: float = 0.010
    """Longest window. Within it, the window is as long as one of this shard's decode calls: the
    answers of one batch come back as next steps spread over the time the event loop takes to
    send the answers and take the steps (measured 2-8 ms for 6 steps)."""
    horizon_s: float = 0.5
    """A session counts as decoding if it sent a decode step this recently (and was not released)."""


def gather_wait(
    decode_arrivals: Sequence[float],
    decoding_sessions: int,
    *,
    prefill_waiting: bool,
    earliest_deadline: float | None,
    now: float,
    policy: GatherPolicy,
    decode_call_s: float = 0.0,
) -> float:
    """Seconds to wait for more decode steps before running the tick; 0 runs it now.

    ``decode_arrivals``: when each ready decode step arrived; ``decoding_sessions``: the steps
    the tick can still expect, ready ones included (``expected_sessions``); ``decode_call_s``:
    how long this shard's recent decode calls took.
    """
    if not decode_arrivals or prefill_waiting or len(decode_arrivals) >= decoding_sessions:
        return 0.0
    wait = window_length(policy, decode_call_s) - (now - min(decode_arrivals))
    if earliest_deadline is not None:
        wait = min(wait, earliest_deadline - now)
    return max(wait, 0.0)


def window_length(policy: GatherPolicy, decode_call_s: float) -> float:
    """How long a tick may wait, counted from its oldest ready decode step (see ``GatherPolicy``)."""
    return min(max(policy.window_s, decode_call_s), policy.max_window_s)


def expected_sessions(
    last_arrival: Mapping[int, float],
    period: Mapping[int, float],
    ready: Collection[int],
    *,
    until: float,
    now: float,
    policy: GatherPolicy,
) -> int:
    """Sessions (slots) whose decode step a tick can still expect by ``until``, the end of its
    window: the ready ones, and the decoding ones whose next step is due by then (their last
    arrival plus their own step period) or whose period is not known yet. A session whose
    client paces it (or whose step was late) is not waited for the whole window every tick.
    """
    count = 0
    for slot, arrived in last_arrival.items():
        if now - arrived > policy.horizon_s:
            continue  # not decoding any more
        every = period.get(slot)
        if slot in ready or every is None or arrived + every <= until:
            count += 1
    return count


def nothing_to_gather(pending: int, sessions_seen: int) -> bool:
    """True when no window can apply, so a tick needs none computed (``gather_wait`` would
    answer 0): nothing is pending, or one piece of work is and at most one session (slot) has
    decoded since it was last released, so no other session's step can join it. The
    single-stream case, checked first on every tick."""
    return pending == 0 or (pending == 1 and sessions_seen <= 1)


INLINE_MAX_CALL_S = 0.05
"""Longest recent decode call for which a lone step still runs inline: the caller's thread is the
event loop's, and a slower shard (a large model on few cores) must not stall its network work,
failure watches and heartbeats for that long each token."""


def runs_inline(
    n_tokens: int, *, queued: int, slot: int, sessions_seen: Sequence[int], decode_call_s: float = 0.0
) -> bool:
    """True when a step may run on the caller's own thread instead of the engine thread's:
    a one-token decode step with nothing pending or queued, of the only session that has
    decoded since its release, on a shard whose recent decode calls were short
    (``INLINE_MAX_CALL_S``). Such a step would run alone in the next tick anyway (see
    ``nothing_to_gather``), so running it at once changes no batch; it only saves the two
    thread hand-offs of the queue (measured 0.3 ms a step on a shard whose threads share a core)."""
    return (
        n_tokens == 1
        and queued == 0
        and decode_call_s <= INLINE_MAX_CALL_S
        and all(seen == slot for seen in sessions_seen)
    )


def gathers(*, takes_tokens: bool, emits_logits: bool) -> bool:
    """Whether a shard waits for the decode steps of its other sessions (``gather_wait``): only a
    shard that is a whole route (it takes token ids and samples), whose sessions' next steps are
    its own last batch's answers coming back; any other shard runs what is ready."""
    return takes_tokens and emits_logits


def pipeline_waves(*, takes_tokens: bool, emits_logits: bool, route_shards: int) -> int:
    """How many waves a shard splits its decoding sessions into: only the head of a route of
    several shards (it takes token ids and forwards), whose batches every later shard inherits;
    as many waves as the longest of its sessions' routes has shards (``route_shards``, at least
    two), so that each shard has a wave to run while the others run theirs.

    Run as one llama_decode, the sessions of a route move as one wave: each shard idles while
    the others compute, so a route of N shards is no faster than one (measured: 0.98x whole at
    concurrency 8 on two pinned shards once the ring's batches stopped splitting the sessions
    by accident). Several waves keep several shards busy at the price of smaller batches: each
    wave streams the shard's weights through the CPU's caches once more, so a call's CPU a row
    falls with its rows (SmolLM2's 11-layer tail on the Xeon VM, timed at start-up: 3.45, 2.82,
    2.48 and 2.39 ms a row in calls of 1, 2, 4 and 8).

    No spare wave: a head used to keep one more wave than the route has shards in flight, so
    that a wave crossing a seam (~1-3 ms) never left a shard without work. Since the ring's
    batches, slot waves and the tail's measured batching, the spare wave costs more than the
    crossings it hid: pinned SmolLM2 ``meshnet-2`` at 8 sessions decoded faster with two waves
    than with three in all ten alternating pairs on the 2-core Xeon VM, 1.024-1.163x, median
    1.046x (``bench/results/v5/waves44``)."""
    if not takes_tokens or emits_logits:
        return 1
    return max(2, route_shards)


def wave_size(max_decode_batch: int, decoding_sessions: int, waves: int) -> int:
    """The most decode steps one tick runs: the decoding sessions split into ``waves`` equal
    waves (rounded up), so that each wave stays a wave from one token to the next; where rounding
    up leaves fewer waves than ``waves`` (four sessions on a three-shard route: 2 + 2), or fewer
    sessions than waves, one wave per session: never a shard without a wave, nor one wave of all
    (the lock-step the waves exist to avoid). A single stream is never held back.

    Two-row waves are waves like any other. They used to be cut into one-row waves, on two
    measurements of the AVX2 EPYC: a tail's two-row call through its Q8_0 LM head cost far more
    than two one-row calls, and a head's two-row call 9% more a row. A tail now measures that at
    start-up and runs such rows one per call itself (``engine.call_costs``); a head's layers cost
    the same a row at one and two rows on the AVX-512 Xeon (SmolLM2 0:19: 3.78 vs 3.74 ms), and a
    two-row wave saves a seam message and a call's fixed cost a row. Pinned SmolLM2 ``meshnet-2``
    at 4 sessions decoded 1.064-1.100x faster (median 1.083x) with two waves of two than with
    four of one, in five alternating pairs on the Xeon (``bench/results/v5/waves45``)."""
    if waves <= 1 or decoding_sessions <= 1:
        return max_decode_batch
    size = min(max_decode_batch, -(-decoding_sessions // waves))
    return size if -(-decoding_sessions // size) >= waves else 1
