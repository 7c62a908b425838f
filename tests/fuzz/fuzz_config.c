/* fuzz_config.c - libFuzzer harness for the job file parser of `tandem run`
 * (src/cli/job_config.c; not built by default).
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE -Iinclude -Isrc -Isrc/cli \
 *       tests/fuzz/fuzz_config.c src/cli/job_config.c src/cli/prompts.c src/cli/input.c src/base/json.c \
 *       src/base/unicode.c src/base/unicode_data.c src/base/common.c $(pkg-config --cflags --libs inih) -lm \
 *       -o fuzz_config
 *   TDM_REPO=/path/to/repo ./fuzz_config -max_len=4096 corpus_config/ configs/
 *
 * The input (any bytes) is the text of an INI file read as $TDM_REPO/configs/fuzz.ini
 * (else ./configs/fuzz.ini), so that the relative paths of the shipped configs name
 * files that exist and a good config parses through to the end.  Every input must
 * either parse (then the required keys are set and the stop strings are within
 * tandem.h's limits) or fail with a non-empty message naming the file; never crash
 * or leak. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char cfg_path[4096];
static tandem_generate_params defaults; /* as tandem_generate_default_params (not linked) */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *repo = getenv("TDM_REPO");
    snprintf(cfg_path, sizeof cfg_path, "%s/configs/fuzz.ini", repo && repo[0] ? repo : ".");
    defaults = (tandem_generate_params){.max_tokens = 128, .top_p = 1.0f, .spec_k_min = 1, .spec_k_max = 12,
                                        .spec_ngram = 4};
    return 0;
}

static void check_ok(const cli_job_cfg *c) {
    if (c->err[0] || !c->target[0] || !c->input[0] || !c->output[0]) abort();
    if (c->n_stop < 0 || c->n_stop > TANDEM_STOP_MAX || c->gp.n_stop != c->n_stop) abort();
    if (c->n_stop > 0 && (const void *)c->gp.stop != (const void *)c->stop) abort();
    for (int i = 0; i < c->n_stop; i++) {
        size_t n = strlen(c->stop[i]);
        if (n == 0 || n > TANDEM_STOP_LEN_MAX) abort();
    }
    if (!(c->timeout_ms >= 0 && c->timeout_ms <= TDM_ARG_TIMEOUT_S_MAX * 1000.0)) abort();
    if (c->max_batch < 1 || c->max_batch > CLI_BATCH_MAX || c->threads < 0 || c->threads > TANDEM_THREADS_MAX) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* a private copy so ASan catches reads past the end of the input */
    char *text = malloc(size ? size : 1);
    if (!text) return 0;
    if (size) memcpy(text, data, size);
    FILE *f = size ? fmemopen(text, size, "r") : fopen("/dev/null", "r");
    if (!f) {
        free(text);
        return 0;
    }
    cli_job_cfg *c = malloc(sizeof *c);
    if (!c) abort();
    if (cli_job_cfg_read(f, cfg_path, &defaults, NULL, 0, c)) check_ok(c);
    else if (!c->err[0] || !strstr(c->err, "fuzz.ini")) abort(); /* a contract violation */
    cli_job_cfg_free(c);
    free(c);
    fclose(f);
    free(text);
    return 0;
}
