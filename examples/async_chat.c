/* async_chat.c - a host program on tandem's public API alone: the engine runs its own
 * scheduler thread; the main thread submits several chat turns at once, each
 * streaming its text through a callback, cancels one, and waits for all of them.
 *
 *   usage: async_chat TARGET.gguf [DRAFT.gguf]
 *
 * Prints each request's streamed text as it arrives (prefixed by its number), then
 * one line per result and the engine's counters.  Exits 0 when every request ended
 * as expected (the cancelled one cancelled, the others by length or end of text,
 * the streamed text equal to the result's text). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tandem.h"

#define N_REQ 4

typedef struct turn {
    int index;
    char stream[8192];     /* what on_token passed */
    size_t n_stream;
    tandem_result result;  /* owned once done */
    int done;
} turn;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_left = N_REQ;

/* called on the engine's thread for each committed token */
static bool on_token(int32_t token, const char *text, size_t len, void *user) {
    (void)token;
    turn *t = user;
    if (t->n_stream + len < sizeof t->stream) {
        memcpy(t->stream + t->n_stream, text, len);
        t->n_stream += len;
    }
    if (len) printf("[%d] %.*s\n", t->index, (int)len, text);
    return true;
}

/* called on the engine's thread once per request; the result is ours */
static void on_finish(tandem_request_id id, tandem_result *r, void *user) {
    (void)id;
    turn *t = user;
    pthread_mutex_lock(&g_mu);
    t->result = *r;
    t->done = 1;
    g_left--;
    pthread_cond_signal(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: %s TARGET.gguf [DRAFT.gguf]\n", argv[0]);
        return 2;
    }
    tandem_model *target = NULL, *draft = NULL;
    if (tandem_model_open(argv[1], NULL, &target) || (argc == 3 && tandem_model_open(argv[2], NULL, &draft))) {
        fprintf(stderr, "error: %s\n", tandem_last_error());
        tandem_model_close(target);
        return 1;
    }
    tandem_engine_params ep = tandem_engine_default_params();
    ep.n_seq_max = N_REQ;
    ep.n_ctx = 1024;
    tandem_engine *engine = NULL;
    if (tandem_engine_open(target, draft, &ep, &engine) || tandem_engine_start(engine)) {
        fprintf(stderr, "error: %s\n", tandem_last_error());
        tandem_engine_close(engine);
        tandem_model_close(draft);
        tandem_model_close(target);
        return 1;
    }
    static const char *prompts[N_REQ] = {
        "def fibonacci(n):",
        "import os\n\ndef list_files(path):",
        "class Stack:\n    def __init__(self):",
        "def parse_args():",
    };
    static turn turns[N_REQ];
    tandem_request_id ids[N_REQ];
    int status = 0;
    for (int i = 0; i < N_REQ; i++) {
        turns[i].index = i;
        tandem_request r = tandem_request_default();
        r.prompt = prompts[i];
        r.params.max_tokens = i == 3 ? 400 : 48;
        r.params.temperature = i == 1 ? 0.7f : 0.0f;
        r.params.seed = 42;
        r.params.on_token = on_token;
        r.params.user_data = &turns[i];
        r.priority = i == 0 ? 1 : 0;
        if (tandem_engine_submit(engine, &r, on_finish, &turns[i], &ids[i])) {
            fprintf(stderr, "error: submit %d: %s\n", i, tandem_last_error());
            return 1;
        }
    }
    /* the last one is cancelled while it runs (or before, if it has not started) */
    if (tandem_engine_cancel(engine, ids[3]) != TANDEM_OK) {
        fprintf(stderr, "error: cancel: %s\n", tandem_last_error());
        status = 1;
    }
    pthread_mutex_lock(&g_mu);
    while (g_left > 0) pthread_cond_wait(&g_cv, &g_mu);
    pthread_mutex_unlock(&g_mu);
    for (int i = 0; i < N_REQ; i++) {
        const tandem_result *r = &turns[i].result;
        printf("request %d: %s, %zu tokens, finish %s, queue %.1f ms\n", i, tandem_status_str(r->status), r->n_tokens,
               tandem_finish_reason_str(r->finish_reason), r->queue_ms);
        const bool streamed = turns[i].n_stream == strlen(r->text) && memcmp(turns[i].stream, r->text, turns[i].n_stream) == 0;
        const bool cancelled = r->finish_reason == TANDEM_FINISH_CANCELLED;
        if (r->status != TANDEM_OK || !streamed || cancelled != (i == 3)) {
            fprintf(stderr, "error: request %d ended unexpectedly (streamed text %s)\n", i, streamed ? "equal" : "differs");
            status = 1;
        }
        tandem_result_free(&turns[i].result);
    }
    tandem_engine_stats st;
    tandem_engine_get_stats(engine, &st);
    printf("engine: %llu submitted, %llu finished, %llu cancelled, %llu tokens in %llu steps, %d of %d KV blocks free\n",
           (unsigned long long)st.n_submitted, (unsigned long long)st.n_finished, (unsigned long long)st.n_cancelled,
           (unsigned long long)st.generated_tokens, (unsigned long long)st.steps, st.kv_blocks_free, st.kv_blocks_total);
    if (st.kv_blocks_free != st.kv_blocks_total) status = 1;
    tandem_engine_close(engine); /* (stops its thread) */
    tandem_model_close(draft);
    tandem_model_close(target);
    return status;
}
