/* spec_tree_arg.c - the value of --spec-tree and of a job file's [spec] tree:
 * "off" / "0", "auto", a node budget, or a static shape (branching factors with
 * commas).  Its own file so that the job-file parser (and its fuzz harness) links
 * it without the command-line program. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "request_args.h"
#include "tree.h"

bool tdm_arg_spec_tree_from_str(const char *s, int *tree, const char **shape, char *msg, size_t msg_len) {
    *shape = NULL;
    if (!strcmp(s, "off") || !strcmp(s, "0")) {
        *tree = 0;
        return true;
    }
    if (!strcmp(s, "auto")) {
        *tree = TANDEM_SPEC_TREE_AUTO;
        return true;
    }
    if (strchr(s, ',')) {
        tdm_tree_cfg c;
        tdm_err err = {0};
        if (!tdm_tree_cfg_parse_shape(s, &c, &err)) {
            snprintf(msg, msg_len, "%s", err.msg);
            return false;
        }
        *tree = c.budget;
        *shape = s;
        return true;
    }
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < 1 || v > TANDEM_SPEC_TREE_MAX) {
        snprintf(msg, msg_len,
                 "'%s' is not off, auto, a node budget 1..%d or a static shape (branching factors with commas, "
                 "e.g. 4,2,2,1)",
                 s, TANDEM_SPEC_TREE_MAX);
        return false;
    }
    *tree = (int)v;
    return true;
}

bool tdm_arg_spec_tree_into(const char *s, int *tree, char *shape_buf, size_t shape_cap, char *msg, size_t msg_len) {
    const char *shape;
    if (strlen(s) >= shape_cap) {
        snprintf(msg, msg_len, "'%.40s...' is too long", s);
        return false;
    }
    if (!tdm_arg_spec_tree_from_str(s, tree, &shape, msg, msg_len)) return false;
    snprintf(shape_buf, shape_cap, "%s", shape ? shape : "");
    return true;
}
