/* bench_prompts.h - the prompt texts of a JSON-lines prompts file, for the
 * benchmark programs (one {"prompt": "..."} object per line; lines without a string
 * "prompt" are skipped).  Exits with a message on an unreadable file or bad JSON. */
#ifndef TDM_BENCH_PROMPTS_H
#define TDM_BENCH_PROMPTS_H

/* At most limit prompts; *n receives the count.  Free with bench_prompts_free. */
char **bench_prompts_read(const char *path, int limit, int *n);
void bench_prompts_free(char **prompts, int n);

#endif
