"""How long one step of a route may take before the route is given up as hung: a pure decision.

A frozen or wedged shard keeps its sockets open, so nothing but a deadline ends a wait for its
answer (transport keepalive finds a frozen *process*, ``wire.tls.link_options``; a shard whose
engine stopped while its process still answers pings is found only here). The bound comes from
what the route's own nodes measured (``NodeCapability.prefill_tokens_per_s`` and
``decode_tokens_per_s``, each over the node's layer range), never from a fixed 30-60 s:

    budget = floor + factor * sum over hops (own tokens / speed + one engine call ahead) + link * hops

- *own tokens / speed*: the step's own work on the hop (a prefill chunk's tokens at the prefill
  speed, one token at the decode speed), so a long prefill chunk gets a budget proportional to
  its tokens and is never cut for being long;
- *one engine call ahead*: another session's prefill chunk (``prefill_chunk_tokens`` at the
  prefill speed) may run on the hop's engine before this step does, which an honest busy shard
  does all the time; a step queued behind more than that (many sessions arriving at once) is
  given further windows while its hops answer other sessions (``route.hop_progress``);
- *factor* and *floor*: a node measured itself once, idle; a loaded machine (a 2-core CI runner
  with other work) runs the same step several times slower and stalls a process for a second or
  two now and then. An honest slow step must never look like a hung one, as a false failover
  replays the whole request; a hung shard is still given up within seconds;
- *link*: each seam's round trip (and, on a route's first step, its TLS handshake).

A route with a hop that has not measured itself (speed 0) gets no step budget (None): only the
request's own deadline and the transport's keepalive bound it, as nothing says what its step
should take.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from meshnet.core.checks import check_finite
from meshnet.core.errors import InvalidArgument
from meshnet.core.node_record import NodeCapability


@dataclass(frozen=True)
class StepBudget:
    """The margins a step's measured cost is given (see the module's formula)."""

    factor: float = 4.0
    """Times the measured cost: a loaded machine runs a step several times slower than idle."""
    floor_s: float = 5.0
    """Never less: an honest step on a busy 2-core machine can stall a second or two; a hung
    shard's route is still failed over well before a user gives up."""
    link_s: float = 0.25
    """Per hop: the seam's round trip, and a first step's TLS handshake to the next hop."""

    def __post_init__(self) -> None:
        check_finite("step budget factor", self.factor, low=1.0)
        check_finite("step budget floor_s", self.floor_s)
        check_finite("step budget link_s", self.link_s)

    def seconds(self, hops: Sequence[NodeCapability], tokens: int, *, prefill: bool) -> float | None:
        """The most one step of ``tokens`` tokens through ``hops`` may take (a prefill chunk when
        ``prefill``, else one decode token each); None when a hop has not measured its speed."""
        if tokens < 1:
            raise InvalidArgument(f"a step carries at least one token, got {tokens}")
        cost = 0.0
        for hop in hops:
            speed = hop.prefill_tokens_per_s if prefill else hop.decode_tokens_per_s
            if speed <= 0 or hop.prefill_tokens_per_s <= 0:
                return None
            cost += tokens / speed + hop.prefill_chunk_tokens / hop.prefill_tokens_per_s
        return self.floor_s + self.factor * cost + self.link_s * len(hops)
