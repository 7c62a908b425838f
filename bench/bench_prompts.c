/* bench_prompts.c - see bench_prompts.h. */
#include "bench_prompts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "json.h"

static void fail(const char *path, const char *msg) {
    fprintf(stderr, "error: %s: %s\n", path, msg);
    exit(1);
}

char **bench_prompts_read(const char *path, int limit, int *n) {
    char *text;
    size_t len;
    tdm_err err = {0};
    if (tdm_read_file(path, &text, &len, &err)) fail(path, err.msg);
    char **prompts = NULL;
    *n = 0;
    for (char *line = strtok(text, "\n"); line && *n < limit; line = strtok(NULL, "\n")) {
        tdm_json *j;
        if (tdm_json_parse(line, strlen(line), &j, &err)) fail(path, err.msg);
        const tdm_json *p = tdm_json_get(j, "prompt");
        if (p && p->type == TDM_JSON_STRING) {
            char **np = realloc(prompts, (size_t)(*n + 1) * sizeof *np);
            char *s = strdup(p->str);
            if (!np || !s) fail(path, "out of memory");
            prompts = np;
            prompts[(*n)++] = s;
        }
        tdm_json_free(j);
    }
    free(text);
    return prompts;
}

void bench_prompts_free(char **prompts, int n) {
    for (int i = 0; i < n; i++) free(prompts[i]);
    free(prompts);
}
