/* chat.c - choosing a chat template and rendering a conversation with it
 * (chat.h).  The built-in templates are our own Jinja sources: for role/content
 * conversations they render what the templates of those model families render
 * (tests/test_chat.c compares them with the real ones), without their tool-calling
 * branches and without refusing unusual role orders. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"

/* The system texts joined, then the turns up to an assistant message (deepseek3, -r1). */
#define DEEPSEEK_HEAD                                                                                              \
    "{%- set ns = namespace(system='', first=true) %}"                                                             \
    "{%- for message in messages if message['role'] == 'system' %}"                                                \
    "{%- set ns.system = ns.system + ('' if ns.first else '\\n\\n') + message['content'] %}{%- set ns.first = false %}" \
    "{%- endfor %}"                                                                                                \
    "{{- bos_token + ns.system }}"                                                                                 \
    "{%- for message in messages %}"                                                                               \
    "{%- if message['role'] == 'user' %}{{- '<｜User｜>' + message['content'] }}"                                  \
    "{%- elif message['role'] == 'assistant' %}"

/* Each: messages[0] may be a system message; "\\n" is a Jinja escape. */
static const struct {
    const char *name;
    const char *src;
} builtins[] = {
    {"chatml", /* <|im_start|>role\ncontent<|im_end|>\n (SmolLM2, Qwen, Yi...) */
     "{%- for message in messages %}"
     "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
     "{%- endfor %}"
     "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"},
    {"llama2", /* [INST] <<SYS>>...<</SYS>> ... [/INST] answer </s> */
     "{%- if messages and messages[0]['role'] == 'system' %}"
     "{%- set system_message = messages[0]['content'] %}{%- set loop_messages = messages[1:] %}"
     "{%- else %}{%- set loop_messages = messages %}{%- endif %}"
     "{%- for message in loop_messages %}"
     "{%- set content = message['content'] %}"
     "{%- if loop.first and system_message is defined %}"
     "{%- set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + content %}{%- endif %}"
     "{%- if message['role'] == 'user' %}{{- bos_token + '[INST] ' + content | trim + ' [/INST]' }}"
     "{%- elif message['role'] == 'assistant' %}{{- ' ' + content | trim + ' ' + eos_token }}{%- endif %}"
     "{%- endfor %}"},
    {"llama3", /* <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|> */
     "{{- bos_token }}"
     "{%- for message in messages %}"
     "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
     "{%- endfor %}"
     "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"},
    {"gemma", /* <start_of_turn>user\n...<end_of_turn>\n; the system text opens the first turn */
     "{{- bos_token }}"
     "{%- if messages and messages[0]['role'] == 'system' %}"
     "{%- set first = messages[0]['content'] + '\\n\\n' %}{%- set loop_messages = messages[1:] %}"
     "{%- else %}{%- set first = '' %}{%- set loop_messages = messages %}{%- endif %}"
     "{%- for message in loop_messages %}"
     "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
     "{{- '<start_of_turn>' + role + '\\n' + (first if loop.first else '') + message['content'] | trim + '<end_of_turn>\\n' }}"
     "{%- endfor %}"
     "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}"},
    {"mistral", /* v0.3: [INST] ...[/INST] answer</s>; the system text joins the last user turn */
     "{{- bos_token }}"
     "{%- if messages and messages[0]['role'] == 'system' %}"
     "{%- set system_message = messages[0]['content'] %}{%- set loop_messages = messages[1:] %}"
     "{%- else %}{%- set loop_messages = messages %}{%- endif %}"
     "{%- for message in loop_messages %}"
     "{%- if message['role'] == 'user' %}"
     "{%- if loop.last and system_message is defined %}"
     "{{- '[INST] ' + system_message + '\\n\\n' + message['content'] + '[/INST]' }}"
     "{%- else %}{{- '[INST] ' + message['content'] + '[/INST]' }}{%- endif %}"
     "{%- elif message['role'] == 'assistant' %}{{- ' ' + message['content'] | trim + eos_token }}{%- endif %}"
     "{%- endfor %}"},
    {"mistral-v7", /* [SYSTEM_PROMPT]...[/SYSTEM_PROMPT][INST]...[/INST]answer</s> */
     "{{- bos_token }}"
     "{%- for message in messages %}"
     "{%- if message['role'] == 'system' %}{{- '[SYSTEM_PROMPT]' + message['content'] + '[/SYSTEM_PROMPT]' }}"
     "{%- elif message['role'] == 'user' %}{{- '[INST]' + message['content'] + '[/INST]' }}"
     "{%- elif message['role'] == 'assistant' %}{{- message['content'] + eos_token }}{%- endif %}"
     "{%- endfor %}"},
    {"phi3", /* <|role|>\ncontent<|end|>\n (Phi-3.5) */
     "{%- for message in messages %}"
     "{%- if message['role'] in ['user', 'assistant'] or (message['role'] == 'system' and message['content']) %}"
     "{{- '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
     "{%- endif %}"
     "{%- endfor %}"
     "{%- if add_generation_prompt %}{{- '<|assistant|>\\n' }}{%- else %}{{- eos_token }}{%- endif %}"},
    {"deepseek2", /* User: ...\n\nAssistant: answer<｜end▁of▁sentence｜> (DeepSeek V2) */
     "{{- bos_token }}"
     "{%- for message in messages %}"
     "{%- if message['role'] == 'user' %}{{- 'User: ' + message['content'] + '\\n\\n' }}"
     "{%- elif message['role'] == 'assistant' %}{{- 'Assistant: ' + message['content'] + eos_token }}"
     "{%- elif message['role'] == 'system' %}{{- message['content'] + '\\n\\n' }}{%- endif %}"
     "{%- endfor %}"
     "{%- if add_generation_prompt %}{{- 'Assistant:' }}{%- endif %}"},
    {"deepseek3", /* <｜User｜>...<｜Assistant｜>answer<｜end▁of▁sentence｜> (V3) */
     DEEPSEEK_HEAD
     "{{- '<｜Assistant｜>' + message['content'] + '<｜end▁of▁sentence｜>' }}"
     "{%- endif %}"
     "{%- endfor %}"
     "{%- if add_generation_prompt %}{{- '<｜Assistant｜>' }}{%- endif %}"},
    {"deepseek-r1", /* deepseek3, the thinking of earlier answers dropped, the answer opening with <think>\n */
     DEEPSEEK_HEAD
     "{%- set content = message['content'] %}"
     "{%- if '</think>' in content %}{%- set content = content.split('</think>')[-1] %}{%- endif %}"
     "{{- '<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>' }}"
     "{%- endif %}"
     "{%- endfor %}"
     "{%- if add_generation_prompt %}{{- '<｜Assistant｜><think>\\n' }}{%- endif %}"},
};

const char tdm_chat_builtin_names[] = "chatml, llama2, llama3, gemma, mistral, mistral-v7, phi3, deepseek2, deepseek3, deepseek-r1";

const char *tdm_chat_builtin(const char *name) {
    for (size_t i = 0; name && i < TDM_ARRAY_LEN(builtins); i++)
        if (strcmp(builtins[i].name, name) == 0) return builtins[i].src;
    return NULL;
}

static bool gguf_str(const tdm_gguf *g, const char *key, const char **s, size_t *len) {
    if (!g || !tdm_gguf_find(g, key)) return false;
    tdm_gguf_str v;
    if (tdm_gguf_get_str(g, key, &v, NULL) != TANDEM_OK) return false;
    *s = v.ptr;
    *len = v.len;
    return true;
}

tandem_status tdm_chat_pick(const tdm_gguf *g, const char *name, const char **src, size_t *len, const char **what,
                            tdm_err *err) {
    *src = NULL;
    *len = 0;
    *what = "the model's chat template";
    if (!name) {
        if (gguf_str(g, "tokenizer.chat_template", src, len)) return TANDEM_OK;
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED,
                          "the model has no chat template (tokenizer.chat_template); name a built-in one: %s",
                          tdm_chat_builtin_names);
    }
    if ((*src = tdm_chat_builtin(name))) {
        *len = strlen(*src);
        *what = "the built-in chat template";
        return TANDEM_OK;
    }
    if (strstr(name, "{{") || strstr(name, "{%")) {
        *src = name;
        *len = strlen(name);
        *what = "the chat template given";
        return TANDEM_OK;
    }
    char key[160];
    if (strlen(name) < 100) {
        snprintf(key, sizeof key, "tokenizer.chat_template.%s", name);
        if (gguf_str(g, key, src, len)) return TANDEM_OK;
    }
    char quoted[64];
    tdm_jinja_escape(quoted, sizeof quoted, name);
    return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "unknown chat template '%s' (built-in: %s)", quoted,
                      tdm_chat_builtin_names);
}

tandem_status tdm_chat_check_messages(const tdm_json *m, tdm_err *err) {
    if (!m || m->type != TDM_JSON_ARRAY)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "messages must be a JSON array of message objects");
    for (size_t i = 0; i < m->n; i++) {
        const tdm_json *e = &m->items[i], *role = tdm_json_get(e, "role");
        if (e->type != TDM_JSON_OBJECT)
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "messages[%zu] must be an object", i);
        if (!role || role->type != TDM_JSON_STRING)
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "messages[%zu] needs a string \"role\"", i);
    }
    return TANDEM_OK;
}

tandem_status tdm_chat_messages_json(const tandem_chat_message *msgs, size_t n, tdm_json **out, tdm_err *err) {
    *out = NULL;
    if (!msgs && n) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "messages is NULL");
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    fputc('[', f);
    for (size_t i = 0; i < n; i++) {
        const char *role = msgs[i].role, *content = msgs[i].content;
        if (!role) {
            fclose(f);
            free(text);
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "messages[%zu].role is NULL", i);
        }
        fputs(i ? ", {\"role\": " : "{\"role\": ", f);
        tdm_json_write_str(f, role, strlen(role));
        fputs(", \"content\": ", f);
        if (content)
            tdm_json_write_str(f, content, strlen(content));
        else
            fputs("null", f);
        fputc('}', f);
    }
    fputc(']', f);
    if (fclose(f) != 0) {
        free(text);
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    }
    tandem_status st = tdm_json_parse(text, len, out, err);
    free(text);
    return st;
}

tandem_status tdm_chat_render(const char *src, size_t len, const char *what, const tdm_chat_input *in,
                              const tdm_jinja_limits *lim, char **out, size_t *out_len, tdm_err *err) {
    *out = NULL;
    tdm_err e = {0};
    tandem_status st = tdm_chat_check_messages(in->messages, err);
    if (st != TANDEM_OK) return st;
    tdm_jinja *t = NULL;
    st = tdm_jinja_parse(src, len, &t, &e);
    if (st == TANDEM_OK) {
        tdm_json agp = {.type = TDM_JSON_BOOL, .b = in->add_generation_prompt};
        tdm_jinja_var vars[6] = {
            {.name = "messages", .json = in->messages},
            {.name = "tools", .json = in->tools},
            {.name = "documents"},
            {.name = "add_generation_prompt", .json = &agp},
        };
        size_t n = 4;
        /* an absent BOS / EOS stays undefined, as transformers leaves it */
        if (in->bos_token) vars[n++] = (tdm_jinja_var){.name = "bos_token", .str = in->bos_token};
        if (in->eos_token) vars[n++] = (tdm_jinja_var){.name = "eos_token", .str = in->eos_token};
        st = tdm_jinja_render(t, vars, n, lim, out, out_len, &e);
    }
    tdm_jinja_free(t);
    if (st != TANDEM_OK) return tdm_seterr(err, st, "%s: %s", what, e.msg);
    return TANDEM_OK;
}

/* The text of a token as the template sees it (NULL when there is none). */
static char *token_text(const tdm_tokenizer *tok, int32_t id) {
    size_t n;
    const char *s = id >= 0 ? tdm_tok_text(tok, id, &n) : NULL;
    return s ? tdm_strndup(s, n) : NULL;
}

tandem_status tdm_chat_render_for(const tdm_gguf *g, const tdm_tokenizer *tok, const char *name,
                                  const tdm_json *messages, const tdm_json *tools, bool add_generation_prompt,
                                  bool strip_bos, char **out, tdm_err *err) {
    *out = NULL;
    const char *src, *what;
    size_t len;
    tandem_status st = tdm_chat_pick(g, name, &src, &len, &what, err);
    if (st != TANDEM_OK) return st;
    char *bos = token_text(tok, tdm_tok_bos(tok)), *eos = token_text(tok, tdm_tok_eos(tok));
    tdm_chat_input in = {.messages = messages, .tools = tools, .add_generation_prompt = add_generation_prompt,
                         .bos_token = bos, .eos_token = eos};
    size_t out_len = 0;
    st = tdm_chat_render(src, len, what, &in, NULL, out, &out_len, err);
    if (st == TANDEM_OK && strip_bos && bos && *bos && tdm_tok_add_bos(tok) && strncmp(*out, bos, strlen(bos)) == 0)
        memmove(*out, *out + strlen(bos), out_len - strlen(bos) + 1);
    free(bos);
    free(eos);
    return st;
}
