/* Hook 1: a vocabulary-less derivative GGUF loads and runs from embeddings.
 *
 * meshnet's head and middle range slices carry tokenizer.ggml.model = "none", {arch}.vocab_size = 1,
 * a 1-row placeholder token_embd.weight and a ones output_norm (src/meshnet/artifact/slicing.py).
 * This checks that the pinned llama.cpp loads such a file as a model with no vocabulary and the
 * slice's own layer count, runs it from llama_batch.embd, and rejects token input cleanly (so the
 * placeholder table is never read).
 *
 * usage: 01_vocabless_slice <source.gguf> <middle-slice.gguf> <n_slice_layers>
 */
#include "repro.h"

int main(int argc, char ** argv) {
    repro_start(argc, argv, 3, "<source.gguf> <middle-slice.gguf> <n_slice_layers>");
    struct llama_model * source = load_model(argv[1]);
    struct llama_model * slice  = load_model(argv[2]);
    const int n_slice_layers    = atoi(argv[3]);
    const int n_embd            = llama_model_n_embd(slice);
    char detail[160];

    const struct llama_vocab * vocab = llama_model_get_vocab(slice);
    snprintf(detail, sizeof(detail), "vocab type %d, %d tokens", (int) llama_vocab_type(vocab), llama_vocab_n_tokens(vocab));
    check("tokenizer 'none' loads as LLAMA_VOCAB_TYPE_NONE", llama_vocab_type(vocab) == LLAMA_VOCAB_TYPE_NONE, detail);

    snprintf(detail, sizeof(detail), "n_layer %d, expected %d", llama_model_n_layer(slice), n_slice_layers);
    check("block_count of the slice is its layer count", llama_model_n_layer(slice) == n_slice_layers, detail);
    check("slice keeps the source width", n_embd == llama_model_n_embd(source), NULL);

    snprintf(detail, sizeof(detail), "slice %llu bytes, source %llu bytes", (unsigned long long) llama_model_size(slice),
             (unsigned long long) llama_model_size(source));
    check("slice holds fewer weight bytes than the source", llama_model_size(slice) < llama_model_size(source), detail);

    probe_t probe = { 0 };
    probe_reset(&probe, "l_out-0");
    struct llama_context * ctx  = make_context(slice, 1, false, &probe);
    float *                rows = pseudo_random_rows(PROMPT_LEN, n_embd, 7);
    const int status = decode_rows(ctx, NULL, rows, n_embd, PROMPT_LEN, 0, 0, true);
    snprintf(detail, sizeof(detail), "llama_decode returned %d", status);
    check("decode from llama_batch.embd succeeds", status == 0, detail);
    check("the slice's layer 0 ran (l_out-0 evaluated)", probe.seen == 1, NULL);

    /* A real token id is refused up front (vocab_size = 1). Token id 0 is NOT refused: it reads the
     * zero placeholder row, which is why meshnet's backend refuses token input on such slices itself. */
    const llama_token real_token = 5;
    const int token_status = decode_rows(ctx, &real_token, NULL, n_embd, 1, PROMPT_LEN, 0, true);
    snprintf(detail, sizeof(detail), "llama_decode returned %d", token_status);
    check("a token id >= vocab_size 1 is rejected", token_status != 0, detail);
    const llama_token placeholder_token = 0;
    const int placeholder_status = decode_rows(ctx, &placeholder_token, NULL, n_embd, 1, PROMPT_LEN, 0, true);
    printf("NOTE token id 0 on a vocabulary-less slice: llama_decode returned %d (reads the placeholder row)\n",
           placeholder_status);

    free(rows);
    llama_free(ctx);
    llama_model_free(slice);
    llama_model_free(source);
    return finish();
}
