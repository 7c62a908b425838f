/* line_edit.c - the line editor of `tandem chat` on a terminal (see line_edit.h).
 *
 * libedit's native interface: emacs key bindings, the history of this session (H_ENTER
 * per message line, duplicates of the last one left out).  Its characters come from
 * read_char below rather than from libedit's own read: a wait for a key polls the
 * stop flag, since SIGINT may be delivered to an engine thread and so need not
 * interrupt a read on this one.  Built only with libedit (meson: TDM_HAVE_LIBEDIT);
 * without it cli_edit_open returns NULL and chat reads plain lines. */
#include "line_edit.h"

#ifdef TDM_HAVE_LIBEDIT

#include <errno.h>
#include <histedit.h>
#include <locale.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <wchar.h>

struct cli_edit {
    EditLine *el;
    History *hist;
    const char *prompt;
    const volatile sig_atomic_t *stop;
    mbstate_t mb; /* a multibyte character's bytes read so far */
};

static char *prompt_fn(EditLine *el) {
    cli_edit *e;
    el_get(el, EL_CLIENTDATA, &e);
    return (char *)e->prompt;
}

/* One character from the terminal: 1, 0 at the end, -1 (errno EINTR) when *stop is set. */
static int read_char(EditLine *el, wchar_t *c) {
    cli_edit *e;
    el_get(el, EL_CLIENTDATA, &e);
    for (;;) {
        if (*e->stop) {
            memset(&e->mb, 0, sizeof e->mb);
            errno = EINTR;
            return -1;
        }
        struct pollfd pfd = {.fd = STDIN_FILENO, .events = POLLIN};
        int pr = poll(&pfd, 1, 100);
        if (pr < 0 && errno != EINTR) return -1;
        if (pr <= 0) continue;
        char b;
        ssize_t k = read(STDIN_FILENO, &b, 1);
        if (k == 0) return 0;
        if (k < 0) {
            if (errno == EINTR || errno == EAGAIN) continue;
            return -1;
        }
        size_t r = mbrtowc(c, &b, 1, &e->mb);
        if (r == (size_t)-2) continue; /* more bytes of this character */
        if (r == (size_t)-1) {         /* not valid in the locale: the byte as it is */
            memset(&e->mb, 0, sizeof e->mb);
            *c = (unsigned char)b;
        }
        return 1;
    }
}

cli_edit *cli_edit_open(const char *name, const volatile sig_atomic_t *stop) {
    setlocale(LC_CTYPE, ""); /* UTF-8 input as characters (the terminal's encoding) */
    cli_edit *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->stop = stop;
    e->prompt = "";
    e->el = el_init(name, stdin, stdout, stderr);
    e->hist = history_init();
    if (!e->el || !e->hist) {
        cli_edit_close(e);
        return NULL;
    }
    HistEvent ev;
    history(e->hist, &ev, H_SETSIZE, 1000);
    history(e->hist, &ev, H_SETUNIQUE, 1);
    el_set(e->el, EL_CLIENTDATA, e);
    el_set(e->el, EL_EDITOR, "emacs");
    el_set(e->el, EL_SIGNAL, 0);
    el_set(e->el, EL_PROMPT, prompt_fn);
    el_set(e->el, EL_HIST, history, e->hist);
    el_set(e->el, EL_GETCFN, read_char);
    el_source(e->el, NULL); /* the user's ~/.editrc, as other libedit programs read it */
    return e;
}

tandem_status cli_edit_line(cli_edit *e, const char *prompt, const char **line, size_t *len, bool *got) {
    *line = NULL, *len = 0, *got = false;
    e->prompt = prompt;
    int n = 0;
    const char *s = el_gets(e->el, &n);
    if (!s || n <= 0) {
        if (*e->stop) return TANDEM_ERR_CANCELLED;
        if (n < 0) return TANDEM_ERR_IO;
        return TANDEM_OK; /* the end of input (Ctrl-D) */
    }
    size_t l = (size_t)n;
    if (l && s[l - 1] == '\n') l--;
    if (l) {
        HistEvent ev;
        char *h = strndup(s, l);
        if (h) history(e->hist, &ev, H_ENTER, h);
        free(h);
    }
    *line = s, *len = l, *got = true;
    return TANDEM_OK;
}

void cli_edit_close(cli_edit *e) {
    if (!e) return;
    if (e->el) el_end(e->el);
    if (e->hist) history_end(e->hist);
    free(e);
}

#else

cli_edit *cli_edit_open(const char *name, const volatile sig_atomic_t *stop) {
    (void)name, (void)stop;
    return NULL;
}
tandem_status cli_edit_line(cli_edit *e, const char *prompt, const char **line, size_t *len, bool *got) {
    (void)e, (void)prompt, (void)line, (void)len, (void)got;
    return TANDEM_ERR_UNSUPPORTED;
}
void cli_edit_close(cli_edit *e) {
    (void)e;
}

#endif
