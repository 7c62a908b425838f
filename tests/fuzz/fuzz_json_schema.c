/* fuzz_json_schema.c - libFuzzer harness for the JSON schema -> grammar compiler
 * (built by scripts/fuzz.sh).
 *
 * The input is a schema.  It must either become GBNF text that compiles (or fails
 * only on a grammar limit or on a recursion the schema itself has, with a message),
 * or fail with a status and a message; never crash or hang. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"
#include "json_schema.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size ? size : 1);
    if (!text) return 0;
    if (size) memcpy(text, data, size);
    char *gbnf = NULL;
    tdm_err err = {0};
    tandem_status st = tdm_json_schema_to_gbnf(text, size, &gbnf, &err);
    if (st != TANDEM_OK) {
        if (gbnf || err.msg[0] == 0) abort();
        free(text);
        return 0;
    }
    if (!gbnf) abort();
    tdm_grammar *g = NULL;
    st = tdm_grammar_parse(gbnf, strlen(gbnf), &g, &err);
    if (st != TANDEM_OK) {
        /* our own text: only limits, left recursion ($ref loops) or an empty
         * language (a required recursion) may refuse it */
        if (!strstr(err.msg, "limit") && !strstr(err.msg, "too large") && !strstr(err.msg, "left recursion") &&
            !strstr(err.msg, "can match nothing"))
            abort();
    } else {
        bool ok;
        tdm_grammar_matches(g, "{\"a\": [1, \"x\", null, true]}", 27, &ok, NULL);
        tdm_grammar_free(g);
    }
    free(gbnf);
    free(text);
    return 0;
}
