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

from collections.abc import Iterable, Mapping, Sequence
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


Q8_0 = 8
"""ggml's type id of Q8_0."""
BATCHED_LM_HEAD_FROM = 8
"""Fewest one-token rows a ubatch carries through a Q8_0 LM head on one CPU thread where start-up
could not measure it (``call_costs``: too slow a shard for its budget); the rows of a smaller one
run one per call (``decode_calls``). From two rows on, ggml hands a Q8_0 matrix product to
llamafile's tinyBLAS, whose cost against the one-row kernel depends on the CPU. On an AMD EPYC
(AVX2), SmolLM2's 49152-row LM head cost ~1.4, 3.3, 5.6 and 8.6 ms at 1, 2, 4 and 8 rows
(engine-thread CPU, 1 thread), and its 19:30 tail decoded 2, 4, 6 and 8 rows in one call at 8.2,
13.1, 19.5 and 20.9 ms against 2.8 ms a row one per call: cheaper one per call below 8 rows
(``bench/results/v5/waves40-rows-sweep.json``). On an AVX-512 Xeon the same tail cost 4.2 ms a
row in one call of 8 and 7.0 one per call: batched is cheaper from two rows there."""


def fewest_from_costs(one_row_s: float, calls: Mapping[int, float]) -> int:
    """Fewest rows worth one call, from measured costs: ``one_row_s`` the cost of a one-row call,
    ``calls`` the cost of one call of each measured row count. The smallest measured count from
    which every measured call is cheaper than as many one-row calls; one past the largest measured
    when none is (larger calls amortize more); 1 with nothing measured (nothing to batch)."""
    if not calls:
        return 1
    cheaper = {rows for rows, cost in calls.items() if cost < rows * one_row_s}
    for rows in sorted(calls):
        if all(other in cheaper for other in calls if other >= rows):
            return rows
    return max(calls) + 1


def fewest_batched_rows(weights: Iterable[MatrixWeight], *, emits_logits: bool, one_cpu_thread: bool) -> int:
    """Fewest one-token rows worth one call (``decode_calls``) before start-up measures it: for a
    shard that multiplies a Q8_0 LM head (``output.weight``, or the token table where it is tied) on
    one CPU thread ``BATCHED_LM_HEAD_FROM``, which ``call_costs`` replaces with what this CPU
    costs; else 1, measured by nobody. Only one thread: with more, a lone step past ``SPLIT_KV_FROM`` runs on one
    (``LlamaBackend._threads_for``), so one row per call would give up the others."""
    if not emits_logits or not one_cpu_thread:
        return 1
    tensors = {t.name: t for t in weights}
    head = tensors.get("output.weight") or tensors.get("token_embd.weight")
    return BATCHED_LM_HEAD_FROM if head is not None and head.ggml_type == Q8_0 else 1


def decode_calls(slots: Sequence[int], *, most: int, fewest: int) -> list[list[int]]:
    """The llama_decode calls that carry one-token steps of ``slots`` (ascending): lists of indices
    into ``slots``, of up to ``most`` rows each. llama.cpp cuts a call into one ubatch (one graph
    run, one pass over the LM head) per run of consecutive slots (``split_equal`` on a per-session
    KV takes only increasing, consecutive sequence ids), so a row in a run shorter than ``fewest``
    runs in a call of its own. Each row's arithmetic is the same in any of them
    (``decode_rows_per_call``); only the cost differs."""
    runs: list[list[int]] = []
    for index, slot in enumerate(slots):
        if runs and slot == slots[runs[-1][-1]] + 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    batched = [index for run in runs if len(run) >= fewest for index in run]
    alone = [[index] for run in runs if len(run) < fewest for index in run]
    return [batched[start : start + most] for start in range(0, len(batched), most)] + alone
