"""A test-only rogue worker, run as its own process: ``python rogue_worker.py --data-dir D worker ...``.

It is the normal ``meshnet worker`` with two changes an attacker could make to their own copy:
every boundary hidden state it forwards is shifted by a small epsilon (a subtly wrong answer),
and it claims a decode rate well above any honest node's, yet inside what the tracker believes
(tracker/claims.py caps a claim at 32x its peers'), so the tracker routes users to it.
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

from meshnet import cli
from meshnet.worker import assembly, stages

EPSILON = 1e-2
"""Relative shift of the forwarded residual: tiny, yet it changes some sampled tokens."""
CLAIM_FACTOR = 20.0
"""Times the lower median of the rates its peers claimed: inside the 32x the tracker believes
(tracker/claims.py), above every honest peer (their measured rates differ by a few times)."""
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
    return [float(json.loads(row[0])["decode_tokens_per_s"]) for row in rows]


def _boasting_registration(*args: Any) -> Any:
    honest = _registration(*args)
    claims = _peer_claims()
    reference = statistics.median_low(claims) if claims else honest.decode_tokens_per_s
    return replace(honest, decode_tokens_per_s=reference * CLAIM_FACTOR)


if __name__ == "__main__":
    stages.ForwardStage.emit = _perturbed_emit  # type: ignore[method-assign]
    assembly._registration = _boasting_registration
    sys.exit(cli.main(sys.argv[1:]))
