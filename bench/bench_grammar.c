/* bench_grammar.c - the cost of grammar-constrained decoding on the host: the token
 * mask (tdm_gmatch_mask) per position, and the accept of the chosen token, at the
 * states along a real JSON document tokenized by each vocabulary.
 *
 * For each vocabulary (a GGUF's tokenizer) and each grammar (any JSON object, the
 * `json_object` response format; and a JSON schema of a tool call with nested
 * objects, arrays, enums and bounds), two passes over the document's tokens:
 *   in use: one matcher; at each position one mask (timed), a check that the
 *           document's next token is allowed, and its accept (timed).  A state met
 *           before (inside a string, after each ordinary token) is answered by the
 *           matcher's mask cache: this is the cost a generation pays.
 *   cold:   at each position a fresh matcher brought there (untimed) and one mask
 *           (timed; the median of R matchers): the full walk over the vocabulary.
 * Prints a markdown table: the median / mean / p90 / max over the positions of each,
 * the mean allowed-token count, the accept time, and the means as a fraction of a
 * decode step (--step-ms, default 21 ms: a CPU step of the real Qwen 1.5B / 0.5B
 * pair; and 0.3 ms: a pycode GPU step).  Exit status 1 when a document token is
 * masked out (a bug).
 *
 * usage: bench_grammar [--vocab GGUF]... [-r 5] [--step-ms 21]
 *   (default vocabularies: models/pycode-target-f16.gguf and, when present,
 *    models/real/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "grammar.h"
#include "json_schema.h"
#include "tokenizer.h"

static const char *DOC =
    "{\"name\": \"search_files\", \"arguments\": {\"query\": \"def tokenize(text: str) -> list[int]\", "
    "\"paths\": [\"src/tokenizer/tok_bpe.c\", \"src/tokenizer/tokenizer.h\", \"tests/test_tokenizer.c\"], "
    "\"max_results\": 25, \"case_sensitive\": false, \"mode\": \"regex\", \"since\": \"2026-12-07\", "
    "\"options\": {\"context_lines\": 3, \"include_hidden\": true, \"owner\": null, \"score\": -1.5e-3}, "
    "\"note\": \"caf\\u00e9 \\\"quoted\\\" \xc3\xa9t\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \\n end\"}}";

static const char *SCHEMA =
    "{\"type\": \"object\", \"additionalProperties\": false, \"required\": [\"name\", \"arguments\"],"
    " \"properties\": {\"name\": {\"enum\": [\"search_files\", \"read_file\", \"run_tests\"]},"
    "  \"arguments\": {\"type\": \"object\", \"additionalProperties\": false,"
    "   \"required\": [\"query\", \"paths\", \"max_results\", \"case_sensitive\", \"mode\", \"since\", \"options\", \"note\"],"
    "   \"properties\": {\"query\": {\"type\": \"string\", \"minLength\": 1},"
    "    \"paths\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}, \"maxItems\": 16},"
    "    \"max_results\": {\"type\": \"integer\", \"minimum\": 1, \"maximum\": 100},"
    "    \"case_sensitive\": {\"type\": \"boolean\"}, \"mode\": {\"enum\": [\"plain\", \"regex\"]},"
    "    \"since\": {\"type\": \"string\", \"format\": \"date\"},"
    "    \"options\": {\"type\": \"object\", \"properties\": {\"context_lines\": {\"type\": \"integer\"},"
    "      \"include_hidden\": {\"type\": \"boolean\"}, \"owner\": {\"type\": [\"string\", \"null\"]},"
    "      \"score\": {\"type\": \"number\"}}},"
    "    \"note\": {\"type\": \"string\"}}}}}";

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void die(const char *what, const tdm_err *err) {
    fprintf(stderr, "bench_grammar: %s: %s\n", what, err ? err->msg : "");
    exit(2);
}

typedef struct stats {
    double median, mean, p90, max;
} stats;

static stats summarize(double *us, size_t n) {
    stats s = {0};
    for (size_t p = 0; p < n; p++) s.mean += us[p];
    s.mean /= (double)n;
    qsort(us, n, sizeof(double), cmp_d);
    s.median = us[n / 2], s.p90 = us[(n * 9) / 10], s.max = us[n - 1];
    return s;
}

static int run(const char *vname, const tdm_tokenizer *t, const tdm_gvocab *v, const char *gname,
               const tdm_grammar *g, int R, double step_ms) {
    tdm_err err = {0};
    int32_t *ids;
    size_t n;
    if (tdm_tokenize(t, DOC, strlen(DOC), false, false, &ids, &n, &err)) die("tokenize", &err);
    uint32_t *mask = calloc(tdm_gvocab_mask_words(v), sizeof(uint32_t));
    double *use = calloc(n + 1, sizeof(double)), *cold = calloc(n + 1, sizeof(double));
    double *rep = calloc((size_t)R, sizeof(double));
    double acc_s = 0, allowed_sum = 0;
    int bad = 0;
    /* in use: one matcher along the document, one mask per position (the matcher's
     * cache answers a state met before) */
    tdm_gmatch *m;
    if (tdm_gmatch_create(g, &m, &err)) die("matcher", &err);
    for (size_t p = 0; p <= n; p++) {
        int32_t na = 0;
        double t0 = tdm_now();
        if (tdm_gmatch_mask(m, v, mask, &na, &err)) die("mask", &err);
        use[p] = (tdm_now() - t0) * 1e6;
        allowed_sum += na;
        if (p == n) break;
        if (!(mask[ids[p] / 32] >> (ids[p] % 32) & 1)) {
            fprintf(stderr, "bench_grammar: %s / %s: the document's token %zu (id %d) is masked out\n", vname, gname, p,
                    (int)ids[p]);
            bad = 1;
            break;
        }
        t0 = tdm_now();
        if (tdm_gmatch_accept_token(m, v, ids[p], &err)) die("accept", &err);
        acc_s += tdm_now() - t0;
    }
    if (!bad && !tdm_gmatch_is_complete(m)) {
        fprintf(stderr, "bench_grammar: %s / %s: the document is not complete\n", vname, gname);
        bad = 1;
    }
    tdm_gmatch_free(m);
    /* cold: the walk itself, a fresh matcher brought to each position (median of R) */
    for (size_t p = 0; p <= n && !bad; p++) {
        for (int r = 0; r < R; r++) {
            if (tdm_gmatch_create(g, &m, &err)) die("matcher", &err);
            for (size_t q = 0; q < p; q++)
                if (tdm_gmatch_accept_token(m, v, ids[q], &err)) die("accept", &err);
            double t0 = tdm_now();
            if (tdm_gmatch_mask(m, v, mask, NULL, &err)) die("mask", &err);
            rep[r] = (tdm_now() - t0) * 1e6;
            tdm_gmatch_free(m);
        }
        qsort(rep, (size_t)R, sizeof(double), cmp_d);
        cold[p] = rep[R / 2];
    }
    size_t np = n + 1;
    stats u = summarize(use, np), c = summarize(cold, np);
    printf("| %s | %s | %zu | %.1f / %.1f / %.1f / %.1f | %.1f / %.1f / %.1f / %.1f | %.0f | %.2f | %.2f %% | %.1f %% | %.2f %% |\n",
           vname, gname, n, u.median, u.mean, u.p90, u.max, c.median, c.mean, c.p90, c.max, allowed_sum / (double)np,
           acc_s * 1e6 / (double)(n ? n : 1), 100.0 * u.mean / (step_ms * 1000.0), 100.0 * u.mean / 300.0,
           100.0 * c.mean / (step_ms * 1000.0));
    free(mask), free(use), free(cold), free(rep), free(ids);
    return bad;
}

int main(int argc, char **argv) {
    const char *vocabs[8];
    int nv = 0, R = 5;
    double step_ms = 21.0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--vocab") && i + 1 < argc && nv < 8) vocabs[nv++] = argv[++i];
        else if (!strcmp(argv[i], "-r") && i + 1 < argc) R = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--step-ms") && i + 1 < argc) step_ms = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_grammar [--vocab GGUF]... [-r 5] [--step-ms 21]\n");
            return 2;
        }
    }
    if (R < 1) R = 1;
    if (nv == 0) {
        vocabs[nv++] = "models/pycode-target-f16.gguf";
        FILE *f = fopen("models/real/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "rb");
        if (f) fclose(f), vocabs[nv++] = "models/real/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf";
    }
    tdm_err err = {0};
    tdm_grammar *gobj, *gsch;
    if (tdm_json_object_grammar(&gobj, &err)) die("json_object grammar", &err);
    if (tdm_json_schema_grammar(SCHEMA, strlen(SCHEMA), &gsch, &err)) die("schema grammar", &err);
    printf("mask per position along a %zu-byte JSON document (µs: median / mean / p90 / max over the positions;"
           " cold: median of %d fresh matchers each)\n\n", strlen(DOC), R);
    printf("| vocabulary | grammar | tokens | mask in use µs | mask cold µs | allowed (mean) | accept µs |"
           " in use / %.0f ms step | in use / 0.3 ms step | cold / %.0f ms step |\n", step_ms, step_ms);
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    int bad = 0;
    for (int k = 0; k < nv; k++) {
        tdm_gguf *gg;
        tdm_tokenizer *t;
        tdm_gvocab *v;
        if (tdm_gguf_open(vocabs[k], &gg, &err) || tdm_tokenizer_load(gg, &t, &err)) die(vocabs[k], &err);
        double t0 = tdm_now();
        if (tdm_gvocab_create(t, &v, &err)) die("vocabulary", &err);
        double build_ms = (tdm_now() - t0) * 1e3;
        const char *name = strrchr(vocabs[k], '/') ? strrchr(vocabs[k], '/') + 1 : vocabs[k];
        char vname[160];
        snprintf(vname, sizeof vname, "%.100s (%d tokens; built in %.0f ms)", name, (int)tdm_gvocab_n(v), build_ms);
        bad |= run(vname, t, v, "json_object", gobj, R, step_ms);
        bad |= run(vname, t, v, "tool-call schema", gsch, R, step_ms);
        tdm_gvocab_free(v);
        tdm_tokenizer_free(t);
        tdm_gguf_close(gg);
    }
    tdm_grammar_free(gobj);
    tdm_grammar_free(gsch);
    return bad;
}
