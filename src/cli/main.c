/* main.c - the `tandem` program: subcommand dispatch, usage text, and the option
 * parsing helpers shared by the subcommands. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "json.h"

int cli_verror(const char *fmt, va_list ap) {
    fputs("error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    return CLI_EXIT_ERROR;
}

int cli_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    cli_verror(fmt, ap);
    va_end(ap);
    return CLI_EXIT_ERROR;
}

int cli_status_error(tandem_status st, const char *what) {
    const char *msg = tandem_last_error();
    if (!msg || !*msg) msg = tandem_status_str(st);
    if (!msg) msg = "unknown error";
    if (what)
        return cli_error("%s: %s", what, msg);
    return cli_error("%s", msg);
}

int cli_pair_error(tandem_status st, const char *target, const char *draft) {
    if (st && target && draft && *draft) { /* an EAGLE-3 head as the draft: its pairing's error names both */
        char fit[512];
        bool is_head;
        int rc = cli_eagle3_check(target, draft, &is_head, fit, sizeof fit);
        if (is_head && rc != CLI_EXIT_OK) return rc;
    }
    if (st != TANDEM_ERR_MISMATCH || !target || !draft || !*draft) return cli_status_error(st, NULL);
    const char *msg = tandem_last_error();
    if (!msg || !*msg) msg = tandem_status_str(st);
    return cli_error("target '%s' and draft '%s' do not go together: %s", target, draft, msg ? msg : "");
}

bool cli_take(int argc, char **argv, int *i, const char *short_name, const char *long_name,
              const char **val, bool *missing) {
    const char *a = argv[*i];
    const char *name = NULL;
    if (short_name && strcmp(a, short_name) == 0) name = short_name;
    if (long_name && strcmp(a, long_name) == 0) name = long_name;
    if (name) {
        if (*i + 1 >= argc) {
            cli_usage_error("option %s needs a value", name);
            *val = NULL;
            *missing = true;
            return true;
        }
        *i += 1;
        *val = argv[*i];
        return true;
    }
    if (long_name) {
        size_t n = strlen(long_name);
        if (strncmp(a, long_name, n) == 0 && a[n] == '=') {
            *val = a + n + 1;
            return true;
        }
    }
    return false;
}

/* The length of the option name in "--name" or "--name=value". */
static int opt_len(const char *opt) { return (int)strcspn(opt, "="); }

bool cli_opt_flag(const char *arg, const char *short_name, const char *long_name) {
    return (short_name && strcmp(arg, short_name) == 0) ||
           (long_name && strcmp(arg, long_name) == 0);
}

bool cli_is_help(const char *arg) { return cli_opt_flag(arg, "-h", "--help"); }

bool cli_parse_int(const char *opt, const char *s, long lo, long hi, int *out) {
    if (!s) return false;
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    /* strtol skips leading blanks: demand a sign or a digit first. */
    if (!(isdigit((unsigned char)*s) || *s == '-' || *s == '+') || end == s || *end != '\0' ||
        errno == ERANGE) {
        cli_usage_error("option %.*s: '%s' is not an integer", opt_len(opt), opt, s);
        return false;
    }
    if (v < lo || v > hi || v < INT_MIN || v > INT_MAX) {
        cli_usage_error("option %.*s: %ld is out of range [%ld, %ld]", opt_len(opt), opt, v, lo, hi);
        return false;
    }
    *out = (int)v;
    return true;
}

bool cli_parse_u64(const char *opt, const char *s, uint64_t *out) {
    if (!s) return false;
    char *end = NULL;
    errno = 0;
    if (*s < '0' || *s > '9') { /* rejects '-', '+', spaces and "" */
        cli_usage_error("option %.*s: '%s' is not a non-negative integer", opt_len(opt), opt, s);
        return false;
    }
    unsigned long long v = strtoull(s, &end, 10);
    if (*end != '\0' || errno == ERANGE) {
        cli_usage_error("option %.*s: '%s' is not a non-negative 64-bit integer", opt_len(opt), opt, s);
        return false;
    }
    *out = (uint64_t)v;
    return true;
}

bool cli_parse_size(const char *opt, const char *s, size_t *out) {
    if (!s) return false;
    char *end = NULL;
    errno = 0;
    unsigned long long v = *s >= '0' && *s <= '9' ? strtoull(s, &end, 10) : 0;
    int shift = -1;
    if (end && end != s && errno != ERANGE) {
        if (*end == '\0') shift = 0;
        else if (end[1] == '\0' || ((end[1] == 'B' || end[1] == 'b') && end[2] == '\0') ||
                 (end[1] == 'i' && end[2] == 'B' && end[3] == '\0'))
            shift = *end == 'K' || *end == 'k' ? 10 : *end == 'M' || *end == 'm' ? 20 : *end == 'G' || *end == 'g' ? 30
                  : *end == 'T' || *end == 't' ? 40 : -1;
    }
    if (shift < 0 || (shift > 0 && v > (SIZE_MAX >> shift)) || (v << shift) < (1ull << 20)) {
        cli_usage_error("option %.*s: '%s' is not a size of at least 1M (digits with an optional K, M, G or T suffix)",
                        opt_len(opt), opt, s);
        return false;
    }
    *out = (size_t)(v << shift);
    return true;
}

/* A float in [lo, hi], or (lo, hi] when lo_open; the range applies to the value as a
 * float, which is what the library receives (1e-50 is 0 there, 1e39 infinite). */
static bool parse_float_range(const char *opt, const char *s, double lo, bool lo_open, double hi, float *out) {
    if (!s) return false;
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (!(isdigit((unsigned char)*s) || *s == '-' || *s == '+' || *s == '.') || end == s ||
        *end != '\0' || !isfinite(v)) { /* (an underflow is a number: the range decides) */
        cli_usage_error("option %.*s: '%s' is not a number", opt_len(opt), opt, s);
        return false;
    }
    double f = fabs(v) > FLT_MAX ? v * INFINITY : (double)(float)v; /* (float)v would be undefined */
    if (!(lo_open ? f > lo : f >= lo) || !(f <= hi)) {
        cli_usage_error("option %.*s: %s is out of range %c%g, %g]", opt_len(opt), opt, s, lo_open ? '(' : '[',
                        lo, hi);
        return false;
    }
    *out = (float)v;
    return true;
}

bool cli_parse_float(const char *opt, const char *s, double lo, double hi, float *out) {
    return parse_float_range(opt, s, lo, false, hi, out);
}

bool cli_parse_logit_bias(const char *opt, const char *s, tandem_logit_bias **out, int *n) {
    *out = NULL;
    *n = 0;
    if (!s || !*s) return cli_usage_error("option %.*s: empty (ID=BIAS[,ID=BIAS]...)", opt_len(opt), opt), false;
    int cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    if (cap > TANDEM_LOGIT_BIAS_MAX)
        return cli_usage_error("option %.*s: %d entries, at most %d", opt_len(opt), opt, cap, TANDEM_LOGIT_BIAS_MAX), false;
    tandem_logit_bias *b = calloc((size_t)cap, sizeof *b);
    if (!b) return cli_error("out of memory"), false;
    for (const char *p = s;;) {
        char *end = NULL;
        errno = 0;
        const long id = isdigit((unsigned char)*p) ? strtol(p, &end, 10) : -1;
        double bias = 0;
        bool ok = id >= 0 && errno == 0 && id <= INT32_MAX && *end == '=';
        if (ok) {
            const char *q = end + 1;
            bias = strtod(q, &end);
            ok = end != q && (*end == ',' || *end == '\0') && bias >= -100 && bias <= 100;
        }
        for (int x = 0; ok && x < *n; x++) ok = b[x].token != (int32_t)id;
        if (!ok) {
            free(b);
            *n = 0;
            return cli_usage_error("option %.*s: '%s': each entry ID=BIAS, a token id >= 0 given once and a bias in "
                                   "[-100, 100]",
                                   opt_len(opt), opt, s),
                   false;
        }
        b[(*n)++] = (tandem_logit_bias){(int32_t)id, (float)bias};
        if (*end == '\0') break;
        p = end + 1;
    }
    *out = b;
    return true;
}

bool cli_parse_float_gt(const char *opt, const char *s, double lo, double hi, float *out) {
    return parse_float_range(opt, s, lo, true, hi, out);
}

bool cli_is_spec_opt(const char *arg) {
    static const char *const names[] = {"--spec-k", "--spec-k-max", "--p-min", "--spec-ngram", "--spec-tree",
                                        "--spec-oracle", "--draft-vocab"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if ((int)strlen(names[i]) == opt_len(arg) && strncmp(arg, names[i], strlen(names[i])) == 0) return true;
    return false;
}

int cli_needs(const char *opt, const char *needed) {
    return cli_usage_error("option %.*s has no effect without %s", opt_len(opt), opt, needed);
}

bool cli_parse_tensor_parallel(const char *opt, const char *s, int *out) { return cli_parse_int(opt, s, 1, 8, out); }

bool cli_parse_backend(const char *opt, const char *s, tandem_backend_kind *out) {
    if (!s) return false;
    if (strcmp(s, "cpu") == 0) {
        *out = TANDEM_BACKEND_CPU;
        return true;
    }
    if (strcmp(s, "cuda") == 0) {
        *out = TANDEM_BACKEND_CUDA;
        return true;
    }
    cli_usage_error("option %.*s: unknown backend '%s' (expected cpu or cuda)", opt_len(opt), opt, s);
    return false;
}

bool cli_parse_draft_vocab(const char *opt, const char *s, int *out) {
    if (!s) return false;
    if (cli_draft_vocab_from_str(s, out)) return true;
    cli_usage_error("option %.*s: '%s' is not " CLI_DRAFT_VOCAB, opt_len(opt), opt, s);
    return false;
}

bool cli_parse_weights(const char *opt, const char *s, tandem_weights *out) {
    if (!s) return false;
    if (cli_weights_from_str(s, out)) return true;
    cli_usage_error("option %.*s: '%s' is not " CLI_WEIGHTS, opt_len(opt), opt, s);
    return false;
}

bool cli_parse_kv_type(const char *opt, const char *s, tandem_kv_type *out) {
    if (!s) return false;
    if (cli_kv_type_from_str(s, out)) return true;
    cli_usage_error("option %.*s: unknown KV cache type '%s' (expected " CLI_KV_TYPES ")", opt_len(opt), opt, s);
    return false;
}

bool cli_parse_spec_k(const char *opt, const char *s, int *out) {
    if (!s) return false;
    if (strcmp(s, "auto") == 0) {
        *out = 0;
        return true;
    }
    return cli_parse_int(opt, s, 1, TANDEM_SPEC_K_MAX, out);
}

bool cli_parse_spec_ngram(const char *opt, const char *s, int *out) {
    if (!s) return false;
    if (strcmp(s, "off") == 0) {
        *out = 0;
        return true;
    }
    if (!cli_parse_int(opt, s, 0, TANDEM_SPEC_NGRAM_MAX, out)) return false;
    if (*out > 0 && *out < TANDEM_SPEC_NGRAM_MIN) {
        cli_usage_error("option %.*s: n-gram length %d is not allowed (0 = off, or %d..%d)", opt_len(opt), opt,
                        *out, TANDEM_SPEC_NGRAM_MIN, TANDEM_SPEC_NGRAM_MAX);
        return false;
    }
    return true;
}

bool cli_parse_spec_tree(const char *opt, const char *s, int *tree, const char **shape) {
    if (!s) return false;
    char msg[300];
    if (tdm_arg_spec_tree_from_str(s, tree, shape, msg, sizeof msg)) return true;
    cli_usage_error("option %.*s: %s", opt_len(opt), opt, msg);
    return false;
}

void cli_json_num(FILE *f, double x, int decimals) {
    if (!isfinite(x)) x = 0;
    fprintf(f, "%.*f", decimals, x);
}

double cli_tok_per_s(double n, double ms) { return n > 0 && ms > 0 ? n * 1000.0 / ms : 0.0; }

const char *cli_rate_str(double n, double ms, char buf[32]) {
    double r = cli_tok_per_s(n, ms);
    if (r <= 0) return "n/a";
    snprintf(buf, 32, "%.0f tok/s", r);
    return buf;
}

/* tandem --version: the version, then what this build can run on. */
static int print_version(void) {
    printf("tandem %s (library %s)\n", TANDEM_VERSION, tandem_version());
    fputs(tandem_system_info(), stdout);
#ifdef TDM_HAVE_HTTP
    puts("http server: built (tandem serve)");
#else
    puts("http server: not built (tandem serve needs libmicrohttpd)");
#endif
    return CLI_EXIT_OK;
}

int main(int argc, char **argv) {
    if (argc < 2) return cli_usage_error("missing command");
    const char *cmd = argv[1];
    if (strcmp(cmd, "help") == 0 || cli_is_help(cmd)) {
        if (argc > 2 && !cli_help_command(stdout, argv[2])) return cli_unknown_command(argv[2]);
        if (argc <= 2) cli_usage(stdout);
        return CLI_EXIT_OK;
    }
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "-V") == 0 || strcmp(cmd, "version") == 0)
        return print_version();
    if (!cli_set_command(cmd)) return cli_unknown_command(cmd);
    int sub_argc = argc - 1;
    char **sub_argv = argv + 1;
    if (strcmp(cmd, "generate") == 0) return cli_generate(sub_argc, sub_argv);
    if (strcmp(cmd, "tokenize") == 0) return cli_tokenize(sub_argc, sub_argv);
    if (strcmp(cmd, "info") == 0) return cli_info(sub_argc, sub_argv);
    if (strcmp(cmd, "bench") == 0) return cli_bench(sub_argc, sub_argv);
    if (strcmp(cmd, "synth") == 0) return cli_synth(sub_argc, sub_argv);
    if (strcmp(cmd, "run") == 0) return cli_run(sub_argc, sub_argv);
    if (strcmp(cmd, "merge") == 0) return cli_merge(sub_argc, sub_argv);
    if (strcmp(cmd, "chat") == 0) return cli_chat(sub_argc, sub_argv);
    if (strcmp(cmd, "quantize") == 0) return cli_quantize(sub_argc, sub_argv);
    if (strcmp(cmd, "serve") == 0) return cli_serve(sub_argc, sub_argv);
    return cli_error("command '%s' is listed but not dispatched", cmd); /* a bug: usage.c and this list disagree */
}

void cli_json_spec(FILE *f, const tandem_spec_stats *s) {
    double rate = s->drafted ? (double)s->accepted / (double)s->drafted : 0.0;
    double mean = s->steps ? (double)s->accepted / (double)s->steps : 0.0;
    fprintf(f, "\"spec\": {\"steps\": %llu, \"drafted\": %llu, \"accepted\": %llu, \"acceptance_rate\": ",
            (unsigned long long)s->steps, (unsigned long long)s->drafted, (unsigned long long)s->accepted);
    cli_json_num(f, rate, 4);
    fputs(", \"mean_accepted\": ", f);
    cli_json_num(f, mean, 4);
    fprintf(f, ", \"k_final\": %d, \"accept_hist\": [", s->k_final);
    int last = 0;
    for (int i = 0; i < TANDEM_SPEC_HIST_MAX; i++)
        if (s->accept_hist[i]) last = i;
    for (int i = 0; i <= last; i++) fprintf(f, "%s%llu", i ? ", " : "", (unsigned long long)s->accept_hist[i]);
    fprintf(f, "], \"ngram_steps\": %llu, \"ngram_drafted\": %llu, \"ngram_accepted\": %llu",
            (unsigned long long)s->ngram_steps, (unsigned long long)s->ngram_drafted,
            (unsigned long long)s->ngram_accepted);
    fprintf(f, ", \"tree_steps\": %llu, \"tree_nodes\": %llu, \"forwards\": %llu, \"tokens_per_forward\": ",
            (unsigned long long)s->tree_steps, (unsigned long long)s->tree_nodes, (unsigned long long)s->forwards);
    cli_json_num(f, s->forwards ? (double)s->forward_tokens / (double)s->forwards : 0.0, 4);
    fputs(", \"draft_ms\": ", f);
    cli_json_num(f, s->draft_ms, 3);
    fputs(", \"verify_ms\": ", f);
    cli_json_num(f, s->verify_ms, 3);
    fputs(", \"other_ms\": ", f);
    cli_json_num(f, s->other_ms, 3);
    fputc('}', f);
}

void cli_spec_add(tandem_spec_stats *a, const tandem_spec_stats *b) {
    a->steps += b->steps;
    a->drafted += b->drafted;
    a->accepted += b->accepted;
    a->k_final = b->k_final;
    for (int i = 0; i < TANDEM_SPEC_HIST_MAX; i++) a->accept_hist[i] += b->accept_hist[i];
    a->draft_ms += b->draft_ms;
    a->verify_ms += b->verify_ms;
    a->other_ms += b->other_ms;
    a->ngram_steps += b->ngram_steps;
    a->ngram_drafted += b->ngram_drafted;
    a->ngram_accepted += b->ngram_accepted;
    a->forwards += b->forwards;
    a->forward_tokens += b->forward_tokens;
    a->tree_steps += b->tree_steps;
    a->tree_nodes += b->tree_nodes;
}

/* One result as tandem generate --json writes it (a line, flushed). */
void cli_json_result(FILE *f, const cli_prompt *p, const tandem_result *r, bool has_draft) {
    fputs("{\"id\": ", f);
    cli_prompt_write_id(f, p, true);
    fputs(", \"text\": ", f);
    tdm_json_write_str(f, r->text ? r->text : "", r->text ? strlen(r->text) : 0);
    fputs(", \"tokens\": [", f);
    for (size_t i = 0; i < r->n_tokens; i++) fprintf(f, i ? ", %d" : "%d", (int)r->tokens[i]);
    fputs("]", f);
    if (r->logprobs) { /* [{"logprob", "top_logprobs": [{"id", "logprob"}, ...]}], one per token */
        fputs(", \"logprobs\": [", f);
        for (size_t i = 0; i < r->n_tokens; i++) {
            const tandem_token_logprob *lp = &r->logprobs[i];
            fputs(i ? ", {\"logprob\": " : "{\"logprob\": ", f);
            cli_json_num(f, lp->logprob, 6);
            fputs(", \"top_logprobs\": [", f);
            for (int k = 0; k < lp->n_top; k++) {
                fprintf(f, "%s{\"id\": %d, \"logprob\": ", k ? ", " : "", (int)lp->top_ids[k]);
                cli_json_num(f, lp->top_logprobs[k], 6);
                fputc('}', f);
            }
            fputs("]}", f);
        }
        fputc(']', f);
    }
    fputs(", \"finish_reason\": ", f);
    const char *fr = tandem_finish_reason_str(r->finish_reason);
    tdm_json_write_str(f, fr ? fr : "none", fr ? strlen(fr) : 4);
    fprintf(f, ", \"prompt_tokens\": %zu, \"cached_tokens\": %zu, \"preemptions\": %d, \"queue_ms\": ",
            r->n_prompt_tokens, r->n_cached_tokens, r->n_preemptions);
    cli_json_num(f, r->queue_ms, 3);
    fputs(", \"timings\": {\"prefill_ms\": ", f);
    cli_json_num(f, r->prefill_ms, 3);
    fputs(", \"decode_ms\": ", f);
    cli_json_num(f, r->decode_ms, 3);
    fputs(", \"decode_tok_per_s\": ", f); /* 0 with no decoded token */
    cli_json_num(f, cli_tok_per_s(r->n_tokens > 0 ? (double)(r->n_tokens - 1) : 0.0, r->decode_ms), 2);
    fputc('}', f);
    if (has_draft) {
        fputs(", ", f);
        cli_json_spec(f, &r->spec);
    }
    fputs("}\n", f);
    fflush(f);
}

