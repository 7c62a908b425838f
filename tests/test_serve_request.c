/* test_serve_request.c - `tandem serve`'s request parser and validator (every bad
 * input it refuses, with its status, member and message), the context check, the
 * answers' JSON and server-sent events, and the metrics text; tools: an agent's
 * history and tools rendered by real templates, tool calls answered whole and streamed. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "json.h"
#include "metrics.h"
#include "oai_request.h"
#include "oai_response.h"
#include "testutil.h"

static oai_limits limits(bool draft) {
    oai_limits l = {.model_id = "pycode", .n_ctx = 1024, .n_vocab = 8192, .has_draft = draft};
    l.defaults = tandem_generate_default_params();
    return l;
}

static bool parse(oai_kind k, const char *body, const oai_limits *l, oai_request *r, oai_error *e) {
    return oai_request_parse(k, body, strlen(body), l, r, e);
}

Test(serve_request, completion_members) {
    oai_limits l = limits(true);
    oai_request r;
    oai_error e;
    cr_assert(parse(OAI_COMPLETION,
                    "{\"model\": \"pycode\", \"prompt\": \"def f():\", \"max_tokens\": 16, \"temperature\": 0.5, "
                    "\"top_p\": 0.9, \"top_k\": 40, \"min_p\": 0.05, \"seed\": -1, \"stop\": [\"\\n\\n\", \"def \"], "
                    "\"n\": 1, \"stream\": true, \"stream_options\": {\"include_usage\": true}, \"priority\": 3, "
                    "\"timeout_s\": 2.5, \"spec_k\": 4, \"spec_tree\": \"off\", \"user\": \"ignored\", "
                    "\"logprobs\": null, \"echo\": false, \"best_of\": 1, \"presence_penalty\": 0}",
                    &l, &r, &e),
              "%s", e.message);
    cr_expect_str_eq(r.prompt, "def f():");
    cr_expect_eq(r.prompt_len, 8);
    cr_expect(r.has_max_tokens && r.params.max_tokens == 16);
    cr_expect_float_eq(r.params.temperature, 0.5f, 1e-6);
    cr_expect_float_eq(r.params.top_p, 0.9f, 1e-6);
    cr_expect_eq(r.params.top_k, 40);
    cr_expect_float_eq(r.params.min_p, 0.05f, 1e-6);
    cr_expect_eq(r.params.seed, UINT64_MAX);
    cr_assert_eq(r.params.n_stop, 2);
    cr_expect_str_eq(r.params.stop[1], "def ");
    cr_expect(r.stream && r.include_usage);
    cr_expect_eq(r.priority, 3);
    cr_expect_float_eq(r.timeout_ms, 2500.0, 1e-9);
    cr_expect_eq(r.params.spec_k, 4);
    oai_request_free(&r);

    /* defaults; a prompt as an array of one string or of token ids; model absent */
    cr_assert(parse(OAI_COMPLETION, "{\"prompt\": [\"x\"]}", &l, &r, &e), "%s", e.message);
    cr_expect_str_eq(r.prompt, "x");
    cr_expect(!r.has_max_tokens && !r.stream && r.params.n_stop == 0 && r.timeout_ms == 0);
    oai_request_free(&r);
    cr_assert(parse(OAI_COMPLETION, "{\"prompt\": [0, 5, 8191], \"top_k\": -1, \"stop\": null}", &l, &r, &e), "%s",
              e.message);
    cr_expect(r.n_prompt_ids == 3 && r.prompt_ids[2] == 8191 && !r.prompt);
    cr_expect_eq(r.params.top_k, 0);
    oai_request_free(&r);
}

/* seed: the API's uint64 whole (a negative one taken modulo 2^64, as before) */
Test(serve_request, seed_range) {
    oai_limits l = limits(false);
    oai_request r;
    oai_error e;
    const struct {
        const char *body;
        uint64_t seed;
    } ok[] = {
        {"{\"prompt\": \"x\", \"seed\": 9223372036854775807}", 9223372036854775807ull},
        {"{\"prompt\": \"x\", \"seed\": 9223372036854775808}", 9223372036854775808ull},
        {"{\"prompt\": \"x\", \"seed\": 18446744073709551615}", UINT64_MAX},
        {"{\"prompt\": \"x\", \"seed\": 1.8446744073709551615e19}", UINT64_MAX},
        {"{\"prompt\": \"x\", \"seed\": -9223372036854775808}", 9223372036854775808ull},
        {"{\"prompt\": \"x\", \"seed\": 0}", 0},
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        cr_assert(parse(OAI_COMPLETION, ok[i].body, &l, &r, &e), "%s: %s", ok[i].body, e.message);
        cr_expect_eq(r.params.seed, ok[i].seed, "%s: %llu", ok[i].body, (unsigned long long)r.params.seed);
        oai_request_free(&r);
    }
}

Test(serve_request, chat_members) {
    oai_limits l = limits(false);
    oai_request r;
    oai_error e;
    cr_assert(parse(OAI_CHAT,
                    "{\"model\": \"pycode\", \"messages\": [{\"role\": \"system\", \"content\": \"be brief\"}, "
                    "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, {\"type\": \"text\", "
                    "\"text\": \"b\"}]}, {\"role\": \"assistant\", \"content\": null}], \"max_completion_tokens\": 5}",
                    &l, &r, &e),
              "%s", e.message);
    cr_assert_eq(r.n_messages, 3);
    cr_expect_str_eq(r.messages[0].role, "system");
    cr_expect_str_eq(r.messages[1].content, "ab");
    cr_expect_null(r.messages[2].content);
    cr_expect(r.has_max_tokens && r.params.max_tokens == 5);
    oai_request_free(&r);
}

Test(serve_request, timeout_shortens_only) {
    oai_limits l = limits(false);
    l.timeout_s = 10;
    oai_request r;
    oai_error e;
    cr_assert(parse(OAI_COMPLETION, "{\"prompt\": \"x\"}", &l, &r, &e));
    cr_expect_float_eq(r.timeout_ms, 10000.0, 1e-9);
    oai_request_free(&r);
    cr_assert(parse(OAI_COMPLETION, "{\"prompt\": \"x\", \"timeout_s\": 60}", &l, &r, &e));
    cr_expect_float_eq(r.timeout_ms, 10000.0, 1e-9);
    oai_request_free(&r);
    cr_assert(parse(OAI_COMPLETION, "{\"prompt\": \"x\", \"timeout_s\": 0.5}", &l, &r, &e));
    cr_expect_float_eq(r.timeout_ms, 500.0, 1e-9);
    oai_request_free(&r);
}

/* Every refused input: the status, the member named and a piece of the message. */
typedef struct bad_case {
    oai_kind kind;
    const char *body;
    int status;
    const char *param; /* "" = none */
    const char *msg;
} bad_case;

static const bad_case bad_cases[] = {
    {OAI_COMPLETION, "", 400, "", "not valid JSON"},
    {OAI_COMPLETION, "{\"prompt\": \"x\"", 400, "", "not valid JSON"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"prompt\": \"y\"}", 400, "", "not valid JSON"},
    {OAI_COMPLETION, "[1, 2]", 400, "", "must be a JSON object, not an array"},
    {OAI_COMPLETION, "\"x\"", 400, "", "must be a JSON object, not a string"},
    {OAI_COMPLETION, "{}", 400, "prompt", "'prompt' is required"},
    {OAI_COMPLETION, "{\"prompt\": null}", 400, "prompt", "'prompt' is required"},
    {OAI_COMPLETION, "{\"prompt\": \"\"}", 400, "prompt", "'prompt' is empty"},
    {OAI_COMPLETION, "{\"prompt\": []}", 400, "prompt", "'prompt' is empty"},
    {OAI_COMPLETION, "{\"prompt\": 5}", 400, "prompt", "must be a string or an array of token ids, not a number"},
    {OAI_COMPLETION, "{\"prompt\": [\"a\", \"b\"]}", 400, "prompt", "holds 2 prompts"},
    {OAI_COMPLETION, "{\"prompt\": [[1, 2]]}", 400, "prompt", "holds 1 prompts"},
    {OAI_COMPLETION, "{\"prompt\": [1, 8192]}", 400, "prompt", "'prompt'[1] is not a token id in [0, 8192)"},
    {OAI_COMPLETION, "{\"prompt\": [1, -1]}", 400, "prompt", "'prompt'[1] is not a token id"},
    {OAI_COMPLETION, "{\"prompt\": [1.5]}", 400, "prompt", "'prompt'[0] is not a token id"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"model\": \"gpt-4\"}", 404, "model", "The model 'gpt-4' does not exist"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"model\": 7}", 400, "model", "'model' must be a string, not a number"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"max_tokens\": \"16\"}", 400, "max_tokens", "must be an integer, not a string"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"max_tokens\": 1.5}", 400, "max_tokens", "must be an integer, not 1.5"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"max_tokens\": 0}", 400, "max_tokens", "is 0, out of range [1, 1023]"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"max_tokens\": -3}", 400, "max_tokens", "out of range [1, 1023]"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"max_tokens\": 1024}", 400, "max_tokens", "is 1024, out of range [1, 1023]"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"max_tokens\": 1e30}", 400, "max_tokens", "must be an integer"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"temperature\": \"hot\"}", 400, "temperature", "must be a number, not a string"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"temperature\": -0.1}", 400, "temperature", "out of range [0, 1e+06]"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"top_p\": 0}", 400, "top_p", "out of range (0, 1]"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"top_p\": 1.01}", 400, "top_p", "out of range (0, 1]"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"top_p\": 1e-320}", 400, "top_p", "is 1e-320, out of range (0, 1]"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"min_p\": 2}", 400, "min_p", "out of range [0, 1]"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"top_k\": -2}", 400, "top_k", "out of range [-1,"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"top_k\": true}", 400, "top_k", "must be an integer, not a boolean"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"seed\": \"1\"}", 400, "seed", "must be an integer, not a string"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"seed\": 1e100}", 400, "seed",
     "'seed' must be an integer in [-9223372036854775808, 18446744073709551615], not 1e100"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"seed\": 18446744073709551616}", 400, "seed",
     "'seed' must be an integer in [-9223372036854775808, 18446744073709551615], not 18446744073709551616"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"seed\": -9223372036854775809}", 400, "seed", "in [-9223372036854775808,"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"n\": 17}", 400, "n", "'n' is 17, out of range [1, 16]"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"ignore_eos\": 1}", 400, "ignore_eos", "must be a boolean, not a number"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"stream\": true, \"stream_options\": {\"continuous_usage_stats\": true}}", 400,
     "stream_options", "'stream_options.continuous_usage_stats' is not supported by this server"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"n\": 0}", 400, "n", "out of range [1,"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"stop\": 3}", 400, "stop", "'stop' must be a string or an array of strings"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"stop\": [\"\"]}", 400, "stop", "'stop'[0]"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"stop\": [1]}", 400, "stop", "'stop'[0]"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"stop\": [\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\",\"j\",\"k\",\"l\",\"m\",\"n\",\"o\",\"p\",\"q\"]}",
     400, "stop", "17 strings, more than 16"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"stream\": \"yes\"}", 400, "stream", "must be a boolean, not a string"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"stream_options\": {\"include_usage\": true}}", 400, "stream_options",
     "only allowed with 'stream': true"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"stream\": true, \"stream_options\": 1}", 400, "stream_options",
     "must be an object"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"stream\": true, \"stream_options\": {\"include_usage\": 1}}", 400,
     "stream_options.include_usage", "must be a boolean"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"priority\": 1.5}", 400, "priority", "must be an integer"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"priority\": 3000000000}", 400, "priority", "out of range"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"timeout_s\": -1}", 400, "timeout_s", "out of range [0, 1e+09]"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"timeout_s\": \"1\"}", 400, "timeout_s", "must be a number"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"spec_k\": 33}", 400, "spec_k", "out of range [0, 32]"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"spec_tree\": \"2x3\"}", 400, "spec_tree", "is not off, auto, a node budget"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"spec_tree\": {\"width\": 2}}", 400, "spec_tree", "not an object"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"spec_tree\": 65}", 400, "spec_tree", "an integer in [1, 64]"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"spec_tree\": 2.5}", 400, "spec_tree", "an integer in [1, 64]"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"spec_tree\": \"4,0\"}", 400, "spec_tree", "'spec_tree': "},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"spec_tree\": \"16,16,16\"}", 400, "spec_tree", "'spec_tree': "},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"logprobs\": 21}", 400, "logprobs", "out of range [0, 20]"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"logprobs\": true}", 400, "logprobs", "must be an integer"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"top_logprobs\": 2}", 400, "top_logprobs", "'logprobs': N"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_logprobs\": 2}", 400, "top_logprobs",
     "needs 'logprobs': true"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logprobs\": true, \"top_logprobs\": 21}", 400,
     "top_logprobs", "out of range [0, 20]"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logprobs\": 1}", 400, "logprobs",
     "must be a boolean"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"echo\": true}", 400, "echo", "not supported"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"best_of\": 2}", 400, "best_of", "not supported"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"suffix\": \"y\"}", 400, "suffix", "not supported"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"presence_penalty\": 2.5}", 400, "presence_penalty", "out of range [-2, 2]"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"frequency_penalty\": -3}", 400, "frequency_penalty", "out of range [-2, 2]"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"frequency_penalty\": \"1\"}", 400, "frequency_penalty", "must be a number"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"repetition_penalty\": 0}", 400, "repetition_penalty", "out of range (0, 100]"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"repeat_penalty\": 101}", 400, "repeat_penalty", "out of range (0, 100]"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"repetition_penalty\": 1.1, \"repeat_penalty\": 1.2}", 400, "repeat_penalty",
     "give one of"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"min_tokens\": -1}", 400, "min_tokens", "out of range"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"min_tokens\": 9, \"max_tokens\": 8}", 400, "min_tokens", "more than 'max_tokens' 8"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"logit_bias\": {\"abc\": 1}}", 400, "logit_bias", "not a token id"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"logit_bias\": {\"99999999\": 1}}", 400, "logit_bias", "not a token id"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"logit_bias\": {\"5\": 101}}", 400, "logit_bias", "in [-100, 100]"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"logit_bias\": {\"5\": \"1\"}}", 400, "logit_bias", "in [-100, 100]"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"logit_bias\": [5]}", 400, "logit_bias", "must be an object"},
    {OAI_CHAT, "{}", 400, "messages", "'messages' is required"},
    {OAI_CHAT, "{\"messages\": []}", 400, "messages", "'messages' is empty"},
    {OAI_CHAT, "{\"messages\": \"hi\"}", 400, "messages", "must be an array of messages, not a string"},
    {OAI_CHAT, "{\"messages\": [1]}", 400, "messages", "'messages'[0] must be an object, not a number"},
    {OAI_CHAT, "{\"messages\": [{\"content\": \"x\"}]}", 400, "messages", "'messages'[0].role must be a non-empty string"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"\", \"content\": \"x\"}]}", 400, "messages", "non-empty string"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", 400, "messages",
     "'messages'[0].content must be a string, null or an array of text parts, not a number"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}", 400, "messages",
     "'messages'[0].content[0] is not a text part"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\\u0000b\"}]}", 400, "messages", "NUL"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": \"function\"}]}", 400, "tools", "'tools'[0].function must be an object"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": {}}", 400, "tools", "'tools' must be an array, not an object"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": \"code_interpreter\"}]}", 400, "tools", "'tools'[0].type must be \"function\""},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a b\"}}]}", 400, "tools", "'tools'[0].function.name must be 1 to 64"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}, {\"type\": \"function\", \"function\": {\"name\": \"f\"}}]}", 400, "tools", "'tools'[1].function.name 'f' is given twice"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": []}}]}", 400, "tools", "'tools'[0].function.parameters must be an object"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": 1}}]}", 400, "tools", "description must be a string"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"strict\": true}}]}", 400, "tools", "strict: true needs tool_choice \"required\" or a named function"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"g\"}}}", 400, "tool_choice", "names 'g', which is not among 'tools'"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], \"tool_choice\": {\"type\": \"function\"}}", 400, "tool_choice", "must be {\"type\": \"function\", \"function\": {\"name\": ...}}"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"strict\": true}}], \"tool_choice\": \"none\"}", 400, "tools", "with \"none\" the arguments would not be enforced"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tool_choice\": \"required\"}", 400, "tool_choice", "\"required\" needs 'tools'"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], \"tool_choice\": \"always\"}", 400, "tool_choice", "'tool_choice' must be \"none\", \"auto\""},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], \"parallel_tool_calls\": 1}", 400, "parallel_tool_calls", "must be a boolean, not a number"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"functions\": [{\"name\": \"f\"}]}", 400, "functions", "deprecated by OpenAI"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"function_call\": \"auto\"}", 400, "function_call", "use 'tools' and 'tool_choice'"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"assistant\", \"content\": null, \"tool_calls\": {}}]}", 400, "messages", "'messages'[0].tool_calls must be an array, not an object"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"c\", \"type\": \"function\"}]}]}", 400, "messages", "'messages'[0].tool_calls[0].function must be an object"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": [{\"id\": 3, \"function\": {\"name\": \"f\"}}]}]}", 400, "messages", "'messages'[0].tool_calls[0].id must be a string"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": [{\"type\": \"x\", \"function\": {\"name\": \"f\"}}]}]}", 400, "messages", "'messages'[0].tool_calls[0].type must be \"function\""},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"name\": \"\"}}]}]}", 400, "messages", "'messages'[0].tool_calls[0].function.name must be a non-empty string"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": \"{x\"}}]}]}", 400, "messages", "'messages'[0].tool_calls[0].function.arguments is not the text of a JSON object"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": 5}}]}]}", 400, "messages", "arguments must be a string, not a number"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"tool\", \"content\": \"1\", \"tool_call_id\": 7}]}", 400, "messages", "'messages'[0].tool_call_id must be a string, not a number"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"1\", \"name\": [\"a\"]}]}", 400, "messages", "'messages'[0].name must be a string, not an array"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"assistant\", \"content\": \"1\", \"reasoning_content\": {}}]}", 400, "messages", "'messages'[0].reasoning_content must be a string"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"tools\": [1]}", 400, "tools", "not supported"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": {\"type\": \"xml\"}}",
     400, "response_format", "not \"xml\""},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": \"json\"}", 400,
     "response_format", "must be an object"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": {\"type\": \"json_schema\"}}",
     400, "response_format", "'response_format.json_schema' must be an object"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"schema\": {}}}}",
     400, "response_format", "name' is required"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"a b\"}}}",
     400, "response_format", "name' must be 1 to 64"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"a\", \"strict\": 1}}}",
     400, "response_format", "strict' must be a boolean"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"a\", \"schema\": [1]}}}",
     400, "response_format", "schema' must be an object"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": {\"type\": \"json_object\"}, \"grammar\": \"root ::= \\\"a\\\"\"}",
     400, "grammar", "give one of 'response_format', 'grammar' and 'json_schema'"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"grammar\": \"root ::= \\\"a\\\"\", \"json_schema\": {}}", 400, "json_schema",
     "give one of"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"grammar\": 1}", 400, "grammar", "must be a string of GBNF text"},
    {OAI_COMPLETION, "{\"prompt\": \"x\", \"json_schema\": \"{}\"}", 400, "json_schema", "must be an object"},
    {OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_completion_tokens\": 0}", 400,
     "max_completion_tokens", "out of range"},
};

Test(serve_request, bad_inputs) {
    oai_limits l = limits(true);
    for (size_t i = 0; i < sizeof bad_cases / sizeof *bad_cases; i++) {
        const bad_case *c = &bad_cases[i];
        oai_request r;
        oai_error e;
        cr_assert_not(parse(c->kind, c->body, &l, &r, &e), "case %zu (%s) was accepted", i, c->body);
        cr_expect_eq(e.status, c->status, "case %zu (%s): status %d", i, c->body, e.status);
        cr_expect_str_eq(e.param, c->param, "case %zu (%s): param '%s'", i, c->body, e.param);
        cr_expect(strstr(e.message, c->msg) != NULL, "case %zu (%s): message '%s' lacks '%s'", i, c->body, e.message,
                  c->msg);
        cr_expect(e.type != NULL);
        cr_expect(r.prompt == NULL && r.messages == NULL && r.stop == NULL, "case %zu: not freed", i);
    }
}

/* spec_tree: off, auto, a budget (a number or its digits) or a static shape. */
Test(serve_request, spec_tree_values) {
    oai_limits l = limits(true);
    static const struct {
        const char *v;
        int tree;
        const char *shape;
    } cases[] = {{"null", 0, NULL},   {"false", 0, NULL},       {"\"off\"", 0, NULL}, {"0", 0, NULL},
                 {"true", TANDEM_SPEC_TREE_AUTO, NULL}, {"\"auto\"", TANDEM_SPEC_TREE_AUTO, NULL},
                 {"16", 16, NULL},    {"\"32\"", 32, NULL},       {"\"4,2,2,1\"", 0, "4,2,2,1"}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char body[128];
        snprintf(body, sizeof body, "{\"prompt\": \"x\", \"spec_tree\": %s}", cases[i].v);
        oai_request r;
        oai_error e;
        cr_assert(parse(OAI_COMPLETION, body, &l, &r, &e), "%s: %s", body, e.message);
        cr_expect_eq(r.params.spec_tree, cases[i].tree, "%s: spec_tree %d", body, r.params.spec_tree);
        if (cases[i].shape) cr_expect_str_eq(r.params.spec_tree_shape, cases[i].shape, "%s", body);
        else cr_expect_null(r.params.spec_tree_shape, "%s", body);
        oai_request_free(&r);
    }
    /* without a draft: off is fine, a tree is refused */
    l = limits(false);
    oai_request r;
    oai_error e;
    cr_assert(parse(OAI_COMPLETION, "{\"prompt\": \"x\", \"spec_tree\": \"off\"}", &l, &r, &e));
    oai_request_free(&r);
    cr_assert_not(parse(OAI_COMPLETION, "{\"prompt\": \"x\", \"spec_tree\": 8}", &l, &r, &e));
    cr_expect_eq(e.status, 400);
    cr_expect_str_eq(e.param, "spec_tree");
    cr_expect(strstr(e.message, "without a draft model"));
}

Test(serve_request, spec_k_needs_a_draft) {
    oai_limits l = limits(false);
    oai_request r;
    oai_error e;
    cr_assert_not(parse(OAI_COMPLETION, "{\"prompt\": \"x\", \"spec_k\": 4}", &l, &r, &e));
    cr_expect_eq(e.status, 400);
    cr_expect(strstr(e.message, "without a draft model"));
}

Test(serve_request, context) {
    oai_limits l = limits(false);
    oai_request r;
    oai_error e;
    cr_assert(parse(OAI_COMPLETION, "{\"prompt\": \"x\", \"max_tokens\": 100}", &l, &r, &e));
    cr_expect(oai_fit_context(&r, 924, &l, &e));
    cr_expect_not(oai_fit_context(&r, 925, &l, &e));
    cr_expect_eq(e.status, 400);
    cr_expect_str_eq(e.code, "context_length_exceeded");
    cr_expect(strstr(e.message, "maximum context length is 1024 tokens. However, you requested 1025 tokens (925 in "
                                "the prompt, 100 in the completion)"), "%s", e.message);
    cr_expect_not(oai_fit_context(&r, 1024, &l, &e));
    cr_expect(strstr(e.message, "your prompt is 1024 tokens"), "%s", e.message);
    oai_request_free(&r);
    /* a default max_tokens is cut to the room left */
    cr_assert(parse(OAI_COMPLETION, "{\"prompt\": \"x\"}", &l, &r, &e));
    cr_expect(oai_fit_context(&r, 1000, &l, &e));
    cr_expect_eq(r.params.max_tokens, 24);
    oai_request_free(&r);
}

static tdm_json *json_of(const char *text, size_t len) {
    tdm_json *j = NULL;
    tdm_err err = {0};
    cr_assert_eq(tdm_json_parse(text, len, &j, &err), TANDEM_OK, "%s: %s", text, err.msg);
    return j;
}

static tandem_result result(const char *text, tandem_finish_reason fr) {
    tandem_result r = {0};
    r.text = (char *)text;
    r.n_tokens = 3;
    r.n_prompt_tokens = 7;
    r.finish_reason = fr;
    r.spec.steps = 2, r.spec.drafted = 4, r.spec.accepted = 2;
    r.spec.forwards = 2, r.spec.forward_tokens = 3; /* (the first token comes from the prompt's forward) */
    return r;
}

Test(serve_response, whole_answers) {
    oai_meta m = {.kind = OAI_COMPLETION, .id = "cmpl-1", .created = 5, .model = "pycode", .has_draft = true};
    tandem_result r = result("a\"b\xff", TANDEM_FINISH_EOS);
    size_t n;
    char *t = oai_result_json(&m, &r, &n);
    cr_assert_not_null(t);
    cr_expect_eq(strlen(t), n);
    tdm_json *j = json_of(t, n);
    cr_expect_str_eq(tdm_json_get(j, "object")->str, "text_completion");
    const tdm_json *c = &tdm_json_get(j, "choices")->items[0];
    cr_expect_str_eq(tdm_json_get(c, "text")->str, "a\"b\xef\xbf\xbd"); /* invalid UTF-8: U+FFFD */
    cr_expect_str_eq(tdm_json_get(c, "finish_reason")->str, "stop");
    const tdm_json *u = tdm_json_get(j, "usage");
    cr_expect_eq(tdm_json_get(u, "total_tokens")->num, 10);
    const tdm_json *sp = tdm_json_get(u, "spec");
    cr_expect_eq(tdm_json_get(sp, "acceptance_rate")->num, 0.5);
    cr_expect_eq(tdm_json_get(sp, "forwards")->num, 2);
    cr_expect_eq(tdm_json_get(sp, "tokens_per_forward")->num, 1.5);
    cr_expect_null(tdm_json_get(sp, "tokens_per_step"));
    tdm_json_free(j);
    free(t);

    /* tokens per target forward, as `tandem generate --json` counts them: at a low
     * acceptance a step's forward commits about one token, not all the tokens over the
     * few speculative steps */
    r = result("abc", TANDEM_FINISH_LENGTH);
    r.n_tokens = 101;
    r.spec.steps = 17, r.spec.drafted = 111, r.spec.accepted = 1;
    r.spec.forwards = 100, r.spec.forward_tokens = 100;
    t = oai_result_json(&m, &r, &n);
    j = json_of(t, n);
    sp = tdm_json_get(tdm_json_get(j, "usage"), "spec");
    cr_expect_eq(tdm_json_get(sp, "tokens_per_forward")->num, 1.0, "%g", tdm_json_get(sp, "tokens_per_forward")->num);
    tdm_json_free(j);
    free(t);

    m.kind = OAI_CHAT;
    r = result("hi", TANDEM_FINISH_TIMEOUT);
    t = oai_result_json(&m, &r, &n);
    j = json_of(t, n);
    cr_expect_str_eq(tdm_json_get(j, "object")->str, "chat.completion");
    c = &tdm_json_get(j, "choices")->items[0];
    cr_expect_str_eq(tdm_json_get(tdm_json_get(c, "message"), "content")->str, "hi");
    cr_expect_str_eq(tdm_json_get(c, "finish_reason")->str, "length");
    cr_expect(tdm_json_get(tdm_json_get(c, "tandem"), "timeout")->b);
    tdm_json_free(j);
    free(t);
}

/* One SSE event: "data: " JSON "\n\n". */
static tdm_json *event_json(const char *t, size_t n) {
    cr_assert(n > 8 && strncmp(t, "data: ", 6) == 0 && strcmp(t + n - 2, "\n\n") == 0, "not an event: '%s'", t);
    return json_of(t + 6, n - 8);
}

Test(serve_response, stream_events) {
    oai_meta m = {.kind = OAI_CHAT, .id = "chatcmpl-1", .created = 5, .model = "pycode"};
    size_t n;
    char *t = oai_chunk_sse(&m, "he\nllo", 6, true, true, &n);
    tdm_json *j = event_json(t, n);
    cr_expect_str_eq(tdm_json_get(j, "object")->str, "chat.completion.chunk");
    const tdm_json *d = tdm_json_get(&tdm_json_get(j, "choices")->items[0], "delta");
    cr_expect_str_eq(tdm_json_get(d, "role")->str, "assistant");
    cr_expect_str_eq(tdm_json_get(d, "content")->str, "he\nllo");
    cr_expect_eq(tdm_json_get(j, "usage")->type, TDM_JSON_NULL);
    tdm_json_free(j);
    free(t);
    t = oai_chunk_sse(&m, "x", 1, false, false, &n);
    j = event_json(t, n);
    cr_expect_null(tdm_json_get(tdm_json_get(&tdm_json_get(j, "choices")->items[0], "delta"), "role"));
    cr_expect_null(tdm_json_get(j, "usage"));
    tdm_json_free(j);
    free(t);
    tandem_result r = result("x", TANDEM_FINISH_LENGTH);
    t = oai_final_chunk_sse(&m, &r, false, &n);
    j = event_json(t, n);
    cr_expect_str_eq(tdm_json_get(&tdm_json_get(j, "choices")->items[0], "finish_reason")->str, "length");
    tdm_json_free(j);
    free(t);
    t = oai_usage_chunk_sse(&m, &r, &n);
    j = event_json(t, n);
    cr_expect_eq(tdm_json_get(j, "choices")->n, 0);
    cr_expect_eq(tdm_json_get(tdm_json_get(j, "usage"), "completion_tokens")->num, 3);
    tdm_json_free(j);
    free(t);
    t = oai_done_sse(&n);
    cr_expect_str_eq(t, "data: [DONE]\n\n");
    free(t);
    m.kind = OAI_COMPLETION;
    t = oai_chunk_sse(&m, "\x01", 1, true, false, &n);
    j = event_json(t, n);
    cr_expect_str_eq(tdm_json_get(&tdm_json_get(j, "choices")->items[0], "text")->str, "\x01");
    tdm_json_free(j);
    free(t);
}

Test(serve_response, errors_and_models) {
    oai_error e;
    oai_fail(&e, 429, NULL, "queue_full", "busy \"now\"");
    size_t n;
    char *t = oai_error_json(&e, &n);
    tdm_json *j = json_of(t, n);
    const tdm_json *o = tdm_json_get(j, "error");
    cr_expect_str_eq(tdm_json_get(o, "message")->str, "busy \"now\"");
    cr_expect_str_eq(tdm_json_get(o, "type")->str, "rate_limit_error");
    cr_expect_eq(tdm_json_get(o, "param")->type, TDM_JSON_NULL);
    cr_expect_str_eq(tdm_json_get(o, "code")->str, "queue_full");
    tdm_json_free(j);
    free(t);
    t = oai_error_sse(&e, &n);
    j = event_json(t, n);
    cr_expect_not_null(tdm_json_get(j, "error"));
    tdm_json_free(j);
    free(t);
    t = oai_models_json("py\"code", 5, 1024, &n);
    j = json_of(t, n);
    cr_expect_str_eq(tdm_json_get(&tdm_json_get(j, "data")->items[0], "id")->str, "py\"code");
    tdm_json_free(j);
    free(t);
    t = oai_health_json("ok", "m", -1, &n);
    j = json_of(t, n);
    cr_expect_str_eq(tdm_json_get(j, "status")->str, "ok");
    cr_expect_null(tdm_json_get(j, "progress"));
    tdm_json_free(j);
    free(t);
    t = oai_health_json("loading", NULL, 0.25f, &n);
    j = json_of(t, n);
    cr_expect_str_eq(tdm_json_get(j, "status")->str, "loading");
    cr_expect_eq(tdm_json_get(j, "progress")->num, 0.25);
    tdm_json_free(j);
    free(t);
}

/* n choices, ignore_eos; the members of vLLM, llama-server and OpenAI that are not
 * implemented: refused naming them, unless neutral */
Test(serve_request, choices_and_refused_members) {
    oai_limits l = limits(true);
    oai_request r;
    oai_error e;
    cr_assert(parse(OAI_COMPLETION, "{\"prompt\": \"x\", \"n\": 16, \"ignore_eos\": true}", &l, &r, &e), "%s", e.message);
    cr_expect_eq(r.n, 16);
    cr_expect(r.params.ignore_eos);
    oai_request_free(&r);
    cr_assert(parse(OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", &l, &r, &e), "%s", e.message);
    cr_expect_eq(r.n, 1);
    cr_expect_not(r.params.ignore_eos);
    oai_request_free(&r);
    /* neutral values are answered (the answer is the one asked for) */
    cr_assert(parse(OAI_COMPLETION,
                    "{\"prompt\": \"x\", \"repetition_penalty\": 1, \"min_tokens\": 0, \"stop_token_ids\": [], "
                    "\"skip_special_tokens\": true, \"mirostat\": 0, \"typical_p\": 1, \"top_n_sigma\": -1, "
                    "\"cache_prompt\": true, \"chat_template_kwargs\": {}, \"n_probs\": 0, \"user\": \"u\"}",
                    &l, &r, &e),
              "%s", e.message);
    oai_request_free(&r);
    static const struct {
        const char *body, *param, *msg;
    } bad[] = {
        {"\"length_penalty\": 1.2", "length_penalty", "'length_penalty' is not supported by this server (only 1)"},
        {"\"stop_token_ids\": [2]", "stop_token_ids", "(only empty) (use 'stop' strings)"},
        {"\"include_stop_str_in_output\": true", "include_stop_str_in_output", "(only false)"},
        {"\"skip_special_tokens\": false", "skip_special_tokens", "(only true)"},
        {"\"use_beam_search\": true", "use_beam_search", "not supported"},
        {"\"mirostat\": 2", "mirostat", "not supported"},
        {"\"typical_p\": 0.9", "typical_p", "not supported"},
        {"\"dry_multiplier\": 0.8", "dry_multiplier", "not supported"},
        {"\"xtc_probability\": 0.5", "xtc_probability", "not supported"},
        {"\"n_predict\": 5", "n_predict", "use 'max_tokens'"},
        {"\"chat_template\": \"{{x}}\"", "chat_template", "--chat-template"},
        {"\"chat_template_kwargs\": {\"enable_thinking\": false}", "chat_template_kwargs", "not supported"},
        {"\"cache_prompt\": false", "cache_prompt", "(only true)"},
        {"\"add_generation_prompt\": false", "add_generation_prompt", "(only true)"},
        {"\"truncate_prompt_tokens\": 5", "truncate_prompt_tokens", "not supported"},
        {"\"prompt_logprobs\": 1", "prompt_logprobs", "not supported"},
        {"\"allowed_token_ids\": [1]", "allowed_token_ids", "not supported"},
        {"\"prediction\": {\"type\": \"content\", \"content\": \"x\"}", "prediction", "not supported"},
        {"\"reasoning_effort\": \"low\"", "reasoning_effort", "not supported"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char body[512];
        snprintf(body, sizeof body, "{\"prompt\": \"x\", %s}", bad[i].body);
        cr_assert_not(parse(OAI_COMPLETION, body, &l, &r, &e), "%s was accepted", body);
        cr_expect_eq(e.status, 400, "%s", body);
        cr_expect_str_eq(e.param, bad[i].param, "%s", body);
        cr_expect(strstr(e.message, bad[i].msg) != NULL, "%s: '%s' lacks '%s'", body, e.message, bad[i].msg);
    }
}

/* n choices in one answer: each with its index, the usage summed (the prompt once,
 * cached_tokens the most a choice took from the cache), their stream chunks indexed */
Test(serve_response, choices) {
    oai_meta ms[3];
    tandem_result rs[3];
    for (int i = 0; i < 3; i++) {
        ms[i] = (oai_meta){.kind = OAI_CHAT, .id = "chatcmpl-1", .created = 5, .model = "pycode", .has_draft = true,
                           .index = i};
        rs[i] = result(i == 1 ? "b" : "a", i == 2 ? TANDEM_FINISH_LENGTH : TANDEM_FINISH_EOS);
        rs[i].n_cached_tokens = i ? 16 : 0;
    }
    size_t n;
    char *t = oai_results_json(ms, rs, 3, &n);
    tdm_json *j = json_of(t, n);
    const tdm_json *ch = tdm_json_get(j, "choices");
    cr_assert_eq(ch->n, 3);
    for (int i = 0; i < 3; i++) cr_expect_eq(tdm_json_get(&ch->items[i], "index")->num, i);
    cr_expect_str_eq(tdm_json_get(tdm_json_get(&ch->items[1], "message"), "content")->str, "b");
    cr_expect_str_eq(tdm_json_get(&ch->items[2], "finish_reason")->str, "length");
    const tdm_json *u = tdm_json_get(j, "usage");
    cr_expect_eq(tdm_json_get(u, "prompt_tokens")->num, 7);
    cr_expect_eq(tdm_json_get(u, "completion_tokens")->num, 9);
    cr_expect_eq(tdm_json_get(u, "total_tokens")->num, 16);
    cr_expect_eq(tdm_json_get(tdm_json_get(u, "prompt_tokens_details"), "cached_tokens")->num, 16);
    cr_expect_eq(tdm_json_get(tdm_json_get(u, "spec"), "drafted")->num, 12);
    tdm_json_free(j);
    free(t);
    t = oai_usage_chunks_sse(&ms[0], rs, 3, &n);
    j = event_json(t, n);
    cr_expect_eq(tdm_json_get(tdm_json_get(j, "usage"), "completion_tokens")->num, 9);
    tdm_json_free(j);
    free(t);
    t = oai_chunk_sse(&ms[2], "x", 1, true, false, &n);
    j = event_json(t, n);
    cr_expect_eq(tdm_json_get(&tdm_json_get(j, "choices")->items[0], "index")->num, 2);
    tdm_json_free(j);
    free(t);
    t = oai_final_chunk_sse(&ms[1], &rs[1], false, &n);
    j = event_json(t, n);
    cr_expect_eq(tdm_json_get(&tdm_json_get(j, "choices")->items[0], "index")->num, 1);
    tdm_json_free(j);
    free(t);
}

Test(serve_metrics, text) {
    srv_metrics *m = srv_metrics_new();
    cr_assert_not_null(m);
    srv_metrics_request(m, SRV_EP_COMPLETIONS, 200);
    srv_metrics_request(m, SRV_EP_COMPLETIONS, 200);
    srv_metrics_request(m, SRV_EP_CHAT, 429);
    srv_metrics_ttft(m, 0.003);
    srv_metrics_ttft(m, 100);
    srv_metrics_itl(m, 0.0002);
    srv_metrics_conn_open(m, 1);
    srv_metrics_conn_open(m, 1);
    srv_metrics_conn_open(m, -1);
    srv_metrics_conn_closed(m, SRV_CONN_EVICTED);
    srv_metrics_conn_closed(m, SRV_CONN_READ_TIMEOUT);
    srv_metrics_conn_closed(m, SRV_CONN_READ_TIMEOUT);
    tandem_engine_stats st = {.n_waiting = 2, .n_running = 3, .kv_blocks_total = 10, .kv_blocks_free = 4,
                              .generated_tokens = 30, .steps = 10, .spec_drafted = 8, .spec_accepted = 6,
                              .n_finished = 5, .n_cancelled = 1, .prefix_hits = 2};
    size_t n;
    char *t = srv_metrics_text(m, &st, &n);
    cr_assert_not_null(t);
    const char *want[] = {
        "tandem_http_requests_total{endpoint=\"completions\",status=\"200\"} 2\n",
        "tandem_http_requests_total{endpoint=\"chat_completions\",status=\"429\"} 1\n",
        "tandem_time_to_first_token_seconds_bucket{le=\"0.0025\"} 0\n",
        "tandem_time_to_first_token_seconds_bucket{le=\"0.005\"} 1\n",
        "tandem_time_to_first_token_seconds_bucket{le=\"30\"} 1\n",
        "tandem_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2\n",
        "tandem_time_to_first_token_seconds_count 2\n",
        "tandem_inter_token_latency_seconds_bucket{le=\"0.00025\"} 1\n",
        "# TYPE tandem_requests_waiting gauge\ntandem_requests_waiting 2\n",
        "tandem_requests_running 3\n",
        "tandem_kv_blocks_used 6\n",
        "tandem_kv_blocks_free 4\n",
        "tandem_prefix_cache_hits_total 2\n",
        "tandem_spec_acceptance_rate 0.75\n",
        "tandem_tokens_per_forward 3\n",
        "tandem_engine_requests_total{outcome=\"cancelled\"} 1\n",
        "tandem_model_loaded 1\n",
        "# TYPE tandem_http_connections gauge\ntandem_http_connections 1\n",
        "tandem_http_connections_closed_total{reason=\"read_timeout\"} 2\n",
        "tandem_http_connections_closed_total{reason=\"idle_timeout\"} 0\n",
        "tandem_http_connections_closed_total{reason=\"evicted\"} 1\n",
        "tandem_http_connections_closed_total{reason=\"refused\"} 0\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) cr_expect(strstr(t, want[i]), "missing: %s", want[i]);
    free(t);
    t = srv_metrics_text(m, NULL, &n);
    cr_expect(strstr(t, "tandem_model_loaded 0\n") && !strstr(t, "tandem_requests_waiting"));
    free(t);
    srv_metrics_free(m);
}

/* ---- tools: the conversation of an agent, the tools, tool_choice ---- */

#define AGENT_HISTORY                                                                                                   \
    "{\"messages\": [{\"role\": \"system\", \"content\": \"You help.\"}, {\"role\": \"user\", \"content\": \"Weather in "  \
    "Paris?\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"call_1\", \"type\": "           \
    "\"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}}]}, "       \
    "{\"role\": \"tool\", \"tool_call_id\": \"call_1\", \"name\": \"get_weather\", \"content\": \"18 C\"}, {\"role\": "   \
    "\"assistant\", \"content\": \"18 C.\", \"reasoning_content\": \"easy\"}, {\"role\": \"user\", \"content\": "         \
    "\"And Oslo?\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "   \
    "\"The weather\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}]"

/* Renders a request's chat_json through tests/data/chat/NAME.jinja. */
static char *render_with(const char *name, const oai_request *r) {
    char path[128], *src = NULL, *out = NULL;
    size_t len = 0, n = 0;
    snprintf(path, sizeof path, "chat/%s.jinja", name);
    tdm_err err = {0};
    cr_assert_eq(tdm_read_file(tdm_test_data_path(path), &src, &len, &err), TANDEM_OK, "%s", err.msg);
    tdm_json *j = json_of(r->chat_json, strlen(r->chat_json));
    tdm_chat_input in = {.messages = tdm_json_get(j, "messages"), .tools = tdm_json_get(j, "tools"),
                         .add_generation_prompt = true};
    cr_assert_eq(tdm_chat_render(src, len, name, &in, NULL, &out, &n, &err), TANDEM_OK, "%s: %s", name, err.msg);
    tdm_json_free(j);
    free(src);
    return out;
}

Test(serve_request, agent_history_and_tools) {
    oai_limits l = limits(false);
    oai_request r;
    oai_error e;
    cr_assert(parse(OAI_CHAT, AGENT_HISTORY ", \"parallel_tool_calls\": false}", &l, &r, &e), "%s", e.message);
    cr_expect_eq(r.n_tools, 1);
    cr_expect_str_eq(r.tool_names[0], "get_weather");
    cr_expect_eq(r.tool_choice, OAI_TOOLS_AUTO);
    cr_expect(!r.parallel_tool_calls);
    tdm_json *j = json_of(r.chat_json, strlen(r.chat_json));
    const tdm_json *msgs = tdm_json_get(j, "messages");
    cr_assert_eq(msgs->n, 6);
    const tdm_json *call = &tdm_json_get(&msgs->items[2], "tool_calls")->items[0];
    cr_expect_str_eq(tdm_json_get(call, "id")->str, "call_1");
    const tdm_json *args = tdm_json_get(tdm_json_get(call, "function"), "arguments");
    cr_expect(args->type == TDM_JSON_OBJECT && !strcmp(tdm_json_get(args, "city")->str, "Paris"),
              "the arguments' text became the object templates print");
    cr_expect_eq(tdm_json_get(&msgs->items[2], "content")->type, TDM_JSON_NULL);
    cr_expect_str_eq(tdm_json_get(&msgs->items[3], "tool_call_id")->str, "call_1");
    cr_expect_str_eq(tdm_json_get(&msgs->items[3], "name")->str, "get_weather");
    cr_expect_str_eq(tdm_json_get(&msgs->items[4], "reasoning_content")->str, "easy");
    cr_expect_str_eq(tdm_json_get(&tdm_json_get(j, "tools")->items[0], "type")->str, "function");
    tdm_json_free(j);
    /* the real Qwen 2.5 template renders it: the call, the tool's answer, the tools */
    char *text = render_with("qwen2.5", &r);
    cr_expect(strstr(text, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"),
              "%s", text);
    cr_expect(strstr(text, "<tool_response>\n18 C\n</tool_response>"), "%s", text);
    cr_expect(strstr(text, "\"description\": \"The weather\""), "%s", text);
    free(text);
    text = render_with("llama3.1", &r);
    cr_expect(strstr(text, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}"), "%s", text);
    free(text);
    oai_request_free(&r);

    /* tool_choice none: the tools are not shown to the model */
    cr_assert(parse(OAI_CHAT, AGENT_HISTORY ", \"tool_choice\": \"none\"}", &l, &r, &e), "%s", e.message);
    cr_expect_eq(r.tool_choice, OAI_TOOLS_NONE);
    cr_expect(r.parallel_tool_calls);
    j = json_of(r.chat_json, strlen(r.chat_json));
    cr_expect_null(tdm_json_get(j, "tools"));
    tdm_json_free(j);
    text = render_with("qwen2.5", &r);
    cr_expect_null(strstr(text, "\"description\": \"The weather\""), "%s", text);
    free(text);
    oai_request_free(&r);
    /* tool_choice auto without tools, and an empty tools array: no tools */
    cr_assert(parse(OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [], \"tool_choice\": "
                              "\"auto\"}", &l, &r, &e), "%s", e.message);
    cr_expect(r.n_tools == 0 && r.tool_choice == OAI_TOOLS_NONE);
    oai_request_free(&r);
    /* required and a named function (of the tools; the grammar is built at submission,
     * from the parameters' schemas kept as text); strict tools with them */
    cr_assert(parse(OAI_CHAT, AGENT_HISTORY ", \"tool_choice\": \"required\"}", &l, &r, &e), "%s", e.message);
    cr_expect_eq(r.tool_choice, OAI_TOOLS_REQUIRED);
    cr_expect(r.tool_params[0] && strstr(r.tool_params[0], "\"city\""), "%s", r.tool_params[0]);
    oai_request_free(&r);
    cr_assert(parse(OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": "
                              "\"function\", \"function\": {\"name\": \"f\"}}, {\"type\": \"function\", \"function\": "
                              "{\"name\": \"g\", \"strict\": true}}], \"tool_choice\": {\"type\": \"function\", "
                              "\"function\": {\"name\": \"g\"}}}", &l, &r, &e), "%s", e.message);
    cr_expect(r.tool_choice == OAI_TOOLS_NAMED && r.tool_named == 1 && !r.tool_params[0] && !r.tool_params[1]);
    oai_request_free(&r);
}

static tdm_json *first_choice(const tdm_json *j) { return &tdm_json_get(j, "choices")->items[0]; }

/* The whole answer for output text (m->called_tools reset first), parsed. */
static tdm_json *answer_of(oai_meta *m, const char *text, tandem_finish_reason fr) {
    m->called_tools = false;
    tandem_result r = result(text, fr);
    size_t n;
    char *t = oai_result_json(m, &r, &n);
    cr_assert_not_null(t);
    tdm_json *j = json_of(t, n);
    free(t);
    return j;
}

Test(serve_response, tool_calls_whole) {
    oai_meta m = {.kind = OAI_CHAT, .id = "chatcmpl-7", .created = 5, .model = "pycode",
                  .tool_format = TDM_TOOL_FORMAT_HERMES, .parallel_tool_calls = true};
    tandem_result r = result("I'll check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n"
                             "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
                             TANDEM_FINISH_EOS);
    size_t n;
    char *t = oai_result_json(&m, &r, &n);
    tdm_json *j = json_of(t, n);
    const tdm_json *c = first_choice(j), *msg = tdm_json_get(c, "message");
    cr_expect_str_eq(tdm_json_get(c, "finish_reason")->str, "tool_calls");
    cr_expect_str_eq(tdm_json_get(msg, "content")->str, "I'll check.");
    const tdm_json *calls = tdm_json_get(msg, "tool_calls");
    cr_assert_eq(calls->n, 2);
    const tdm_json *f0 = tdm_json_get(&calls->items[0], "function");
    cr_expect_str_eq(tdm_json_get(f0, "name")->str, "get_weather");
    cr_expect_str_eq(tdm_json_get(f0, "arguments")->str, "{\"city\": \"Oslo\"}");
    cr_expect_str_eq(tdm_json_get(&calls->items[0], "type")->str, "function");
    const char *id0 = tdm_json_get(&calls->items[0], "id")->str, *id1 = tdm_json_get(&calls->items[1], "id")->str;
    cr_expect(strlen(id0) == 29 && !strncmp(id0, "call_", 5) && strcmp(id0, id1) != 0, "%s %s", id0, id1);
    tdm_json_free(j);
    free(t);

    /* parallel_tool_calls false: the first call; only calls: content null */
    m.parallel_tool_calls = false;
    j = answer_of(&m, "<tool_call>{\"name\": \"a\"}</tool_call><tool_call>{\"name\": \"b\"}</tool_call>", TANDEM_FINISH_EOS);
    msg = tdm_json_get(first_choice(j), "message");
    cr_expect_eq(tdm_json_get(msg, "content")->type, TDM_JSON_NULL);
    cr_expect_eq(tdm_json_get(msg, "tool_calls")->n, 1);
    tdm_json_free(j);

    /* a malformed call is text, finish_reason as it was; mistral ids are 9 characters */
    m.tool_format = TDM_TOOL_FORMAT_MISTRAL;
    j = answer_of(&m, "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {", TANDEM_FINISH_LENGTH);
    msg = tdm_json_get(first_choice(j), "message");
    cr_expect_str_eq(tdm_json_get(msg, "content")->str, "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {");
    cr_expect_null(tdm_json_get(msg, "tool_calls"));
    cr_expect_str_eq(tdm_json_get(first_choice(j), "finish_reason")->str, "length");
    tdm_json_free(j);
    char id[40];
    oai_tool_call_id(&m, 3, id, sizeof id);
    cr_expect_eq(strlen(id), 9, "%s", id);
}

/* The event at *ev (one of several in a text), parsed; *ev moves past it. */
static tdm_json *next_event_json(const char **ev) {
    const char *end = strstr(*ev, "\n\n");
    cr_assert_not_null(end);
    char one[2048];
    const size_t len = (size_t)(end + 2 - *ev);
    cr_assert_lt(len, sizeof one);
    memcpy(one, *ev, len);
    one[len] = '\0';
    *ev = end + 2;
    return event_json(one, len);
}

Test(serve_response, tool_calls_stream) {
    oai_meta m = {.kind = OAI_CHAT, .id = "chatcmpl-8", .created = 5, .model = "pycode",
                  .tool_format = TDM_TOOL_FORMAT_HERMES, .parallel_tool_calls = true};
    const char *text = "<tool_call>{\"name\": \"a\", \"arguments\": {\"x\": 1}}</tool_call>"
                       "<tool_call>{\"name\": \"b\"}</tool_call>";
    tdm_tool_parse p;
    cr_assert(oai_tool_parse(&m, text, strlen(text), &p));
    size_t n;
    char *t = oai_tool_calls_sse(&m, &p, true, true, &n);
    /* four events: (id, name, "") and (arguments) per call */
    const char *ev = t;
    for (int k = 0; k < 4; k++) {
        tdm_json *j = next_event_json(&ev);
        const tdm_json *d = tdm_json_get(first_choice(j), "delta");
        const tdm_json *tc = &tdm_json_get(d, "tool_calls")->items[0], *fn = tdm_json_get(tc, "function");
        cr_expect_eq(tdm_json_get(tc, "index")->num, k / 2);
        cr_expect_eq(tdm_json_get(d, "role") != NULL, k == 0);
        cr_expect_eq(tdm_json_get(j, "usage")->type, TDM_JSON_NULL);
        if (k % 2 == 0) {
            char id[40];
            oai_tool_call_id(&m, (size_t)k / 2, id, sizeof id);
            cr_expect_str_eq(tdm_json_get(tc, "id")->str, id);
            cr_expect_str_eq(tdm_json_get(fn, "name")->str, k ? "b" : "a");
            cr_expect_str_eq(tdm_json_get(fn, "arguments")->str, "");
        } else {
            cr_expect_null(tdm_json_get(tc, "id"));
            cr_expect_str_eq(tdm_json_get(fn, "arguments")->str, k == 1 ? "{\"x\": 1}" : "{}");
        }
        tdm_json_free(j);
    }
    cr_expect_eq(*ev, '\0');
    free(t);
    tdm_tool_parse_free(&p);
    m.called_tools = true;
    tandem_result r = result(text, TANDEM_FINISH_EOS);
    t = oai_final_chunk_sse(&m, &r, false, &n);
    tdm_json *j = event_json(t, n);
    cr_expect_str_eq(tdm_json_get(first_choice(j), "finish_reason")->str, "tool_calls");
    tdm_json_free(j);
    free(t);
}

Test(serve_response, reasoning) {
    oai_meta m = {.kind = OAI_CHAT, .id = "chatcmpl-9", .created = 5, .model = "pycode", .reasoning = true};
    tdm_json *j = answer_of(&m, "<think>\nThe user greets.\n</think>\n\nHello!", TANDEM_FINISH_EOS);
    const tdm_json *msg = tdm_json_get(first_choice(j), "message");
    cr_expect_str_eq(tdm_json_get(msg, "reasoning_content")->str, "The user greets.");
    cr_expect_str_eq(tdm_json_get(msg, "content")->str, "Hello!");
    cr_expect_str_eq(tdm_json_get(first_choice(j), "finish_reason")->str, "stop");
    tdm_json_free(j);
    /* no <think> at the start: all content, no reasoning_content */
    j = answer_of(&m, "Hello <think>", TANDEM_FINISH_EOS);
    msg = tdm_json_get(first_choice(j), "message");
    cr_expect_str_eq(tdm_json_get(msg, "content")->str, "Hello <think>");
    cr_expect_null(tdm_json_get(msg, "reasoning_content"));
    tdm_json_free(j);
    /* reasoning, then a call */
    m.tool_format = TDM_TOOL_FORMAT_HERMES;
    m.parallel_tool_calls = true;
    j = answer_of(&m, "<think>need weather</think>\n<tool_call>\n{\"name\": \"w\", \"arguments\": {}}\n</tool_call>",
                  TANDEM_FINISH_EOS);
    msg = tdm_json_get(first_choice(j), "message");
    cr_expect_str_eq(tdm_json_get(msg, "reasoning_content")->str, "need weather");
    cr_expect_eq(tdm_json_get(msg, "content")->type, TDM_JSON_NULL);
    cr_expect_eq(tdm_json_get(msg, "tool_calls")->n, 1);
    cr_expect_str_eq(tdm_json_get(first_choice(j), "finish_reason")->str, "tool_calls");
    tdm_json_free(j);
    size_t n;
    char *t = oai_reasoning_chunk_sse(&m, "abc", 3, true, false, &n);
    j = event_json(t, n);
    const tdm_json *d = tdm_json_get(first_choice(j), "delta");
    cr_expect_str_eq(tdm_json_get(d, "reasoning_content")->str, "abc");
    cr_expect_str_eq(tdm_json_get(d, "role")->str, "assistant");
    cr_expect_null(tdm_json_get(d, "content"));
    tdm_json_free(j);
    free(t);
}

/* What a client puts together from a parsed stream's events. */
typedef struct assembled {
    char reasoning[512], content[512], names[4][32], args[4][128];
    size_t n_calls;
} assembled;

static void cat_str(char *dst, size_t cap, const tdm_json *v) {
    if (!v || v->type != TDM_JSON_STRING) return;
    cr_assert_lt(strlen(dst) + v->str_len, cap);
    strcat(dst, v->str);
}

static void take_events(assembled *a, const char *t) {
    while (t && *t) {
        tdm_json *j = next_event_json(&t);
        const tdm_json *d = tdm_json_get(first_choice(j), "delta");
        cat_str(a->reasoning, sizeof a->reasoning, tdm_json_get(d, "reasoning_content"));
        cat_str(a->content, sizeof a->content, tdm_json_get(d, "content"));
        const tdm_json *tc = tdm_json_get(d, "tool_calls");
        for (size_t k = 0; tc && k < tc->n; k++) {
            const size_t i = (size_t)tdm_json_get(&tc->items[k], "index")->num;
            cr_assert_lt(i, 4);
            if (i + 1 > a->n_calls) a->n_calls = i + 1;
            const tdm_json *fn = tdm_json_get(&tc->items[k], "function");
            cat_str(a->names[i], sizeof a->names[i], tdm_json_get(fn, "name"));
            cat_str(a->args[i], sizeof a->args[i], tdm_json_get(fn, "arguments"));
        }
        tdm_json_free(j);
    }
}

/* A stream fed text[0..len) in pieces ending at cuts[0..n_cuts), then done. */
static assembled stream_in_pieces(oai_meta *m, const char *text, size_t len, const size_t *cuts, size_t n_cuts) {
    assembled a;
    memset(&a, 0, sizeof a);
    oai_stream_sent sent = {.first = true};
    m->called_tools = false;
    for (size_t i = 0; i <= n_cuts; i++) {
        const bool done = i == n_cuts;
        size_t n = 0;
        bool oom = false;
        char *t = oai_parsed_events(m, &sent, text, done ? len : cuts[i], done, false, &n, &oom);
        cr_assert(!oom);
        take_events(&a, t);
        free(t);
    }
    return a;
}

/* Streamed in any pieces (one byte at a time, or two pieces cut at every byte), a parsed
 * answer puts together into the whole answer's message. */
Test(serve_response, parsed_stream_equals_whole) {
    static const struct {
        tdm_tool_format f;
        bool reasoning;
        const char *text;
    } cases[] = {
        {TDM_TOOL_FORMAT_HERMES, true,
         "<think>\nweather needed\n</think>\n\nChecking.\n<tool_call>\n{\"name\": \"w\", \"arguments\": {\"c\": \"P\"}}\n"
         "</tool_call>\n<tool_call>{\"name\": \"t\"}</tool_call>"},
        {TDM_TOOL_FORMAT_HERMES, false, "Plain text with <b>tags</b> and <tool_ca"},
        {TDM_TOOL_FORMAT_HERMES, false, "```json\n{\"name\": \"w\", \"arguments\": {}}\n```"},
        {TDM_TOOL_FORMAT_HERMES, false, "<tool_call>\n{\"name\": \"w\", \"arguments\": {\"c\": }}\n</tool_call>"},
        {TDM_TOOL_FORMAT_NONE, true, "<think>a\nb</think>  c d  "},
        {TDM_TOOL_FORMAT_NONE, true, "  <thinking> is not a tag here"},
        {TDM_TOOL_FORMAT_LLAMA3, false, "<|python_tag|>{\"name\": \"w\", \"parameters\": {\"c\": 1}}"},
        {TDM_TOOL_FORMAT_MISTRAL, false, "Sure [TOOL_CALLS][{\"name\": \"w\", \"arguments\": {}}]"},
    };
    static const char *const names[] = {"w", "t"};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        oai_meta m = {.kind = OAI_CHAT, .id = "chatcmpl-10", .created = 5, .model = "pycode", .tool_format = cases[i].f,
                      .reasoning = cases[i].reasoning, .parallel_tool_calls = true, .tool_names = names,
                      .n_tool_names = 2};
        const char *text = cases[i].text;
        const size_t len = strlen(text);
        tdm_json *j = answer_of(&m, text, TANDEM_FINISH_EOS);
        const bool whole_called = m.called_tools;
        const tdm_json *msg = tdm_json_get(first_choice(j), "message"), *rc = tdm_json_get(msg, "reasoning_content"),
                       *cc = tdm_json_get(msg, "content"), *calls = tdm_json_get(msg, "tool_calls");
        if (i == 0)
            cr_expect(calls && calls->n == 2 && rc && !strcmp(rc->str, "weather needed") && !strcmp(cc->str, "Checking."),
                      "the whole answer of case 0");
        size_t cuts[512];
        cr_assert_lt(len, 512);
        for (size_t k = 0; k < len; k++) cuts[k] = k + 1;
        for (size_t split = 0; split <= len + 1; split++) {
            /* split == len + 1: byte by byte; else two pieces cut at split */
            const size_t cut[1] = {split};
            assembled a = split == len + 1 ? stream_in_pieces(&m, text, len, cuts, len)
                                           : stream_in_pieces(&m, text, len, cut, 1);
            cr_expect_str_eq(a.reasoning, rc ? rc->str : "", "case %zu split %zu", i, split);
            cr_expect_str_eq(a.content, cc->type == TDM_JSON_STRING ? cc->str : "", "case %zu split %zu", i, split);
            cr_expect_eq(a.n_calls, calls ? calls->n : 0, "case %zu split %zu", i, split);
            cr_expect_eq(m.called_tools, whole_called, "case %zu split %zu", i, split);
            for (size_t k = 0; calls && k < calls->n && k < a.n_calls; k++) {
                const tdm_json *fn = tdm_json_get(&calls->items[k], "function");
                cr_expect_str_eq(a.names[k], tdm_json_get(fn, "name")->str, "case %zu split %zu", i, split);
                cr_expect_str_eq(a.args[k], tdm_json_get(fn, "arguments")->str, "case %zu split %zu", i, split);
            }
        }
        tdm_json_free(j);
    }
}

/* The output's constraint: response_format json_object / json_schema and
 * llama-server's grammar and json_schema into the engine's grammar / json_schema. */
Test(serve_request, response_format_and_grammar) {
    oai_limits l = limits(false);
    oai_request r;
    oai_error e;
    cr_assert(parse(OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": {\"type\": \"text\"}}", &l, &r, &e), "%s", e.message);
    cr_expect(r.params.grammar == NULL && r.params.json_schema == NULL);
    oai_request_free(&r);
    cr_assert(parse(OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": {\"type\": \"json_object\"}}", &l, &r, &e), "%s", e.message);
    cr_expect_str_eq(r.params.json_schema, "{\"type\":\"object\"}");
    cr_expect_null(r.params.grammar);
    oai_request_free(&r);
    cr_assert(parse(OAI_CHAT,
                    "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": {\"type\": \"json_schema\", "
                    "\"json_schema\": {\"name\": \"pt\", \"strict\": true, \"schema\": {\"type\": \"object\", \"properties\": "
                    "{\"x\": {\"type\": \"integer\"}}, \"required\": [\"x\"], \"additionalProperties\": false}}}}",
                    &l, &r, &e),
              "%s", e.message);
    tdm_json *j = NULL;
    tdm_err err = {0};
    cr_assert_eq(tdm_json_parse(r.params.json_schema, strlen(r.params.json_schema), &j, &err), TANDEM_OK, "%s", err.msg);
    cr_expect_eq(tdm_json_get(j, "additionalProperties")->type, TDM_JSON_BOOL);
    cr_expect_not_null(tdm_json_get(tdm_json_get(j, "properties"), "x"));
    tdm_json_free(j);
    oai_request_free(&r);
    cr_assert(parse(OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"any\"}}}", &l, &r, &e), "%s", e.message);
    cr_expect_str_eq(r.params.json_schema, "{}");
    oai_request_free(&r);
    cr_assert(parse(OAI_COMPLETION, "{\"prompt\": \"x\", \"grammar\": \"root ::= [a-z]+\"}", &l, &r, &e), "%s", e.message);
    cr_expect_str_eq(r.params.grammar, "root ::= [a-z]+");
    cr_expect_null(r.params.json_schema);
    oai_request_free(&r);
    cr_assert(parse(OAI_COMPLETION, "{\"prompt\": \"x\", \"json_schema\": {\"type\": \"boolean\"}}", &l, &r, &e), "%s", e.message);
    cr_expect_str_eq(r.params.json_schema, "{\"type\": \"boolean\"}");
    oai_request_free(&r);
}

/* Penalties, logit_bias, min_tokens and logprobs are taken into the engine request. */
Test(serve_request, penalties_and_logprobs) {
    oai_limits l = limits(false);
    oai_request r;
    oai_error e;
    cr_assert(parse(OAI_COMPLETION,
                    "{\"prompt\": \"x\", \"presence_penalty\": 0.5, \"frequency_penalty\": -1.25, \"repeat_penalty\": 1.3, "
                    "\"min_tokens\": 4, \"max_tokens\": 9, \"logit_bias\": {\"5\": -100, \"17\": 2.5}, \"logprobs\": 3}",
                    &l, &r, &e),
              "%s", e.message);
    cr_expect_float_eq(r.params.presence_penalty, 0.5f, 1e-7);
    cr_expect_float_eq(r.params.frequency_penalty, -1.25f, 1e-7);
    cr_expect_float_eq(r.params.repetition_penalty, 1.3f, 1e-6);
    cr_expect_eq(r.params.min_tokens, 4);
    cr_assert_eq(r.params.n_logit_bias, 2);
    cr_expect_eq(r.params.logit_bias[0].token, 5);
    cr_expect_eq(r.params.logit_bias[0].bias, -100.0f);
    cr_expect_eq(r.params.logit_bias[1].token, 17);
    cr_expect(r.params.logprobs);
    cr_expect_eq(r.params.top_logprobs, 3);
    oai_request_free(&r);
    cr_assert(parse(OAI_CHAT,
                    "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logprobs\": true, \"top_logprobs\": 20, "
                    "\"repetition_penalty\": 0.8}",
                    &l, &r, &e),
              "%s", e.message);
    cr_expect(r.params.logprobs);
    cr_expect_eq(r.params.top_logprobs, 20);
    cr_expect_float_eq(r.params.repetition_penalty, 0.8f, 1e-7);
    oai_request_free(&r);
    cr_assert(parse(OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logprobs\": false}", &l, &r, &e),
              "%s", e.message);
    cr_expect_not(r.params.logprobs);
    oai_request_free(&r);
    cr_assert(parse(OAI_COMPLETION, "{\"prompt\": \"x\", \"logprobs\": 0}", &l, &r, &e), "%s", e.message);
    cr_expect(r.params.logprobs);
    cr_expect_eq(r.params.top_logprobs, 0);
    oai_request_free(&r);
}

/* logprobs in a whole answer and in stream chunks: chat's content list (token,
 * logprob, bytes, top_logprobs), completions' four lists with text offsets running
 * on across chunks. */
Test(serve_response, logprobs_shapes) {
    tandem_result r = result("ab", TANDEM_FINISH_LENGTH);
    int32_t toks[3] = {11, 12, 13};
    r.tokens = toks;
    cr_assert_eq(r.n_tokens, 3);
    tandem_token_logprob *lp = calloc(r.n_tokens, sizeof *lp);
    for (size_t i = 0; i < r.n_tokens; i++) {
        lp[i].logprob = -0.5f * (float)(i + 1);
        lp[i].n_top = 2;
        lp[i].top_ids[0] = r.tokens[i], lp[i].top_logprobs[0] = lp[i].logprob;
        lp[i].top_ids[1] = 3, lp[i].top_logprobs[1] = -7.0f;
    }
    r.logprobs = lp;
    oai_meta m = {.kind = OAI_CHAT, .id = "chatcmpl-1", .created = 5, .model = "pycode", .logprobs = true};
    size_t n;
    char *t = oai_result_json(&m, &r, &n);
    tdm_json *j = json_of(t, n);
    const tdm_json *c = tdm_json_get(tdm_json_get(&tdm_json_get(j, "choices")->items[0], "logprobs"), "content");
    cr_assert(c && c->type == TDM_JSON_ARRAY && c->n == r.n_tokens, "%s", t);
    cr_expect_float_eq(tdm_json_get(&c->items[1], "logprob")->num, -1.0, 1e-6);
    cr_expect_eq(tdm_json_get(&c->items[0], "top_logprobs")->n, 2);
    cr_expect(tdm_json_get(&c->items[0], "bytes")->type == TDM_JSON_ARRAY);
    cr_expect(tdm_json_get(&c->items[0], "token")->type == TDM_JSON_STRING);
    tdm_json_free(j);
    free(t);
    m.kind = OAI_COMPLETION, m.id = "cmpl-1";
    t = oai_result_json(&m, &r, &n);
    j = json_of(t, n);
    const tdm_json *l = tdm_json_get(&tdm_json_get(j, "choices")->items[0], "logprobs");
    cr_assert(l, "%s", t);
    cr_expect_eq(tdm_json_get(l, "tokens")->n, r.n_tokens);
    cr_expect_eq(tdm_json_get(l, "token_logprobs")->n, r.n_tokens);
    cr_expect_eq(tdm_json_get(l, "top_logprobs")->n, r.n_tokens);
    cr_expect_eq(tdm_json_get(l, "text_offset")->n, r.n_tokens);
    tdm_json_free(j);
    free(t);
    /* a stream: the offsets run on; a chunk without tokens has empty lists */
    size_t off = 0;
    const oai_lp_span sp = {r.tokens, lp, 2};
    m.lp_span = &sp, m.lp_offset = &off;
    t = oai_chunk_sse(&m, "ab", 2, true, false, &n);
    cr_assert(strstr(t, "\"token_logprobs\": [-0.5, -1]"), "%s", t);
    cr_expect_eq(off, 0, "no model: the token texts are empty (offset %zu)", off);
    free(t);
    m.lp_span = NULL;
    t = oai_final_chunk_sse(&m, &r, false, &n);
    cr_assert(strstr(t, "\"tokens\": []"), "%s", t);
    free(t);
    m.logprobs = false;
    t = oai_chunk_sse(&m, "ab", 2, true, false, &n);
    cr_assert(strstr(t, "\"logprobs\": null"), "%s", t);
    free(t);
    free(lp);
}
