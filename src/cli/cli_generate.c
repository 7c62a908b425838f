/* cli_generate.c - `tandem generate`: completions of one prompt or a prompt file,
 * streamed as text or written as JSON lines; with --chat (or --messages, or prompt
 * lines that carry "messages") the conversations are rendered by the model's chat
 * template (or --chat-template NAME) first.  Its option parsing and model opening
 * serve `tandem chat` too (cli_chat.c). */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "input.h"
#include "json.h"



/* Streaming state for the on_token callback. */
typedef struct stream_state {
    size_t written;          /* bytes of text written so far for this prompt */
} stream_state;

static bool on_token_print(int32_t token, const char *text, size_t len, void *user) {
    (void)token;
    stream_state *st = user;
    if (len > 0) fwrite(text, 1, len, stdout);
    fflush(stdout);
    st->written += len;
    return true;
}

/* The text of a --grammar / --json-schema FILE into *out (heap); false with the
 * error printed. */
static bool read_constraint(const char *opt, const char *path, char **out) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        cli_error("%s %s: cannot open the file", opt, path);
        return false;
    }
    char *text = NULL;
    size_t len = 0;
    tdm_err err = {0};
    tandem_status st = tdm_input_read_all(f, path, TDM_INPUT_TOTAL_MAX, &text, &len, &err);
    fclose(f);
    if (st) {
        cli_error("%s %s", opt, err.msg);
        return false;
    }
    if (strlen(text) != len) {
        free(text);
        cli_error("%s %s: the file holds a NUL byte", opt, path);
        return false;
    }
    *out = text;
    return true;
}

int cli_gen_parse(int argc, char **argv, bool interactive, cli_gen_opts *o) {
    tandem_generate_params d = tandem_generate_default_params();
    *o = (cli_gen_opts){.max_tokens = 128, .temp = 0, .top_k = d.top_k, .top_p = d.top_p,
                    .min_p = d.min_p, .p_min = d.spec_p_min, .seed = 0, .threads = 0,
                    .backend = TANDEM_BACKEND_CPU, .spec_k = 0, .spec_k_max = 0, .spec_ngram = d.spec_ngram, .batch = 1,
                    .tensor_parallel = 1, .draft_vocab = TANDEM_DRAFT_VOCAB_AUTO, .repetition = d.repetition_penalty,
                    .logprobs = -1};
    const char *spec_opt = NULL; /* the first speculation option given: needs -d */
    const char *grammar_file = NULL, *schema_file = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        bool ok = true, missing = false;
        if (cli_is_help(a)) {
            cli_usage(stdout);
            return CLI_EXIT_OK;
        }
#define TAKE(s, l) cli_take(argc, argv, &i, (s), (l), &v, &missing)
        if (!interactive && cli_opt_flag(a, NULL, "--json")) o->json = true;
        else if (!interactive && cli_opt_flag(a, NULL, "--chat")) o->chat = true;
        else if (!interactive && TAKE(NULL, "--messages")) o->messages_file = v;
        else if (TAKE(NULL, "--chat-template")) o->chat_template = v;
        else if (interactive && TAKE(NULL, "--system")) o->system = v;
        else if (TAKE(NULL, "--grammar")) grammar_file = v;
        else if (TAKE(NULL, "--json-schema")) schema_file = v;
        else if (TAKE("-m", "--model")) o->model = v;
        else if (TAKE("-d", "--draft")) o->draft = v;
        else if (!interactive && TAKE("-p", "--prompt")) o->prompt = v;
        else if (!interactive && TAKE(NULL, "--prompts")) o->prompts_file = v;
        else if (TAKE("-n", "--max-tokens")) ok = cli_parse_int(a, v, 0, CLI_COUNT_MAX, &o->max_tokens);
        else if (TAKE(NULL, "--temp")) ok = cli_parse_float(a, v, 0, CLI_TEMP_MAX, &o->temp);
        else if (TAKE(NULL, "--top-k")) ok = cli_parse_int(a, v, 0, CLI_COUNT_MAX, &o->top_k);
        else if (TAKE(NULL, "--top-p")) ok = cli_parse_float_gt(a, v, 0, 1, &o->top_p);
        else if (TAKE(NULL, "--min-p")) ok = cli_parse_float(a, v, 0, 1, &o->min_p);
        else if (TAKE(NULL, "--seed")) ok = cli_parse_u64(a, v, &o->seed);
        else if (TAKE(NULL, "--presence-penalty")) ok = cli_parse_float(a, v, -2, 2, &o->presence);
        else if (TAKE(NULL, "--frequency-penalty")) ok = cli_parse_float(a, v, -2, 2, &o->frequency);
        else if (TAKE(NULL, "--repetition-penalty")) ok = cli_parse_float_gt(a, v, 0, 100, &o->repetition);
        else if (TAKE(NULL, "--min-tokens")) ok = cli_parse_int(a, v, 0, CLI_COUNT_MAX, &o->min_tokens);
        else if (!interactive && TAKE(NULL, "--logprobs")) ok = cli_parse_int(a, v, 0, TANDEM_TOP_LOGPROBS_MAX, &o->logprobs);
        else if (TAKE(NULL, "--logit-bias")) {
            free(o->logit_bias);
            ok = cli_parse_logit_bias(a, v, &o->logit_bias, &o->n_logit_bias);
        }
        else if (TAKE("-t", "--threads")) ok = cli_parse_int(a, v, 0, TANDEM_THREADS_MAX, &o->threads);
        else if (TAKE(NULL, "--backend")) ok = cli_parse_backend(a, v, &o->backend);
        else if (TAKE(NULL, "--gpu-mem")) ok = cli_parse_size(a, v, &o->gpu_mem);
        else if (TAKE(NULL, "--tensor-parallel")) ok = cli_parse_tensor_parallel(a, v, &o->tensor_parallel);
        else if (TAKE(NULL, "--kv-type")) ok = cli_parse_kv_type(a, v, &o->kv_type);
        else if (TAKE(NULL, "--weights")) ok = cli_parse_weights(a, v, &o->weights);
        else if (TAKE(NULL, "--draft-vocab")) ok = cli_parse_draft_vocab(a, v, &o->draft_vocab);
        else if (TAKE(NULL, "--ctx")) ok = cli_parse_int(a, v, 1, CLI_CTX_MAX, &o->ctx);
        else if (TAKE(NULL, "--kv-mem")) ok = cli_parse_size(a, v, &o->kv_mem);
        else if (!interactive && TAKE(NULL, "--batch")) ok = cli_parse_int(a, v, 1, CLI_BATCH_MAX, &o->batch);
        else if (TAKE(NULL, "--spec-k")) ok = cli_parse_spec_k(a, v, &o->spec_k);
        else if (TAKE(NULL, "--spec-k-max")) ok = cli_parse_int(a, v, 1, TANDEM_SPEC_K_MAX, &o->spec_k_max);
        else if (TAKE(NULL, "--p-min")) ok = cli_parse_float(a, v, 0, 1, &o->p_min);
        else if (TAKE(NULL, "--spec-ngram")) ok = cli_parse_spec_ngram(a, v, &o->spec_ngram);
        else if (TAKE(NULL, "--spec-tree")) ok = cli_parse_spec_tree(a, v, &o->spec_tree, &o->spec_tree_shape);
        else return cli_unknown_arg(a);
#undef TAKE
        if (missing || !ok) return CLI_EXIT_USAGE;
        if (!spec_opt && cli_is_spec_opt(a)) spec_opt = a;
    }
    if (grammar_file && schema_file) return cli_usage_error("give --grammar or --json-schema, not both");
    if (!o->model) return cli_usage_error("missing required option -m MODEL");
    if (grammar_file && !read_constraint("--grammar", grammar_file, &o->grammar)) return CLI_EXIT_ERROR;
    if (schema_file && !read_constraint("--json-schema", schema_file, &o->json_schema)) return CLI_EXIT_ERROR;
    if (spec_opt && !o->draft) return cli_needs(spec_opt, "-d DRAFT");
    if (interactive) return -1;
    if (!!o->prompt + !!o->prompts_file + !!o->messages_file > 1)
        return cli_usage_error("give one of -p, --prompts and --messages");
    if (!o->prompt && !o->prompts_file && !o->messages_file)
        return cli_usage_error("missing -p TEXT, --prompts FILE or --messages FILE");
    if (o->messages_file) o->chat = true;
    if (o->chat_template && !o->chat && !o->prompts_file) return cli_needs("--chat-template", "--chat");
    return -1;
}

/* Tokens produced by the decode phase (the first comes out of the prefill). */
static double decode_tokens(const tandem_result *r) {
    return r->n_tokens > 0 ? (double)(r->n_tokens - 1) : 0.0;
}

static void print_json_result(const cli_prompt *p, const tandem_result *r, bool has_draft) {
    cli_json_result(stdout, p, r, has_draft);
}

/* Text mode with --logprobs: a line per token on stderr, "[logprobs] ID LOGPROB" and
 * the alternatives "ID:LOGPROB". */
static void print_logprobs(const tandem_result *r) {
    for (size_t i = 0; r->logprobs && i < r->n_tokens; i++) {
        const tandem_token_logprob *lp = &r->logprobs[i];
        fprintf(stderr, "[logprobs] %d %.6f", (int)r->tokens[i], (double)lp->logprob);
        for (int k = 0; k < lp->n_top; k++) fprintf(stderr, " %d:%.6f", (int)lp->top_ids[k], (double)lp->top_logprobs[k]);
        fputc('\n', stderr);
    }
}

static void print_speed_line(const cli_prompt *p, const tandem_result *r, bool has_draft) {
    print_logprobs(r);
    fputs("[id ", stderr);
    cli_prompt_write_id(stderr, p, false);
    /* no token: the prompt did not run (max_tokens 0), so no prefill rate */
    double prefilled = r->n_tokens > 0 ? (double)r->n_prompt_tokens : 0.0;
    char b1[32], b2[32];
    fprintf(stderr, "] %zu tokens, prompt %zu tokens: prefill %.1f ms (%s), decode %.1f ms (%s)", r->n_tokens,
            r->n_prompt_tokens, r->prefill_ms, cli_rate_str(prefilled, r->prefill_ms, b1), r->decode_ms,
            cli_rate_str(decode_tokens(r), r->decode_ms, b2));
    if (has_draft) {
        fprintf(stderr, " spec: acceptance %.2f, mean accepted %.1f/step, k=%d",
                r->spec.acceptance_rate, r->spec.mean_accepted, r->spec.k_final);
        if (r->spec.ngram_drafted)
            fprintf(stderr, ", n-gram %llu of %llu steps, %llu of %llu proposed tokens",
                    (unsigned long long)r->spec.ngram_steps, (unsigned long long)r->spec.steps,
                    (unsigned long long)r->spec.ngram_drafted, (unsigned long long)r->spec.drafted);
        if (r->spec.tree_steps)
            fprintf(stderr, ", trees in %llu of %llu steps (%.1f nodes each)", (unsigned long long)r->spec.tree_steps,
                    (unsigned long long)r->spec.steps, (double)r->spec.tree_nodes / (double)r->spec.tree_steps);
        if (r->spec.forwards)
            fprintf(stderr, ", %.2f tokens per target forward", (double)r->spec.forward_tokens / (double)r->spec.forwards);
    }
    fputc('\n', stderr);
}

tandem_request cli_gen_request(const cli_gen_opts *o) {
    tandem_request rq = tandem_request_default();
    tandem_generate_params *gp = &rq.params;
    gp->max_tokens = o->max_tokens;
    gp->temperature = o->temp;
    gp->seed = o->seed;
    gp->top_k = o->top_k;
    gp->top_p = o->top_p;
    gp->min_p = o->min_p;
    gp->spec_k = o->spec_k;
    if (o->spec_k_max > 0) gp->spec_k_max = o->spec_k_max;
    if (gp->spec_k_min > gp->spec_k_max) gp->spec_k_min = gp->spec_k_max;
    gp->spec_p_min = o->p_min;
    gp->spec_ngram = o->spec_ngram;
    gp->spec_tree = o->spec_tree_shape ? 0 : o->spec_tree;
    gp->spec_tree_shape = o->spec_tree_shape;
    gp->grammar = o->grammar;
    gp->json_schema = o->json_schema;
    gp->presence_penalty = o->presence;
    gp->frequency_penalty = o->frequency;
    gp->repetition_penalty = o->repetition;
    gp->min_tokens = o->min_tokens;
    gp->logit_bias = o->logit_bias;
    gp->n_logit_bias = o->n_logit_bias;
    gp->logprobs = o->logprobs >= 0;
    gp->top_logprobs = o->logprobs > 0 ? o->logprobs : 0;
    return rq;
}

/* A prompt's request: its own fields over the command line's. */
static tandem_request prompt_request(const cli_gen_opts *o, const cli_prompt *p) {
    tandem_request rq = cli_gen_request(o);
    cli_prompt_apply(p, &rq);
    return rq;
}

/* A whole file within input.h's limit (heap); NULL with the error printed. */
static char *read_file_text(const char *opt, const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return cli_error("%s %s: cannot open the file", opt, path), NULL;
    char *text = NULL;
    tdm_err err = {0};
    tandem_status s = tdm_input_read_all(f, path, TDM_INPUT_TOTAL_MAX, &text, len, &err);
    fclose(f);
    if (s != TANDEM_OK) return cli_error("%s %s", opt, err.msg), NULL;
    return text;
}

const char *cli_chat_template_arg(const char *value, char **owned) {
    *owned = NULL;
    if (!value || strstr(value, "{{") || strstr(value, "{%")) return value;
    FILE *probe = fopen(value, "rb");
    if (!probe) return value; /* a name */
    fclose(probe);
    size_t len;
    char *text = read_file_text("--chat-template", value, &len);
    if (!text) return NULL;
    if (strlen(text) != len || (!strstr(text, "{{") && !strstr(text, "{%"))) {
        /* the library tells a template text from a name by its tags */
        free(text);
        cli_error("--chat-template %s: the file holds no Jinja tag (or a NUL byte)", value);
        return NULL;
    }
    *owned = text;
    return text;
}

int cli_render_chats(const tandem_model *target, const char *tmpl, bool all, const char *file, cli_prompts *ps,
                     bool lenient) {
    for (size_t i = 0; i < ps->n; i++) {
        cli_prompt *p = &ps->items[i];
        if ((!p->messages && !all) || p->error) continue;
        char *text = NULL;
        tandem_status s;
        if (p->messages) {
            s = tandem_chat_render_json(target, tmpl, p->messages, strlen(p->messages), true, &text);
        } else {
            tandem_chat_message m = {"user", p->text};
            s = tandem_chat_render(target, tmpl, &m, 1, true, &text);
        }
        if (s != TANDEM_OK) {
            char what[PATH_MAX + 32];
            if (p->line > 0) snprintf(what, sizeof what, "%s:%d", file, p->line);
            else snprintf(what, sizeof what, "%s", file);
            if (!lenient) return cli_status_error(s, what);
            size_t n = strlen(what) + strlen(tandem_last_error()) + 3;
            if (!(p->error = malloc(n))) return cli_error("out of memory");
            snprintf(p->error, n, "%s: %s", what, tandem_last_error());
            continue;
        }
        free(p->text);
        p->text = text; /* tandem_free is free */
        p->len = strlen(text);
    }
    return -1;
}

/* The chat prompts of generate rendered in place; -1 or an exit code. */
static int render_chats(const tandem_model *target, const cli_gen_opts *o, cli_prompts *ps) {
    char *owned;
    const char *tmpl = cli_chat_template_arg(o->chat_template, &owned);
    if (o->chat_template && !tmpl) return CLI_EXIT_ERROR;
    const char *file = o->prompts_file ? o->prompts_file : o->messages_file ? o->messages_file : "-p";
    int rc = cli_render_chats(target, tmpl, o->chat, file, ps, false);
    free(owned);
    return rc;
}

/* --messages FILE: one conversation, an array of messages or {"messages": [...],
 * "tools": [...]} (the library takes either form). */
static bool read_messages_file(const char *path, cli_prompts *out) {
    size_t len;
    char *text = read_file_text("--messages", path, &len);
    if (!text) return false;
    tdm_json *j = NULL;
    tdm_err err = {0};
    bool ok = tdm_json_parse(text, len, &j, &err) == TANDEM_OK;
    if (!ok) {
        cli_error("--messages %s: %s", path, err.msg);
    } else {
        const tdm_json *msgs = j->type == TDM_JSON_OBJECT ? tdm_json_get(j, "messages") : j;
        ok = msgs && cli_messages_ok(msgs);
        if (!ok)
            cli_error("--messages %s: expected an array of messages (objects with a string \"role\"), or an object "
                      "with one as \"messages\"", path);
    }
    if (ok && !(ok = cli_prompts_single("", out))) cli_error("out of memory");
    if (ok) {
        out->items[0].messages = text;
        text = NULL;
    }
    tdm_json_free(j);
    free(text);
    return ok;
}

/* Runs one prompt (as a request of one: a timeout only a request carries); returns a
 * tandem_status, the error in res->error or else in tandem_last_error. */
static tandem_status run_prompt(tandem_engine *eng, const tandem_model *target,
                                const cli_gen_opts *o, const cli_prompt *p, tandem_result *res) {
    tandem_request rq = prompt_request(o, p);
    stream_state st = {0};
    if (!o->json) {
        rq.params.on_token = on_token_print;
        rq.params.user_data = &st;
    }
    memset(res, 0, sizeof *res);
    tandem_status s = TANDEM_OK;
    int32_t *ids = NULL;
    if (memchr(p->text, '\0', p->len) == NULL) {
        rq.prompt = p->text;
    } else {
        /* The prompt holds NUL bytes: tokenize it with its length (BOS as the
         * model asks), then generate from the ids. */
        s = tandem_tokenize(target, p->text, p->len, true, &ids, &rq.n_prompt_ids);
        rq.prompt_ids = ids;
    }
    if (s == TANDEM_OK) s = tandem_generate_batch(eng, &rq, 1, res);
    if (s == TANDEM_OK) s = res->status;
    tandem_free(ids);
    if (s != TANDEM_OK && st.written > 0) {
        fputc('\n', stdout); /* end the partial line */
        fflush(stdout);
    }
    if (s == TANDEM_OK && !o->json) {
        /* Write what the stream did not (e.g. a held-back incomplete character). */
        size_t tl = res->text ? strlen(res->text) : 0;
        if (st.written < tl) fwrite(res->text + st.written, 1, tl - st.written, stdout);
        fputc('\n', stdout);
        fflush(stdout);
    }
    return s;
}

/* The error of a failed prompt: its result's own message, else the library's. */
static int prompt_error(tandem_status s, const tandem_result *res, const char *where) {
    if (!res->error) return cli_status_error(s, where);
    return where ? cli_error("%s: %s", where, res->error) : cli_error("%s", res->error);
}

/* --batch N: every prompt through tandem_generate_batch (N decoding at once); the
 * results in input order as they would print one by one, a failed prompt's error
 * named by file:line without stopping the others (exit 1 if any failed). */
static int run_batch(tandem_engine *eng, const tandem_model *target, const cli_gen_opts *o, const cli_prompts *prompts,
                     bool has_draft) {
    const size_t n = prompts->n;
    tandem_request *req = calloc(n ? n : 1, sizeof *req);
    tandem_result *res = calloc(n ? n : 1, sizeof *res);
    int32_t **ids = calloc(n ? n : 1, sizeof *ids);
    if (!req || !res || !ids) {
        free(req), free(res), free(ids);
        return cli_error("out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        const cli_prompt *p = &prompts->items[i];
        req[i] = prompt_request(o, p);
        if (memchr(p->text, '\0', p->len) == NULL) {
            req[i].prompt = p->text;
        } else { /* NUL bytes: tokenized with its length (BOS as the model asks) */
            size_t m = 0;
            if (tandem_tokenize(target, p->text, p->len, true, &ids[i], &m) != TANDEM_OK) ids[i] = NULL, m = 0;
            req[i].prompt_ids = ids[i];
            req[i].n_prompt_ids = m;
        }
    }
    int rc = CLI_EXIT_OK;
    tandem_status s = tandem_generate_batch(eng, req, n, res);
    if (s != TANDEM_OK) rc = cli_status_error(s, NULL);
    for (size_t i = 0; i < n && s == TANDEM_OK; i++) {
        const cli_prompt *p = &prompts->items[i];
        if (res[i].status != TANDEM_OK) {
            fprintf(stderr, "error: %s:%d: %s\n", o->prompts_file ? o->prompts_file : "", p->line,
                    res[i].error ? res[i].error : tandem_status_str(res[i].status));
            rc = CLI_EXIT_ERROR;
            continue;
        }
        if (o->json) {
            print_json_result(p, &res[i], has_draft);
        } else {
            fputs(res[i].text ? res[i].text : "", stdout);
            fputc('\n', stdout);
            fflush(stdout);
            print_speed_line(p, &res[i], has_draft);
        }
    }
    for (size_t i = 0; i < n; i++) {
        tandem_result_free(&res[i]);
        tandem_free(ids[i]);
    }
    free(req), free(res), free(ids);
    return rc;
}

int cli_gen_open(const cli_gen_opts *o, bool (*progress)(float, void *), void *progress_user, tandem_model **target,
                 tandem_model **draft, tandem_engine **eng) {
    *target = *draft = NULL;
    *eng = NULL;
    tandem_model_params mp = tandem_model_default_params();
    mp.progress_callback = progress;
    mp.progress_callback_user_data = progress_user;
    mp.backend = o->backend;
    mp.weights = o->weights; /* (both models) */
    mp.tensor_parallel = o->tensor_parallel; /* (the target only: a draft runs whole) */
    tandem_status s = tandem_model_open(o->model, &mp, target);
    mp.tensor_parallel = 1;
    if (s == TANDEM_OK && o->draft) s = tandem_model_open(o->draft, &mp, draft);
    if (s == TANDEM_OK) {
        tandem_engine_params ep = tandem_engine_default_params();
        ep.n_threads = o->threads;
        ep.gpu_mem = o->gpu_mem;
        ep.kv_type = o->kv_type;
        ep.draft_vocab = o->draft_vocab;
        ep.n_ctx = o->ctx;
        ep.kv_bytes = o->kv_mem;
        ep.n_seq_max = o->batch;
        s = tandem_engine_open(*target, *draft, &ep, eng);
    }
    if (s == TANDEM_OK) return -1;
    int rc = cli_pair_error(s, o->model, o->draft);
    tandem_model_close(*draft);
    tandem_model_close(*target);
    *target = *draft = NULL;
    return rc;
}

void cli_gen_opts_free(cli_gen_opts *o) {
    free(o->grammar);
    free(o->json_schema);
    free(o->logit_bias);
    o->grammar = o->json_schema = NULL;
    o->logit_bias = NULL;
    o->n_logit_bias = 0;
}

static int generate_main(cli_gen_opts *o_in);

int cli_generate(int argc, char **argv) {
    cli_gen_opts o;
    int rc = cli_gen_parse(argc, argv, false, &o);
    if (rc < 0) rc = generate_main(&o);
    cli_gen_opts_free(&o);
    return rc;
}

/* generate with the parsed options. */
static int generate_main(cli_gen_opts *o_in) {
    cli_gen_opts o = *o_in; /* (the constraints' texts stay the caller's to free) */
    int rc;

    cli_prompts prompts = {0};
    if (o.prompts_file) {
        char err[512];
        if (!cli_prompts_read(o.prompts_file, &prompts, err, sizeof err)) return cli_error("%s", err);
    } else if (o.messages_file) {
        if (!read_messages_file(o.messages_file, &prompts)) return CLI_EXIT_ERROR;
    } else if (!cli_prompts_single(o.prompt, &prompts)) {
        return cli_error("out of memory");
    }

    tandem_model *target = NULL, *draft = NULL;
    tandem_engine *eng = NULL;
    tandem_status s;
    rc = cli_gen_open(&o, NULL, NULL, &target, &draft, &eng);
    if (rc >= 0) goto done;
    if ((rc = render_chats(target, &o, &prompts)) >= 0) goto done;

    rc = CLI_EXIT_OK;
    if (o.batch > 1) {
        rc = run_batch(eng, target, &o, &prompts, draft != NULL);
        goto done;
    }
    for (size_t i = 0; i < prompts.n; i++) {
        const cli_prompt *p = &prompts.items[i];
        tandem_result res;
        s = run_prompt(eng, target, &o, p, &res);
        if (s != TANDEM_OK) {
            char what[512];
            snprintf(what, sizeof what, "%s:%d", o.prompts_file ? o.prompts_file : "", p->line);
            rc = prompt_error(s, &res, p->line > 0 ? what : NULL);
            tandem_result_free(&res);
            break;
        }
        if (o.json)
            print_json_result(p, &res, draft != NULL);
        else
            print_speed_line(p, &res, draft != NULL);
        tandem_result_free(&res);
    }

done:
    tandem_engine_close(eng);
    tandem_model_close(draft);
    tandem_model_close(target);
    cli_prompts_free(&prompts);
    return rc;
}
