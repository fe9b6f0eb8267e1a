"""Which shards may batch one-token decode steps: a pure rule over the weights they multiply."""

from __future__ import annotations

from meshnet.engine.batching import MatrixWeight, decode_rows_per_call

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
