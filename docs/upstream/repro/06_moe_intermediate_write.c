/* Hook 6: a write into an intermediate tensor from the eval callback is seen by later nodes.
 *
 * meshnet's expert-parallel design exchanges per-slot expert rows between nodes: each node
 * computes the slots of its own experts, and the full ffn_moe_weighted-{il} tensor
 * [n_embd, n_expert_used, n_tokens] is assembled and written back in the eval callback before
 * build_moe_ffn folds the slots left in slot order into ffn_moe_out-{il}. This checks that writing
 * the reference slot rows back is bit-identical, that zeroing slot 1 makes ffn_moe_out exactly slot
 * 0, and that the write reaches the boundary output of the last layer.
 *
 * usage: 06_moe_intermediate_write <moe-slice.gguf>
 */
#include "repro.h"

#define N_ROWS 4

typedef struct {
    float * weighted; /* ffn_moe_weighted-0 as computed (or as written) */
    float * watched;  /* the watched tensor */
    size_t  n_weighted, n_watched;
    int64_t ne[4];
} moe_run_t;

static moe_run_t moe_run(struct llama_model * model, const float * rows, const float * replacement, const char * watch) {
    const int n_embd = llama_model_n_embd(model);
    moe_run_t run    = { 0 };
    probe_t   probe  = { 0 };
    probe_reset(&probe, "ffn_moe_weighted-0");
    snprintf(probe.watch, sizeof(probe.watch), "%s", watch);
    probe.replacement    = replacement;
    probe.out_capacity   = (size_t) 16 * N_ROWS * n_embd;
    probe.out            = (float *) calloc(probe.out_capacity, sizeof(float));
    probe.watch_capacity = (size_t) N_ROWS * n_embd;
    probe.watch_out      = (float *) calloc(probe.watch_capacity, sizeof(float));
    struct llama_context * ctx = make_context(model, 1, false, &probe);
    if (decode_rows(ctx, NULL, rows, n_embd, N_ROWS, 0, 0, true) != 0) {
        fprintf(stderr, "decode failed\n");
        exit(2);
    }
    llama_free(ctx);
    run.weighted   = probe.out;
    run.n_weighted = probe.out_used;
    run.watched    = probe.watch_out;
    run.n_watched  = probe.watch_used;
    memcpy(run.ne, probe.ne, sizeof(run.ne));
    return run;
}

int main(int argc, char ** argv) {
    repro_start(argc, argv, 1, "<moe-slice.gguf>");
    struct llama_model * model  = load_model(argv[1]);
    const int            n_embd = llama_model_n_embd(model);
    float *              rows   = pseudo_random_rows(N_ROWS, n_embd, 11);
    char last[64], detail[200];
    snprintf(last, sizeof(last), "l_out-%d", llama_model_n_layer(model) - 1);

    moe_run_t reference = moe_run(model, rows, NULL, last);
    const int64_t n_used = reference.ne[1];
    snprintf(detail, sizeof(detail), "shape [%lld, %lld, %lld]", (long long) reference.ne[0], (long long) n_used,
             (long long) reference.ne[2]);
    check("ffn_moe_weighted-0 is [n_embd, n_expert_used, n_tokens]",
          reference.ne[0] == n_embd && n_used == 2 && reference.ne[2] == N_ROWS, detail);
    check("the boundary output was captured", reference.n_watched == (size_t) N_ROWS * n_embd, NULL);

    moe_run_t same = moe_run(model, rows, reference.weighted, last);
    snprintf(detail, sizeof(detail), "max abs diff %g", max_abs_diff(reference.watched, same.watched, reference.n_watched));
    check("writing the reference slot rows back is bit-identical",
          bit_identical(reference.watched, same.watched, reference.n_watched), detail);

    /* slot 1 of every token zeroed: the fold slot0 + slot1 must give slot 0 exactly */
    float * zeroed = copy_floats(reference.weighted, reference.n_weighted);
    for (int t = 0; t < N_ROWS; t++) {
        memset(zeroed + ((size_t) t * n_used + 1) * n_embd, 0, n_embd * sizeof(float));
    }
    moe_run_t folded = moe_run(model, rows, zeroed, "ffn_moe_out-0");
    bool exact = folded.n_watched == (size_t) N_ROWS * n_embd;
    for (int t = 0; t < N_ROWS && exact; t++) {
        exact = bit_identical(folded.watched + (size_t) t * n_embd, reference.weighted + (size_t) t * n_used * n_embd, n_embd);
    }
    check("after zeroing slot 1 in the callback, ffn_moe_out-0 is exactly slot 0", exact, NULL);

    moe_run_t changed = moe_run(model, rows, zeroed, last);
    check("the write reaches the last layer's boundary output",
          !bit_identical(reference.watched, changed.watched, reference.n_watched), NULL);

    moe_run_t runs[4] = { reference, same, folded, changed };
    for (int i = 0; i < 4; i++) {
        free(runs[i].weighted);
        free(runs[i].watched);
    }
    free(zeroed);
    free(rows);
    llama_model_free(model);
    return finish();
}
