/* testutil.c - shared helpers for the Criterion tests. */
#include "testutil.h"
#include "sched_internal.h"
#include "engine.h"
#include "kv_cache.h"
#include "scheduler.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *rot_path(const char *dir, const char *name) {
    static char buf[4][4096];
    static int k;
    char *b = buf[k++ & 3];
    snprintf(b, sizeof buf[0], "%s/%s", dir, name);
    return b;
}

const char *tdm_test_data_path(const char *name) { return rot_path(TDM_TEST_DATA, name); }
const char *tdm_test_model_path(const char *name) { return rot_path(TDM_MODELS, name); }

tdm_json **tdm_test_jsonl(const char *path, size_t *n) {
    char *text;
    size_t len;
    tdm_err err = {0};
    cr_assert_eq(tdm_read_file(path, &text, &len, &err), TANDEM_OK, "%s", err.msg);
    size_t cap = 16, cnt = 0;
    tdm_json **items = malloc(cap * sizeof *items);
    char *p = text, *end = text + len;
    int line = 0;
    while (p < end) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *le = nl ? nl : end;
        line++;
        if (le > p) {
            tdm_json *j = NULL;
            cr_assert_eq(tdm_json_parse(p, (size_t)(le - p), &j, &err), TANDEM_OK,
                         "%s:%d: %s", path, line, err.msg);
            if (cnt == cap) items = realloc(items, (cap *= 2) * sizeof *items);
            items[cnt++] = j;
        }
        p = le + 1;
    }
    free(text);
    *n = cnt;
    return items;
}

void tdm_test_jsonl_free(tdm_json **items, size_t n) {
    for (size_t i = 0; i < n; i++) tdm_json_free(items[i]);
    free(items);
}

int32_t *tdm_test_json_ids(const tdm_json *arr, size_t *n) {
    cr_assert(arr && arr->type == TDM_JSON_ARRAY, "expected a JSON array of ids");
    int32_t *ids = malloc((arr->n + 1) * sizeof *ids);
    for (size_t i = 0; i < arr->n; i++) {
        int64_t v;
        cr_assert(tdm_json_int(&arr->items[i], &v), "element %zu is not an integer", i);
        ids[i] = (int32_t)v;
    }
    *n = arr->n;
    return ids;
}

uint64_t tdm_test_rand(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

float tdm_test_randf(uint64_t *s, float lo, float hi) {
    return lo + (hi - lo) * (float)((tdm_test_rand(s) >> 40) * (1.0 / 16777216.0));
}

double tdm_test_randu(uint64_t *s) { return (double)(tdm_test_rand(s) >> 11) * 0x1.0p-53; }

bool tdm_test_stop_cb(int32_t token, const char *text, size_t len, void *user_data) {
    (void)token;
    (void)text;
    (void)len;
    tdm_test_stop *st = user_data;
    return ++st->count < st->limit;
}

void tdm_test_sample_counts(tdm_engine *e, const tandem_generate_params *base, const int32_t *prompt,
                            int32_t n_prompt, uint64_t seed0, int n_runs, int n_pos, int32_t V, uint64_t *counts,
                            tandem_spec_stats *agg) {
    tdm_err err = {0};
    for (int r = 0; r < n_runs; r++) {
        tandem_generate_params gp = *base;
        gp.seed = seed0 + (uint64_t)r;
        gp.max_tokens = n_pos;
        tandem_result res;
        cr_assert_eq(tdm_generate_one(e, prompt, n_prompt, &gp, &res, &err), TANDEM_OK, "%s", err.msg);
        cr_assert_eq(res.n_tokens, (size_t)n_pos);
        for (int i = 0; i < n_pos; i++) counts[i * V + res.tokens[i]]++;
        if (agg) {
            agg->drafted += res.spec.drafted;
            agg->accepted += res.spec.accepted;
            agg->ngram_steps += res.spec.ngram_steps;
            agg->ngram_drafted += res.spec.ngram_drafted;
            agg->ngram_accepted += res.spec.ngram_accepted;
            agg->tree_steps += res.spec.tree_steps;
        }
        tandem_result_free(&res);
    }
}

int tdm_test_run_all(int argc, char *argv[]) {
    struct criterion_test_set *tests = criterion_initialize();
    int result = 0;
    if (criterion_handle_args(argc, argv, true)) result = !criterion_run_all_tests(tests);
    criterion_finalize(tests);
    return result;
}

tdm_engine *tdm_test_engine(tdm_model *target, tdm_model *draft, int32_t n_threads) {
    tdm_err err = {0};
    tdm_engine_cfg cfg = {.n_threads = n_threads};
    tdm_engine *e;
    cr_assert_eq(tdm_engine_create(target, draft, &cfg, &e, &err), TANDEM_OK, "%s", err.msg);
    return e;
}

void tdm_test_pair_load(const char *draft_file, tdm_backend **wbe, tdm_model **target, tdm_model **draft) {
    tdm_err err = {0};
    cr_assert_eq(tdm_backend_cpu_create(1, wbe, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_model_load(tdm_test_model_path("pycode-target-f16.gguf"), *wbe, target, &err), TANDEM_OK, "%s",
                 err.msg);
    cr_assert_eq(tdm_model_load(tdm_test_model_path(draft_file), *wbe, draft, &err), TANDEM_OK, "%s", err.msg);
}

void tdm_test_pair_free(tdm_backend *wbe, tdm_model *target, tdm_model *draft) {
    tdm_model_free(draft);
    tdm_model_free(target);
    tdm_backend_destroy(wbe);
}

void tdm_test_check_held(const tdm_engine *e, const tdm_seq *s) {
    const int32_t held = s->n_tokens - 1;
    cr_assert_eq(s->n_target, held);
    cr_assert_leq(s->n_draft, held);
    cr_assert_eq(s->kv.len, held, "block table holds %d positions, accepted length needs %d", (int)s->kv.len, (int)held);
    const int32_t used = tdm_kv_pool_n_blocks(e->pool) - tdm_kv_pool_n_free(e->pool);
    cr_assert_eq(used, tdm_kv_blocks_for(e->pool, held), "%d blocks in use for %d positions", (int)used, (int)held);
}

typedef struct checked_run {
    bool done;
    tandem_result res;
} checked_run;

static void checked_finish(tandem_request_id id, tandem_result *res, void *user) {
    (void)id;
    checked_run *c = user;
    c->res = *res;
    c->done = true;
}

int tdm_test_run_checked(tdm_engine *e, const int32_t *ids, size_t n, const tandem_generate_params *gp,
                         tandem_spec_stats *spec) {
    tdm_err err = {0};
    tdm_sched *s;
    cr_assert_eq(tdm_sched_create(e, NULL, &s, &err), TANDEM_OK, "%s", err.msg);
    checked_run c = {0};
    cr_assert_eq(tdm_sched_submit(s, ids, (int32_t)n, gp, 0, 0, checked_finish, &c, NULL, &err), TANDEM_OK, "%s",
                 err.msg);
    int steps = 0;
    while (!c.done) {
        cr_assert_eq(tdm_sched_step(s, NULL, &err), TANDEM_OK, "%s", err.msg);
        const tdm_req *r = tdm_sched_running_req(s, 0);
        if (!r || r->state != TDM_REQ_RUNNING) continue; /* (queued, prefilling or finished) */
        steps++;
        tdm_test_check_held(e, &r->s);
        cr_assert_eq(tdm_kv_pool_check(e->pool, &err), TANDEM_OK, "%s", err.msg);
    }
    cr_assert_eq(c.res.status, TANDEM_OK, "%s", c.res.error ? c.res.error : "");
    if (spec) *spec = c.res.spec;
    tandem_result_free(&c.res);
    tdm_sched_free(s);
    cr_assert_eq(tdm_kv_pool_n_free(e->pool), tdm_kv_pool_n_blocks(e->pool), "leak after release");
    return steps;
}
