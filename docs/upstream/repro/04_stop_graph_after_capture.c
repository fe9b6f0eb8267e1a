/* Hook 4: returning false from the eval callback after the boundary capture stops the graph.
 *
 * Once a non-tail shard has copied l_out-{n-1}, the rest of its graph (output_norm, the 1-row
 * placeholder head) is wasted work; the eval callback can end the compute by returning false.
 * ggml-backend.h documents "if the user returns false, the scheduler will cancel the graph
 * compute"; what the pin actually does afterwards is what meshnet depends on: llama_decode still
 * returns 0, the KV written by the layers that ran is kept, and the next step is bit-identical to
 * a run that never stopped.
 *
 * usage: 04_stop_graph_after_capture <source.gguf> <head-slice.gguf>
 */
#include "repro.h"

typedef struct {
    probe_t                probe;
    struct llama_context * ctx;
    int                    status[2];
    int                    asked_after; /* nodes asked about after the capture, first decode */
    float *                boundary; /* prompt rows, then one decode step */
} run_t;

static void run(run_t * r, struct llama_model * head, const float * embd, const char * target, bool stop) {
    const int n_embd = llama_model_n_embd(head);
    memset(r, 0, sizeof(*r));
    probe_reset(&r->probe, target);
    r->probe.stop         = stop;
    r->probe.out_capacity = (size_t) (PROMPT_LEN + 1) * n_embd;
    r->probe.out          = (float *) malloc(r->probe.out_capacity * sizeof(float));
    r->ctx                = make_context(head, 1, false, &r->probe);
    r->status[0]          = decode_rows(r->ctx, NULL, embd, n_embd, PROMPT_LEN - 1, 0, 0, true);
    r->asked_after        = r->probe.asked_after;
    /* the next step, one row, reads the KV the stopped graph wrote */
    r->status[1] = decode_rows(r->ctx, NULL, embd + (size_t) (PROMPT_LEN - 1) * n_embd, n_embd, 1, PROMPT_LEN - 1, 0, true);
    r->boundary  = r->probe.out;
}

int main(int argc, char ** argv) {
    repro_start(argc, argv, 2, "<source.gguf> <head-slice.gguf>");
    struct llama_model * whole  = load_model(argv[1]);
    struct llama_model * head   = load_model(argv[2]);
    const int            n_embd = llama_model_n_embd(head);
    float *              embd   = prompt_embeddings(whole);
    char target[64], detail[160];
    snprintf(target, sizeof(target), "l_out-%d", llama_model_n_layer(head) - 1);

    run_t full, stopped;
    run(&full, head, embd, target, false);
    run(&stopped, head, embd, target, true);

    snprintf(detail, sizeof(detail), "statuses %d, %d", stopped.status[0], stopped.status[1]);
    check("llama_decode returns 0 when the callback stops the graph", stopped.status[0] == 0 && stopped.status[1] == 0,
          detail);
    snprintf(detail, sizeof(detail), "nodes asked after the capture: %d stopped, %d not stopped",
             stopped.asked_after, full.asked_after);
    check("no node after l_out-{n-1} is evaluated once stopped", stopped.asked_after == 0 && full.asked_after > 0,
          detail);
    const size_t n = (size_t) PROMPT_LEN * n_embd;
    check("both runs captured every row", full.probe.out_used == n && stopped.probe.out_used == n, NULL);
    snprintf(detail, sizeof(detail), "max abs diff %g", max_abs_diff(full.boundary, stopped.boundary, n));
    check("boundary rows (prompt and next step) are bit-identical to an unstopped run",
          bit_identical(full.boundary, stopped.boundary, n), detail);
    llama_memory_t memory = llama_get_memory(stopped.ctx);
    snprintf(detail, sizeof(detail), "seq_pos_max %d", (int) llama_memory_seq_pos_max(memory, 0));
    check("the KV written before the stop is kept", llama_memory_seq_pos_max(memory, 0) == PROMPT_LEN - 1, detail);

    llama_free(full.ctx);
    llama_free(stopped.ctx);
    free(full.boundary);
    free(stopped.boundary);
    free(embd);
    llama_model_free(head);
    llama_model_free(whole);
    return finish();
}
