/* test_api_tokenizer.c - the stand-alone tokenizer handle of the public API: it
 * opens vocabulary-only GGUF files (no tensors) as well as whole models, encodes
 * exactly like the reference, and fails cleanly on bad input. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf_write.h"
#include "tandem.h"
#include "testutil.h"

static void check_vocab(const char *gguf, const char *cases) {
    tandem_tokenizer *tok;
    cr_assert_eq(tandem_tokenizer_open(tdm_test_data_path(gguf), &tok), TANDEM_OK, "%s: %s", gguf,
                 tandem_last_error());
    size_t n_cases;
    tdm_json **items = tdm_test_jsonl(tdm_test_data_path(cases), &n_cases);
    cr_assert_gt(n_cases, 0);
    for (size_t c = 0; c < n_cases; c++) {
        const tdm_json *text = tdm_json_get(items[c], "text");
        size_t n_want;
        int32_t *want = tdm_test_json_ids(tdm_json_get(items[c], "ids"), &n_want);
        int32_t *ids;
        size_t n;
        cr_assert_eq(tandem_tokenizer_encode(tok, text->str, text->str_len, false, &ids, &n), TANDEM_OK);
        cr_assert(n == n_want && (n == 0 || memcmp(ids, want, n * sizeof *ids) == 0),
                  "%s case %zu: ids differ from the reference (%zu vs %zu ids)", gguf, c, n, n_want);
        tandem_free(ids);
        free(want);
    }
    tdm_test_jsonl_free(items, n_cases);
    tandem_tokenizer_close(tok);
}

Test(api_tokenizer, vocabulary_only_files_encode_like_the_reference) {
    check_vocab("vocab/ggml-vocab-gpt-2.gguf", "vocab/gpt-2.jsonl");
    check_vocab("vocab/ggml-vocab-llama-spm.gguf", "vocab/llama-spm.jsonl");
    check_vocab("vocab/ggml-vocab-phi-3.gguf", "vocab/phi-3.jsonl");
    check_vocab("vocab/ggml-vocab-starcoder.gguf", "vocab/starcoder.jsonl");
}

Test(api_tokenizer, model_file_round_trip_and_bos) {
    tandem_tokenizer *tok;
    cr_assert_eq(tandem_tokenizer_open(tdm_test_model_path("pycode-target-f16.gguf"), &tok), TANDEM_OK, "%s",
                 tandem_last_error());
    const char *text = "def add(a, b):\n    return a + b  # \xc3\xa9t\xc3\xa9 \xf0\x9f\x98\x80\n";
    int32_t *ids;
    size_t n;
    cr_assert_eq(tandem_tokenizer_encode(tok, text, strlen(text), true, &ids, &n), TANDEM_OK);
    cr_assert_gt(n, 1);
    cr_assert_eq(ids[0], 0, "BOS (token 0) first, as add_bos_token asks");
    char *back;
    cr_assert_eq(tandem_tokenizer_decode(tok, ids + 1, n - 1, &back), TANDEM_OK);
    cr_assert_str_eq(back, text);
    tandem_free(back);
    int32_t bad = 1 << 20;
    cr_assert_eq(tandem_tokenizer_decode(tok, &bad, 1, &back), TANDEM_ERR_INVALID_ARG);
    tandem_free(ids);
    tandem_tokenizer_close(tok);
}

Test(api_tokenizer, bad_input_is_a_clear_error) {
    tandem_tokenizer_close(NULL); /* no-op */
    tandem_tokenizer *tok = (tandem_tokenizer *)1;
    cr_assert_eq(tandem_tokenizer_open("/nonexistent/vocab.gguf", &tok), TANDEM_ERR_IO);
    cr_assert_null(tok);
    cr_assert(strstr(tandem_last_error(), "/nonexistent/vocab.gguf"), "%s", tandem_last_error());
    cr_assert_eq(tandem_tokenizer_open(NULL, &tok), TANDEM_ERR_INVALID_ARG);
    cr_assert_eq(tandem_tokenizer_open("x", NULL), TANDEM_ERR_INVALID_ARG);
    cr_assert_eq(tandem_tokenizer_encode(NULL, "a", 1, false, NULL, NULL), TANDEM_ERR_INVALID_ARG);

    /* a valid GGUF without tokenizer metadata */
    tdm_gguf_writer *w = tdm_gguf_writer_new(3, 32);
    tdm_gguf_w_str(w, "general.architecture", "llama");
    uint8_t *buf;
    size_t len;
    cr_assert_eq(tdm_gguf_writer_finish(w, &buf, &len), TANDEM_OK);
    tdm_gguf_writer_free(w);
    char path[] = "/tmp/tandem-notok-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, buf, len), (ssize_t)len);
    close(fd);
    free(buf);
    tandem_status st = tandem_tokenizer_open(path, &tok);
    unlink(path);
    cr_assert_eq(st, TANDEM_ERR_FORMAT, "%s", tandem_status_str(st));
    cr_assert(strstr(tandem_last_error(), "tokenizer"), "message should name the missing tokenizer data: %s",
              tandem_last_error());
}
