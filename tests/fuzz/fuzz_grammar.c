/* fuzz_grammar.c - libFuzzer harness for the GBNF grammar compiler and the matcher
 * (built by scripts/fuzz.sh).
 *
 * The input is grammar text.  It must either compile or fail with TANDEM_ERR_FORMAT
 * (or _NOMEM) and a message, never crash or hang.  A grammar that compiles is then
 * run: the input's own bytes fed to a matcher a few at a time, with a mask over a
 * small vocabulary (every byte, some multi-byte pieces, an end token) at each step,
 * each allowed token checked by accepting it, and random rollbacks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static tdm_gvocab *vocab;

static void make_vocab(void) {
    static char bytes[256];
    static const char *extra[] = {"\xC3\xA9", "\xF0\x9F\x98\x80", "\xE2\x82", "ab", "\"}", "{\"", "  ", "\n"};
    const char *b[256 + 9];
    size_t l[256 + 9];
    for (int k = 0; k < 256; k++) bytes[k] = (char)k, b[k] = bytes + k, l[k] = 1;
    for (int k = 0; k < 8; k++) b[256 + k] = extra[k], l[256 + k] = strlen(extra[k]);
    b[264] = "", l[264] = 0;
    int32_t eog = 264;
    if (tdm_gvocab_create_raw(265, b, l, &eog, 1, &vocab, NULL) != TANDEM_OK) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!vocab) make_vocab();
    char *text = malloc(size ? size : 1);
    if (!text) return 0;
    if (size) memcpy(text, data, size);
    tdm_grammar *g = NULL;
    tdm_err err = {0};
    tandem_status st = tdm_grammar_parse(text, size, &g, &err);
    if (st != TANDEM_OK) {
        if (g || err.msg[0] == 0 || (st != TANDEM_ERR_FORMAT && st != TANDEM_ERR_NOMEM)) abort();
        free(text);
        return 0;
    }
    if (!g) abort();
    tdm_gmatch *m = NULL;
    if (tdm_gmatch_create(g, &m, &err) == TANDEM_OK) {
        uint32_t mask[(265 + 31) / 32];
        uint32_t seed = (uint32_t)size * 2654435761u;
        for (size_t i = 0; i < size && i < 64; i++) {
            int32_t n_allowed;
            if (tdm_gmatch_mask(m, vocab, mask, &n_allowed, &err) != TANDEM_OK) break;
            /* an allowed token is accepted, a refused byte refused */
            int32_t id = (uint8_t)text[i];
            bool allowed = mask[id / 32] >> (id % 32) & 1;
            uint32_t mark = tdm_gmatch_mark(m);
            st = tdm_gmatch_accept_token(m, vocab, id, &err);
            if (allowed != (st == TANDEM_OK) && st != TANDEM_ERR_UNSUPPORTED && st != TANDEM_ERR_NOMEM) abort();
            if (st == TANDEM_OK && tdm_gmatch_mark(m) != mark + 1) abort();
            seed = seed * 1103515245u + 12345u;
            if ((seed >> 16) % 7 == 0 && tdm_gmatch_rollback(m, (seed >> 8) % (tdm_gmatch_mark(m) + 1), NULL) != TANDEM_OK)
                abort();
            if ((seed >> 16) % 13 == 0 && tdm_gmatch_commit(m, NULL) == TANDEM_OK && tdm_gmatch_mark(m) != 0) abort();
        }
        bool ok;
        if (tdm_grammar_matches(g, text, size, &ok, &err) != TANDEM_OK && err.msg[0] == 0) abort();
        tdm_gmatch_free(m);
    }
    tdm_grammar_free(g);
    free(text);
    return 0;
}
