"""The Backend protocol: what the session loop asks of an engine that runs one layer range.

A backend is driven by exactly one owner (the session loop); it is not thread-safe and does not
need to be. Sessions appear here only as llama sequence ids (``slot``); mapping route sessions to
slots, admission and eviction belong to ``meshnet.session``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from meshnet.core.errors import FailedPrecondition
from meshnet.core.layers import LayerRange

ShardRole = Literal["full", "head", "middle", "tail"]


@dataclass(frozen=True)
class ShardShape:
    """What a loaded shard is, read from the model, not from the operator's flags."""

    layers: LayerRange
    n_layers: int
    """Layers of the whole model."""
    n_embd: int
    n_vocab: int
    """Vocabulary size at the tail (logit width); 0 on head and middle shards."""
    role: ShardRole
    max_slots: int
    """Sessions that can hold KV at once (llama sequences)."""
    n_ctx_per_slot: int
    """Positions each session may use."""
    max_batch_tokens: int
    """Tokens one ``run`` call may carry in total."""
    max_decode_rows: int
    """One-token decode steps one ``run`` call may carry and stay bit-identical to each run
    alone (see ``engine/batching.py``): ``max_slots``, or 1 where the kernels would round a
    batched row differently."""

    @property
    def rows_per_decode_call(self) -> int:
        """One-token rows one llama_decode call may carry: the batch's token room and the rows
        that stay bit-identical batched, whichever is fewer."""
        return min(self.max_batch_tokens, self.max_decode_rows)

    @property
    def takes_tokens(self) -> bool:
        return self.role in ("full", "head")

    @property
    def emits_logits(self) -> bool:
        return self.role in ("full", "tail")


@dataclass(frozen=True)
class StepInput:
    """One session's contribution to a batch: consecutive positions of one sequence."""

    slot: int
    position: int
    """Absolute position of the first row (RoPE needs absolute positions on every shard)."""
    tokens: np.ndarray | None = None
    """int32 [n] token ids: head and full shards."""
    hidden: np.ndarray | None = None
    """float32 [n, n_embd] boundary residual from the previous shard: middle and tail shards."""
    want_logits: Literal["none", "last", "all"] = "last"
    """Tail only: which rows' logits to return ("none" for non-final prefill chunks)."""
    read_logits: bool = True
    """Tail only: False when only the rows' final-norm values are read (an embedding): the rows
    still run to the end, but their ``rows x n_vocab`` logits are not copied out."""
    route_shards: int = 1
    """Shards of the session's route from this one to its end, this one counted. Not the
    backend's business: a route's head cuts its decoding sessions into as many waves as the
    longest of their routes has shards (``session.scheduler.pipeline_waves``)."""

    @property
    def n_tokens(self) -> int:
        source = self.tokens if self.tokens is not None else self.hidden
        return 0 if source is None else int(source.shape[0])


@dataclass(frozen=True)
class StepOutput:
    slot: int
    hidden: np.ndarray | None = None
    """float32 [n, n_embd]: the unnormalized residual after this shard's last layer (non-tail)."""
    logits: np.ndarray | None = None
    """float32 [rows, n_vocab] (tail): rows as asked by ``want_logits``."""
    normed: np.ndarray | None = None
    """float32 [rows, n_embd] (tail): the same rows after the final norm, before the LM head --
    llama.cpp's ``result_norm``, the hidden states its embeddings pool. None where the engine
    cannot see them."""


def chunk_bounds(position: int, n_tokens: int, chunk: int) -> list[tuple[int, int]]:
    """Offsets ``(start, stop)`` cutting ``n_tokens`` rows at ``position`` into prefill chunks.

    Cuts fall on absolute positions that are multiples of ``chunk``. Chunk boundaries fix the
    row counts the kernels see, so they must not depend on how a prompt reached a shard (one
    frame or several, whole model or split): aligned cuts make every route chunk a prompt alike.
    """
    first_cut = -(-(position + 1) // chunk) * chunk
    cuts = [0, *(p - position for p in range(first_cut, position + n_tokens, chunk)), n_tokens]
    return list(itertools.pairwise(cuts))


def prefill_pieces(step: StepInput, chunk: int) -> list[StepInput]:
    """``step`` cut at ``chunk_bounds``; only the last piece keeps the logits the step asked for
    (every piece keeps its rows' logits when all rows were asked for)."""
    bounds = chunk_bounds(step.position, step.n_tokens, chunk)
    if len(bounds) == 1:
        return [step]
    keep_rows: Literal["all", "none"] = "all" if step.want_logits == "all" else "none"
    return [
        StepInput(
            step.slot,
            step.position + start,
            None if step.tokens is None else step.tokens[start:stop],
            None if step.hidden is None else step.hidden[start:stop],
            step.want_logits if stop == step.n_tokens else keep_rows,
            step.read_logits,
            step.route_shards,
        )
        for start, stop in bounds
    ]


def join_pieces(outputs: list[StepOutput]) -> StepOutput:
    """The output of a step run as ``prefill_pieces``: its pieces' rows, in order."""
    if len(outputs) == 1:
        return outputs[0]
    slot = outputs[0].slot
    hidden = [o.hidden for o in outputs if o.hidden is not None]
    if hidden:
        return StepOutput(slot, hidden=np.concatenate(hidden))
    logits = [o.logits for o in outputs if o.logits is not None]
    normed = [o.normed for o in outputs if o.normed is not None]
    whole_normed = np.concatenate(normed) if normed and len(normed) == len(outputs) else None
    return StepOutput(slot, logits=np.concatenate(logits) if logits else None, normed=whole_normed)


class KeepsNoKv:
    """For a backend whose KV lives elsewhere (an expert group's nodes): nothing to export or
    restore, so its shard keeps no prefixes or snapshots (its store's budget is 0)."""

    def export_slot(self, slot: int) -> bytes:
        raise FailedPrecondition("an expert group's KV lives on its nodes: it keeps no prefixes or snapshots")

    def import_slot(self, slot: int, blob: bytes, tokens: int) -> None:
        raise FailedPrecondition("an expert group's KV lives on its nodes: it keeps no prefixes or snapshots")


class Backend(Protocol):
    @property
    def shape(self) -> ShardShape: ...

    def run(self, batch: list[StepInput]) -> list[StepOutput]:
        """Run every input through this shard's layers, appending to each slot's KV."""
        ...

    def truncate(self, slot: int, position: int) -> None:
        """Forget positions >= ``position`` of ``slot`` (0 forgets the whole sequence)."""
        ...

    def export_slot(self, slot: int) -> bytes:
        """The KV ``slot`` holds (every position it has), as bytes ``import_slot`` takes back:
        what the shard keeps to reuse a prompt's prefix or to resume a session elsewhere."""
        ...

    def import_slot(self, slot: int, blob: bytes, tokens: int) -> None:
        """Replace ``slot``'s KV with ``blob`` (an ``export_slot`` of a shard of this recipe and
        layer range) holding positions ``[0, tokens)``; SnapshotRefused when it does not load."""
        ...

    def close(self) -> None: ...
