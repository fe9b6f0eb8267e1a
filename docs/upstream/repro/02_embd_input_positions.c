/* Hook 2: llama_batch.embd as the boundary input, at absolute positions.
 *
 * A meshnet shard that does not start at layer 0 receives the previous shard's residual stream as
 * float rows in llama_batch.embd, with batch.pos holding each row's absolute position in the
 * session (src/meshnet/engine/llama_backend.py, _decode). This checks, on the whole model, that
 * feeding the embeddings of the tokens instead of the tokens gives bit-identical logits, also when
 * the prompt arrives in two calls (positions 0..4, then 5..7), and that the positions are taken
 * from batch.pos and must continue the sequence's KV.
 *
 * usage: 02_embd_input_positions <source.gguf>
 */
#include "repro.h"

#define FIRST 5 /* rows in the first call; the rest of the prompt follows in a second call */

/* Logits of every prompt row, decoded in two calls of FIRST and PROMPT_LEN - FIRST rows. */
static float * logits_in_two_calls(struct llama_model * model, const float * embd, int * status) {
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    const int n_embd  = llama_model_n_embd(model);
    float *   logits  = (float *) malloc((size_t) PROMPT_LEN * n_vocab * sizeof(float));
    struct llama_context * ctx = make_context(model, 1, false, NULL);
    const int sizes[2] = { FIRST, PROMPT_LEN - FIRST };
    int row = 0;
    *status = 0;
    for (int call = 0; call < 2; call++) {
        const int n = sizes[call];
        *status |= decode_rows(ctx, embd ? NULL : PROMPT + row, embd ? embd + (size_t) row * n_embd : NULL, n_embd, n,
                               row, 0, true);
        for (int i = 0; i < n; i++) {
            memcpy(logits + (size_t) (row + i) * n_vocab, llama_get_logits_ith(ctx, i), n_vocab * sizeof(float));
        }
        row += n;
    }
    llama_free(ctx);
    return logits;
}

int main(int argc, char ** argv) {
    repro_start(argc, argv, 1, "<source.gguf>");
    struct llama_model * model   = load_model(argv[1]);
    const int            n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    const int            n_embd  = llama_model_n_embd(model);
    float *              embd    = prompt_embeddings(model);
    char detail[160];

    int token_status = 0, embd_status = 0;
    float * from_tokens = logits_in_two_calls(model, NULL, &token_status);
    float * from_embd   = logits_in_two_calls(model, embd, &embd_status);
    check("both inputs decode", token_status == 0 && embd_status == 0, NULL);
    const size_t n = (size_t) PROMPT_LEN * n_vocab;
    snprintf(detail, sizeof(detail), "max abs diff %g over %d rows", max_abs_diff(from_tokens, from_embd, n), PROMPT_LEN);
    check("embd rows give the same logits as their tokens (bit-identical)", bit_identical(from_tokens, from_embd, n), detail);

    /* Positions come from batch.pos: the same rows, with the same (empty) history, decoded at
     * positions 0.. and at positions FIRST.. give different logits. */
    const int late = PROMPT_LEN - FIRST;
    struct llama_context * ctx = make_context(model, 1, false, NULL);
    decode_rows(ctx, NULL, embd + (size_t) FIRST * n_embd, n_embd, late, 0, 0, true);
    float * at_zero = copy_floats(llama_get_logits_ith(ctx, late - 1), n_vocab);
    llama_free(ctx);
    ctx = make_context(model, 1, false, NULL);
    const int offset_status = decode_rows(ctx, NULL, embd + (size_t) FIRST * n_embd, n_embd, late, FIRST, 0, true);
    snprintf(detail, sizeof(detail), "llama_decode returned %d", offset_status);
    check("an empty sequence accepts rows starting at an absolute position", offset_status == 0, detail);
    check("the same rows at other positions give other logits (RoPE reads batch.pos)",
          offset_status == 0 && !bit_identical(at_zero, llama_get_logits_ith(ctx, late - 1), n_vocab), NULL);
    free(at_zero);
    llama_free(ctx);

    /* A batch that skips positions is refused: a shard's input must continue its session's KV. */
    ctx = make_context(model, 1, false, NULL);
    decode_rows(ctx, NULL, embd, n_embd, FIRST, 0, 0, true);
    const int gap_status = decode_rows(ctx, NULL, embd + (size_t) FIRST * n_embd, n_embd, 1, FIRST + 3, 0, true);
    snprintf(detail, sizeof(detail), "llama_decode returned %d", gap_status);
    check("a position gap in a sequence is rejected", gap_status != 0, detail);
    llama_memory_t memory = llama_get_memory(ctx);
    snprintf(detail, sizeof(detail), "seq_pos_max %d", (int) llama_memory_seq_pos_max(memory, 0));
    check("the rejected batch left the sequence's KV unchanged", llama_memory_seq_pos_max(memory, 0) == FIRST - 1, detail);
    llama_free(ctx);

    free(from_tokens);
    free(from_embd);
    free(embd);
    llama_model_free(model);
    return finish();
}
