/* test_api.c - the public C API (include/tandem.h) as a user sees it, up to generation: handles,
 * defaults, status strings, per-thread errors, every way tandem_model_open / tandem_engine_open can
 * fail (including a KV budget below one block), model info and tokenization.  Generation is tested
 * in test_api_generate.c. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api_testutil.h"
#include "tandem.h"
#include "testutil.h"
#include "tiny_model.h"

/* ------------------------------------------------------------ helpers */

/* Writes bytes to a new temp file; returns its malloc'ed path. */
static char *write_temp(const void *data, size_t n) {
    char *path = strdup("/tmp/tandem-api-XXXXXX");
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    if (n) cr_assert_eq(write(fd, data, n), (ssize_t)n);
    close(fd);
    return path;
}

/* Opens a file that must fail with want; the message must be non-empty and, when
 * needle is given, contain it.  Returns nothing: *out must stay NULL. */
static void expect_open_fails(const char *path, tandem_status want, const char *needle, const char *what) {
    tandem_model *m = (tandem_model *)0x1;
    tandem_status st = tandem_model_open(path, NULL, &m);
    cr_assert_eq(st, want, "%s: got status %d (%s: %s), want %d (%s)", what, (int)st, tandem_status_str(st),
                 tandem_last_error(), (int)want, tandem_status_str(want));
    cr_assert_null(m, "%s: *out not NULL after a failure", what);
    cr_assert(tandem_last_error()[0], "%s: empty error message", what);
    if (needle)
        cr_assert(strstr(tandem_last_error(), needle), "%s: message '%s' does not name '%s'", what,
                  tandem_last_error(), needle);
}

/* Opens a tiny model file built from cfg and expects a failure. */
static void expect_tiny_fails(const tdm_tiny_cfg *cfg, tandem_status want, const char *needle, const char *what) {
    char *path = tdm_tiny_model_file(cfg);
    expect_open_fails(path, want, needle, what);
    unlink(path);
    free(path);
}

/* ------------------------------------------------------------ handles, defaults, strings */

Test(api, null_handles_are_noops) {
    tandem_model_close(NULL);
    tandem_engine_close(NULL);
    tandem_free(NULL);
    tandem_result r;
    memset(&r, 0, sizeof r);
    tandem_result_free(&r);
    tandem_result_free(&r); /* twice: still fine */
    tandem_result_free(NULL);
    cr_assert_null(r.tokens);
    cr_assert_null(r.text);
}

Test(api, default_params_match_documentation) {
    tandem_model_params mp = tandem_model_default_params();
    cr_assert_eq(mp.backend, TANDEM_BACKEND_CPU);
    cr_assert_eq(mp.cuda_device, 0);

    tandem_engine_params ep = tandem_engine_default_params();
    cr_assert_eq(ep.n_threads, 0);
    cr_assert_eq(ep.kv_bytes, 0);
    cr_assert_eq(ep.n_ctx, 0);
    cr_assert_eq(ep.n_seq_max, 1);
    cr_assert_eq(ep.kv_block_size, 16);

    tandem_generate_params gp = tandem_generate_default_params();
    cr_assert_eq(gp.max_tokens, 128);
    cr_assert_eq(gp.temperature, 0.0f);
    cr_assert_eq(gp.top_k, 0);
    cr_assert_eq(gp.top_p, 1.0f);
    cr_assert_eq(gp.min_p, 0.0f);
    cr_assert_eq(gp.seed, 0);
    cr_assert_eq(gp.spec_k, 0);
    cr_assert_eq(gp.spec_k_min, 1);
    cr_assert_eq(gp.spec_k_max, 12);
    cr_assert_eq(gp.spec_p_min, 0.0f);
    cr_assert_eq(gp.spec_ngram, 4);
    cr_assert_null(gp.on_token);
    cr_assert_null(gp.user_data);
}

Test(api, status_strings_are_distinct) {
    const tandem_status all[] = {
        TANDEM_OK, TANDEM_ERR_INVALID_ARG, TANDEM_ERR_IO, TANDEM_ERR_FORMAT, TANDEM_ERR_UNSUPPORTED,
        TANDEM_ERR_NOMEM, TANDEM_ERR_MISMATCH, TANDEM_ERR_KV_FULL, TANDEM_ERR_BACKEND, TANDEM_ERR_CANCELLED,
        TANDEM_ERR_INTERNAL,
    };
    size_t n = sizeof all / sizeof all[0];
    cr_assert_eq((int)TANDEM_ERR_INTERNAL + 1, (int)n, "a status is missing from this test");
    for (size_t i = 0; i < n; i++) {
        const char *s = tandem_status_str(all[i]);
        cr_assert(s && s[0], "status %d has an empty string", (int)all[i]);
        for (size_t j = 0; j < i; j++)
            cr_assert(strcmp(s, tandem_status_str(all[j])) != 0, "statuses %d and %d share the string '%s'",
                      (int)all[i], (int)all[j], s);
    }
    cr_assert_str_eq(tandem_status_str(TANDEM_OK), "ok");
    /* an out-of-range value still gives a string */
    const char *u = tandem_status_str((tandem_status)12345);
    cr_assert(u && u[0]);

    cr_assert_str_eq(tandem_finish_reason_str(TANDEM_FINISH_EOS), "eos");
    cr_assert_str_eq(tandem_finish_reason_str(TANDEM_FINISH_LENGTH), "length");
    cr_assert_str_eq(tandem_finish_reason_str(TANDEM_FINISH_CANCELLED), "cancelled");
    const char *none = tandem_finish_reason_str(TANDEM_FINISH_NONE);
    cr_assert(none && none[0]);
    cr_assert(strcmp(none, "eos") && strcmp(none, "length") && strcmp(none, "cancelled"));
    cr_assert_str_eq(TANDEM_VERSION, "0.1.0");
}

/* tandem_last_error is per thread: a failure on another thread does not change it. */
static void *fail_on_thread(void *arg) {
    (void)arg;
    tandem_model *m;
    tandem_status st = tandem_model_open("/tmp/tandem-api-no-such-dir/other-thread.gguf", NULL, &m);
    return strstr(tandem_last_error(), "other-thread") && st == TANDEM_ERR_IO ? (void *)1 : NULL;
}

Test(api, last_error_is_per_thread) {
    tandem_model *m;
    cr_assert_eq(tandem_model_open("/tmp/tandem-api-no-such-dir/main-thread.gguf", NULL, &m), TANDEM_ERR_IO);
    cr_assert(strstr(tandem_last_error(), "main-thread"), "%s", tandem_last_error());
    pthread_t th;
    void *ok = NULL;
    cr_assert_eq(pthread_create(&th, NULL, fail_on_thread, NULL), 0);
    cr_assert_eq(pthread_join(th, &ok), 0);
    cr_assert(ok, "the other thread did not see its own message");
    cr_assert(strstr(tandem_last_error(), "main-thread"), "changed by another thread: %s", tandem_last_error());
}

/* ------------------------------------------------------------ tandem_model_open failures */

Test(api, open_missing_file_is_io_error_naming_the_path) {
    const char *path = "/tmp/tandem-api-no-such-dir/missing-model.gguf";
    expect_open_fails(path, TANDEM_ERR_IO, path, "missing file");
    /* a directory is not a model either */
    expect_open_fails("/tmp", TANDEM_ERR_IO, "/tmp", "directory");
}

Test(api, open_corrupt_file_is_format_error) {
    const char text[] = "this is not a GGUF file, only some text that is long enough to be parsed";
    char *p = write_temp(text, sizeof text - 1);
    expect_open_fails(p, TANDEM_ERR_FORMAT, NULL, "text file");
    unlink(p);
    free(p);
    /* GGUF magic and version 3, then an absurd tensor count */
    uint8_t hdr[64];
    memset(hdr, 0xA5, sizeof hdr);
    memcpy(hdr, "GGUF", 4);
    uint32_t ver = 3;
    uint64_t n_tensors = 0x0000FFFFFFFFFFFFull, n_kv = 1;
    memcpy(hdr + 4, &ver, 4);
    memcpy(hdr + 8, &n_tensors, 8);
    memcpy(hdr + 16, &n_kv, 8);
    p = write_temp(hdr, sizeof hdr);
    expect_open_fails(p, TANDEM_ERR_FORMAT, NULL, "absurd tensor count");
    unlink(p);
    free(p);
}

Test(api, open_truncated_model_is_format_error, .timeout = 120) {
    char *data;
    size_t len;
    tdm_err err = {0};
    cr_assert_eq(tdm_read_file(tdm_test_model_path(TARGET), &data, &len, &err), TANDEM_OK, "%s", err.msg);
    size_t cuts[] = {1, 4, 8, 16, 23, 24, 100, 1000, 4096, 100000, 300000, len / 2, len - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        char *p = write_temp(data, cuts[i]);
        char what[64];
        snprintf(what, sizeof what, "first %zu of %zu bytes", cuts[i], len);
        expect_open_fails(p, TANDEM_ERR_FORMAT, NULL, what);
        unlink(p);
        free(p);
    }
    /* an empty file cannot be a model: any error but OK, with a message */
    char *p = write_temp(data, 0);
    tandem_model *m = NULL;
    tandem_status st = tandem_model_open(p, NULL, &m);
    cr_assert(st == TANDEM_ERR_FORMAT || st == TANDEM_ERR_IO, "empty file: status %d (%s)", (int)st,
              tandem_last_error());
    cr_assert_null(m);
    unlink(p);
    free(p);
    free(data);
}

Test(api, open_unsupported_architecture) {
    tdm_tiny_cfg c = tdm_tiny_default();
    c.arch = "gpt2";
    expect_tiny_fails(&c, TANDEM_ERR_UNSUPPORTED, "gpt2", "architecture gpt2");
    c.arch = "llama";
    /* control: the same model as llama opens */
    char *path = tdm_tiny_model_file(&c);
    tandem_model *m = NULL;
    cr_assert_eq(tandem_model_open(path, NULL, &m), TANDEM_OK, "%s", tandem_last_error());
    tandem_model_close(m);
    unlink(path);
    free(path);
}

Test(api, open_model_missing_a_tensor) {
    const char *names[] = {"blk.1.ffn_up.weight", "token_embd.weight", "output_norm.weight", "blk.0.attn_k.weight",
                           "blk.1.attn_norm.weight"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        tdm_tiny_cfg c = tdm_tiny_default();
        c.skip_tensor = names[i];
        expect_tiny_fails(&c, TANDEM_ERR_FORMAT, names[i], names[i]);
    }
    tdm_tiny_cfg q = tdm_tiny_default();
    q.arch = "qwen2";
    q.skip_tensor = "blk.1.attn_v.bias";
    expect_tiny_fails(&q, TANDEM_ERR_FORMAT, "blk.1.attn_v.bias", "qwen2 without a bias");
}

Test(api, open_tensor_with_wrong_shape) {
    const char *names[] = {"blk.0.attn_k.weight", "blk.1.ffn_down.weight", "token_embd.weight",
                           "blk.0.ffn_norm.weight", "output.weight"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        tdm_tiny_cfg c = tdm_tiny_default();
        c.bad_shape_tensor = names[i];
        c.untied_output = true;
        expect_tiny_fails(&c, TANDEM_ERR_FORMAT, names[i], names[i]);
    }
}

Test(api, open_null_arguments_and_cuda) {
    tandem_model *m = NULL;
    cr_assert_eq(tandem_model_open(NULL, NULL, &m), TANDEM_ERR_INVALID_ARG);
    cr_assert_null(m);
    cr_assert(tandem_last_error()[0]);
    cr_assert_eq(tandem_model_open(tdm_test_model_path(TARGET), NULL, NULL), TANDEM_ERR_INVALID_ARG);

    tandem_model_params p = tandem_model_default_params();
    p.backend = TANDEM_BACKEND_CUDA;
    m = (tandem_model *)0x1;
    cr_assert_eq(tandem_model_open(tdm_test_model_path(TARGET), &p, &m), TANDEM_ERR_BACKEND, "%s",
                 tandem_last_error());
    cr_assert_null(m);
    cr_assert(strstr(tandem_last_error(), "CUDA"), "%s", tandem_last_error());
    p.backend = (tandem_backend_kind)7;
    cr_assert_eq(tandem_model_open(tdm_test_model_path(TARGET), &p, &m), TANDEM_ERR_INVALID_ARG);
    cr_assert_null(m);

    /* NULL params = defaults */
    cr_assert_eq(tandem_model_open(tdm_test_model_path(TARGET), NULL, &m), TANDEM_OK, "%s", tandem_last_error());
    tandem_model_info info;
    cr_assert_eq(tandem_model_get_info(NULL, &info), TANDEM_ERR_INVALID_ARG);
    cr_assert_eq(tandem_model_get_info(m, NULL), TANDEM_ERR_INVALID_ARG);
    tandem_model_close(m);
}

/* The load's progress hook: 0 first, rising, 1 last; false at any call cancels with
 * TANDEM_ERR_CANCELLED and frees everything (the sanitizer build checks the leaks). */
typedef struct progress_log {
    float seen[1024];
    int n, stop_at; /* stop_at: the call that answers false (-1: none) */
} progress_log;

static bool on_progress(float progress, void *user) {
    progress_log *l = user;
    if (l->n < 1024) l->seen[l->n] = progress;
    return l->n++ != l->stop_at;
}

Test(api, open_progress_callback_reports_and_cancels) {
    cr_assert_null(tandem_model_default_params().progress_callback);
    cr_assert_null(tandem_model_default_params().progress_callback_user_data);
    progress_log all = {.stop_at = -1};
    tandem_model_params p = tandem_model_default_params();
    p.progress_callback = on_progress;
    p.progress_callback_user_data = &all;
    tandem_model *m = NULL;
    cr_assert_eq(tandem_model_open(tdm_test_model_path(TARGET), &p, &m), TANDEM_OK, "%s", tandem_last_error());
    tandem_model_close(m);
    cr_assert_gt(all.n, 10, "one call per tensor: %d calls", all.n);
    cr_assert_eq(all.seen[0], 0.0f);
    cr_assert_eq(all.seen[all.n - 1], 1.0f);
    for (int i = 1; i < all.n; i++)
        cr_assert(all.seen[i] >= all.seen[i - 1] && all.seen[i] <= 1.0f, "call %d: %g after %g", i, all.seen[i],
                  all.seen[i - 1]);
    const int stops[] = {0, 1, all.n / 2, all.n - 1};
    for (size_t k = 0; k < sizeof stops / sizeof *stops; k++) {
        progress_log cut = {.stop_at = stops[k]};
        p.progress_callback_user_data = &cut;
        m = (tandem_model *)0x1;
        cr_assert_eq(tandem_model_open(tdm_test_model_path(TARGET), &p, &m), TANDEM_ERR_CANCELLED,
                     "stop at call %d: %s", stops[k], tandem_last_error());
        cr_assert_null(m);
        cr_assert_eq(cut.n, stops[k] + 1, "no call after the one that said stop (%d calls)", cut.n);
        cr_assert(strstr(tandem_last_error(), "cancelled by its progress callback"), "%s", tandem_last_error());
    }
}

/* ------------------------------------------------------------ tandem_engine_open */

static tandem_model *open_tiny(const tdm_tiny_cfg *c) {
    char *path = tdm_tiny_model_file(c);
    tandem_model *m = NULL;
    cr_assert_eq(tandem_model_open(path, NULL, &m), TANDEM_OK, "%s", tandem_last_error());
    unlink(path); /* the file stays mapped */
    free(path);
    return m;
}

static void expect_mismatch(tandem_model *t, tandem_model *d, const char *what) {
    tandem_engine *e = (tandem_engine *)0x1;
    tandem_engine_params p = tandem_engine_default_params();
    p.n_threads = 1;
    tandem_status st = tandem_engine_open(t, d, &p, &e);
    cr_assert_eq(st, TANDEM_ERR_MISMATCH, "%s: status %d (%s)", what, (int)st, tandem_last_error());
    cr_assert_null(e, "%s", what);
    cr_assert(tandem_last_error()[0], "%s: no message", what);
}

Test(api, engine_open_rejects_different_vocabularies) {
    tdm_tiny_cfg tc = tdm_tiny_default();
    tandem_model *t = open_tiny(&tc);

    tdm_tiny_cfg dc = tdm_tiny_default();
    dc.seed = 9;
    dc.n_layer = 1;
    dc.n_embd = 32;
    tandem_model *same = open_tiny(&dc); /* control: same vocabulary, other weights */
    tandem_engine *e = api_open_engine(t, same, NULL);
    tandem_engine_close(e);

    dc.n_vocab = 20;
    tandem_model *bigger = open_tiny(&dc);
    expect_mismatch(t, bigger, "vocab 16 vs 20");
    cr_assert(strstr(tandem_last_error(), "16") && strstr(tandem_last_error(), "20"), "%s", tandem_last_error());

    dc.n_vocab = 16;
    dc.tok_offset = 1;
    tandem_model *shifted = open_tiny(&dc);
    expect_mismatch(t, shifted, "same size, other token strings");
    cr_assert(strstr(tandem_last_error(), "token 0"), "%s", tandem_last_error());

    dc.tok_offset = 0;
    dc.eos = 3;
    tandem_model *other_eos = open_tiny(&dc);
    expect_mismatch(t, other_eos, "EOS differs");

    tandem_model *real = api_open_model(TARGET);
    expect_mismatch(real, same, "pycode target with a tiny draft");
    expect_mismatch(same, real, "tiny target with the pycode model as draft");

    e = (tandem_engine *)0x1;
    cr_assert_eq(tandem_engine_open(NULL, same, NULL, &e), TANDEM_ERR_INVALID_ARG);
    cr_assert_null(e);
    cr_assert(tandem_last_error()[0]);
    cr_assert_eq(tandem_engine_open(t, NULL, NULL, NULL), TANDEM_ERR_INVALID_ARG);
    tandem_engine_params bad = tandem_engine_default_params();
    bad.n_threads = -1;
    cr_assert_eq(tandem_engine_open(t, NULL, &bad, &e), TANDEM_ERR_INVALID_ARG);
    cr_assert_null(e);
    bad.n_threads = TANDEM_THREADS_MAX + 1; /* the CLI's --threads range ends at the same limit */
    cr_assert_eq(tandem_engine_open(t, NULL, &bad, &e), TANDEM_ERR_INVALID_ARG);
    cr_assert(strstr(tandem_last_error(), "n_threads") && strstr(tandem_last_error(), "1024"), "%s",
              tandem_last_error());

    tandem_model_close(real);
    tandem_model_close(other_eos);
    tandem_model_close(shifted);
    tandem_model_close(bigger);
    tandem_model_close(same);
    tandem_model_close(t);
}

/* A KV budget that does not hold one block cannot open an engine. */
Test(api, kv_budget_below_one_block_is_rejected) {
    tandem_model *t = api_open_model(TARGET);
    tandem_engine_params ep = tandem_engine_default_params();
    ep.n_threads = 1;
    ep.kv_bytes = 100;
    tandem_engine *e = (tandem_engine *)0x1;
    tandem_status st = tandem_engine_open(t, NULL, &ep, &e);
    cr_assert_neq(st, TANDEM_OK);
    cr_assert_null(e);
    cr_assert(tandem_last_error()[0]);
    tandem_model_close(t);
}

/* ------------------------------------------------------------ tokenizer and info */

Test(api, model_info_of_the_target) {
    tandem_model *m = api_open_model(TARGET);
    tandem_model_info info;
    cr_assert_eq(tandem_model_get_info(m, &info), TANDEM_OK);
    cr_assert_str_eq(info.arch, "llama");
    cr_assert_str_eq(info.name, "pycode-target");
    cr_assert_eq(info.n_layer, 8);
    cr_assert_eq(info.n_vocab, 8192);
    cr_assert_eq(info.n_embd, 384);
    cr_assert_eq(info.n_head, 6);
    cr_assert_eq(info.n_head_kv, 2);
    cr_assert_eq(info.n_ff, 1024);
    cr_assert_eq(info.n_ctx_train, 1024);
    cr_assert_eq(info.bos, 0);
    cr_assert_eq(info.eos, 0);
    /* 15.74 M parameters (README), f16 matrices */
    cr_assert(info.n_params > 15700000 && info.n_params < 15800000, "n_params %llu",
              (unsigned long long)info.n_params);
    cr_assert(info.weight_bytes > 2 * 15000000ull && info.weight_bytes < 2 * 16500000ull, "weight_bytes %llu",
              (unsigned long long)info.weight_bytes);
    tandem_model_close(m);
}

Test(api, tokenize_detokenize_round_trip) {
    tandem_model *m = api_open_model(TARGET);
    const char *texts[] = {
        "def foo(x):\n    return x + 1\n",
        "import numpy as np\n\nclass A(object):\n\tpass  # comment with ünïcödé and 漢字\n",
        " leading space and trailing spaces   ",
        "x",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        const char *s = texts[i];
        int32_t *ids = NULL;
        size_t n = 0;
        cr_assert_eq(tandem_tokenize(m, s, strlen(s), false, &ids, &n), TANDEM_OK, "%s", tandem_last_error());
        cr_assert(n > 0 && n <= strlen(s));
        for (size_t k = 0; k < n; k++) cr_assert(ids[k] > 0 && ids[k] < 8192);
        char *back = NULL;
        cr_assert_eq(tandem_detokenize(m, ids, n, &back), TANDEM_OK, "%s", tandem_last_error());
        cr_assert_str_eq(back, s);
        tandem_free(back);

        int32_t *ids2 = NULL;
        size_t n2 = 0;
        cr_assert_eq(tandem_tokenize(m, s, strlen(s), true, &ids2, &n2), TANDEM_OK);
        cr_assert_eq(n2, n + 1, "add_bos: %zu tokens, want %zu", n2, n + 1);
        cr_assert_eq(ids2[0], 0);
        cr_assert_eq(memcmp(ids2 + 1, ids, n * sizeof(int32_t)), 0);
        tandem_free(ids2);
        tandem_free(ids);
    }
    /* the special token's text becomes the token */
    int32_t *ids = NULL;
    size_t n = 0;
    const char *sp = "a<|endoftext|>b";
    cr_assert_eq(tandem_tokenize(m, sp, strlen(sp), false, &ids, &n), TANDEM_OK);
    bool has0 = false;
    for (size_t k = 0; k < n; k++) has0 |= ids[k] == 0;
    cr_assert(has0, "'<|endoftext|>' did not become token 0");
    tandem_free(ids);
    /* empty text */
    cr_assert_eq(tandem_tokenize(m, "", 0, false, &ids, &n), TANDEM_OK);
    cr_assert_eq(n, 0);
    tandem_free(ids);
    /* bad arguments */
    cr_assert_eq(tandem_tokenize(NULL, "a", 1, false, &ids, &n), TANDEM_ERR_INVALID_ARG);
    cr_assert_eq(tandem_tokenize(m, NULL, 3, false, &ids, &n), TANDEM_ERR_INVALID_ARG);
    char *text = NULL;
    int32_t bad[] = {5, 8192};
    cr_assert_eq(tandem_detokenize(m, bad, 2, &text), TANDEM_ERR_INVALID_ARG);
    cr_assert_null(text);
    int32_t neg[] = {-1};
    cr_assert_eq(tandem_detokenize(m, neg, 1, &text), TANDEM_ERR_INVALID_ARG);
    cr_assert_eq(tandem_detokenize(m, NULL, 0, &text), TANDEM_OK);
    cr_assert_str_eq(text, "");
    tandem_free(text);
    tandem_model_close(m);
}
