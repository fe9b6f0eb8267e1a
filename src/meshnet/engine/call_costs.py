"""How many one-token rows are worth one llama_decode call through a shard's Q8_0 LM head,
measured at start-up on the CPU that serves them.

Whether a few rows cost less in one call than one call each depends on the CPU, not the model:
ggml hands a many-row Q8_0 product to llamafile's tinyBLAS and a one-row one to its own dot
kernel, and which is cheaper follows the instruction sets (``batching.BATCHED_LM_HEAD_FROM``:
batched only from 8 rows on an AVX2 EPYC, from 2 on an AVX-512 Xeon, SmolLM2's tail). A shard
whose rows could go either way times both on its own thread before it serves and keeps the
cheaper (``batching.fewest_from_costs``). The rows compute the same either way
(``batching.decode_rows_per_call``): a noisy measurement costs only speed, never a token.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from meshnet.engine.backend import ShardShape, StepInput, StepOutput
from meshnet.engine.batching import MatrixWeight, fewest_batched_rows, fewest_from_costs
from meshnet.engine.llama_config import LlamaConfig

log = logging.getLogger(__name__)
Decode = Callable[[list[tuple[int, StepInput]], dict[int, list[StepOutput]]], None]
"""A backend's one llama_decode call over (index, step) rows, its outputs added to the pieces."""
Clear = Callable[[int, int], None]
"""A backend's truncate: drop a slot's KV from a position on."""

MEASURED_ROWS = (1, 2, 4, 8)
"""Row counts timed: one call of each, in this order, per round (so no call reuses the last
one's graph, as none does when a shard serves waves of several sessions)."""
BUDGET_S = 1.0
"""CPU seconds the measurement may take at start-up; a shard too slow for one round in it keeps
the default (``batching.BATCHED_LM_HEAD_FROM``): its layers, not its LM head, set its cost."""
MOST_ROUNDS = 5


@dataclass(frozen=True)
class CallCosts:
    """What one call of each measured row count cost (CPU seconds, median of ``rounds``), and the
    fewest rows worth one call that follows."""

    calls: tuple[tuple[int, float], ...]
    rounds: int
    fewest: int

    def describe(self) -> str:
        per_row = ", ".join(f"{rows}: {cost / rows * 1e3:.2f}" for rows, cost in self.calls)
        return (
            f"decode batches run as one call from {self.fewest} row(s); CPU ms a row by rows a call: "
            f"{per_row} (median of {self.rounds} round(s))"
        )


def measure_call_costs(
    decode_rows: Callable[[int], float], max_rows: int, *, budget_s: float = BUDGET_S
) -> CallCosts | None:
    """Time ``decode_rows(k)``, one call of ``k`` one-token rows that returns its CPU seconds, for
    each measured ``k`` up to ``max_rows``; None when nothing can batch (``max_rows`` < 2) or one
    round would not fit ``budget_s``."""
    sizes = [rows for rows in MEASURED_ROWS if rows <= max_rows]
    if len(sizes) < 2:
        return None
    decode_rows(1)  # the first call allocates llama.cpp's compute buffers: not a cost to compare
    one_round = decode_rows(1) * sum(sizes)
    rounds = min(MOST_ROUNDS, int(budget_s / one_round)) if one_round > 0 else MOST_ROUNDS
    if rounds < 1:
        return None
    seen: dict[int, list[float]] = {rows: [] for rows in sizes}
    for _ in range(rounds):
        for rows in sizes:
            seen[rows].append(decode_rows(rows))
    costs = {rows: statistics.median(times) for rows, times in seen.items()}
    fewest = fewest_from_costs(costs[1], {rows: cost for rows, cost in costs.items() if rows > 1})
    return CallCosts(tuple(sorted(costs.items())), rounds, fewest)


def probe_step(slot: int, shape: ShardShape) -> StepInput:
    """A one-token step at position 0 of ``slot`` for this shard's input (token 0, or a zero
    residual), its logits not copied out: what a measured call carries."""
    if shape.takes_tokens:
        return StepInput(slot, 0, tokens=np.zeros(1, np.int32), read_logits=False)
    return StepInput(slot, 0, hidden=np.zeros((1, shape.n_embd), np.float32), read_logits=False)


def batched_from(
    weights: Iterable[MatrixWeight], config: LlamaConfig, shape: ShardShape, decode: Decode, clear: Clear
) -> tuple[int, CallCosts | None]:
    """Fewest one-token rows a shard runs as one decode call (``batching.decode_calls``), and what
    was measured to choose it: 1, nothing measured, where a call of any rows is the cheaper
    (``batching.fewest_batched_rows``) or the config runs every batch as one call (certification);
    the config's own number where it names one; else measured now, on the thread that serves."""
    if not config.split_small_decode_batches:
        return 1, None
    cpu_one_thread = config.n_threads == 1 and not config.device.is_gpu
    default = fewest_batched_rows(weights, emits_logits=shape.emits_logits, one_cpu_thread=cpu_one_thread)
    if default == 1:
        return 1, None
    if config.lm_head_batch_from is not None:
        return config.lm_head_batch_from, None
    costs = measure_call_costs(lambda rows: _timed_rows(decode, clear, shape, rows), shape.rows_per_decode_call)
    if costs is None:
        return default, None
    log.info("%s shard %s: %s", shape.role, shape.layers, costs.describe())
    return costs.fewest, costs


def _timed_rows(decode: Decode, clear: Clear, shape: ShardShape, rows: int) -> float:
    """CPU seconds of one call of ``rows`` one-token rows at position 0 of slots 0.., cleared after
    it (at one llama.cpp thread the caller's thread computes)."""
    call = [(slot, probe_step(slot, shape)) for slot in range(rows)]
    started = time.thread_time()
    decode(call, {slot: [] for slot in range(rows)})
    spent = time.thread_time() - started
    for slot in range(rows):
        clear(slot, 0)
    return spent
