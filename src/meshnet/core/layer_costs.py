"""What a worker holds resident — the one memory cost model — and a worker's question "which
layers should I serve?".

The capacity plan (how many sessions fit a worker's budget, ``node.assembly``), ``--layers auto``
(``node.auto_layers``) and the tracker's placement (``tracker.placement``, which gets the
asking worker's ``LayerCosts`` over the wire) all count with this module, so the range the
tracker suggests holds exactly the sessions the worker then plans. A worker serving layers
A:B with S sessions of C positions holds (``layer_costs``):

- **runtime**: what every worker process carries (Python, NumPy, gRPC, llama.cpp's code and
  threads), the heap its start-up certification leaves (one tiny model per weight type), the
  source's header parsed into Python objects (its vocabulary is most of it), and a little per
  session (its streams and frame buffers);
- **weights** of its blocks: llama.cpp maps the slice and populates the mapping, so all of it;
- **KV**: keys and values of every owned layer for C positions of each of S sessions, stored
  as the worker's KV type (``core.kv_type``: f16, or q8_0/q4_0 blocks); llama.cpp allocates
  and clears them at start, so all of it is resident from the start;
- **scratch**: llama.cpp's compute buffers for one prefill chunk (the feed-forward and
  attention activations of its rows and the attention mask over C positions);
- a **head** (layer 0, not the whole model): the token table it maps and looks rows up in. Each
  lookup faults in the pages around its row, so a few prompts make tens of MiB resident; they
  are cold and the kernel reclaims them first, so at most ``HEAD_TABLE_RESIDENT_BYTES`` count;
- a **tail**: the output norm and LM head, the vocabulary twice (llama.cpp's context and the
  grammar matcher's copy) and S sessions' logits rows.

The constants are calibrated on real workers (``scripts/measure_worker_memory.py`` writes
``bench/results/worker-memory.json``; ``tests/unit/core/test_layer_costs.py`` checks the model
against every recorded worker: never below its resident size, and close above it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from meshnet.core.kv_type import KvType
from meshnet.core.layers import LayerRange

MIB = 2**20
RUNTIME_BYTES = 131 * MIB
"""A worker process before any model: Python, NumPy, gRPC with mutual TLS, llama.cpp's code and
threads, its servers. Fitted on workers of this tree with TLS on every link, as users run them
(``bench/results/worker-memory.json``): 128 MiB covers the worst-counted worker, plus 3 MiB for
the spread between runs (two calibrations of the same tree differed by up to 6 MiB on one
worker), so a run does not put a worker over its budget. (107 MiB, the fit on an older tree's
plaintext workers, left the README's middle machine 0.1 MiB over its 340 MiB in CI.)"""
CERTIFICATION_BYTES_PER_TYPE = 10 * MIB
"""Heap start-up certification leaves, per weight type it certifies (glibc keeps freed heap)."""
HEADER_ENTRY_BYTES = 104
"""Per vocabulary token or merge rule: the source's GGUF header parsed into Python objects,
which every worker reads whatever its range."""
SESSION_BYTES = 640 * 1024
"""Per session beyond its KV: its streams, frames in flight and queued steps."""
VOCAB_ENTRY_BYTES = 176
"""llama.cpp's vocabulary, per token or merge rule (text, score, attributes, lookup and rank
maps); measured by loading vocab-only copies of SmolLM2 and Gemma 3, and fitted on real tails."""
VOCAB_COPIES = 2
"""A tail loads the vocabulary twice: its llama.cpp context and its grammar matcher."""
LOGITS_ROW_COPIES = 4
"""A session's logits row lives in llama.cpp's graph and output buffers, its NumPy copy and the
sampler's adjusted copy."""
HEAD_TABLE_RESIDENT_BYTES = 24 * MIB
"""At most this much of a head's token table counts as resident (see the module docstring)."""


@dataclass(frozen=True)
class ModelFootprint:
    """What a model's GGUF header says about its memory (``artifact.describe.memory_footprint``)."""

    block_bytes: tuple[int, ...]
    """Weight bytes of each block, in model order."""
    table_bytes: int
    """The token table (``token_embd``) a head looks rows up in."""
    tail_weight_bytes: int
    """Output norm and LM head (the token table itself when they are tied)."""
    tied: bool
    """The LM head is the token table: a whole-model range holds it once."""
    n_embd: int
    n_ff: int
    """Feed-forward width (for MoE, the active experts' together)."""
    n_q: int
    """Width of a row's attention queries (heads x key length)."""
    n_kv: int
    """Width of one position's keys plus values in one layer (the widest layer)."""
    n_vocab: int
    n_merges: int
    weight_types: int
    """Weight types of the blocks, each certified at start-up."""

    @property
    def n_layers(self) -> int:
        return len(self.block_bytes)


@dataclass(frozen=True)
class WorkerLoad:
    """What a worker is asked to hold besides its layers."""

    sessions: int
    context: int
    """Positions per session."""
    prefill_chunk: int
    """Rows per llama_decode call."""
    kv_type: KvType = KvType.F16
    """What the keys and values are stored as."""


@dataclass(frozen=True)
class LayerCosts:
    """A worker's costs by range, as the tracker's placement receives them (``placement_wire``)."""

    block_bytes: tuple[int, ...]
    """Weight bytes of each block, in model order."""
    kv_bytes_per_layer: int
    """KV one layer needs for all the sessions a node must hold."""
    head_bytes: int = 0
    """What only the first range carries."""
    tail_bytes: int = 0
    """What only the last range carries (output norm and LM head, vocabulary, logits)."""
    fixed_bytes: int = 0
    """What every node carries whatever it serves (runtime, compute scratch)."""
    tied_bytes: int = 0
    """Counted in both head_bytes and tail_bytes (a tied token table): a range that is both
    (the whole model) holds it once."""

    @property
    def n_layers(self) -> int:
        return len(self.block_bytes)

    def range_bytes(self, layers: LayerRange) -> int:
        total = self.fixed_bytes + sum(self.block_bytes[layers.start : layers.stop])
        total += self.kv_bytes_per_layer * len(layers)
        head, tail = layers.is_head(), layers.is_tail(self.n_layers)
        total += self.head_bytes if head else 0
        total += self.tail_bytes if tail else 0
        return total - (self.tied_bytes if head and tail else 0)


def kv_bytes_per_layer(footprint: ModelFootprint, context: int, kv_type: KvType = KvType.F16) -> int:
    """One session's keys and values in one layer: ``context`` rows of ``n_kv`` values stored as
    ``kv_type`` (f16: 2 bytes a value; q8_0: 34 bytes per 32; q4_0: 18 bytes per 32)."""
    return context * kv_type.row_bytes(footprint.n_kv)


def scratch_bytes(footprint: ModelFootprint, load: WorkerLoad) -> int:
    """llama.cpp's compute buffers for one prefill chunk: float32 activations of each row
    (three feed-forward wide, four hidden wide, two query wide) and an f16 attention mask over
    the context per row (checked against llama.cpp's reported compute buffer sizes)."""
    per_row = 4 * (3 * footprint.n_ff + 4 * footprint.n_embd + 2 * footprint.n_q) + 2 * load.context
    return load.prefill_chunk * per_row


def layer_costs(footprint: ModelFootprint, load: WorkerLoad) -> LayerCosts:
    """Every range's cost for a worker of ``footprint``'s model holding ``load``."""
    entries = footprint.n_vocab + footprint.n_merges
    runtime = RUNTIME_BYTES + footprint.weight_types * CERTIFICATION_BYTES_PER_TYPE + entries * HEADER_ENTRY_BYTES
    logits = load.sessions * LOGITS_ROW_COPIES * 4 * footprint.n_vocab
    table = min(footprint.table_bytes, HEAD_TABLE_RESIDENT_BYTES)
    return LayerCosts(
        block_bytes=footprint.block_bytes,
        kv_bytes_per_layer=load.sessions * kv_bytes_per_layer(footprint, load.context, load.kv_type),
        head_bytes=table,
        tail_bytes=footprint.tail_weight_bytes + VOCAB_COPIES * entries * VOCAB_ENTRY_BYTES + logits,
        fixed_bytes=runtime + load.sessions * SESSION_BYTES + scratch_bytes(footprint, load),
        tied_bytes=table if footprint.tied else 0,
    )


def worker_bytes(footprint: ModelFootprint, layers: LayerRange, load: WorkerLoad) -> int:
    """What a worker serving ``layers`` with ``load`` holds resident."""
    return layer_costs(footprint, load).range_bytes(layers)


def sessions_within(footprint: ModelFootprint, layers: LayerRange, load: WorkerLoad, budget_bytes: int) -> int:
    """The most sessions, up to ``load.sessions``, a worker of ``layers`` holds within the budget
    (0: not even one)."""
    for sessions in range(load.sessions, 0, -1):
        if worker_bytes(footprint, layers, replace(load, sessions=sessions)) <= budget_bytes:
            return sessions
    return 0


@dataclass(frozen=True)
class LayerQuestion:
    """A worker about to start asks the tracker which contiguous layers the swarm needs most."""

    model: str
    """Model name or recipe fingerprint: whose served ranges count."""
    costs: LayerCosts
    """The asking worker's own costs (its sessions and context are in the KV figure)."""
    budget_bytes: int
    """Memory the asking worker may fill."""


@dataclass(frozen=True)
class LayerAdvice:
    layers: LayerRange
    reason: str
    """Why this range, in words for the worker's log (``uncovered``, ``fewest replicas``...)."""
