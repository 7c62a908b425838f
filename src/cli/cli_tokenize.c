/* cli_tokenize.c - `tandem tokenize`: prints the token ids of a text (from --text or
 * all of stdin, at most TDM_INPUT_TOTAL_MAX bytes) as a JSON array on one line. */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "input.h"

int cli_tokenize(int argc, char **argv) {
    const char *model_path = NULL, *text = NULL;
    bool add_bos = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        bool missing = false;
        if (cli_is_help(a)) {
            cli_usage(stdout);
            return CLI_EXIT_OK;
        }
#define TAKE(s, l) cli_take(argc, argv, &i, (s), (l), &v, &missing)
        if (cli_opt_flag(a, NULL, "--no-bos")) add_bos = false;
        else if (TAKE("-m", "--model")) model_path = v;
        else if (TAKE(NULL, "--text")) text = v;
        else return cli_unknown_arg(a);
#undef TAKE
        if (missing) return CLI_EXIT_USAGE;
    }
    if (!model_path) return cli_usage_error("missing required option -m MODEL");

    char *buf = NULL;
    size_t len = 0;
    if (text) {
        len = strlen(text);
    } else {
        tdm_err err = {0};
        if (tdm_input_read_all(stdin, "stdin", TDM_INPUT_TOTAL_MAX, &buf, &len, &err) != TANDEM_OK)
            return cli_error("%s", err.msg);
        text = buf;
    }

    int rc = CLI_EXIT_OK;
    tandem_tokenizer *tok = NULL; /* a vocabulary-only GGUF is enough */
    int32_t *ids = NULL;
    size_t n = 0;
    tandem_status s = tandem_tokenizer_open(model_path, &tok);
    if (s == TANDEM_OK) s = tandem_tokenizer_encode(tok, text, len, add_bos, &ids, &n);
    if (s != TANDEM_OK) {
        rc = cli_status_error(s, NULL);
    } else {
        fputc('[', stdout);
        for (size_t i = 0; i < n; i++) printf(i ? ", %d" : "%d", (int)ids[i]);
        fputs("]\n", stdout);
    }
    tandem_free(ids);
    tandem_tokenizer_close(tok);
    free(buf);
    return rc;
}
