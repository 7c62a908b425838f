/* tool_grammar.c - a grammar that admits only tool calls in a template's format
 * (tool_calls.h), for tool_choice "required" or a named function: the calls' JSON
 * objects come from one JSON schema (json_schema.h) whose alternatives are the tools
 * offered, each {"name": its name, "arguments" (llama3: "parameters"): its
 * parameters' schema}, and the format's markers are written around them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_schema.h"
#include "tool_calls.h"

/* A name of [A-Za-z0-9_-], 1 to 64 bytes (as the server accepts them): safe inside a
 * JSON string and a schema's const. */
static bool plain_name(const char *s) {
    size_t n = 0;
    for (; s[n]; n++)
        if (!((s[n] >= 'a' && s[n] <= 'z') || (s[n] >= 'A' && s[n] <= 'Z') || (s[n] >= '0' && s[n] <= '9') ||
              s[n] == '_' || s[n] == '-'))
            return false;
    return n >= 1 && n <= 64;
}

tandem_status tdm_tool_grammar(tdm_tool_format f, const char *const *names, const char *const *params, size_t n,
                               int only, bool parallel, char **out, tdm_err *err) {
    *out = NULL;
    if (f != TDM_TOOL_FORMAT_HERMES && f != TDM_TOOL_FORMAT_LLAMA3)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED,
                          "tool calls in the %s format cannot be enforced by a grammar (its markers are control tokens, "
                          "which no grammar writes)",
                          tdm_tool_format_name(f));
    if (n == 0 || only >= (int)n) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "tool grammar: no such tool");
    const char *arg_key = f == TDM_TOOL_FORMAT_LLAMA3 ? "parameters" : "arguments";
    char *schema = NULL, *gbnf = NULL;
    size_t schema_len = 0, gbnf_len = 0;
    FILE *sf = open_memstream(&schema, &schema_len);
    if (!sf) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory building a tool grammar");
    fputs("{\"anyOf\": [", sf);
    bool first = true;
    for (size_t i = 0; i < n; i++) {
        if (only >= 0 && (size_t)only != i) continue;
        if (!plain_name(names[i])) {
            fclose(sf);
            free(schema);
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "tool grammar: tool name '%s' is not 1 to 64 of [A-Za-z0-9_-]",
                              names[i]);
        }
        fprintf(sf,
                "%s{\"type\": \"object\", \"properties\": {\"name\": {\"const\": \"%s\"}, \"%s\": %s}, "
                "\"required\": [\"name\", \"%s\"], \"additionalProperties\": false}",
                first ? "" : ", ", names[i], arg_key, params && params[i] ? params[i] : "{\"type\": \"object\"}", arg_key);
        first = false;
    }
    fputs("]}", sf);
    if (fclose(sf) != 0 || !schema) {
        free(schema);
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory building a tool grammar");
    }
    char *obj = NULL;
    tandem_status st = tdm_json_schema_to_gbnf(schema, schema_len, &obj, err);
    free(schema);
    if (st) return st;
    /* the schema's root becomes the call object's rule; the calls' rules take the root */
    char *root = strstr(obj, "root ::= ");
    FILE *gf = root ? open_memstream(&gbnf, &gbnf_len) : NULL;
    if (!gf) {
        free(obj);
        return root ? tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory building a tool grammar")
                    : tdm_seterr(err, TANDEM_ERR_INTERNAL, "tool grammar: the schema's grammar has no root");
    }
    fwrite(obj, 1, (size_t)(root - obj), gf);
    fprintf(gf, "tool-obj ::= %s", root + strlen("root ::= "));
    if (f == TDM_TOOL_FORMAT_HERMES)
        fprintf(gf, "tool-call ::= \"<tool_call>\\n\" tool-obj \"\\n</tool_call>\"\nroot ::= tool-call%s\n",
                parallel ? " (\"\\n\" tool-call)*" : "");
    else
        fprintf(gf, "root ::= tool-obj%s\n", parallel ? " (\"; \" tool-obj)*" : "");
    free(obj);
    if (fclose(gf) != 0 || !gbnf) {
        free(gbnf);
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory building a tool grammar");
    }
    *out = gbnf;
    return TANDEM_OK;
}
