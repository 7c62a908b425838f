/* cli_chat.c - `tandem chat`: an interactive conversation on the terminal.
 *
 * Each line of standard input is a user message; the whole conversation so far is
 * rendered by the chat template and the reply streams to standard output (the
 * engine's prefix cache keeps the earlier turns' K/V, so only the new turn is
 * prefilled).  "/reset" forgets the conversation (not the --system message),
 * "/exit" or the end of input ends it.  Works the same on a pipe, without the
 * "> " prompt and the per-reply statistics a terminal gets. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "common.h"
#include "input.h"

typedef struct history {
    tandem_chat_message *m; /* [n]; contents heap, roles static */
    size_t n, cap;
    size_t keep;            /* the first keep messages (the system one) survive /reset */
} history;

static bool history_push(history *h, const char *role, const char *content, size_t len) {
    if (h->n == h->cap) {
        size_t nc = h->cap ? h->cap * 2 : 16;
        tandem_chat_message *nm = realloc(h->m, nc * sizeof *nm);
        if (!nm) return false;
        h->m = nm;
        h->cap = nc;
    }
    char *c = tdm_strndup(content, len);
    if (!c) return false;
    h->m[h->n].role = role;
    h->m[h->n++].content = c;
    return true;
}

static void history_truncate(history *h, size_t n) {
    while (h->n > n) free((char *)h->m[--h->n].content);
}

static bool on_token_stream(int32_t token, const char *text, size_t len, void *user) {
    (void)token;
    size_t *written = user;
    if (len) fwrite(text, 1, len, stdout);
    fflush(stdout);
    *written += len;
    return true;
}

/* One turn: renders the history, streams the reply, adds it.  Returns -1 to go on,
 * else an exit code (a template that cannot render ends the chat). */
static int turn(tandem_engine *eng, const tandem_model *target, const char *tmpl, const cli_gen_opts *o, history *h,
                bool tty, int *rc_soft) {
    char *prompt = NULL;
    tandem_status s = tandem_chat_render(target, tmpl, h->m, h->n, true, &prompt);
    if (s != TANDEM_OK) return cli_status_error(s, "chat template");
    tandem_request rq = cli_gen_request(o);
    size_t written = 0;
    rq.prompt = prompt;
    rq.params.on_token = on_token_stream;
    rq.params.user_data = &written;
    tandem_result res;
    memset(&res, 0, sizeof res);
    s = tandem_generate_batch(eng, &rq, 1, &res);
    if (s == TANDEM_OK) s = res.status;
    tandem_free(prompt);
    if (s != TANDEM_OK) {
        if (written) fputc('\n', stdout);
        if (res.error) cli_error("%s", res.error);
        else cli_status_error(s, NULL);
        history_truncate(h, h->n - 1); /* the turn did not happen */
        *rc_soft = CLI_EXIT_ERROR;
        tandem_result_free(&res);
        return -1;
    }
    const size_t tl = res.text ? strlen(res.text) : 0;
    if (written < tl) fwrite(res.text + written, 1, tl - written, stdout);
    fputc('\n', stdout);
    fflush(stdout);
    if (tty) {
        char b[32];
        fprintf(stderr, "[%zu tokens, %s, %s]\n", res.n_tokens, cli_rate_str(res.n_tokens > 1 ? (double)(res.n_tokens - 1) : 0, res.decode_ms, b),
                tandem_finish_reason_str(res.finish_reason));
    }
    bool ok = history_push(h, "assistant", res.text ? res.text : "", tl);
    tandem_result_free(&res);
    return ok ? -1 : cli_error("out of memory");
}

int cli_chat(int argc, char **argv) {
    cli_gen_opts o;
    int rc = cli_gen_parse(argc, argv, true, &o);
    if (rc >= 0) return rc;
    char *owned = NULL;
    const char *tmpl = cli_chat_template_arg(o.chat_template, &owned);
    if (o.chat_template && !tmpl) return CLI_EXIT_ERROR;
    tandem_model *target = NULL, *draft = NULL;
    tandem_engine *eng = NULL;
    if ((rc = cli_gen_open(&o, &target, &draft, &eng)) >= 0) {
        free(owned);
        return rc;
    }
    history h = {0};
    rc = -1;
    if (o.system && !history_push(&h, "system", o.system, strlen(o.system))) rc = cli_error("out of memory");
    h.keep = h.n;
    const bool tty = isatty(STDIN_FILENO) && isatty(STDOUT_FILENO);
    tdm_lines in = {.f = stdin, .own = false, .name = "stdin", .line_max = TDM_INPUT_LINE_MAX,
                    .total_max = TDM_INPUT_TOTAL_MAX};
    int rc_soft = CLI_EXIT_OK;
    while (rc < 0) {
        if (tty) fputs("> ", stdout), fflush(stdout);
        const char *line;
        size_t n;
        bool got;
        tdm_err err = {0};
        if (tdm_lines_next(&in, &line, &n, &got, &err) != TANDEM_OK) {
            rc = cli_error("%s", err.msg);
            break;
        }
        if (!got) break;
        while (n && (line[n - 1] == '\r' || line[n - 1] == ' ')) n--;
        if (n == 0) continue;
        if ((n == 5 && !memcmp(line, "/exit", 5)) || (n == 5 && !memcmp(line, "/quit", 5))) break;
        if (n == 6 && !memcmp(line, "/reset", 6)) {
            history_truncate(&h, h.keep);
            if (tty) fputs("[conversation cleared]\n", stderr);
            continue;
        }
        if (!history_push(&h, "user", line, n)) {
            rc = cli_error("out of memory");
            break;
        }
        rc = turn(eng, target, tmpl, &o, &h, tty, &rc_soft);
    }
    tdm_lines_close(&in);
    history_truncate(&h, 0);
    free(h.m);
    free(owned);
    tandem_engine_close(eng);
    tandem_model_close(draft);
    tandem_model_close(target);
    return rc >= 0 ? rc : rc_soft;
}
