"""Where the bench's routes split for decode: by the engine's measured cost per row (issue 34).

Counting weight elements (``DecodeWork``) balances what one decoded row multiplies, not what it
costs at the workload's context: every layer's attention reads the positions its KV holds, and
the tail's one-row Q8_0 LM head costs less per element than a Q4_1 block. On SmolLM2 (1 thread)
the element split 0:19 / 19:30 left the head 1.11x the tail's CPU a row at position 200 and
1.27x at 700 (engine timings), and in pinned meshnet-2 at concurrency 8 the head's engine thread
did 1.2x the tail's work, so the head set the route's pace. Measured, the split is 0:18 / 18:30:
aggregate decode +7-10% at 4 and 8 sessions in paired runs (``bench/results/v5/split41/``).

So the bench times one row at a time through the element split's two slices at the workload's
mean decode position and expresses what the tail adds beyond its blocks (LM head, output norm)
in the head's per-element cost: a ``DecodeWork`` whose ``tail`` is measured. Splits into any
number of shards then follow from it as before (``split_by_work``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import DecodeWork, ModelDescription
from meshnet.core.errors import InvalidArgument
from meshnet.core.layers import LayerRange
from meshnet.engine.backend import Backend, StepInput
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.local_route import LocalRoute
from meshnet.engine.shards import open_local_route

CALIBRATION_ROUNDS = 6
"""Rounds (one row of every session each) timed on each slice; the median row is taken (a few
rows run late on a busy machine)."""
WARMUP_ROUNDS = 2
TOKEN = 1
"""The token id every row feeds (every vocabulary has it): the cost does not depend on which."""


@dataclass(frozen=True)
class SplitCalibration:
    """What the engine measured at ``position``: CPU ms a row on each slice of the element split."""

    position: int
    cut: int
    """The element split's cut: the head is layers 0:cut, the tail cut:n."""
    head_ms: float
    tail_ms: float
    work: DecodeWork
    """The model's layers as counted, with the tail's measured extra (in head elements)."""

    def describe(self, counted: Sequence[LayerRange], measured: Sequence[LayerRange]) -> str:
        """The line the report states: what was measured, the split it gave (``measured``) and the
        one weight elements alone give (``counted``), both as the route is placed on its cores."""
        return (
            f"decode split {', '.join(map(str, measured))} from measured cost a row at position {self.position} "
            f"(layers 0:{self.cut} {self.head_ms:.2f} ms, {self.cut}:{len(self.work.layers)} {self.tail_ms:.2f} ms "
            f"of CPU, one row a call); weight elements alone would split {', '.join(map(str, counted))}"
        )


def calibrated_work(work: DecodeWork, cut: int, *, head_ms: float, tail_ms: float) -> DecodeWork:
    """``work`` with its ``tail`` replaced by what the measured slices say it costs: the head's
    CPU per weight element prices the tail's blocks, and the rest of the tail's time (its LM head,
    at its own kernel's pace) is converted back into head elements. Pure."""
    if not 0 < cut < len(work.layers):
        raise InvalidArgument(f"cut {cut} does not leave both slices a layer of {len(work.layers)}")
    if head_ms <= 0 or tail_ms < 0:
        raise InvalidArgument(f"measured costs must be positive, got {head_ms} and {tail_ms} ms")
    per_element = head_ms / sum(work.layers[:cut])
    tail_extra = max(0.0, tail_ms - per_element * sum(work.layers[cut:]))
    return DecodeWork(work.layers, round(tail_extra / per_element))


def calibrate(
    model: ModelDescription, work: DecodeWork, cache: SliceCache, llama: LlamaConfig, *, position: int, sessions: int
) -> SplitCalibration:
    """Time one row per call through the element split's head and tail at ``position``, the rows
    of ``sessions`` sessions in turn, as a route at that concurrency runs them: each row reads
    its own session's KV (one session's KV stays in the CPU's caches and would flatter a long head)."""
    cut = work.split(2)[0].stop
    config = replace(llama, max_slots=sessions, n_ctx_per_slot=max(llama.n_ctx_per_slot, position + 64))
    route = open_local_route(model, 2, cache, config, [LayerRange(0, cut), LayerRange(cut, model.n_layers)])
    try:
        _prefill(route, position, sessions, config.max_batch_tokens)
        costs = _row_costs(route.backends, position, sessions)
    finally:
        for backend in route.backends:
            backend.close()
    head_ms, tail_ms = (statistics.median(c[WARMUP_ROUNDS * sessions :]) for c in costs)
    measured = calibrated_work(work, cut, head_ms=head_ms, tail_ms=tail_ms)
    return SplitCalibration(position, cut, head_ms, tail_ms, measured)


def _prefill(route: LocalRoute, position: int, sessions: int, chunk: int) -> None:
    """``position`` tokens into session 0, its KV copied into the others (one prefill, not N)."""
    for start in range(0, position, chunk):
        route.forward(0, start, np.full(min(chunk, position - start), TOKEN, np.int32))
    for backend in route.backends:
        blob = backend.export_slot(0)
        for slot in range(1, sessions):
            backend.import_slot(slot, blob, position)


def _row_costs(slices: Sequence[Backend], position: int, sessions: int) -> list[list[float]]:
    """CPU ms of each one-row decode on each slice, the sessions in turn, each slice taking the
    previous one's hidden state. Process CPU, not wall time: another process's load on a shared
    machine distorts it less."""
    costs: list[list[float]] = [[] for _ in slices]
    for offset in range(WARMUP_ROUNDS + CALIBRATION_ROUNDS):
        for slot in range(sessions):
            step = StepInput(slot, position + offset, tokens=np.array([TOKEN], np.int32))
            for index, backend in enumerate(slices):
                started = time.process_time()
                (output,) = backend.run([step])
                costs[index].append((time.process_time() - started) * 1000.0)
                if output.hidden is not None:
                    step = StepInput(slot, step.position, hidden=output.hidden)
    return costs
