/* fuzz_prompts.c - libFuzzer harness for the JSON-lines request reader of `tandem
 * generate --prompts` and `tandem run` (src/cli/prompts.c; not built by default).
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE -Iinclude -Isrc -Isrc/cli \
 *       tests/fuzz/fuzz_prompts.c src/cli/prompts.c src/cli/input.c src/base/json.c src/base/unicode.c \
 *       src/base/unicode_data.c src/base/common.c -lm -o fuzz_prompts
 *   ./fuzz_prompts -max_len=8192 corpus_prompts/ tests/data/
 *
 * The input (any bytes) is a prompt file, read leniently (as `tandem run` does: a bad
 * line becomes an item with an error) and strictly (as `tandem generate`).  Checks
 * (abort() on a violation, so the fuzzer reports it):
 *   - a read either succeeds with at least one item or fails with a non-empty message;
 *   - strict succeeds exactly when lenient succeeds with no error item, with as many
 *     items; lenient fails only when strict fails;
 *   - every error item names the file and line; every good item has a prompt, its
 *     stop strings are within tandem.h's limits (1..256 bytes, no NUL, at most 16)
 *     and its timeout in [0, 1e9] s;
 *   - an id's output text reads back to itself (what `tandem run` resumes and
 *     `tandem merge` compares by); applying an item to a request sets its fields. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NAME "fuzz.jsonl"

static bool read_as(const char *text, size_t size, bool lenient, cli_prompts *ps, char *err, size_t cap) {
    FILE *f = size ? fmemopen((void *)text, size, "r") : fopen("/dev/null", "r");
    if (!f) abort();
    err[0] = 0;
    bool ok = cli_prompts_read_stream(f, NAME, lenient, ps, err, cap);
    fclose(f);
    if (ok ? ps->n == 0 || !ps->items : err[0] == 0) abort();
    return ok;
}

/* The id's text as an output line holds it parses back to the same text. */
static void check_id(const cli_prompt *p) {
    char *t = cli_prompt_id_text(p);
    if (!t) abort();
    tdm_json *j = NULL;
    tdm_err jerr = {0};
    if (tdm_json_parse(t, strlen(t), &j, &jerr) != TANDEM_OK) abort();
    char *back = cli_json_id_text(j);
    if (!back || strcmp(back, t) != 0) abort();
    free(back);
    tdm_json_free(j);
    free(t);
}

static void check_item(const cli_prompt *p) {
    if (!p->text) abort();
    check_id(p);
    if (p->error) {
        if (strncmp(p->error, NAME ":", sizeof NAME) != 0) abort();
        return;
    }
    if (p->n_stop < 0 || p->n_stop > TANDEM_STOP_MAX || (!p->has_stop && p->n_stop)) abort();
    for (int i = 0; i < p->n_stop; i++) {
        size_t n = strlen(p->stop[i]);
        if (n == 0 || n > TANDEM_STOP_LEN_MAX) abort();
    }
    if (p->has_timeout && !(p->timeout_ms >= 0 && p->timeout_ms <= TDM_ARG_TIMEOUT_S_MAX * 1000.0)) abort();
    tandem_request rq;
    memset(&rq, 0, sizeof rq);
    cli_prompt_apply(p, &rq);
    if (rq.params.n_stop != p->n_stop || rq.priority != (p->has_priority ? p->priority : 0)) abort();
    if (p->has_max_tokens && rq.params.max_tokens != p->max_tokens) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* a private copy so ASan catches reads past the end of the input */
    char *text = malloc(size ? size : 1);
    if (!text) return 0;
    if (size) memcpy(text, data, size);
    char err[512];
    cli_prompts lenient = {0}, strict = {0};
    bool ok_l = read_as(text, size, true, &lenient, err, sizeof err);
    bool ok_s = read_as(text, size, false, &strict, err, sizeof err);
    size_t n_bad = 0;
    for (size_t i = 0; ok_l && i < lenient.n; i++) {
        check_item(&lenient.items[i]);
        n_bad += lenient.items[i].error != NULL;
    }
    for (size_t i = 0; ok_s && i < strict.n; i++)
        if (strict.items[i].error) abort();
    if (ok_s != (ok_l && n_bad == 0) || (ok_s && strict.n != lenient.n)) abort();
    cli_prompts_free(&lenient);
    cli_prompts_free(&strict);
    free(text);
    return 0;
}
