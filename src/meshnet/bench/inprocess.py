"""In-process lanes: whole-model llama.cpp, an N-shard split, and the naive recompute flow.

``llama-whole`` and ``split-N`` share one driver: prefill each session on its own (as every
engine here does), then decode all sessions in lock-step, one ``backend.run`` per shard per
step carrying every session's one-token input. At concurrency 1 that is plain single-stream
decode; at k it is llama.cpp batching k sequences in one context, the throughput anchor.

``recompute`` is what meshnet replaces: no KV cache, so every output token re-runs the whole
growing sequence through every shard and the full [seq, n_embd] float32 activation crosses
every seam.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from meshnet.bench.stats import RequestTrace, RunRecord
from meshnet.core.errors import MeshnetError
from meshnet.core.generation import SamplingParams
from meshnet.engine.backend import StepInput
from meshnet.engine.local_route import LocalRoute
from meshnet.engine.tail_sampler import TailSampler

GREEDY = SamplingParams()


@dataclass(frozen=True)
class InProcessRun:
    record: RunRecord
    logits: tuple[np.ndarray, ...] = ()
    """Slot 0's logits for each generated token, when asked for (drift checks)."""
    seam_bytes_per_token: float = 0.0
    """Bytes crossing one seam per generated token (float32 boundary rows)."""


def _decode_all(route: LocalRoute, slots: list[int], positions: list[int], tokens: list[int]) -> list[np.ndarray]:
    """One decode step of every session: one run per shard carrying all sessions."""
    batch = [StepInput(s, p, tokens=np.array([t], np.int32)) for s, p, t in zip(slots, positions, tokens, strict=True)]
    outputs = route.backends[0].run(batch)
    for backend in route.backends[1:]:
        # hidden: [1, n_embd] per session, straight from the previous shard
        batch = [StepInput(i.slot, i.position, hidden=o.hidden) for i, o in zip(batch, outputs, strict=True)]
        outputs = backend.run(batch)
    return [o.logits[-1] for o in outputs]  # type: ignore[index]


class _RouteLane:
    """A lane over an in-process route of llama.cpp shards."""

    def __init__(self, route: LocalRoute) -> None:
        self.route = route
        self.n_embd = route.backends[0].shape.n_embd

    @property
    def seams(self) -> int:
        return len(self.route.backends) - 1


class CachedLane(_RouteLane):
    """``llama-whole`` (one full shard) or ``split-N``: KV-cached, batched decode."""

    def run(
        self, prompts: Sequence[tuple[int, ...]], indices: Sequence[int], max_tokens: int, *, keep_logits: bool = False
    ) -> InProcessRun:
        streams = [_Stream() for _ in prompts]
        logits_log: list[np.ndarray] | None = [] if keep_logits else None
        started = time.perf_counter()
        error: str | None = None
        try:
            self._generate(prompts, streams, max_tokens, logits_log)
        except MeshnetError as failure:
            error = f"{failure.code}: {failure.message}"
        finally:
            for slot in range(len(prompts)):
                self.route.release(slot)
        finished = time.perf_counter()
        traces = tuple(
            RequestTrace(
                index,
                len(prompt),
                started,
                tuple(stream.times),
                tuple(stream.tokens),
                stream.times[-1] if stream.times else finished,
                error,
            )
            for stream, index, prompt in zip(streams, indices, prompts, strict=True)
        )
        occupancy = float(len(prompts)) if error is None else None
        record = RunRecord(len(prompts), started, finished, traces, batch_occupancy=occupancy)
        return InProcessRun(record, tuple(logits_log or ()), float(4 * self.n_embd))

    def _generate(
        self,
        prompts: Sequence[tuple[int, ...]],
        streams: list[_Stream],
        max_tokens: int,
        logits_log: list[np.ndarray] | None,
    ) -> None:
        """Prefill each session in its own slot, then decode every session in lock-step."""
        slots = list(range(len(prompts)))
        positions, current = [], []
        # One sampler per session, as a tail keeps one: the distributed lanes' token choice.
        samplers = [TailSampler(GREEDY) for _ in slots]
        for slot, prompt in zip(slots, prompts, strict=True):
            logits = self.route.forward(slot, 0, np.asarray(prompt, np.int32))[-1]
            positions.append(len(prompt))
            current.append(samplers[slot].choose(logits, len(prompt))[0])
            streams[slot].add(current[-1], time.perf_counter())
            if logits_log is not None and slot == 0:
                logits_log.append(logits.copy())
        for _ in range(max_tokens - 1):
            rows = _decode_all(self.route, slots, positions, current)
            stamp = time.perf_counter()
            for slot, logits in zip(slots, rows, strict=True):
                positions[slot] += 1
                current[slot] = samplers[slot].choose(logits, positions[slot])[0]
                streams[slot].add(current[slot], stamp)
            if logits_log is not None:
                logits_log.append(rows[0].copy())


@dataclass
class _Stream:
    """One session's tokens and the moments they were sampled, while a run is under way."""

    tokens: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)

    def add(self, token: int, stamp: float) -> None:
        self.tokens.append(token)
        self.times.append(stamp)


class RecomputeLane(_RouteLane):
    """No KV cache: each token re-runs the whole sequence from position 0 through every shard."""

    def step(self, sequence: Sequence[int], slot: int = 0) -> int:
        """Recompute ``sequence`` from scratch and pick its next token (KV is dropped afterwards)."""
        self.route.release(slot)
        try:
            logits = self.route.forward(slot, 0, np.asarray(sequence, np.int32))[-1]
        finally:
            self.route.release(slot)
        return TailSampler(GREEDY).choose(logits, len(sequence))[0]

    def run(self, prompts: Sequence[tuple[int, ...]], indices: Sequence[int], max_tokens: int) -> InProcessRun:
        """Streams run one after another: without a KV cache there is nothing to batch."""
        started = time.perf_counter()
        traces, seam_rows, generated = [], 0, 0
        for index, prompt in zip(indices, prompts, strict=True):
            begun = time.perf_counter()
            sequence, times, error = list(prompt), [], None
            try:
                for _ in range(max_tokens):
                    seam_rows += len(sequence)
                    sequence.append(self.step(sequence))
                    times.append(time.perf_counter())
                    generated += 1
            except MeshnetError as failure:
                error = f"{failure.code}: {failure.message}"
            out = tuple(sequence[len(prompt) :])
            traces.append(
                RequestTrace(
                    index, len(prompt), begun, tuple(times), out, times[-1] if times else time.perf_counter(), error
                )
            )
        finished = time.perf_counter()
        # Every generated token moved its whole sequence's rows across each seam.
        per_token = 4.0 * self.n_embd * seam_rows / max(generated, 1)
        return InProcessRun(RunRecord(len(prompts), started, finished, tuple(traces)), (), per_token)
