/* Hook 3: the eval callback reads l_out-{n-1} as the boundary output; every row is an output.
 *
 * A non-tail meshnet shard asks the eval callback for the tensor named "l_out-{n_layer-1}" (the
 * residual stream after its last layer, before output_norm) and copies it out with
 * ggml_backend_tensor_get (src/meshnet/engine/native_capture.py). It marks every batch row as an
 * output, because the last layer of a llama graph gathers only the output rows (inp_out_ids) before
 * l_out is formed. This checks that a head slice's boundary fed to a tail slice reproduces the whole
 * model's logits bit for bit, and reports how many rows l_out has when only one row is an output.
 *
 * usage: 03_boundary_output_all_rows <source.gguf> <head-slice.gguf> <tail-slice.gguf>
 */
#include "repro.h"

int main(int argc, char ** argv) {
    repro_start(argc, argv, 3, "<source.gguf> <head-slice.gguf> <tail-slice.gguf>");
    struct llama_model * whole   = load_model(argv[1]);
    struct llama_model * head    = load_model(argv[2]);
    struct llama_model * tail    = load_model(argv[3]);
    const int            n_embd  = llama_model_n_embd(whole);
    const int            n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(whole));
    float *              embd    = prompt_embeddings(whole);
    char target[64], detail[160];
    snprintf(target, sizeof(target), "l_out-%d", llama_model_n_layer(head) - 1);

    struct llama_context * reference = make_context(whole, 1, false, NULL);
    decode_rows(reference, PROMPT, NULL, n_embd, PROMPT_LEN, 0, 0, true);

    probe_t probe = { 0 };
    probe_reset(&probe, target);
    probe.out_capacity = (size_t) PROMPT_LEN * n_embd;
    probe.out          = (float *) malloc(probe.out_capacity * sizeof(float));
    struct llama_context * head_ctx = make_context(head, 1, false, &probe);
    const int head_status = decode_rows(head_ctx, NULL, embd, n_embd, PROMPT_LEN, 0, 0, true);
    check("head slice decodes", head_status == 0, NULL);
    snprintf(detail, sizeof(detail), "delivered %d times, shape [%lld, %lld]", probe.seen, (long long) probe.ne[0],
             (long long) probe.ne[1]);
    check("the tensor named l_out-{n-1} exists and is delivered once", probe.seen == 1, detail);
    check("with every row an output, l_out-{n-1} has every row", probe.ne[0] == n_embd && probe.ne[1] == PROMPT_LEN,
          detail);

    struct llama_context * tail_ctx = make_context(tail, 1, false, NULL);
    const int tail_status = decode_rows(tail_ctx, NULL, probe.out, n_embd, PROMPT_LEN, 0, 0, true);
    check("tail slice decodes the boundary rows", tail_status == 0, NULL);
    bool same = tail_status == 0;
    float worst = 0.0f;
    for (int i = 0; i < PROMPT_LEN && same; i++) {
        const float * a = llama_get_logits_ith(reference, i);
        const float * b = llama_get_logits_ith(tail_ctx, i);
        const float   d = max_abs_diff(a, b, n_vocab);
        worst = d > worst ? d : worst;
        same  = same && bit_identical(a, b, n_vocab);
    }
    snprintf(detail, sizeof(detail), "max abs diff %g", worst);
    check("head boundary -> tail gives the whole model's logits (bit-identical)", same, detail);

    /* The pruning the workaround avoids: only the last row an output. */
    probe_t pruned = { 0 };
    probe_reset(&pruned, target);
    struct llama_context * pruned_ctx = make_context(head, 1, false, &pruned);
    decode_rows(pruned_ctx, NULL, embd, n_embd, PROMPT_LEN, 0, 0, false);
    printf("NOTE with only the last row an output, %s has %lld of %d rows (the last layer prunes to output rows)\n",
           target, (long long) pruned.ne[1], PROMPT_LEN);

    llama_free(pruned_ctx);
    llama_free(tail_ctx);
    llama_free(head_ctx);
    llama_free(reference);
    free(probe.out);
    free(embd);
    llama_model_free(tail);
    llama_model_free(head);
    llama_model_free(whole);
    return finish();
}
