/* real_testutil.c - see real_testutil.h. */
#include "real_testutil.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

const char *real_str(const tdm_json *line, const char *key) {
    const tdm_json *v = tdm_json_get(line, key);
    cr_assert(v && v->type == TDM_JSON_STRING, "reference line without \"%s\"", key);
    return v->str;
}

bool real_is_kind(const tdm_json *line, const char *kind) { return strcmp(real_str(line, "kind"), kind) == 0; }

void real_expect_ids(const int32_t *got, size_t n_got, const int32_t *want, size_t n_want, const char *who,
                     const char *text) {
    size_t i = 0;
    while (i < n_got && i < n_want && got[i] == want[i]) i++;
    cr_expect(i == n_got && i == n_want,
              "%s \"%s\": tokens differ from llama.cpp's at %zu (%zu / %zu tokens): %d vs %d", who, text, i, n_got,
              n_want, i < n_got ? got[i] : -1, i < n_want ? want[i] : -1);
}

size_t real_cases_load(tdm_json *const *ref, size_t n_ref, real_case *c, size_t cap) {
    size_t n = 0;
    for (size_t li = 0; li < n_ref; li++) {
        const tdm_json *l = ref[li];
        if (!real_is_kind(l, "plain") && !real_is_kind(l, "chat")) continue;
        cr_assert_lt(n, cap, "more than %zu generation lines", cap);
        c[n].kind = real_str(l, "kind");
        c[n].prompt = tdm_test_json_ids(tdm_json_get(l, "prompt_ids"), &c[n].n_prompt);
        c[n].ref = tdm_test_json_ids(tdm_json_get(l, "tokens"), &c[n].n_ref);
        const tdm_json *m = tdm_json_get(l, "margins");
        cr_assert(m && m->type == TDM_JSON_ARRAY && m->n == c[n].n_ref);
        c[n].margin = calloc(m->n + 1, sizeof(double));
        for (size_t i = 0; i < m->n; i++) c[n].margin[i] = m->items[i].num;
        n++;
    }
    return n;
}

void real_cases_free(real_case *c, size_t n) {
    for (size_t i = 0; i < n; i++) free(c[i].prompt), free(c[i].ref), free(c[i].margin);
}

tandem_request real_case_request(const real_case *c) {
    tandem_request rq = tandem_request_default();
    rq.prompt_ids = c->prompt;
    rq.n_prompt_ids = c->n_prompt;
    rq.params.max_tokens = (int)c->n_ref;
    return rq;
}

bool real_case_follows(const real_case *c, size_t i, const tandem_result *r, double near_tie) {
    size_t d = 0;
    while (d < r->n_tokens && d < c->n_ref && r->tokens[d] == c->ref[d]) d++;
    if (d == c->n_ref && d == r->n_tokens) return true;
    /* a departure: where the reference had a near tie (both generate n_ref tokens at
     * most, so a departure is inside the reference) */
    cr_assert(d < c->n_ref, "%s case %zu: %zu tokens past the reference's %zu", c->kind, i, r->n_tokens, c->n_ref);
    cr_expect_lt(c->margin[d], near_tie,
                 "%s case %zu: departs from the float32 reference at token %zu (%d vs %d) where its top-two "
                 "margin is %.3f",
                 c->kind, i, d, d < r->n_tokens ? r->tokens[d] : -1, c->ref[d], c->margin[d]);
    cr_log_info("%s case %zu departs at token %zu of %zu (reference margin %.3f)", c->kind, i, d, c->n_ref,
                c->margin[d]);
    return false;
}
