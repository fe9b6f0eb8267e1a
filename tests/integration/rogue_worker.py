"""A test-only rogue worker, run as its own process: ``python rogue_worker.py --data-dir D worker ...``.

It is the normal ``meshnet worker`` with the changes an attacker could make to their own copy:
every boundary hidden state it forwards is shifted by a small epsilon (a subtly wrong answer),
and it claims a decode rate well above any honest node's, yet inside what the tracker believes
(tracker/claims.py caps a claim at 32x its peers'), and a near-zero round trip to every peer it
was asked to measure, measured or not (a loaded machine's probes may time out), so the tracker
routes users to it however noisy the honest nodes' measured speeds and links are.
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
from meshnet.node import assembly, peers, stages

EPSILON = 1e-2
"""Relative shift of the forwarded residual: tiny, yet it changes some sampled tokens."""
CLAIM_FACTOR = 20.0
"""Times the lower median of the rates its peers claimed: inside the 32x the tracker believes
(tracker/claims.py), above every honest peer (their measured rates differ by a few times)."""
BOASTED_RTT_MS = 0.01
"""The round trip it reports to each peer it measured."""
ROGUE_TRACKER_DB = "MESHNET_ROGUE_TRACKER_DB"
"""The tracker's database, read (only) to learn what the honest nodes claimed."""

_emit = stages.ForwardStage.emit
_registration = assembly._registration


async def _perturbed_emit(self: Any, state: Any, frame: Any, output: Any, deadline: Any, timing: Any) -> Any:
    if output.hidden is not None:
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
    stages.ForwardStage.emit = _perturbed_emit  # type: ignore[method-assign]
    assembly._registration = _boasting_registration
    sys.exit(cli.main(sys.argv[1:]))
