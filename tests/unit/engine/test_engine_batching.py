"""Which shards may batch one-token decode steps, and in which calls: pure rules over the weights
they multiply."""

from __future__ import annotations

from meshnet.engine.batching import (
    BATCHED_LM_HEAD_FROM,
    MatrixWeight,
    decode_calls,
    decode_rows_per_call,
    fewest_batched_rows,
    fewest_from_costs,
)

Q4_0, Q4_1, Q8_0, Q4_K, Q6_K, F32 = 2, 3, 8, 12, 14, 0


def block(ggml_type: int, *, name: str = "blk.0.attn_q.weight") -> list[MatrixWeight]:
    return [MatrixWeight(name, ggml_type, 2), MatrixWeight("blk.0.attn_norm.weight", F32, 1)]


def test_batch_exact_types_batch_every_slot() -> None:
    for ggml_type in (Q4_0, Q4_1, Q8_0):
        assert decode_rows_per_call(block(ggml_type), emits_logits=False, max_slots=8) == 8


def test_k_quants_and_f32_matrices_run_each_step_alone() -> None:
    for ggml_type in (Q4_K, Q6_K, F32):
        assert decode_rows_per_call(block(ggml_type), emits_logits=False, max_slots=8) == 1


def test_experts_run_each_step_alone_whatever_their_type() -> None:
    experts = [*block(Q8_0), MatrixWeight("blk.0.ffn_gate_exps.weight", Q8_0, 3)]
    assert decode_rows_per_call(experts, emits_logits=False, max_slots=8) == 1


def test_a_tied_token_table_counts_only_where_it_is_the_lm_head() -> None:
    f32_table = [MatrixWeight("token_embd.weight", F32, 2)]
    # A head's table (or a vocab-less placeholder) is looked up, never multiplied.
    assert decode_rows_per_call(block(Q4_1) + f32_table, emits_logits=False, max_slots=4) == 4
    # A tail without output.weight multiplies by the tied table: its type decides.
    assert decode_rows_per_call(block(Q4_1) + f32_table, emits_logits=True, max_slots=4) == 1
    untied = [*f32_table, MatrixWeight("output.weight", Q8_0, 2)]
    assert decode_rows_per_call(block(Q4_1) + untied, emits_logits=True, max_slots=4) == 4


def test_a_q8_0_lm_head_on_one_thread_batches_only_from_eight_rows() -> None:
    tied = [MatrixWeight("token_embd.weight", Q8_0, 2)]
    assert BATCHED_LM_HEAD_FROM == 8
    assert fewest_batched_rows(block(Q4_1) + tied, emits_logits=True, one_cpu_thread=True) == 8
    untied = [MatrixWeight("token_embd.weight", Q4_1, 2), MatrixWeight("output.weight", Q8_0, 2)]
    assert fewest_batched_rows(block(Q4_1) + untied, emits_logits=True, one_cpu_thread=True) == 8


def test_other_shards_batch_from_one_row() -> None:
    tied = [MatrixWeight("token_embd.weight", Q8_0, 2)]
    # A head looks its Q8_0 table up; it multiplies no LM head.
    assert fewest_batched_rows(block(Q4_1) + tied, emits_logits=False, one_cpu_thread=True) == 1
    # On several threads a lone late step would run on one of them (LlamaBackend._threads_for).
    assert fewest_batched_rows(block(Q4_1) + tied, emits_logits=True, one_cpu_thread=False) == 1
    # The untied LM head decides, not the table beside it.
    untied = [*tied, MatrixWeight("output.weight", Q4_0, 2)]
    assert fewest_batched_rows(block(Q4_1) + untied, emits_logits=True, one_cpu_thread=True) == 1


def test_decode_calls_run_short_runs_of_slots_one_row_per_call() -> None:
    assert decode_calls([0, 1, 2], most=16, fewest=8) == [[0], [1], [2]]
    assert decode_calls(list(range(8)), most=16, fewest=8) == [list(range(8))]
    # llama.cpp cuts a call at every break in consecutive slots: a short run is a small ubatch.
    assert decode_calls([*range(8), 10, 11], most=16, fewest=8) == [list(range(8)), [8], [9]]
    assert decode_calls([0, 2, 4, 6, 8, 10, 12, 14], most=16, fewest=8) == [[i] for i in range(8)]
    # Calls of up to ``most`` rows; with ``fewest`` 1 runs stay together, as before.
    assert decode_calls(list(range(19)), most=16, fewest=8) == [list(range(16)), [16, 17, 18]]
    assert decode_calls([0, 3, 5, 6, 9], most=4, fewest=1) == [[0, 1, 2, 3], [4]]
    assert decode_calls([], most=16, fewest=8) == []


def test_decode_calls_carry_every_row_once() -> None:
    for start in range(3):
        slots = [s for s in range(start, 24) if s % 5 != 4 and s % 7 != 3]
        for most in range(1, 18):
            for fewest in range(1, 10):
                calls = decode_calls(slots, most=most, fewest=fewest)
                assert sorted(i for call in calls for i in call) == list(range(len(slots)))
                assert all(1 <= len(call) <= most for call in calls)


def test_measured_costs_batch_from_the_fewest_rows_from_which_every_call_is_cheaper() -> None:
    ms = 1e-3
    # SmolLM2's 19:30 tail on an AVX2 EPYC: one call of 2 or 4 rows costs more than 2 or 4 calls.
    assert fewest_from_costs(2.8 * ms, {2: 8.2 * ms, 4: 13.1 * ms, 8: 20.9 * ms}) == 8
    # The 18:30 tail on an AVX-512 Xeon: every call of several rows is cheaper per row.
    assert fewest_from_costs(8.5 * ms, {2: 12.7 * ms, 4: 19.0 * ms, 8: 32.9 * ms}) == 2
    # A count that is cheaper but followed by a dearer one does not count.
    assert fewest_from_costs(3 * ms, {2: 5 * ms, 4: 13 * ms, 8: 20 * ms}) == 8
    # None cheaper: past the largest measured (a larger call amortizes more); equal is not cheaper.
    assert fewest_from_costs(1 * ms, {2: 2 * ms, 4: 5 * ms}) == 5
    # Nothing measured: nothing to batch, one call for any run.
    assert fewest_from_costs(1 * ms, {}) == 1
