/* json_schema.h - JSON schema -> GBNF grammar (then compiled by tdm_grammar_parse):
 * the subset OpenAI's strict structured output allows, and a little more.
 *
 * Supported keywords:
 *   type (object, array, string, number, integer, boolean, null, or an array of
 *   them); properties, required, additionalProperties (false: no other members;
 *   true or absent: any other members with any values; a schema: other members with
 *   values of it); items, minItems, maxItems (bounds at most TDM_GRAMMAR_MAX_REPEAT);
 *   enum, const (any JSON values; matched in their compact spelling); anyOf, and
 *   oneOf taken as anyOf; $ref to #/$defs/NAME or #/definitions/NAME (recursion
 *   allowed); format date, date-time, time, uuid on strings; minLength, maxLength
 *   (at most TDM_GRAMMAR_MAX_REPEAT); minimum, maximum, exclusiveMinimum,
 *   exclusiveMaximum on integers (integer-valued bounds with at most 15 digits).
 *   An empty schema or `true` matches any JSON value.
 * Ignored by design (annotations): title, description, examples, default, $schema,
 * $id, $comment.  Every other keyword, minimum / maximum on numbers that are not
 * integers, a format other than those above, a keyword that does not apply to the
 * schema's type(s), `false` as a schema, and a $ref elsewhere: TANDEM_ERR_UNSUPPORTED
 * (or _FORMAT for a malformed value) whose message names the keyword and the
 * schema's JSON-pointer path ("#/properties/a/items").
 *
 * The generated text: members in the order of `properties`, the required ones first,
 * then the optional ones each present or not, then the additional ones; whitespace
 * as llama.cpp's json-schema-to-grammar (between tokens: nothing, a space, or one or
 * two newlines and up to 20 spaces / tabs); strings' characters as JSON allows (no
 * control characters, escapes \" \\ \/ \b \f \n \r \t \uXXXX); numbers with at most
 * 16 integer digits.  Limits: the schema at most TDM_JSON_SCHEMA_MAX_TEXT bytes, then
 * the grammar's limits (grammar.h).  An additional member's name is any string but
 * the declared names, compared as written (a name spelled with escapes, "\u0061" for
 * "a", is not recognised as the declared one; where a declared name itself holds a
 * character JSON escapes, a quote, a backslash or a control, any name is allowed).
 * Not enforced: members repeated; uniqueness in arrays; string patterns (refused).
 */
#ifndef TDM_JSON_SCHEMA_H
#define TDM_JSON_SCHEMA_H

#include "grammar.h"
#include "json.h"

#define TDM_JSON_SCHEMA_MAX_TEXT (1u << 20)

/* The GBNF text of a schema (JSON text, len bytes): *out malloc'ed, NUL-terminated. */
tandem_status tdm_json_schema_to_gbnf(const char *schema, size_t len, char **out, tdm_err *err);
/* The same from a parsed schema. */
tandem_status tdm_json_schema_to_gbnf_json(const tdm_json *schema, char **out, tdm_err *err);
/* Schema text -> compiled grammar. */
tandem_status tdm_json_schema_grammar(const char *schema, size_t len, tdm_grammar **out, tdm_err *err);
/* `json_object` (response_format): any JSON object. */
tandem_status tdm_json_object_grammar(tdm_grammar **out, tdm_err *err);

#endif
