/* llama_tokenize_ids.c - llama.cpp's tokenizer on a text file, for the reference
 * generators (gen_ref.py, gen_pair_ref.py): the command line and output of
 * llama.cpp's llama-tokenize that they use, for a llama.cpp build that has the
 * library but not that tool.
 *   usage: llama_tokenize_ids -m MODEL.gguf -f TEXT_FILE [--ids] [--log-disable]
 * Prints the ids as one line "[1, 2, 3]": llama_tokenize with add_special (BOS / EOS
 * as the vocabulary asks) and parse_special (text spelling a special token is that
 * token), as llama-tokenize does by default.  Loads the vocabulary only.
 *   build: cc -O2 -I LLAMA/include -I LLAMA/ggml/include llama_tokenize_ids.c \
 *          -L LLAMA_BUILD/bin -lllama -Wl,-rpath,LLAMA_BUILD/bin -o llama_tokenize_ids */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)level, (void)text, (void)user;
}

int main(int argc, char **argv) {
    const char *model = NULL, *file = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "-f") && i + 1 < argc) file = argv[++i];
        else if (strcmp(argv[i], "--ids") && strcmp(argv[i], "--log-disable")) {
            fprintf(stderr, "llama_tokenize_ids: unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    if (!model || !file) {
        fprintf(stderr, "usage: llama_tokenize_ids -m MODEL.gguf -f TEXT_FILE [--ids] [--log-disable]\n");
        return 2;
    }
    FILE *f = fopen(file, "rb");
    if (!f) {
        perror(file);
        return 1;
    }
    size_t cap = 1 << 16, len = 0, got;
    char *text = malloc(cap);
    while (text && (got = fread(text + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) text = realloc(text, cap *= 2);
    }
    fclose(f);
    if (!text) return 1;
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    struct llama_model *m = llama_model_load_from_file(model, mp);
    if (!m) {
        fprintf(stderr, "llama_tokenize_ids: cannot load %s\n", model);
        return 1;
    }
    const struct llama_vocab *v = llama_model_get_vocab(m);
    int32_t n_max = (int32_t)len + 8;
    llama_token *ids = malloc(sizeof *ids * (size_t)n_max);
    int32_t n = llama_tokenize(v, text, (int32_t)len, ids, n_max, true, true);
    if (n < 0) {
        fprintf(stderr, "llama_tokenize_ids: llama_tokenize failed (%d)\n", n);
        return 1;
    }
    putchar('[');
    for (int32_t i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
    puts("]");
    free(ids);
    free(text);
    llama_model_free(m);
    llama_backend_free();
    return 0;
}
