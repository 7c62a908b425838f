/* oai_refused.c - the members of vLLM's and llama-server's OpenAI-compatible servers
 * (and OpenAI's own) that tandem serve does not implement: refused with a 400 naming
 * the member, unless they hold the value that changes nothing (oai_request.h).
 *
 * A client that sends, say, length_penalty 1.2 or mirostat 2 to this server would
 * otherwise get an answer computed without it and never know; one that sends the
 * neutral value (length_penalty 1, mirostat 0, an empty stop_token_ids) is
 * answered, since the answer is the one it asked for.  Members outside this list and
 * outside the ones parsed (oai_request.h) are ignored, as OpenAI-compatible servers do
 * with members they do not know (user, metadata, store, ...). */
#include <string.h>

#include "oai_request.h"

/* What value leaves a member without effect. */
typedef enum neutral {
    NEUTRAL_NONE,     /* absent or null only */
    NEUTRAL_NUM,      /* a number equal to num */
    NEUTRAL_BOOL,     /* the boolean num != 0 */
    NEUTRAL_EMPTY,    /* an empty array, object or string */
} neutral;

typedef struct refused {
    const char *name;
    neutral kind;
    double num;
    const char *hint;             /* appended to the message ("" = none) */
} refused;

/* (echo, best_of and suffix are checked in oai_request.c, as are the penalties,
 * logit_bias, min_tokens and logprobs it takes; the grammar members by their own
 * parser) */
static const refused refused_members[] = {
    /* vLLM's sampling extensions */
    {"length_penalty", NEUTRAL_NUM, 1, ""},
    {"use_beam_search", NEUTRAL_BOOL, 0, ""},
    {"stop_token_ids", NEUTRAL_EMPTY, 0, " (use 'stop' strings)"},
    {"include_stop_str_in_output", NEUTRAL_BOOL, 0, ""},
    {"skip_special_tokens", NEUTRAL_BOOL, 1, ""},
    {"spaces_between_special_tokens", NEUTRAL_BOOL, 1, ""},
    {"truncate_prompt_tokens", NEUTRAL_NONE, 0, ""},
    {"prompt_logprobs", NEUTRAL_NONE, 0, ""},
    {"allowed_token_ids", NEUTRAL_NONE, 0, ""},
    {"bad_words", NEUTRAL_EMPTY, 0, ""},
    {"logits_processors", NEUTRAL_EMPTY, 0, ""},
    {"return_tokens_as_token_ids", NEUTRAL_BOOL, 0, ""},
    {"return_token_ids", NEUTRAL_BOOL, 0, ""},
    {"add_generation_prompt", NEUTRAL_BOOL, 1, ""},
    {"continue_final_message", NEUTRAL_BOOL, 0, ""},
    {"add_special_tokens", NEUTRAL_NONE, 0, ""},
    {"chat_template", NEUTRAL_NONE, 0, " (the server's template is set at its start: --chat-template)"},
    {"chat_template_kwargs", NEUTRAL_EMPTY, 0, ""},
    {"documents", NEUTRAL_EMPTY, 0, ""},
    {"mm_processor_kwargs", NEUTRAL_EMPTY, 0, ""},
    {"prompt_embeds", NEUTRAL_NONE, 0, ""},
    {"kv_transfer_params", NEUTRAL_NONE, 0, ""},
    {"vllm_xargs", NEUTRAL_EMPTY, 0, ""},
    /* vLLM's structured output members (the grammar members this server takes are
     * response_format, grammar and json_schema, parsed with the request) */
    {"guided_json", NEUTRAL_NONE, 0, " (use 'response_format')"},
    {"guided_regex", NEUTRAL_NONE, 0, ""},
    {"guided_choice", NEUTRAL_NONE, 0, ""},
    {"guided_grammar", NEUTRAL_NONE, 0, " (use 'response_format')"},
    {"guided_decoding_backend", NEUTRAL_NONE, 0, ""},
    {"guided_whitespace_pattern", NEUTRAL_NONE, 0, ""},
    {"structural_tag", NEUTRAL_NONE, 0, ""},
    {"structured_outputs", NEUTRAL_NONE, 0, " (use 'response_format')"},
    /* llama-server's */
    {"n_predict", NEUTRAL_NONE, 0, " (use 'max_tokens')"},
    {"n_probs", NEUTRAL_NUM, 0, ""},
    {"n_keep", NEUTRAL_NUM, 0, ""},
    {"n_discard", NEUTRAL_NUM, 0, ""},
    {"n_indent", NEUTRAL_NUM, 0, ""},
    {"typical_p", NEUTRAL_NUM, 1, ""},
    {"tfs_z", NEUTRAL_NUM, 1, ""},
    {"repeat_last_n", NEUTRAL_NUM, 0, ""},
    {"penalize_nl", NEUTRAL_BOOL, 0, ""},
    {"mirostat", NEUTRAL_NUM, 0, ""},
    {"mirostat_tau", NEUTRAL_NONE, 0, ""},
    {"mirostat_eta", NEUTRAL_NONE, 0, ""},
    {"dry_multiplier", NEUTRAL_NUM, 0, ""},
    {"dry_base", NEUTRAL_NONE, 0, ""},
    {"dry_allowed_length", NEUTRAL_NONE, 0, ""},
    {"dry_penalty_last_n", NEUTRAL_NONE, 0, ""},
    {"dry_sequence_breakers", NEUTRAL_NONE, 0, ""},
    {"xtc_probability", NEUTRAL_NUM, 0, ""},
    {"xtc_threshold", NEUTRAL_NONE, 0, ""},
    {"top_n_sigma", NEUTRAL_NUM, -1, ""},
    {"dynatemp_range", NEUTRAL_NUM, 0, ""},
    {"dynatemp_exponent", NEUTRAL_NONE, 0, ""},
    {"min_keep", NEUTRAL_NUM, 0, ""},
    {"samplers", NEUTRAL_NONE, 0, ""},
    {"cache_prompt", NEUTRAL_BOOL, 1, " (the prefix cache is the engine's)"},
    {"id_slot", NEUTRAL_NUM, -1, ""},
    {"slot_id", NEUTRAL_NUM, -1, ""},
    {"t_max_predict_ms", NEUTRAL_NUM, 0, " (use 'timeout_s')"},
    {"t_max_prompt_ms", NEUTRAL_NUM, 0, ""},
    {"image_data", NEUTRAL_EMPTY, 0, ""},
    {"lora", NEUTRAL_EMPTY, 0, ""},
    {"post_sampling_probs", NEUTRAL_BOOL, 0, ""},
    {"return_tokens", NEUTRAL_BOOL, 0, ""},
    {"timings_per_token", NEUTRAL_BOOL, 0, ""},
    {"response_fields", NEUTRAL_EMPTY, 0, ""},
    {"reasoning_format", NEUTRAL_NONE, 0, " (reasoning_content is split when the template marks it)"},
    {"thinking_forced_open", NEUTRAL_BOOL, 0, ""},
    /* OpenAI's, changing the answer in ways not implemented */
    {"prediction", NEUTRAL_NONE, 0, ""},
    {"audio", NEUTRAL_NONE, 0, ""},
    {"modalities", NEUTRAL_NONE, 0, ""},
    {"reasoning_effort", NEUTRAL_NONE, 0, ""},
    {"web_search_options", NEUTRAL_NONE, 0, ""},
};

static bool is_neutral(const refused *f, const tdm_json *v) {
    switch (f->kind) {
    case NEUTRAL_NONE: return false;
    case NEUTRAL_NUM: return v->type == TDM_JSON_NUMBER && v->num == f->num;
    case NEUTRAL_BOOL: return v->type == TDM_JSON_BOOL && v->b == (f->num != 0);
    case NEUTRAL_EMPTY:
        return ((v->type == TDM_JSON_ARRAY || v->type == TDM_JSON_OBJECT) && v->n == 0) ||
               (v->type == TDM_JSON_STRING && v->str_len == 0);
    }
    return false;
}

bool oai_check_refused(const tdm_json *j, oai_error *e) {
    for (size_t i = 0; i < sizeof refused_members / sizeof *refused_members; i++) {
        const refused *f = &refused_members[i];
        const tdm_json *v = tdm_json_get(j, f->name);
        if (!v || v->type == TDM_JSON_NULL || is_neutral(f, v)) continue;
        char only[64] = "";
        if (f->kind == NEUTRAL_NUM) snprintf(only, sizeof only, " (only %g)", f->num);
        else if (f->kind == NEUTRAL_BOOL) snprintf(only, sizeof only, " (only %s)", f->num != 0 ? "true" : "false");
        else if (f->kind == NEUTRAL_EMPTY) snprintf(only, sizeof only, " (only empty)");
        return oai_fail(e, 400, f->name, "unsupported_parameter", "'%s' is not supported by this server%s%s", f->name,
                        only, f->hint);
    }
    return true;
}
