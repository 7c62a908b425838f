/* chat.h - conversations rendered into prompts by chat templates.
 *
 * A template is a model's own (the GGUF key tokenizer.chat_template, or
 * tokenizer.chat_template.NAME for a named one), a built-in one (chatml, llama2,
 * llama3, gemma, mistral, mistral-v7, phi3, deepseek2, deepseek3, deepseek-r1: Jinja sources
 * that render role/content conversations as the templates of those families do), or
 * a Jinja text given by the caller.  Rendering follows HF transformers'
 * apply_chat_template (src/chat/jinja/jinja.h): the template sees messages,
 * add_generation_prompt, bos_token and eos_token (the tokenizer's texts of them,
 * when it has them), tools (none unless given) and documents (none).
 */
#ifndef TDM_CHAT_H
#define TDM_CHAT_H

#include "common.h"
#include "gguf.h"
#include "jinja/jinja.h"
#include "json.h"
#include "tokenizer.h"

/* "chatml, llama2, ..." */
extern const char tdm_chat_builtin_names[];

/* The Jinja source of a built-in template, or NULL. */
const char *tdm_chat_builtin(const char *name);

/* Chooses the template: name NULL = g's tokenizer.chat_template (g may be NULL:
 * none); else a built-in name, a named template of g, or (when it holds "{{" or
 * "{%") the template text itself.  *src points into g, a static string or name;
 * *what describes it for messages ("the model's chat template", "chat template
 * 'chatml'").  TANDEM_ERR_UNSUPPORTED when the model has none (the message lists the
 * built-in names), TANDEM_ERR_INVALID_ARG for an unknown name. */
tandem_status tdm_chat_pick(const tdm_gguf *g, const char *name, const char **src, size_t *len, const char **what,
                            tdm_err *err);

/* Checks a JSON messages array: objects with a string "role".  err names the first
 * bad element ("messages[2]: ..."). */
tandem_status tdm_chat_check_messages(const tdm_json *messages, tdm_err *err);

/* messages[n] (role and content strings) as a JSON array (tdm_json_free). */
tandem_status tdm_chat_messages_json(const tandem_chat_message *msgs, size_t n, tdm_json **out, tdm_err *err);

typedef struct tdm_chat_input {
    const tdm_json *messages; /* array of message objects */
    const tdm_json *tools;    /* NULL: none */
    bool add_generation_prompt;
    const char *bos_token, *eos_token; /* NULL: undefined in the template */
} tdm_chat_input;

/* Renders src[0..len) for in; *out malloc'ed, NUL-terminated (free()).  Errors carry
 * what: "<what>: line L, column C: ...".  lim NULL: the defaults. */
tandem_status tdm_chat_render(const char *src, size_t len, const char *what, const tdm_chat_input *in,
                              const tdm_jinja_limits *lim, char **out, size_t *out_len, tdm_err *err);

/* The whole path for a model or a vocabulary: picks the template (tdm_chat_pick),
 * takes BOS/EOS texts from tok, renders; with strip_bos, a leading BOS text is
 * removed when tok adds BOS when tokenizing (so the text can go to generation,
 * which adds it), as llama.cpp does. */
tandem_status tdm_chat_render_for(const tdm_gguf *g, const tdm_tokenizer *tok, const char *name,
                                  const tdm_json *messages, const tdm_json *tools, bool add_generation_prompt,
                                  bool strip_bos, char **out, tdm_err *err);

#endif
