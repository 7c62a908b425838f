/* fuzz_chat_template.c - libFuzzer harness for the chat template engine (src/jinja/;
 * not built by default; scripts/fuzz.sh builds and runs it).
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE -Iinclude -Isrc \
 *       tests/fuzz/fuzz_chat_template.c src/jinja/[a-z]*.c src/base/json.c src/base/unicode.c \
 *       src/base/unicode_data.c src/base/common.c -lm -o fuzz_chat_template
 *   ./fuzz_chat_template -max_len=8192 corpus_chat/ tests/data/chat/
 *
 * The input is a template (any bytes; the seeds are the real templates of
 * tests/data/chat); its first byte picks one of a few conversations and the
 * add_generation_prompt flag.  It is parsed and rendered under small limits.
 * Checks (abort() on a violation, so the fuzzer reports it):
 *   - parse and render each either succeed or fail with a status and a non-empty
 *     message; a failed parse or render leaves no output;
 *   - a rendered text is NUL-terminated at its length and within the output limit;
 *   - rendering the same parse twice gives the same text (no hidden state).
 * Crashes, leaks, undefined behaviour and timeouts are what the sanitizers and
 * libFuzzer itself look for: a hostile template must hit a limit, not the machine. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/jinja.h"
#include "json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const conversations[] = {
    "[{\"role\": \"user\", \"content\": \"Hello!\"}]",
    "[{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hi {{ x }}\"}, "
    "{\"role\": \"assistant\", \"content\": \" <think>a</think>b \"}, {\"role\": \"user\", \"content\": \"\\u00e9\\u65e5\"}]",
    "[{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": "
    "[{\"id\": \"call_123456789\", \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1}}}]}, "
    "{\"role\": \"tool\", \"content\": \"{\\\"r\\\": 2.5}\", \"tool_call_id\": \"call_123456789\"}]",
    "[]",
};

static bool render(const tdm_jinja *t, const tdm_jinja_var *vars, size_t n, const tdm_jinja_limits *lim, char **out,
                   size_t *len) {
    tdm_err err = {0};
    tandem_status st = tdm_jinja_render(t, vars, n, lim, out, len, &err);
    if (st != TANDEM_OK) {
        if (err.msg[0] == 0 || *out) abort();
        return false;
    }
    if (!*out || (*out)[*len] != 0 || *len > lim->max_output) abort();
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const uint8_t pick = data[0];
    tdm_err err = {0};
    tdm_jinja *t = NULL;
    tandem_status st = tdm_jinja_parse((const char *)data + 1, size - 1, &t, &err);
    if (st != TANDEM_OK) {
        if (err.msg[0] == 0 || t) abort();
        return 0;
    }
    const char *conv = conversations[pick % (sizeof conversations / sizeof *conversations)];
    tdm_json *msgs = NULL, *agp = NULL;
    if (tdm_json_parse(conv, strlen(conv), &msgs, &err) != TANDEM_OK) abort();
    if (tdm_json_parse(pick & 0x80 ? "true" : "false", pick & 0x80 ? 4 : 5, &agp, &err) != TANDEM_OK) abort();
    tdm_jinja_var vars[] = {
        {.name = "messages", .json = msgs}, {.name = "add_generation_prompt", .json = agp},
        {.name = "bos_token", .str = "<s>"}, {.name = "eos_token", .str = "</s>"},
        {.name = "tools"}, {.name = "documents"},
    };
    tdm_jinja_limits lim = tdm_jinja_default_limits();
    lim.max_output = 1 << 16;
    lim.max_memory = 16 << 20;
    lim.max_steps = 200000;
    lim.now = 1739145600;
    char *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    bool ok_a = render(t, vars, sizeof vars / sizeof *vars, &lim, &a, &na);
    bool ok_b = render(t, vars, sizeof vars / sizeof *vars, &lim, &b, &nb);
    if (ok_a != ok_b || (ok_a && (na != nb || memcmp(a, b, na) != 0))) abort();
    free(a);
    free(b);
    tdm_json_free(msgs);
    tdm_json_free(agp);
    tdm_jinja_free(t);
    return 0;
}
