/* tok_pretok_names.c - the tokenizer.ggml.pre names of byte-level BPE vocabularies
 * and what each selects, as llama.cpp's llama_vocab::impl::load maps them: a split
 * behaviour (tok_pre), whether a pre-token found whole in the vocabulary skips the
 * merges (ignore_merges) and add_bos_token's default.
 *
 * A name llama.cpp knows whose behaviour tandem does not implement, and a name
 * nobody knows, are both errors naming it: a silent fallback would tokenize wrong. */
#include <string.h>

#include "tok_internal.h"

typedef struct pre_name {
    const char *name;
    tok_pre pre;
    uint8_t flags;
} pre_name;

enum { IGNORE_MERGES = 1, ADD_BOS = 2 };

static const pre_name names[] = {
    {"default", TOK_PRE_DEFAULT, 0},
    /* GPT-2's regex */
    {"gpt-2", TOK_PRE_GPT2, 0},
    {"phi-2", TOK_PRE_GPT2, 0},
    {"jina-es", TOK_PRE_GPT2, 0},
    {"jina-de", TOK_PRE_GPT2, 0},
    {"gigachat", TOK_PRE_GPT2, 0},
    {"jina-v1-en", TOK_PRE_GPT2, 0},
    {"jina-v2-es", TOK_PRE_GPT2, 0},
    {"jina-v2-de", TOK_PRE_GPT2, 0},
    {"jina-v2-code", TOK_PRE_GPT2, 0},
    {"roberta-bpe", TOK_PRE_GPT2, 0},
    {"a.x-4.0", TOK_PRE_GPT2, 0},
    {"mellum", TOK_PRE_GPT2, 0},
    {"modern-bert", TOK_PRE_GPT2, 0},
    {"mpt", TOK_PRE_GPT2, 0},
    {"olmo", TOK_PRE_GPT2, 0},
    {"jais", TOK_PRE_GPT2, 0},
    {"trillion", TOK_PRE_GPT2, 0},
    {"granite-docling", TOK_PRE_GPT2, 0},
    {"exaone4", TOK_PRE_GPT2, 0},
    {"falcon", TOK_PRE_FALCON, 0},
    /* digits alone, then GPT-2's regex */
    {"starcoder", TOK_PRE_STARCODER, 0},
    {"refact", TOK_PRE_STARCODER, 0},
    {"command-r", TOK_PRE_STARCODER, 0},
    {"smollm", TOK_PRE_STARCODER, 0},
    {"codeshell", TOK_PRE_STARCODER, 0},
    {"exaone", TOK_PRE_STARCODER, 0},
    {"minerva-7b", TOK_PRE_STARCODER, 0},
    {"mellum2", TOK_PRE_STARCODER, 0},
    /* Llama 3's regex */
    {"llama3", TOK_PRE_LLAMA3, IGNORE_MERGES | ADD_BOS},
    {"llama-v3", TOK_PRE_LLAMA3, IGNORE_MERGES | ADD_BOS},
    {"llama-bpe", TOK_PRE_LLAMA3, IGNORE_MERGES | ADD_BOS},
    {"falcon3", TOK_PRE_LLAMA3, IGNORE_MERGES | ADD_BOS},
    {"falcon-h1", TOK_PRE_LLAMA3, IGNORE_MERGES | ADD_BOS},
    {"pixtral", TOK_PRE_LLAMA3, IGNORE_MERGES | ADD_BOS},
    {"midm-2.0", TOK_PRE_LLAMA3, IGNORE_MERGES | ADD_BOS},
    {"lfm2", TOK_PRE_LLAMA3, IGNORE_MERGES | ADD_BOS},
    {"jina-v5-nano", TOK_PRE_LLAMA3, IGNORE_MERGES | ADD_BOS},
    {"dbrx", TOK_PRE_LLAMA3, 0},
    {"smaug-bpe", TOK_PRE_LLAMA3, 0},
    {"chatglm-bpe", TOK_PRE_LLAMA3, 0},
    {"glm4", TOK_PRE_LLAMA3, 0},
    /* its \p{N}{1,3} split first, then Llama 3's regex with \p{N}+: the same pieces */
    {"minicpm5", TOK_PRE_LLAMA3, IGNORE_MERGES},
    /* Qwen2's regex (Llama 3's with single digits) */
    {"qwen2", TOK_PRE_QWEN2, 0},
    {"deepseek-r1-qwen", TOK_PRE_QWEN2, 0},
    {"kormo", TOK_PRE_QWEN2, 0},
    {"f2llmv2", TOK_PRE_QWEN2, 0},
    {"megrez", TOK_PRE_QWEN2, 0},
    {"stablelm2", TOK_PRE_QWEN2, 0},
    {"hunyuan", TOK_PRE_QWEN2, 0},
    {"solar-open", TOK_PRE_QWEN2, 0},
    {"grok-2", TOK_PRE_QWEN2, 0},
    /* its possessive quantifiers and \s*[\r\n] match what Qwen2's do */
    {"bailingmoe", TOK_PRE_QWEN2, 0},
    {"bailingmoe2", TOK_PRE_QWEN2, 0},
    {"llada-moe", TOK_PRE_QWEN2, 0},
    {"qwen35", TOK_PRE_QWEN35, 0},
    {"seed-coder", TOK_PRE_SEED_CODER, 0},
    {"ufakzeka", TOK_PRE_NO_CONTRACTION, 0},
    {"laguna", TOK_PRE_LAGUNA, 0},
    /* o200k */
    {"gpt-4o", TOK_PRE_GPT4O, 0},
    {"llama4", TOK_PRE_GPT4O, 0},
    {"kanana2", TOK_PRE_GPT4O, 0},
    {"talkie", TOK_PRE_GPT4O, 0},
    {"minimax-m2", TOK_PRE_GPT4O, 0},
    {"tekken", TOK_PRE_TEKKEN, IGNORE_MERGES | ADD_BOS},
    {"deepseek-llm", TOK_PRE_DEEPSEEK_LLM, 0},
    {"deepseek-coder", TOK_PRE_DEEPSEEK_CODER, 0},
    {"deepseek-v3", TOK_PRE_DEEPSEEK3, 0},
    {"hunyuan-dense", TOK_PRE_DEEPSEEK3, 0},
    {"joyai-llm", TOK_PRE_DEEPSEEK3, 0},
    {"hy_v4", TOK_PRE_DEEPSEEK3, 0},
    {"bloom", TOK_PRE_BLOOM, 0},
    {"poro-chat", TOK_PRE_BLOOM, 0},
    {"gpt3-finnish", TOK_PRE_BLOOM, 0},
    {"viking", TOK_PRE_VIKING, 0},
    {"superbpe", TOK_PRE_SUPERBPE, 0},
};

/* Names llama.cpp knows, of behaviours tandem does not implement. */
static const char *const not_implemented[] = {
    "chameleon", "jais-2", "kimi-k2", "afmoe", "exaone-moe", "youtu", "spark2_5", "tiny_aya",
    "cohere2moe", "granite-embed-multi-97m", "granite-embed-multi-311m", "gemma4", "sarvam-moe",
    "whitespace",
};

static bool is(const char *lit, const char *s, size_t len) { return strlen(lit) == len && memcmp(lit, s, len) == 0; }

tok_pre_lookup tok_pre_find(const char *name, size_t len, tok_pre_info *out) {
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (is(names[i].name, name, len)) {
            out->pre = names[i].pre;
            out->ignore_merges = names[i].flags & IGNORE_MERGES;
            out->add_bos = names[i].flags & ADD_BOS;
            return TOK_PRE_FOUND;
        }
    for (size_t i = 0; i < sizeof not_implemented / sizeof not_implemented[0]; i++)
        if (is(not_implemented[i], name, len)) return TOK_PRE_NOT_IMPLEMENTED;
    return TOK_PRE_UNKNOWN;
}
