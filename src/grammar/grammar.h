/* grammar.h - the grammar engine of constrained decoding: GBNF grammars compiled
 * once, a per-sequence matcher with cheap snapshots for speculation, and the token
 * mask of the next position over a vocabulary.
 *
 * Three objects:
 *   tdm_grammar  a compiled grammar (tdm_grammar_parse, or tdm_json_schema_grammar in
 *                json_schema.h).  Immutable after compilation: share it across
 *                requests and threads freely; free it after every matcher on it.
 *   tdm_gvocab   a vocabulary as byte strings, sorted for the mask walk: built once
 *                per tokenizer (tdm_gvocab_create) and immutable, shareable like the
 *                grammar.  It does not keep the tokenizer.
 *   tdm_gshare   a mask cache shared by the matchers of one grammar over one
 *                vocabulary (thread-safe): the masks of recent states keyed by the
 *                states' content, so that sequences under one schema walk the
 *                vocabulary once for a state any of them met (tdm_gmatch_share).
 *   tdm_gmatch   one sequence's matcher: the set of pushdown stacks after the text
 *                accepted so far, plus a history of states for rollback.  NOT
 *                thread-safe: one sequence, one thread at a time.  Computing a mask
 *                does not change its observable state but uses its scratch memory:
 *                the walk's memo (about 0.5 MB, made at the first mask) and the
 *                masks of its last 4 states (4 x n_vocab / 8 bytes), so a state met
 *                again costs a copy.  Its history grows by each accepted call's
 *                stacks until tdm_gmatch_commit.
 *
 * Grammar syntax: llama.cpp's GBNF.  `name ::= alternatives` rules, one per line (a
 * rule's body may continue on further lines inside parentheses); names of
 * [A-Za-z0-9_-]; `|` alternation; sequences; groups `( )`; literals "..." with the
 * escapes \n \t \r \" \\ \[ \] \- \xHH \uHHHH \UHHHHHHHH; character classes [a-z0-9_]
 * and negated ones [^"\\]; `.` any character; repetition * + ? {m} {m,} {m,n}; rule
 * references; comments from # to the end of the line.  Matching is over Unicode code
 * points (the text is UTF-8); a rule named `root` is the start.
 *
 * Refused (TANDEM_ERR_FORMAT, the message naming line:column and the problem): syntax
 * errors, an undefined rule (where it is first used), a redefined rule, no `root`,
 * left recursion (direct, indirect, or through rules that can match the empty text),
 * a grammar or a rule that can match no text at all (root unproductive), an empty
 * character class, invalid UTF-8 in the grammar text.  Limits (TANDEM_ERR_FORMAT,
 * naming the limit): the text at most TDM_GRAMMAR_MAX_TEXT bytes, at most
 * TDM_GRAMMAR_MAX_RULES rules after expansion, TDM_GRAMMAR_MAX_ELEMENTS elements after
 * repetitions are expanded, repetition bounds at most TDM_GRAMMAR_MAX_REPEAT, groups
 * nested at most TDM_GRAMMAR_MAX_NESTING deep.  Nothing in the input is trusted for a
 * size; the library never aborts on input.
 */
#ifndef TDM_GRAMMAR_H
#define TDM_GRAMMAR_H

#include "common.h"
#include "tokenizer.h"

#define TDM_GRAMMAR_MAX_TEXT (1u << 20)      /* grammar text bytes */
#define TDM_GRAMMAR_MAX_RULES 65536u         /* rules, generated ones included */
#define TDM_GRAMMAR_MAX_ELEMENTS (1u << 20)  /* elements after expanding repetitions */
#define TDM_GRAMMAR_MAX_REPEAT 10000u        /* m and n of {m}, {m,}, {m,n} */
#define TDM_GRAMMAR_MAX_NESTING 64u          /* ( ) groups inside one another */
/* The most stacks one matcher state may hold (an ambiguous grammar can need many):
 * beyond it an accept or a mask is TANDEM_ERR_UNSUPPORTED naming the limit. */
#define TDM_GMATCH_MAX_STACKS 4096u
/* The most stack nodes a matcher may hold (its history and a mask walk's included;
 * 20 bytes each): beyond it TANDEM_ERR_NOMEM naming the limit. */
#define TDM_GMATCH_MAX_NODES (1u << 22)

typedef struct tdm_grammar tdm_grammar;
typedef struct tdm_gvocab tdm_gvocab;
typedef struct tdm_gmatch tdm_gmatch;
typedef struct tdm_gshare tdm_gshare;

/* ---- grammars ---- */

/* Compiles GBNF text (len bytes, no NUL needed) into *out.  Errors: see above. */
tandem_status tdm_grammar_parse(const char *text, size_t len, tdm_grammar **out, tdm_err *err);
void tdm_grammar_free(tdm_grammar *g); /* NULL is a no-op */
uint32_t tdm_grammar_n_rules(const tdm_grammar *g);    /* generated rules included */
uint32_t tdm_grammar_n_elements(const tdm_grammar *g);

/* Whether the grammar matches the whole UTF-8 text (a convenience for tests and
 * tools: a matcher fed the text, then complete).  Errors only for memory / limits. */
tandem_status tdm_grammar_matches(const tdm_grammar *g, const char *text, size_t len, bool *out, tdm_err *err);

/* ---- vocabularies ---- */

/* From a tokenizer: each token's bytes as tdm_token_to_piece gives them without
 * special rendering (byte-level BPE mapped back to bytes, SentencePiece's U+2581 to a
 * space, <0xHH> byte-fallback tokens to their byte).  Tokens that decode to nothing
 * (control tokens) never match; the end-of-generation ids (tdm_tok_eog_ids) match
 * only where the grammar is complete. */
tandem_status tdm_gvocab_create(const tdm_tokenizer *t, tdm_gvocab **out, tdm_err *err);
/* From byte strings: token i is bytes[i] (lens[i] bytes; 0: never matches);
 * eog: the n_eog end-of-generation ids (each < n). */
tandem_status tdm_gvocab_create_raw(int32_t n, const char *const *bytes, const size_t *lens,
                                    const int32_t *eog, int32_t n_eog, tdm_gvocab **out, tdm_err *err);
void tdm_gvocab_free(tdm_gvocab *v); /* NULL is a no-op */
int32_t tdm_gvocab_n(const tdm_gvocab *v);
/* Words of a mask over v: (n + 31) / 32 uint32_t; token i is bit (i % 32) of word i / 32. */
size_t tdm_gvocab_mask_words(const tdm_gvocab *v);
/* Token id's bytes (NULL with *len 0 when it never matches). */
const char *tdm_gvocab_bytes(const tdm_gvocab *v, int32_t id, size_t *len);
bool tdm_gvocab_is_eog(const tdm_gvocab *v, int32_t id);

/* ---- matchers ---- */

/* A matcher at the start of the grammar (its history: that one state, mark 0). The
 * grammar must outlive it. */
tandem_status tdm_gmatch_create(const tdm_grammar *g, tdm_gmatch **out, tdm_err *err);
void tdm_gmatch_free(tdm_gmatch *m); /* NULL is a no-op */

/* Feeds bytes (a token's, or any text): on success the new state is pushed on the
 * history (one mark per call).  A UTF-8 sequence may be split across calls (the
 * partial code point is kept in the state).  Bytes the grammar does not allow from
 * this state: TANDEM_ERR_INVALID_ARG ("the grammar does not allow ..."), and the
 * state is unchanged.  len 0 pushes a copy of the current state. */
tandem_status tdm_gmatch_accept(tdm_gmatch *m, const char *bytes, size_t len, tdm_err *err);
/* Feeds a token of v: an end-of-generation token where the grammar is complete
 * pushes a state equal to the current one (and the matcher is then done); any other
 * as tdm_gmatch_accept of its bytes; a token that never matches: TANDEM_ERR_INVALID_ARG. */
tandem_status tdm_gmatch_accept_token(tdm_gmatch *m, const tdm_gvocab *v, int32_t id, tdm_err *err);
/* Whether the text so far is a whole sentence of the grammar (end of generation allowed). */
bool tdm_gmatch_is_complete(const tdm_gmatch *m);
/* Whether no text can follow any more (complete, and no stack can go on): the
 * scheduler can then end the sequence without asking the model. */
bool tdm_gmatch_is_finished(const tdm_gmatch *m);

/* Snapshots for speculation: the history is a stack of states, one per accepted
 * call.  tdm_gmatch_mark is the current depth (0 at creation); tdm_gmatch_rollback
 * returns to an earlier depth, dropping the later states (and their memory) in O(1)
 * amortised; a mark above the current depth is TANDEM_ERR_INVALID_ARG.  Typical use:
 * mark = tdm_gmatch_mark(m); for each drafted token: mask, accept; after
 * verification: rollback(m, mark + n_accepted). */
uint32_t tdm_gmatch_mark(const tdm_gmatch *m);
tandem_status tdm_gmatch_rollback(tdm_gmatch *m, uint32_t mark, tdm_err *err);
/* Forgets the history before the current state (it becomes mark 0) and frees the
 * memory only that history used: call it on committed text so a long generation does
 * not keep every state. */
tandem_status tdm_gmatch_commit(tdm_gmatch *m, tdm_err *err);

/* The allowed next tokens of v from the current state, into mask
 * (tdm_gvocab_mask_words(v) words, overwritten): a token is allowed when the grammar
 * accepts all its bytes from here (a token may end inside a UTF-8 sequence that some
 * allowed character completes); end-of-generation tokens only where complete; tokens
 * that never match never.  Cost: one walk over the vocabulary's sorted byte strings,
 * pruned at the first byte no stack allows, its transitions memoized; a copy for a
 * state among the matcher's last 4 (bench/RESULTS.md, issue 47 part, has the
 * measured costs), or a copy from the matcher's shared cache (tdm_gmatch_share) for
 * a state any matcher sharing it met recently.  *n_allowed (may be NULL): the count. */
tandem_status tdm_gmatch_mask(tdm_gmatch *m, const tdm_gvocab *v, uint32_t *mask, int32_t *n_allowed,
                              tdm_err *err);

/* ---- shared mask caches ---- */

/* A cache of the masks of grammar g's states over vocabulary v, at most about
 * max_bytes of masks (at least 16, at most TDM_GSHARE_MAX_ENTRIES masks), shared by
 * any number of matchers on g on any threads.  g and v must outlive it; it must
 * outlive its matchers. */
tandem_status tdm_gshare_create(const tdm_grammar *g, const tdm_gvocab *v, size_t max_bytes, tdm_gshare **out,
                                tdm_err *err);
void tdm_gshare_free(tdm_gshare *sh); /* NULL is a no-op */
/* Its lookups so far that found the state's mask (*hits) and that did not (*misses:
 * walks); a state the matcher's own last 4 hold is not looked up. */
void tdm_gshare_counts(tdm_gshare *sh, uint64_t *hits, uint64_t *misses);
/* Makes m's masks over sh's vocabulary go through sh (NULL: none).  TANDEM_ERR_INVALID_ARG
 * when sh is of another grammar than m's. */
tandem_status tdm_gmatch_share(tdm_gmatch *m, tdm_gshare *sh, tdm_err *err);

/* The number of stacks of the current state (for tests and diagnostics). */
uint32_t tdm_gmatch_n_stacks(const tdm_gmatch *m);

#endif
