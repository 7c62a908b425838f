/* tests.c - jinja2's tests ("x is defined") that chat templates use, and the
 * argument helpers of filters, tests and methods.
 *
 * Tests: boolean, callable, defined, divisibleby, eq, equalto, escaped, even, false,
 * float, ge, gt, in, integer, iterable, le, lower, lt, mapping, ne, none, number,
 * odd, sameas, sequence, string, true, undefined, upper, and == != < <= > >=. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jj_internal.h"

bool jj_arg(const jj_args *a, size_t i, const char *name, jj_val *out) {
    if (i < a->n_pos) {
        *out = a->pos[i];
        return true;
    }
    for (size_t k = 0; name && k < a->n_kw; k++)
        if (strcmp(a->kw[k], name) == 0) {
            *out = a->kwv[k];
            return true;
        }
    return false;
}

bool jj_arg_int(jj_ctx *c, const jj_node *n, const jj_args *a, size_t i, const char *name, int64_t def, int64_t *out) {
    jj_val v;
    *out = def;
    if (!jj_arg(a, i, name, &v) || v.t == JV_NONE) return true;
    if (v.t != JV_INT && v.t != JV_BOOL)
        return jj_fail(c, n, TANDEM_ERR_FORMAT, "argument '%s' must be an integer, not %s", name, jv_type_name(v));
    *out = v.t == JV_INT ? v.u.i : v.u.b;
    return true;
}

bool jj_arg_str(jj_ctx *c, const jj_node *n, const jj_args *a, size_t i, const char *name, const jj_str **out) {
    jj_val v;
    *out = NULL;
    if (!jj_arg(a, i, name, &v) || v.t == JV_NONE) return true;
    if (v.t != JV_STR) return jj_fail(c, n, TANDEM_ERR_FORMAT, "argument '%s' must be a string, not %s", name, jv_type_name(v));
    *out = v.u.s;
    return true;
}

bool jj_str_of(jj_ctx *c, jj_val v, const jj_str **out) {
    jj_val s;
    if (!jj_to_str(c, v, &s)) return false;
    *out = s.u.s;
    return true;
}

/* -------------------------------------------------------------- tests */

typedef bool (*test_fn)(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, bool *out);

static bool t_defined(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, bool *o) { (void)c, (void)n, (void)a; *o = v.t != JV_UNDEF; return true; }
static bool t_undefined(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, bool *o) { (void)c, (void)n, (void)a; *o = v.t == JV_UNDEF; return true; }
static bool t_none(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, bool *o) { (void)c, (void)n, (void)a; *o = v.t == JV_NONE; return true; }
static bool t_boolean(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, bool *o) { (void)c, (void)n, (void)a; *o = v.t == JV_BOOL; return true; }
static bool t_true(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, bool *o) { (void)c, (void)n, (void)a; *o = v.t == JV_BOOL && v.u.b; return true; }
static bool t_false(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, bool *o) { (void)c, (void)n, (void)a; *o = v.t == JV_BOOL && !v.u.b; return true; }
static bool t_integer(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, bool *o) { (void)c, (void)n, (void)a; *o = v.t == JV_INT; return true; }
static bool t_float(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, bool *o) { (void)c, (void)n, (void)a; *o = v.t == JV_FLOAT; return true; }
static bool t_number(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, bool *o) { (void)c, (void)n, (void)a; *o = v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL; return true; }
static bool t_string(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, bool *o) { (void)c, (void)n, (void)a; *o = v.t == JV_STR; return true; }
static bool t_mapping(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, bool *o) { (void)c, (void)n, (void)a; *o = v.t == JV_DICT; return true; }
static bool t_iterable(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, bool *o) { (void)c, (void)n, (void)a; *o = v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT || v.t == JV_UNDEF; return true; }
static bool t_sequence(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, bool *o) { (void)c, (void)n, (void)a; *o = v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT || v.t == JV_UNDEF; return true; }
static bool t_callable(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, bool *o) { (void)c, (void)n, (void)a; *o = v.t == JV_MACRO || v.t == JV_FUNC || v.t == JV_CALLER; return true; }
static bool t_escaped(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, bool *o) { (void)c, (void)n, (void)a, (void)v; *o = false; return true; }

static bool int_of(jj_ctx *c, const jj_node *n, jj_val v, int64_t *out) {
    if (v.t == JV_INT || v.t == JV_BOOL) return *out = v.t == JV_INT ? v.u.i : v.u.b, true;
    if (v.t == JV_UNDEF) return jj_fail(c, n, TANDEM_ERR_FORMAT, "'%s' is undefined", v.u.name ? v.u.name : "value");
    return jj_fail(c, n, TANDEM_ERR_FORMAT, "expected an integer, not %s", jv_type_name(v));
}

static bool t_odd(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, bool *o) {
    (void)a;
    int64_t i = 0;
    return int_of(c, n, v, &i) && (*o = i % 2 != 0, true);
}
static bool t_even(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, bool *o) {
    (void)a;
    int64_t i = 0;
    return int_of(c, n, v, &i) && (*o = i % 2 == 0, true);
}
static bool t_divisibleby(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, bool *o) {
    int64_t i = 0, d = 0;
    jj_val dv;
    if (!jj_arg(a, 0, "num", &dv)) return jj_fail(c, n, TANDEM_ERR_FORMAT, "divisibleby needs a number");
    if (!int_of(c, n, v, &i) || !int_of(c, n, dv, &d)) return false;
    if (d == 0) return jj_fail(c, n, TANDEM_ERR_FORMAT, "integer division or modulo by zero");
    *o = d == -1 || i % d == 0;
    return true;
}

/* The comparison tests: eq, ne, lt, ... against the first argument. */
static bool compare_test(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, int op, bool *o) {
    jj_val other, r;
    if (!jj_arg(a, 0, "other", &other)) return jj_fail(c, n, TANDEM_ERR_FORMAT, "the test needs a value to compare with");
    jj_node tmp = *n;
    tmp.op = (uint8_t)op;
    if (!jj_eval_binary(c, &tmp, v, other, &r)) return false;
    *o = r.u.b;
    return true;
}
static bool t_eq(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, bool *o) { return compare_test(c, n, v, a, OP_EQ, o); }
static bool t_ne(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, bool *o) { return compare_test(c, n, v, a, OP_NE, o); }
static bool t_lt(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, bool *o) { return compare_test(c, n, v, a, OP_LT, o); }
static bool t_le(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, bool *o) { return compare_test(c, n, v, a, OP_LE, o); }
static bool t_gt(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, bool *o) { return compare_test(c, n, v, a, OP_GT, o); }
static bool t_ge(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, bool *o) { return compare_test(c, n, v, a, OP_GE, o); }
static bool t_in(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, bool *o) { return compare_test(c, n, v, a, OP_IN, o); }
static bool t_sameas(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, bool *o) {
    jj_val other;
    if (!jj_arg(a, 0, "other", &other)) return jj_fail(c, n, TANDEM_ERR_FORMAT, "sameas needs a value");
    *o = v.t == other.t && (v.t == JV_NONE || v.t == JV_UNDEF || (v.t == JV_BOOL && v.u.b == other.u.b) ||
                            (v.t != JV_BOOL && memcmp(&v.u, &other.u, sizeof v.u) == 0));
    return true;
}
static bool t_lower(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, bool *o) {
    (void)n, (void)a;
    const jj_str *s, *l;
    if (!jj_str_of(c, v, &s) || !(l = jj_s_case(c, s, JJ_LOWER))) return false;
    *o = l->len == s->len && memcmp(l->s, s->s, s->len) == 0;
    return true;
}
static bool t_upper(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, bool *o) {
    (void)n, (void)a;
    const jj_str *s, *u;
    if (!jj_str_of(c, v, &s) || !(u = jj_s_case(c, s, JJ_UPPER))) return false;
    *o = u->len == s->len && memcmp(u->s, s->s, s->len) == 0;
    return true;
}

static const struct {
    const char *name;
    test_fn fn;
} tests[] = {
    {"defined", t_defined}, {"undefined", t_undefined}, {"none", t_none}, {"boolean", t_boolean},
    {"true", t_true}, {"false", t_false}, {"integer", t_integer}, {"float", t_float}, {"number", t_number},
    {"string", t_string}, {"mapping", t_mapping}, {"iterable", t_iterable}, {"sequence", t_sequence},
    {"callable", t_callable}, {"escaped", t_escaped}, {"odd", t_odd}, {"even", t_even},
    {"divisibleby", t_divisibleby}, {"eq", t_eq}, {"equalto", t_eq}, {"==", t_eq}, {"ne", t_ne}, {"!=", t_ne},
    {"lt", t_lt}, {"lessthan", t_lt}, {"<", t_lt}, {"le", t_le}, {"<=", t_le}, {"gt", t_gt},
    {"greaterthan", t_gt}, {">", t_gt}, {"ge", t_ge}, {">=", t_ge}, {"in", t_in}, {"sameas", t_sameas},
    {"lower", t_lower}, {"upper", t_upper},
};

static test_fn find_test(const char *name) {
    for (size_t i = 0; i < TDM_ARRAY_LEN(tests); i++)
        if (strcmp(tests[i].name, name) == 0) return tests[i].fn;
    return NULL;
}

bool jj_is_test(const char *name) { return find_test(name) != NULL; }

bool jj_test(jj_ctx *c, const jj_node *n, const char *name, jj_val in, const jj_args *a, bool *out) {
    test_fn f = find_test(name);
    if (!f) return jj_fail(c, n, TANDEM_ERR_UNSUPPORTED, "unknown test '%s'", name);
    return f(c, n, in, a, out);
}

