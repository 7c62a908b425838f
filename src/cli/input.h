/* input.h - reading untrusted input within stated size limits.
 *
 * Every reader of input that tandem does not control (prompt files, standard input,
 * job inputs, request bodies) bounds what it reads by these limits, so that no
 * input makes it read or allocate without end (/dev/zero, a file with no newline),
 * and reports a breach with the input's name and the limit:
 *   "prompts.jsonl:7: line longer than the 1 MiB limit"
 *   "stdin: input larger than the 64 MiB limit"
 * Regular files, pipes and devices are read alike; a directory is refused.  Files
 * larger than the limit are refused from their size, before any read.
 */
#ifndef TDM_INPUT_H
#define TDM_INPUT_H

#include <signal.h>
#include <stdio.h>

#include "common.h"

/* One line (record) of a JSON-lines input, without its newline: 1 MiB. */
#define TDM_INPUT_LINE_MIB 1
#define TDM_INPUT_LINE_MAX ((size_t)TDM_INPUT_LINE_MIB << 20)
/* One whole input (a file, standard input, a body): 64 MiB. */
#define TDM_INPUT_TOTAL_MIB 64
#define TDM_INPUT_TOTAL_MAX ((size_t)TDM_INPUT_TOTAL_MIB << 20)

/* Reads all of f (called name in messages) into a NUL-terminated heap buffer *out
 * of *out_len <= max bytes (it may hold NUL bytes).  Over max: TANDEM_ERR_INVALID_ARG,
 * "NAME: input larger than the N MiB limit".  Does not close f. */
tandem_status tdm_input_read_all(FILE *f, const char *name, size_t max, char **out, size_t *out_len,
                                 tdm_err *err);

/* A line reader: lines of at most line_max bytes, total_max bytes in all. */
typedef struct tdm_lines {
    FILE *f;
    bool own;              /* opened by tdm_lines_open: closed by tdm_lines_close */
    const char *name;      /* for messages (borrowed) */
    size_t line_max, total_max;
    char *buf;             /* [cap] bytes; [start, end) not yet returned */
    size_t cap, start, end;
    size_t total;          /* bytes read from f so far */
    int line;              /* the number of the line last returned (1-based) */
    bool eof;
    int mode;              /* 0 until the first read; then 1: a regular file, read in large
                              blocks through f; 2: a terminal, pipe or socket, read with
                              read(2) on f's descriptor, which returns what has arrived, so
                              a line is returned as soon as it is there (f's stdio buffer
                              must be unused: nothing read f before the reader) */
    const volatile sig_atomic_t *stop; /* optional: while mode 2 waits for input, a nonzero
                              *stop (set by a signal handler) ends the wait with
                              TANDEM_ERR_CANCELLED; the pending bytes stay */
} tdm_lines;

/* Opens path for reading as lines (path is also the name in messages and must outlive
 * the reader).  TANDEM_ERR_IO when it cannot be opened or is a directory,
 * TANDEM_ERR_INVALID_ARG when a regular file is larger than total_max. */
tandem_status tdm_lines_open(tdm_lines *r, const char *path, size_t line_max, size_t total_max, tdm_err *err);
/* The next line, without its '\n' (a last line without one counts): *line points
 * into the reader's buffer, valid until the next call; *got is false at the end.
 * TANDEM_ERR_INVALID_ARG for a line or an input over its limit, naming the line.
 * On a terminal or a pipe it returns each line when its newline arrives. */
tandem_status tdm_lines_next(tdm_lines *r, const char **line, size_t *len, bool *got, tdm_err *err);
void tdm_lines_close(tdm_lines *r);

#endif
