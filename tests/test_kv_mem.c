/* test_kv_mem.c - memory as users expect on the CPU:
 *   - the context an engine takes by default (min(TANDEM_CTX_DEFAULT, the model's
 *     training context)), an explicit one (also past the training context), a bad
 *     one refused, a prompt that does not fit refused naming the context, a
 *     generation that reaches the context ending with TANDEM_FINISH_LENGTH, and a
 *     KV budget beyond the machine's memory refused;
 *   - the CPU's KV cache takes memory as its blocks are first used: an engine with
 *     a 1 GiB budget is resident for a small part of it when it opens, and a long
 *     prompt grows it by about the prompt's K/V bytes, not by the budget
 *     (/proc/self/statm). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api_testutil.h"
#include "tandem.h"
#include "testutil.h"
#include "tiny_model.h"

typedef struct tiny {
    char *path;
    tandem_model *m;
} tiny;

static tiny tiny_open(tdm_tiny_cfg c) {
    tiny t = {.path = tdm_tiny_model_file(&c)};
    cr_assert_eq(tandem_model_open(t.path, NULL, &t.m), TANDEM_OK, "%s", tandem_last_error());
    return t;
}

static void tiny_close(tiny *t) {
    tandem_model_close(t->m);
    unlink(t->path);
    free(t->path);
}

static tandem_engine *engine(tandem_model *m, int n_ctx, size_t kv_bytes) {
    tandem_engine_params ep = tandem_engine_default_params();
    ep.n_threads = 2;
    ep.n_ctx = n_ctx;
    ep.kv_bytes = kv_bytes;
    return api_open_engine(m, NULL, &ep);
}

static int32_t *tokens(int n, int n_vocab) {
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    uint64_t rng = 7;
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(tdm_test_rand(&rng) % (uint64_t)n_vocab);
    return ids;
}

Test(kv_mem, context_default_and_limits) {
    tdm_tiny_cfg c = tdm_tiny_default();
    c.n_vocab = 48;
    c.context_length = 8192; /* larger than the default: the default wins */
    tiny big = tiny_open(c);
    tandem_engine *e = engine(big.m, 0, 0);
    cr_assert_eq(tandem_engine_n_ctx(e), TANDEM_CTX_DEFAULT);
    tandem_engine_close(e);
    e = engine(big.m, 6000, 0);
    cr_assert_eq(tandem_engine_n_ctx(e), 6000);
    tandem_engine_close(e);
    tiny_close(&big);

    c.context_length = 0; /* 256: smaller than the default: the model's */
    tiny t = tiny_open(c);
    e = engine(t.m, 0, 0);
    cr_assert_eq(tandem_engine_n_ctx(e), 256);
    cr_assert_eq(tandem_engine_n_ctx(NULL), 0);

    /* a prompt of the whole context does not fit; the error names both */
    int32_t *ids = tokens(300, c.n_vocab);
    tandem_generate_params gp = tandem_generate_default_params();
    gp.max_tokens = 100;
    gp.ignore_eos = true;
    tandem_result r;
    cr_assert_eq(tandem_generate_ids(e, ids, 256, &gp, &r), TANDEM_ERR_INVALID_ARG);
    cr_assert(strstr(tandem_last_error(), "256 tokens") && strstr(tandem_last_error(), "context of 256") &&
                  strstr(tandem_last_error(), "training context is 256"),
              "%s", tandem_last_error());
    /* a reply that reaches the context ends there, finish reason length */
    cr_assert_eq(tandem_generate_ids(e, ids, 250, &gp, &r), TANDEM_OK, "%s", tandem_last_error());
    cr_assert_eq(r.finish_reason, TANDEM_FINISH_LENGTH);
    cr_assert_eq(r.n_tokens, 256 - 250, "%zu tokens after a prompt of 250 in a context of 256", r.n_tokens);
    tandem_result_free(&r);
    tandem_engine_close(e);

    /* past the training context: allowed */
    e = engine(t.m, 300, 0);
    cr_assert_eq(tandem_generate_ids(e, ids, 280, &gp, &r), TANDEM_OK, "%s", tandem_last_error());
    cr_assert_eq(r.n_tokens, 300 - 280);
    tandem_result_free(&r);
    tandem_engine_close(e);

    tandem_engine_params ep = tandem_engine_default_params();
    ep.n_ctx = -1;
    cr_assert_eq(tandem_engine_open(t.m, NULL, &ep, &e), TANDEM_ERR_INVALID_ARG);
    cr_assert(strstr(tandem_last_error(), "n_ctx"), "%s", tandem_last_error());
    /* a budget beyond the machine's memory: refused when the engine opens (the
     * system would take it, the cache's memory being taken as it is used) */
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    ep = tandem_engine_default_params();
    ep.kv_bytes = (size_t)pages * (size_t)page * 2;
    cr_assert_eq(tandem_engine_open(t.m, NULL, &ep, &e), TANDEM_ERR_NOMEM, "%s", tandem_last_error());
    cr_assert(strstr(tandem_last_error(), "is more than this machine's"), "%s", tandem_last_error());
    free(ids);
    tiny_close(&t);
}

/* Resident bytes of this process. */
static uint64_t resident(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    cr_assert(f);
    unsigned long long size = 0, res = 0;
    cr_assert_eq(fscanf(f, "%llu %llu", &size, &res), 2);
    fclose(f);
    return (uint64_t)res * (uint64_t)sysconf(_SC_PAGESIZE);
}

Test(kv_mem, cpu_cache_grows_with_use, .timeout = 120) {
    tdm_tiny_cfg c = tdm_tiny_default();
    c.n_vocab = 48;
    c.n_layer = 8;
    c.n_head = c.n_head_kv = 4;
    c.head_dim = 64;
    c.context_length = 4096;
    tiny t = tiny_open(c);
    tandem_model_info info;
    cr_assert_eq(tandem_model_get_info(t.m, &info), TANDEM_OK);
    const uint64_t per_token = info.kv_bytes_per_token; /* f16: 2 (K, V) x 8 x 4 x 64 x 2 = 8 KiB */
    cr_assert_eq(per_token, 8192);
    const size_t budget = (size_t)1 << 30, mib = 1 << 20;

    const uint64_t r0 = resident();
    tandem_engine *e = engine(t.m, 0, budget);
    tandem_engine_stats st;
    cr_assert_eq(tandem_engine_get_stats(e, &st), TANDEM_OK);
    cr_assert_eq((uint64_t)st.kv_blocks_total * 16 * per_token, budget, "the budget's blocks: %d", st.kv_blocks_total);
    const uint64_t r1 = resident();
    cr_log_info("resident: %.1f MiB before the engine, %.1f MiB after it opened (budget %zu MiB)", (double)r0 / mib,
                (double)r1 / mib, budget / mib);
    cr_assert_lt(r1 - r0, 64 * mib, "opening an engine with a 1 GiB KV budget took %.1f MiB",
                 (double)(r1 - r0) / mib);

    const int n_prompt = 3000; /* K/V: 3000 x 8 KiB = 23.4 MiB */
    int32_t *ids = tokens(n_prompt, c.n_vocab);
    tandem_generate_params gp = tandem_generate_default_params();
    gp.max_tokens = 4;
    gp.ignore_eos = true;
    tandem_result r;
    cr_assert_eq(tandem_generate_ids(e, ids, (size_t)n_prompt, &gp, &r), TANDEM_OK, "%s", tandem_last_error());
    tandem_result_free(&r);
    const uint64_t r2 = resident(), kv = (uint64_t)n_prompt * per_token;
    cr_log_info("after a prompt of %d tokens (%.1f MiB of K/V): %.1f MiB", n_prompt, (double)kv / mib,
                (double)r2 / mib);
    cr_assert_geq(r2 - r1, kv * 9 / 10, "a prompt of %.1f MiB of K/V grew the process by %.1f MiB", (double)kv / mib,
                  (double)(r2 - r1) / mib);
    cr_assert_lt(r2 - r1, kv + 64 * mib, "a prompt of %.1f MiB of K/V grew the process by %.1f MiB",
                 (double)kv / mib, (double)(r2 - r1) / mib);
    free(ids);
    tandem_engine_close(e);
    tiny_close(&t);
}
