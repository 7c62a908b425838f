/* fuzz_gguf.c - libFuzzer harness for the GGUF parser (not built by default).
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE -Iinclude -Isrc \
 *       tests/fuzz/fuzz_gguf.c src/gguf/gguf.c src/gguf/ggml_types.c src/base/dtype.c src/base/common.c src/base/json.c src/base/unicode.c \
 *       src/base/unicode_data.c -lm -o fuzz_gguf
 *   ./fuzz_gguf -max_len=4096 corpus/
 *
 * Every input must either parse (then every lookup and print works) or fail with a
 * status and a non-empty message. */
#include <stdio.h>
#include <stdlib.h>

#include "gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tdm_gguf *g = NULL;
    tdm_err err = {0};
    tandem_status st = tdm_gguf_open_memory(data, size, &g, &err);
    if (st != TANDEM_OK) {
        if (g || err.msg[0] == 0) abort(); /* a contract violation: report it to the fuzzer */
        return 0;
    }
    FILE *null = fopen("/dev/null", "w");
    for (uint64_t i = 0; i < g->n_kv; i++) {
        if (tdm_gguf_find(g, g->kv[i].key) != &g->kv[i].value) abort();
        if (null) tdm_gguf_value_print(&g->kv[i].value, null, 8);
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const tdm_gguf_tensor *t = &g->tensors[i];
        if (tdm_gguf_find_tensor(g, t->name) != t) abort();
        if (!t->nbytes) { /* a type of unknown size: no data to read */
            if (t->data || tdm_dtype_supported(t->type)) abort();
            continue;
        }
        volatile uint8_t sink = 0;
        const uint8_t *p = t->data;
        sink ^= p[0] ^ p[t->nbytes - 1]; /* the data must be readable */
        (void)sink;
    }
    if (null) fclose(null);
    tdm_gguf_close(g);
    return 0;
}
