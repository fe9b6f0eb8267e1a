"""Kills under load: the load generator SIGKILLs processes (a tracker replica, a store member) at
set moments of its measured span and says what each one cost.

The generator does the killing itself, not the bench that started the processes, so the moment
of each kill is on the same clock as every latency and heartbeat it counts. Around each kill it
reports the latencies of the phase before and after (``Counts.new_phase``) and how long until
every simulated node had a heartbeat answered again by a live replica: a node's heartbeats stop
at most until it has failed over, so this is the failover time of the slowest node.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from meshnet.core.errors import InvalidArgument
from meshnet.membership.load_figures import Histogram, summary
from meshnet.membership.simulated_nodes import SimulatedNode

RECOVERY_POLL_S = 0.05


@dataclass(frozen=True)
class Kill:
    """Send ``signal_number`` (SIGKILL) to process ``pid`` (``what`` it is, for the report)
    ``at_s`` into the measured span. An etcd member is killed through its tether
    (``process.tether.CRASH_SIGNAL``), which SIGKILLs etcd and reaps it."""

    at_s: float
    pid: int
    what: str
    signal_number: int = signal.SIGKILL

    def __post_init__(self) -> None:
        if self.at_s < 0 or self.pid <= 0:
            raise InvalidArgument(f"a kill needs a time >= 0 and a process id, got {self}")


async def recovered_after(nodes: Sequence[SimulatedNode], killed_at: float, give_up_at: float) -> float | None:
    """Seconds from ``killed_at`` until every node's heartbeat was answered after it (by whichever
    replica it then talked to); None if that did not happen by ``give_up_at`` (monotonic)."""
    while time.monotonic() < give_up_at:
        if all(node.answered_at > killed_at for node in nodes):
            return round(max(node.answered_at for node in nodes) - killed_at, 3)
        await asyncio.sleep(RECOVERY_POLL_S)
    return None


def _phase(label: str, latencies: dict[str, Histogram], seconds: float) -> dict[str, Any]:
    return {
        "phase": label,
        "seconds": round(seconds, 3),
        "calls": {call: summary(histogram, seconds) for call, histogram in sorted(latencies.items())},
    }


def _kill(kill: Kill) -> str | None:
    try:
        os.kill(kill.pid, kill.signal_number)
    except OSError as error:
        return f"{type(error).__name__}: {error}"
    return None


async def measure_with_kills(
    kills: Sequence[Kill],
    nodes: Sequence[SimulatedNode],
    phase_latencies: Callable[[], dict[str, Histogram]],
    wait: Callable[[float], Awaitable[None]],
    measure_s: float,
) -> dict[str, Any]:
    """Wait out ``measure_s`` (with ``wait``, which samples meters), doing each kill on time; the
    phases' latencies (``phase_latencies`` ends one and starts the next) and each kill's recovery."""
    started = time.monotonic()
    end = started + measure_s
    phase_start, label = started, "before any kill"
    phases: list[dict[str, Any]] = []
    done: list[tuple[Kill, float, str | None, asyncio.Task[float | None]]] = []
    for kill in sorted(kills, key=lambda item: item.at_s):
        await wait(started + kill.at_s - time.monotonic())
        killed_at = time.monotonic()
        phases.append(_phase(label, phase_latencies(), killed_at - phase_start))
        error = _kill(kill)
        recovery = asyncio.create_task(recovered_after(nodes, killed_at, end))
        done.append((kill, killed_at - started, error, recovery))
        phase_start, label = killed_at, f"after killing {kill.what}"
    await wait(end - time.monotonic())
    phases.append(_phase(label, phase_latencies(), time.monotonic() - phase_start))
    return {
        "phases": phases,
        "kills": [
            {
                "what": kill.what,
                "pid": kill.pid,
                "at_s": round(at_s, 3),
                "error": error,
                "every_node_answered_again_after_s": await recovery,
            }
            for kill, at_s, error, recovery in done
        ],
    }
