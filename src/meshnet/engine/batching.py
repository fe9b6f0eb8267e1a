"""How many one-token decode steps one llama.cpp call may carry and stay bit-identical to solo.

The CPU kernels pick their code path by the number of rows a matrix product sees: for some
weight types a row computed beside others is rounded differently than alone (measured on the
pinned build: Q4_K/Q5_K/Q6_K matrices switch to a tiled gemm at 4 rows, F32/F16 matrices to
tinyBLAS, experts go through mul_mat_id; Gemma 3 270M Q4_K_M moved logits by 0.77 at 4
sessions). Batching must never change a session's tokens, so a shard batches decode steps
only when every matrix it multiplies has a type whose one-row and many-row paths agree
(Q4_0, Q4_1, Q8_0, checked by start-up certification at 8 sessions); otherwise each session's
step runs in a call of its own. Prefill is unaffected: its chunks never mix sessions.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

BATCH_EXACT_TYPES = frozenset({2, 3, 8})
"""ggml type ids of Q4_0, Q4_1 and Q8_0: the same rounding for one row as for many."""


@dataclass(frozen=True)
class MatrixWeight:
    name: str
    ggml_type: int
    n_dims: int


def decode_rows_per_call(weights: Iterable[MatrixWeight], *, emits_logits: bool, max_slots: int) -> int:
    """``max_slots`` when batching one-token steps is exact for these weights, else 1.

    ``token_embd.weight`` is multiplied only where it doubles as a tail's LM head (tied
    embeddings); elsewhere it is a lookup table or a vocab-less placeholder.
    """
    tensors = list(weights)
    has_output = any(t.name == "output.weight" for t in tensors)
    for tensor in tensors:
        if tensor.n_dims < 2 or (tensor.name == "token_embd.weight" and (has_output or not emits_logits)):
            continue
        if "_exps." in tensor.name or tensor.ggml_type not in BATCH_EXACT_TYPES:
            return 1
    return max_slots
