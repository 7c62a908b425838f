/* request_args.h - request fields from text, shared by the jobs and the command
 * line (src/cli) and the server (src/server): stop strings from JSON (stop_arg.c)
 * and the speculation tree setting (spec_tree_arg.c). */
#ifndef TDM_REQUEST_ARGS_H
#define TDM_REQUEST_ARGS_H

#include <stdbool.h>
#include <stddef.h>

#include "json.h"
#include "tandem.h"

#define TDM_ARG_TIMEOUT_S_MAX 1e9 /* "timeout_s", [job] timeout_s: [0, 1e9] seconds */

/* --spec-tree / [spec] tree: "off" or 0 -> *tree 0; "auto" -> TANDEM_SPEC_TREE_AUTO; a
 * node budget 1..TANDEM_SPEC_TREE_MAX; or a static shape with a comma ("4,2,2,1",
 * "4,") -> *shape = s.  False with the problem in msg[msg_len] otherwise. */
bool tdm_arg_spec_tree_from_str(const char *s, int *tree, const char **shape, char *msg, size_t msg_len);
/* tdm_arg_spec_tree_from_str with the shape copied into shape_buf[shape_cap] ("" = none);
 * a value that does not fit there is an error too. */
bool tdm_arg_spec_tree_into(const char *s, int *tree, char *shape_buf, size_t shape_cap, char *msg, size_t msg_len);
/* Stop strings: a JSON string, or an array of at most TANDEM_STOP_MAX strings, each
 * 1..TANDEM_STOP_LEN_MAX bytes without a NUL.  On success *out holds [*n] heap strings
 * (NULL for []: none; free with tdm_arg_stop_free).  Else false with why set to the
 * problem, worded to follow the value's name: " must be a string or an array of
 * strings", "[2] is longer than 256 bytes". */
bool tdm_arg_stop_from_json(const struct tdm_json *v, char ***out, int *n, char *why, size_t why_cap);
void tdm_arg_stop_free(char **stop, int n);

#endif
