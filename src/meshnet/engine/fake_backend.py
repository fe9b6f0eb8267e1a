"""A backend that needs no model: deterministic arithmetic with the shape of a real shard.

It keeps real per-slot KV bookkeeping (positions must continue, truncation forgets), and its
output depends on every earlier token of the session, so protocol, batching, isolation and
failover tests catch cross-talk and lost state in seconds, without llama.cpp.

Like the real engine, it splits bit-identically: each layer has its own weights and its own
per-slot state, and the residual is rounded to float32 after every layer (what a seam carries),
so any cut of a fake model computes what the whole fake model computes. That is what lets a
fake worker certify itself (``engine.certification``) and join a swarm like a real one.

What it cannot show is what llama.cpp computes: its numerics, that llama.cpp's split or batch
equals its whole model bit for bit, isolation between sequences inside one real context, and what
a step costs. Tests that rely on it say so; tests/unit/engine and tests/model show those on the
real backend.
"""

from __future__ import annotations

import hashlib
import time

import numpy as np

from meshnet.core.errors import InvalidArgument, ResourceExhausted, SnapshotRefused
from meshnet.core.layers import LayerRange
from meshnet.engine.backend import ShardRole, ShardShape, StepInput, StepOutput
from meshnet.engine.kv_blob import KvOwner, seal, unseal

FAKE_BACKEND_VERSION = "2"
"""Bumped when the fake's arithmetic changes: it names the fake recipe's backend version."""


class FakeBackend:
    def __init__(
        self,
        layers: LayerRange,
        n_layers: int,
        *,
        n_embd: int = 16,
        n_vocab: int = 64,
        max_slots: int = 8,
        n_ctx_per_slot: int = 512,
        max_batch_tokens: int = 64,
        step_delay: float = 0.0,
    ) -> None:
        layers.check_within(n_layers)
        head, tail = layers.is_head(), layers.is_tail(n_layers)
        role: ShardRole = "full" if head and tail else "head" if head else "tail" if tail else "middle"
        self._shape = ShardShape(
            layers,
            n_layers,
            n_embd,
            n_vocab if tail else 0,
            role,
            max_slots,
            n_ctx_per_slot,
            max_batch_tokens,
            max_slots,
        )
        self._vocab = n_vocab
        self._step_delay = step_delay
        # The fake model is its dimensions: its KV snapshots name them as a real one names its source.
        model = hashlib.sha256(f"fake {FAKE_BACKEND_VERSION} {n_layers} {n_embd} {n_vocab}".encode()).hexdigest()
        self._owner = KvOwner(model, layers)
        # state[slot, layer]: a running summary of everything the slot has seen (its "KV").
        self._state = np.zeros((max_slots, len(layers), n_embd), np.float64)
        self._length = np.zeros(max_slots, np.int64)
        # One weight matrix per layer, seeded by the layer's index in the whole model.
        self._mix = np.stack(
            [
                np.random.default_rng(1000 + layer).standard_normal((n_embd, n_embd)) / n_embd
                for layer in range(layers.start, layers.stop)
            ]
        )
        self.calls: list[int] = []
        """Sizes of each ``run`` batch, for tests of batching."""

    @property
    def shape(self) -> ShardShape:
        return self._shape

    def run(self, batch: list[StepInput]) -> list[StepOutput]:
        if self._step_delay:
            time.sleep(self._step_delay)
        self.calls.append(len(batch))
        return [self._one(step) for step in batch]

    def _one(self, step: StepInput) -> StepOutput:
        shape = self._shape
        if step.position != self._length[step.slot]:
            raise InvalidArgument(
                f"slot {step.slot} is at position {self._length[step.slot]}, input starts at {step.position}"
            )
        if step.position + step.n_tokens > shape.n_ctx_per_slot:
            raise ResourceExhausted("positions exceed the session context")
        if step.tokens is not None:
            rows = np.stack([np.sin(np.arange(shape.n_embd) * (t + 1) * 0.37) for t in step.tokens.tolist()])
        elif step.hidden is not None:
            rows = step.hidden.astype(np.float64)
        else:
            raise InvalidArgument("no input")
        outputs = []
        for index, row in enumerate(rows):
            position = step.position + index
            for layer, mix in enumerate(self._mix):
                state = self._state[step.slot, layer]
                state[:] = 0.9 * state + 0.1 * row
                row = (row + np.tanh(mix @ state) + 0.01 * np.cos(position)).astype(np.float32).astype(np.float64)
            outputs.append(row)
        self._length[step.slot] += step.n_tokens
        hidden = np.asarray(outputs, np.float32)
        if not shape.emits_logits:
            return StepOutput(step.slot, hidden=hidden)
        rows_wanted = {"none": hidden[:0], "last": hidden[-1:], "all": hidden}[step.want_logits]
        logits = np.zeros((len(rows_wanted), self._vocab), np.float32)
        for index, row in enumerate(rows_wanted):
            # The peak moves with the row's content, so tokens differ from step to step.
            logits[index] = 10.0 * np.cos(np.arange(self._vocab) * 0.61 + float(row.sum()) * 7.3)
        return StepOutput(step.slot, logits=logits.astype(np.float32))

    def truncate(self, slot: int, position: int) -> None:
        # The running summary cannot be rewound, so only truncation to 0 (a release, the one
        # truncation the session loop performs) restores a state the fake can continue from.
        if position == 0:
            self._state[slot] = 0.0
        self._length[slot] = min(self._length[slot], position)

    def slot_length(self, slot: int) -> int:
        return int(self._length[slot])

    def export_slot(self, slot: int) -> bytes:
        return seal(self._owner, int(self._length[slot]), self._state[slot].tobytes())

    def import_slot(self, slot: int, blob: bytes, tokens: int) -> None:
        self._state[slot] = 0.0
        self._length[slot] = 0
        state = unseal(self._owner, tokens, blob)
        if len(state) != self._state[slot].nbytes:
            raise SnapshotRefused("not a state of this fake shard's width")
        self._state[slot] = np.frombuffer(state, np.float64).reshape(self._state[slot].shape)
        self._length[slot] = tokens

    def close(self) -> None:
        pass
