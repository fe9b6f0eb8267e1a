"""Measure this shard's own prefill and decode speed before it registers.

The tracker routes by measured speed, not by what an operator claims; the probe runs on the
real backend in a spare slot and leaves no KV behind.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from meshnet.engine.backend import Backend, StepInput

PROBE_PREFILL = 64
PROBE_DECODE = 16


@dataclass(frozen=True)
class ShardSpeed:
    prefill_tokens_per_s: float
    decode_tokens_per_s: float


def measure_speed(backend: Backend) -> ShardSpeed:
    shape = backend.shape
    slot = shape.max_slots - 1
    rng = np.random.default_rng(0)

    def step(position: int, n: int) -> StepInput:
        if shape.takes_tokens:
            return StepInput(slot, position, tokens=np.full(n, 1, np.int32))
        return StepInput(slot, position, hidden=rng.standard_normal((n, shape.n_embd)).astype(np.float32))

    try:
        started = time.perf_counter()
        backend.run([step(0, PROBE_PREFILL)])
        prefill = PROBE_PREFILL / (time.perf_counter() - started)
        started = time.perf_counter()
        for index in range(PROBE_DECODE):
            backend.run([step(PROBE_PREFILL + index, 1)])
        decode = PROBE_DECODE / (time.perf_counter() - started)
    finally:
        backend.truncate(slot, 0)
    return ShardSpeed(prefill, decode)
