"""A test-only rogue worker, run as its own process: ``python rogue_worker.py --data-dir D worker ...``.

It is the normal ``meshnet worker`` with the changes an attacker could make to their own copy:
every boundary hidden state it forwards is shifted by a small epsilon (a subtly wrong answer),
and it claims a decode rate well above any honest node's, yet inside what the tracker believes
(tracker/claims.py caps a claim at 32x its peers'), and a near-zero round trip to every peer it
was asked to measure, measured or not (a loaded machine's probes may time out), so the tracker
routes users to it however noisy the honest nodes' measured speeds and links are.

It can also try to compute honestly on audits only (``MESHNET_ROGUE_AUDIT_MARKERS``, a comma
list), telling a replay from a user's request by what it sees on a session's frames:

- ``id``: the request id ends in ``-audit`` (how replays were named before issue 29);
- ``frames``: the frame that ends the prompt hands the head no continuation, so the sender feeds
  every token itself (how replays were fed before issue 29: a user's request always lets the
  head decode on by itself unless it asks for one token);
- ``repeat``: the prompt and sampling seed are ones it has served before. No audit can hide
  this one (a replay must compute the very same thing); the audit's verdicts handle it instead.

On a session it takes for an audit it forwards the honest hidden state. The decision is made
at a session's first frame (``repeat``: at the prompt's last chunk, honest until then).
"""

from __future__ import annotations

import json
import os
import sqlite3
import statistics
import sys
from dataclasses import replace
from typing import Any

import numpy as np

from meshnet.cli import main as cli
from meshnet.node import assembly, forward_stage, peers

EPSILON = 1e-2
"""Relative shift of the forwarded residual: tiny, yet it changes some sampled tokens."""
CLAIM_FACTOR = 20.0
"""Times the lower median of the rates its peers claimed: inside the 32x the tracker believes
(tracker/claims.py), above every honest peer (their measured rates differ by a few times)."""
BOASTED_RTT_MS = 0.01
"""The round trip it reports to each peer it measured."""
ROGUE_TRACKER_DB = "MESHNET_ROGUE_TRACKER_DB"
"""The tracker's database, read (only) to learn what the honest nodes claimed."""
AUDIT_MARKERS = "MESHNET_ROGUE_AUDIT_MARKERS"
"""Which signs of an audit it acts on: ``id``, ``frames``, ``repeat`` (comma-separated; none: it lies always)."""
MARKERS = frozenset({"id", "frames", "repeat"})

_emit = forward_stage.ForwardStage.emit
_registration = assembly._registration


class _Judge:
    """Which sessions this rogue takes for audits (and then computes honestly)."""

    def __init__(self, markers: frozenset[str]) -> None:
        unknown = markers - MARKERS
        if unknown:
            raise SystemExit(f"unknown audit markers {sorted(unknown)}; known: {sorted(MARKERS)}")
        self.markers = markers
        self._decided: dict[str, bool] = {}
        self._prompts: dict[str, bytes] = {}
        """A session's prompt so far (``repeat``: decided on the whole prompt, at its last chunk)."""
        self._seen: set[bytes] = set()

    def is_audit(self, frame: Any) -> bool:
        session = frame.meta.session_id
        if session in self._decided:
            return self._decided[session]
        looks = "id" in self.markers and frame.meta.request_id.endswith("-audit")
        if "frames" in self.markers and frame.final_chunk and frame.continuation is None:
            looks = True
        if "repeat" in self.markers:
            if frame.tokens is not None:
                self._prompts[session] = self._prompts.get(session, b"") + np.asarray(frame.tokens, np.int32).tobytes()
            if not frame.final_chunk:
                return True  # honest on the prompt's first chunks: the repeat is judged on the whole
            seed = 0 if frame.sampling is None else frame.sampling.seed
            key = self._prompts.pop(session, b"") + seed.to_bytes(8, "little")
            looks = looks or key in self._seen
            self._seen.add(key)
        self._decided[session] = looks
        return looks


_JUDGE = _Judge(frozenset(m for m in os.environ.get(AUDIT_MARKERS, "").split(",") if m))


async def _perturbed_emit(self: Any, state: Any, frame: Any, output: Any, deadline: Any, timing: Any) -> Any:
    if output.hidden is not None and not _JUDGE.is_audit(frame):
        output = replace(output, hidden=(output.hidden * np.float32(1 + EPSILON)).astype(np.float32))
    return await _emit(self, state, frame, output, deadline, timing)


def _peer_claims() -> list[float]:
    connection = sqlite3.connect(f"file:{os.environ[ROGUE_TRACKER_DB]}?mode=ro", uri=True, timeout=5.0)
    try:
        rows = connection.execute("SELECT registration_json FROM nodes").fetchall()
    finally:
        connection.close()
    return [float(json.loads(row[0])["capability"]["decode_tokens_per_s"]) for row in rows]


def _boasting_registration(*args: Any) -> Any:
    honest = _registration(*args)
    claims = _peer_claims()
    reference = statistics.median_low(claims) if claims else honest.capability.decode_tokens_per_s
    return replace(honest, capability=replace(honest.capability, decode_tokens_per_s=reference * CLAIM_FACTOR))


def _boasted_latencies(self: Any) -> tuple[tuple[str, float], ...]:
    return tuple((address, BOASTED_RTT_MS) for address in self._targets)


if __name__ == "__main__":
    peers.PeerProber.latest = _boasted_latencies  # type: ignore[method-assign]
    forward_stage.ForwardStage.emit = _perturbed_emit  # type: ignore[method-assign]
    assembly._registration = _boasting_registration
    sys.exit(cli.main(sys.argv[1:]))
