/* cli_chat.c - `tandem chat`: an interactive conversation on the terminal.
 *
 * Each line of standard input is a user message (a line ending in a backslash goes
 * on in the next one: the message is the lines joined by newlines); the whole
 * conversation so far is rendered by the chat template and the reply streams to
 * standard output (the engine's prefix cache keeps the earlier turns' K/V, so only
 * the new turn is prefilled).  Lines are answered as they arrive, on a terminal and
 * on a pipe that stays open (input.h).  "/reset" forgets the conversation (not the
 * --system message), "/help" lists the commands, "/exit" or the end of input ends it.
 *
 * Ctrl-C (SIGINT) during a reply stops it (the token callback returns false, which
 * cancels the request); the part already shown stays in the conversation.  Ctrl-C at
 * the prompt drops a half-typed multi-line message, or on an empty prompt ends the
 * chat; a second Ctrl-C before the first is seen (a long prefill) quits at once.
 * A terminal also gets the "> " prompt, a loading line while the models load and
 * the statistics of each reply on stderr; a pipe gets only the replies. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "common.h"
#include "input.h"
#include "line_edit.h"

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

/* Set by SIGINT: a reply stops at its next token, a wait at the prompt ends. */
static volatile sig_atomic_t g_interrupt;

static void on_sigint(int sig) {
    (void)sig;
    if (g_interrupt) _exit(130); /* the first was not seen yet: quit now */
    g_interrupt = 1;
}

/* Routes SIGINT to on_sigint (no SA_RESTART: the wait at the prompt polls the flag). */
static void catch_sigint(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
}

static bool on_token_stream(int32_t token, const char *text, size_t len, void *user) {
    (void)token;
    size_t *written = user;
    if (len) fwrite(text, 1, len, stdout);
    fflush(stdout);
    *written += len;
    return !g_interrupt; /* false cancels the request: the text so far is its result */
}

/* The loading line on a terminal: "loading NAME  NN%" rewritten in place. */
typedef struct load_line {
    const char *names[2]; /* the target's and the draft's paths */
    int model;            /* the one loading now */
    int pct;              /* the percentage last shown, -1 none */
    float last;
} load_line;

static bool on_load_progress(float progress, void *user) {
    load_line *l = user;
    if (progress < l->last && l->model == 0 && l->names[1]) l->model = 1, l->pct = -1; /* the draft's began */
    l->last = progress;
    const int pct = (int)(progress * 100.0f);
    if (pct != l->pct) {
        l->pct = pct;
        fprintf(stderr, "\r\033[Kloading %s %3d%%", l->names[l->model], pct);
        fflush(stderr);
    }
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
    /* (a Ctrl-C after the last token is spent here: the reply was not stopped) */
    const bool stopped = g_interrupt && (s == TANDEM_ERR_CANCELLED ||
                                         (s == TANDEM_OK && res.finish_reason == TANDEM_FINISH_CANCELLED));
    g_interrupt = 0;
    if (s != TANDEM_OK && !(stopped && s == TANDEM_ERR_CANCELLED)) {
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
    if (stopped) fputs("[reply stopped]\n", stderr);
    if (tty) {
        char b[32], acc[48] = "";
        if (res.spec.drafted)
            snprintf(acc, sizeof acc, ", acceptance %.2f", res.spec.acceptance_rate);
        fprintf(stderr, "[%zu tokens, %s%s, %s]\n", res.n_tokens,
                cli_rate_str(res.n_tokens > 1 ? (double)(res.n_tokens - 1) : 0, res.decode_ms, b), acc,
                tandem_finish_reason_str(stopped ? TANDEM_FINISH_CANCELLED : res.finish_reason));
    }
    bool ok = history_push(h, "assistant", res.text ? res.text : "", tl);
    tandem_result_free(&res);
    return ok ? -1 : cli_error("out of memory");
}

static const char chat_help[] =
    "  /help   this list\n"
    "  /reset  forget the conversation (not --system)\n"
    "  /exit   end the chat (also /quit, the end of input, Ctrl-C at an empty prompt)\n"
    "  a line ending in \\ goes on in the next line: the message is the lines joined\n"
    "  Ctrl-C during a reply stops it; the conversation is kept\n";

/* A command line ("/exit", ...): 1 to end the chat, 0 done, -1 not a command. */
static int command(const char *line, size_t n, history *h, bool tty) {
#define IS(w) (n == sizeof(w) - 1 && !memcmp(line, w, n))
    if (IS("/exit") || IS("/quit")) return 1;
    if (IS("/reset")) {
        history_truncate(h, h->keep);
        if (tty) fputs("[conversation cleared]\n", stderr);
        return 0;
    }
    if (IS("/help")) {
        fputs(chat_help, stderr);
        return 0;
    }
    return -1;
#undef IS
}

static int chat_main(cli_gen_opts *o_in);

int cli_chat(int argc, char **argv) {
    cli_gen_opts o;
    int rc = cli_gen_parse(argc, argv, true, &o);
    if (rc < 0) rc = chat_main(&o);
    cli_gen_opts_free(&o);
    return rc;
}

/* chat with the parsed options. */
static int chat_main(cli_gen_opts *o_in) {
    cli_gen_opts o = *o_in; /* (the constraints' texts stay the caller's to free) */
    int rc;
    char *owned = NULL;
    const char *tmpl = cli_chat_template_arg(o.chat_template, &owned);
    if (o.chat_template && !tmpl) return CLI_EXIT_ERROR;
    const bool tty = isatty(STDIN_FILENO) && isatty(STDOUT_FILENO);
    load_line ll = {.names = {o.model, o.draft}, .pct = -1};
    const bool show_load = isatty(STDERR_FILENO);
    tandem_model *target = NULL, *draft = NULL;
    tandem_engine *eng = NULL;
    rc = cli_gen_open(&o, show_load ? on_load_progress : NULL, &ll, &target, &draft, &eng);
    if (show_load) fputs("\r\033[K", stderr), fflush(stderr);
    if (rc >= 0) {
        free(owned);
        return rc;
    }
    catch_sigint();
    history h = {0};
    rc = -1;
    if (o.system && !history_push(&h, "system", o.system, strlen(o.system))) rc = cli_error("out of memory");
    h.keep = h.n;
    if (tty) fputs("(/help for the commands; a line ending in \\ goes on; Ctrl-C stops a reply)\n", stderr);
    tdm_lines in = {.f = stdin, .own = false, .name = "stdin", .line_max = TDM_INPUT_LINE_MAX,
                    .total_max = TDM_INPUT_TOTAL_MAX, .stop = &g_interrupt};
    cli_edit *ed = tty ? cli_edit_open("tandem", &g_interrupt) : NULL; /* NULL: plain lines */
    char *msg = NULL; /* the lines of a message continued by '\' so far */
    size_t msg_len = 0, msg_cap = 0;
    int rc_soft = CLI_EXIT_OK;
    while (rc < 0) {
        const char *prompt = msg_len ? "... " : "> ";
        if (tty && !ed) fputs(prompt, stdout), fflush(stdout);
        const char *line;
        size_t n;
        bool got;
        tdm_err err = {0};
        tandem_status st = ed ? cli_edit_line(ed, prompt, &line, &n, &got) : tdm_lines_next(&in, &line, &n, &got, &err);
        if (st == TANDEM_ERR_IO && ed) snprintf(err.msg, sizeof err.msg, "error reading the terminal");
        if (st == TANDEM_ERR_CANCELLED) { /* Ctrl-C at the prompt */
            g_interrupt = 0;
            if (tty) fputc('\n', stdout);
            if (!msg_len) break;
            msg_len = 0;
            continue;
        }
        if (st != TANDEM_OK) {
            rc = cli_error("%s", err.msg);
            break;
        }
        if (!got) break;
        if (n > in.line_max) { /* (an edited line: tdm_lines checks its own) */
            rc = cli_error("stdin: a line longer than the %d MiB limit", TDM_INPUT_LINE_MIB);
            break;
        }
        while (n && (line[n - 1] == '\r' || line[n - 1] == ' ')) n--;
        const bool more = n && line[n - 1] == '\\';
        if (more || msg_len) { /* a part of a multi-line message */
            const size_t add = n - more + 1;
            if (msg_len + add > in.line_max) {
                rc = cli_error("stdin: a message longer than the %d MiB limit", TDM_INPUT_LINE_MIB);
                break;
            }
            if (msg_len + add > msg_cap) {
                size_t nc = msg_cap ? msg_cap : 256;
                while (nc < msg_len + add) nc *= 2;
                char *nm = realloc(msg, nc);
                if (!nm) {
                    rc = cli_error("out of memory");
                    break;
                }
                msg = nm, msg_cap = nc;
            }
            memcpy(msg + msg_len, line, n - more);
            msg_len += n - more;
            if (more) {
                msg[msg_len++] = '\n';
                continue;
            }
            line = msg, n = msg_len, msg_len = 0;
        }
        if (n == 0) continue;
        const int c = command(line, n, &h, tty);
        if (c == 1) break;
        if (c == 0) continue;
        if (!history_push(&h, "user", line, n)) {
            rc = cli_error("out of memory");
            break;
        }
        rc = turn(eng, target, tmpl, &o, &h, tty, &rc_soft);
    }
    signal(SIGINT, SIG_DFL);
    cli_edit_close(ed);
    free(msg);
    tdm_lines_close(&in);
    history_truncate(&h, 0);
    free(h.m);
    free(owned);
    tandem_engine_close(eng);
    tandem_model_close(draft);
    tandem_model_close(target);
    return rc >= 0 ? rc : rc_soft;
}
