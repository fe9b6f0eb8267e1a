/* Shared helpers for the meshnet upstream repros.
 *
 * Each repro is one C file that includes this header, links against the libllama/libggml of the
 * pinned llama-cpp-python wheel, and prints one "CHECK <name>: ok|FAILED ..." line per assumption
 * followed by a final "PASS" or "FAIL" (exit status 0 or 1). Everything here uses only the public
 * llama.h / ggml.h / ggml-backend.h API of the pin.
 */
#ifndef MESHNET_REPRO_H
#define MESHNET_REPRO_H

#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int repro_failures = 0;

static inline void check(const char * name, bool ok, const char * detail) {
    printf("CHECK %s: %s%s%s\n", name, ok ? "ok" : "FAILED", detail && *detail ? " - " : "", detail ? detail : "");
    if (!ok) {
        repro_failures++;
    }
}

static inline int finish(void) {
    puts(repro_failures == 0 ? "PASS" : "FAIL");
    llama_backend_free();
    return repro_failures == 0 ? 0 : 1;
}

static inline void quiet_log(enum ggml_log_level level, const char * text, void * user_data) {
    (void) user_data;
    if (level == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

static inline void repro_init(void) {
    llama_log_set(quiet_log, NULL);
    llama_backend_init();
}

/* Checks the argument count (printing the usage otherwise) and initialises the backend. */
static inline void repro_start(int argc, char ** argv, int n_args, const char * usage) {
    if (argc != n_args + 1) {
        fprintf(stderr, "usage: %s %s\n", argv[0], usage);
        exit(2);
    }
    repro_init();
}

static inline struct llama_model * load_model(const char * path) {
    struct llama_model_params params = llama_model_default_params();
    params.n_gpu_layers = 0;
    struct llama_model * model = llama_model_load_from_file(path, params);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", path);
        exit(2);
    }
    return model;
}

/* A probe the eval callback drives: it observes (and optionally overwrites) one named tensor. */
typedef struct {
    char          target[64];
    float       * out;          /* captured rows are appended here */
    size_t        out_capacity; /* floats */
    size_t        out_used;     /* floats */
    const float * replacement;  /* when set, written into the target before it is captured */
    bool          stop;         /* return false after the capture: stop the graph */
    int           seen;         /* times the target was delivered */
    int           asked_after;  /* nodes the scheduler asked about after the first delivery */
    int64_t       ne[4];        /* shape of the last delivery */
    char          watch[64];    /* a second tensor that is only observed (empty: none) */
    float       * watch_out;
    size_t        watch_capacity;
    size_t        watch_used;
} probe_t;

static inline void probe_reset(probe_t * probe, const char * target) {
    snprintf(probe->target, sizeof(probe->target), "%s", target);
    probe->out_used    = 0;
    probe->seen        = 0;
    probe->asked_after = 0;
    probe->watch_used  = 0;
    memset(probe->ne, 0, sizeof(probe->ne));
}

static inline bool probe_eval(struct ggml_tensor * t, bool ask, void * user_data) {
    probe_t *  probe   = (probe_t *) user_data;
    const bool match   = strcmp(ggml_get_name(t), probe->target) == 0;
    const bool watched = probe->watch[0] && strcmp(ggml_get_name(t), probe->watch) == 0;
    if (ask) {
        if (probe->seen > 0) {
            probe->asked_after++;
        }
        return match || watched;
    }
    if (watched) {
        const size_t n = (size_t) ggml_nelements(t);
        if (probe->watch_out && probe->watch_used + n <= probe->watch_capacity) {
            ggml_backend_tensor_get(t, probe->watch_out + probe->watch_used, 0, ggml_nbytes(t));
            probe->watch_used += n;
        }
        return true;
    }
    if (!match) {
        return true;
    }
    if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t)) {
        fprintf(stderr, "%s is not a contiguous F32 tensor\n", probe->target);
        return false;
    }
    const size_t n = (size_t) ggml_nelements(t);
    if (probe->replacement) {
        ggml_backend_tensor_set(t, probe->replacement, 0, ggml_nbytes(t));
    }
    if (probe->out && probe->out_used + n <= probe->out_capacity) {
        ggml_backend_tensor_get(t, probe->out + probe->out_used, 0, ggml_nbytes(t));
        probe->out_used += n;
    }
    memcpy(probe->ne, t->ne, sizeof(probe->ne));
    probe->seen++;
    return !probe->stop;
}

static inline struct llama_context * make_context(struct llama_model * model, uint32_t n_seq_max, bool kv_unified, probe_t * probe) {
    struct llama_context_params params = llama_context_default_params();
    params.n_ctx           = 256 * n_seq_max;
    params.n_batch         = 64;
    params.n_ubatch        = 64;
    params.n_seq_max       = n_seq_max;
    params.n_threads       = 1;
    params.n_threads_batch = 1;
    params.kv_unified      = kv_unified;
    params.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    params.no_perf         = true;
    if (probe) {
        params.cb_eval           = probe_eval;
        params.cb_eval_user_data = probe;
    }
    struct llama_context * ctx = llama_init_from_model(model, params);
    if (!ctx) {
        fprintf(stderr, "cannot create a context\n");
        exit(2);
    }
    return ctx;
}

/* Decode n rows of one sequence: token ids or embeddings, at absolute positions pos0.., marking
 * every row as an output (all_outputs) or only the last one. Returns llama_decode's status. */
static inline int decode_rows(struct llama_context * ctx, const llama_token * tokens, const float * embd, int n_embd, int n,
                       llama_pos pos0, llama_seq_id seq, bool all_outputs) {
    struct llama_batch batch = llama_batch_init(n, embd ? n_embd : 0, 1);
    for (int i = 0; i < n; i++) {
        if (embd) {
            memcpy(batch.embd + (size_t) i * n_embd, embd + (size_t) i * n_embd, sizeof(float) * n_embd);
        } else {
            batch.token[i] = tokens[i];
        }
        batch.pos[i]       = pos0 + i;
        batch.n_seq_id[i]  = 1;
        batch.seq_id[i][0] = seq;
        batch.logits[i]    = all_outputs || i == n - 1;
    }
    batch.n_tokens   = n;
    const int status = llama_decode(ctx, batch);
    llama_batch_free(batch);
    return status;
}

static inline float max_abs_diff(const float * a, const float * b, size_t n) {
    float worst = 0.0f;
    for (size_t i = 0; i < n; i++) {
        const float d = fabsf(a[i] - b[i]);
        if (d > worst || isnan(d)) {
            worst = isnan(d) ? INFINITY : d;
        }
    }
    return worst;
}

static inline bool bit_identical(const float * a, const float * b, size_t n) {
    return memcmp(a, b, n * sizeof(float)) == 0;
}

static inline float * copy_floats(const float * source, size_t n) {
    float * copy = (float *) malloc(n * sizeof(float));
    memcpy(copy, source, n * sizeof(float));
    return copy;
}

static const llama_token PROMPT[] = { 1, 270, 281, 289, 262, 280, 7, 9 };
#define PROMPT_LEN ((int) (sizeof(PROMPT) / sizeof(PROMPT[0])))

/* The prompt's input embeddings as the whole model computes them (the node named "embd"), i.e.
 * exactly what a head's own table lookup feeds a vocabulary-less slice. [PROMPT_LEN, n_embd] */
static inline float * prompt_embeddings(struct llama_model * full) {
    const int n_embd = llama_model_n_embd(full);
    probe_t   probe  = { 0 };
    probe_reset(&probe, "embd");
    probe.out_capacity = (size_t) PROMPT_LEN * n_embd;
    probe.out          = (float *) malloc(probe.out_capacity * sizeof(float));
    struct llama_context * ctx = make_context(full, 1, false, &probe);
    if (decode_rows(ctx, PROMPT, NULL, n_embd, PROMPT_LEN, 0, 0, true) != 0 || probe.out_used != probe.out_capacity) {
        fprintf(stderr, "could not capture the prompt embeddings (node \"embd\")\n");
        exit(2);
    }
    llama_free(ctx);
    return probe.out;
}

/* Deterministic stand-in hidden states for inputs whose values do not matter. */
static inline float * pseudo_random_rows(int n_rows, int n_embd, unsigned seed) {
    float * rows = (float *) malloc((size_t) n_rows * n_embd * sizeof(float));
    for (size_t i = 0; i < (size_t) n_rows * n_embd; i++) {
        seed = seed * 1103515245u + 12345u;
        rows[i] = ((float) ((seed >> 8) & 0xffff) / 65535.0f - 0.5f) * 2.0f;
    }
    return rows;
}

#endif
