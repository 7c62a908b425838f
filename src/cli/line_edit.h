/* line_edit.h - line editing and history for `tandem chat` on a terminal (libedit).
 *
 * Built with libedit when meson finds it; otherwise cli_edit_open returns NULL and
 * the caller reads plain lines (input.h). */
#ifndef TDM_CLI_LINE_EDIT_H
#define TDM_CLI_LINE_EDIT_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>

#include "tandem.h"

typedef struct cli_edit cli_edit;

/* An editor of stdin's lines on stdout, or NULL (no libedit, or it failed): the caller
 * reads plain lines.  A nonzero *stop (set by a signal handler) ends a wait for input. */
cli_edit *cli_edit_open(const char *name, const volatile sig_atomic_t *stop);
/* Shows prompt and reads one edited line: *line (without its '\n', valid until the
 * next call) and *len, *got false at the end of input (Ctrl-D); the line joins the
 * history.  TANDEM_ERR_CANCELLED when *stop was set, TANDEM_ERR_IO on a read error. */
tandem_status cli_edit_line(cli_edit *e, const char *prompt, const char **line, size_t *len, bool *got);
void cli_edit_close(cli_edit *e);

#endif
