/* Hook 5: one KV stream per session (kv_unified = false, n_seq_max = sessions).
 *
 * meshnet gives each session its own llama sequence id in a context with n_seq_max sequences and
 * kv_unified = false (src/meshnet/engine/llama_backend.py, _load), and batches the one-token steps
 * of several sessions into one llama_decode. With a unified cache, cells freed by one session are
 * reused by another, which reorders a session's cells and so its attention sums. This checks that,
 * with one stream per sequence, a session's logits are bit-identical whether it runs alone or
 * interleaved with another session that is removed, refilled and batched with it.
 *
 * usage: 05_kv_stream_per_session <source.gguf>
 */
#include "repro.h"

#define STEPS 3
static const llama_token STEP_TOKENS[STEPS] = { 5, 266, 271 };
static const llama_token OTHER[]            = { 1, 270, 275, 280, 285, 288 };
static const llama_token OTHER_AGAIN[]      = { 1, 262, 263 };

/* One decode carrying one token for each of n sequences (continuous batching of decode steps). */
static int decode_step(struct llama_context * ctx, const llama_token * tokens, const llama_pos * pos,
                       const llama_seq_id * seqs, int n) {
    struct llama_batch batch = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        batch.token[i]     = tokens[i];
        batch.pos[i]       = pos[i];
        batch.n_seq_id[i]  = 1;
        batch.seq_id[i][0] = seqs[i];
        batch.logits[i]    = 1;
    }
    batch.n_tokens   = n;
    const int status = llama_decode(ctx, batch);
    llama_batch_free(batch);
    return status;
}

/* Session 0's logits: after its prompt, then after each step. [STEPS + 1, n_vocab]
 * With a neighbour, session 1 runs a prompt first, is removed, refills and steps alongside. */
static float * session_zero(struct llama_model * model, bool kv_unified, bool neighbour, int * failures) {
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    const int n_embd  = llama_model_n_embd(model);
    float *   logits  = (float *) malloc((size_t) (STEPS + 1) * n_vocab * sizeof(float));
    struct llama_context * ctx    = make_context(model, 2, kv_unified, NULL);
    llama_memory_t         memory = llama_get_memory(ctx);
    *failures = 0;
    if (neighbour) {
        *failures += decode_rows(ctx, OTHER, NULL, n_embd, 6, 0, 1, false) != 0;
    }
    *failures += decode_rows(ctx, PROMPT, NULL, n_embd, PROMPT_LEN, 0, 0, false) != 0;
    memcpy(logits, llama_get_logits_ith(ctx, -1), n_vocab * sizeof(float));
    if (neighbour) {
        llama_memory_seq_rm(memory, 1, -1, -1);
        *failures += decode_rows(ctx, OTHER_AGAIN, NULL, n_embd, 3, 0, 1, false) != 0;
    }
    for (int s = 0; s < STEPS; s++) {
        const llama_token  tokens[2] = { STEP_TOKENS[s], STEP_TOKENS[STEPS - 1 - s] };
        const llama_pos    pos[2]    = { PROMPT_LEN + s, 3 + s };
        const llama_seq_id seqs[2]   = { 0, 1 };
        *failures += decode_step(ctx, tokens, pos, seqs, neighbour ? 2 : 1) != 0;
        memcpy(logits + (size_t) (s + 1) * n_vocab, llama_get_logits_ith(ctx, 0), n_vocab * sizeof(float));
    }
    llama_free(ctx);
    return logits;
}

int main(int argc, char ** argv) {
    repro_start(argc, argv, 1, "<source.gguf>");
    struct llama_model * model   = load_model(argv[1]);
    const int            n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    const size_t         n       = (size_t) (STEPS + 1) * n_vocab;
    char detail[160];

    struct llama_context * probe_ctx = make_context(model, 2, false, NULL);
    snprintf(detail, sizeof(detail), "n_seq_max %u, n_ctx %u, n_ctx_seq %u", llama_n_seq_max(probe_ctx),
             llama_n_ctx(probe_ctx), llama_n_ctx_seq(probe_ctx));
    check("each of n_seq_max sequences gets n_ctx / n_seq_max cells",
          llama_n_seq_max(probe_ctx) == 2 && llama_n_ctx_seq(probe_ctx) * 2 == llama_n_ctx(probe_ctx), detail);
    llama_free(probe_ctx);

    int failures_alone = 0, failures_shared = 0, failures_unified = 0, failures_unified_alone = 0;
    float * alone  = session_zero(model, false, false, &failures_alone);
    float * shared = session_zero(model, false, true, &failures_shared);
    check("all decodes succeed", failures_alone == 0 && failures_shared == 0, NULL);
    snprintf(detail, sizeof(detail), "max abs diff %g", max_abs_diff(alone, shared, n));
    check("kv_unified=false: a session's logits do not depend on its neighbour (bit-identical)",
          bit_identical(alone, shared, n), detail);

    float * unified_alone = session_zero(model, true, false, &failures_unified_alone);
    float * unified       = session_zero(model, true, true, &failures_unified);
    printf("NOTE kv_unified=true: max abs diff with a neighbour %g (cells reused across sessions)\n",
           max_abs_diff(unified_alone, unified, n));

    free(alone);
    free(shared);
    free(unified_alone);
    free(unified);
    llama_model_free(model);
    return finish();
}
