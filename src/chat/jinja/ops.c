/* ops.c - the binary operators with Python's semantics: + - * / // % ** on numbers
 * (ints overflow-checked: an error, where Python would grow), + and * on strings and
 * lists, ~ (concatenation of the str() of both), comparisons, in / not in. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "jj_internal.h"

static bool is_int(jj_val v) { return v.t == JV_INT || v.t == JV_BOOL; }
static bool is_num(jj_val v) { return is_int(v) || v.t == JV_FLOAT; }
static int64_t ival(jj_val v) { return v.t == JV_INT ? v.u.i : (int64_t)v.u.b; }
static double fval(jj_val v) { return v.t == JV_FLOAT ? v.u.f : (double)ival(v); }

static const char *op_text(int op) {
    switch (op) {
    case OP_ADD: return "+";
    case OP_SUB: return "-";
    case OP_MUL: return "*";
    case OP_DIV: return "/";
    case OP_FLOORDIV: return "//";
    case OP_MOD: return "%";
    case OP_POW: return "**";
    default: return "?";
    }
}

static bool type_error(jj_ctx *c, const jj_node *n, jj_val a, jj_val b) {
    if (a.t == JV_UNDEF || b.t == JV_UNDEF) {
        jj_val u = a.t == JV_UNDEF ? a : b;
        if (u.u.name) return jj_fail(c, n, TANDEM_ERR_FORMAT, "'%s' is undefined", u.u.name);
        return jj_fail(c, n, TANDEM_ERR_FORMAT, "an undefined value was used with '%s'", op_text(n->op));
    }
    if (n->op == OP_MOD && a.t == JV_STR)
        return jj_fail(c, n, TANDEM_ERR_UNSUPPORTED, "printf-style string formatting ('%%') is not supported");
    return jj_fail(c, n, TANDEM_ERR_FORMAT, "unsupported operand type(s) for %s: '%s' and '%s'", op_text(n->op),
                   jv_type_name(a), jv_type_name(b));
}

static bool overflow(jj_ctx *c, const jj_node *n) { return jj_fail(c, n, TANDEM_ERR_FORMAT, "integer overflow"); }

/* dst[0..total) filled with copies of its first unit bytes, in doubling copies. */
static void fill_repeated(char *dst, size_t unit, size_t total) {
    for (size_t done = unit; unit && done < total;) {
        const size_t m = TDM_MIN(done, total - done);
        memcpy(dst + done, dst, m);
        done += m;
    }
}

/* s repeated k times (k <= 0: empty); the work is the length of the result, whatever
 * k is ('' * 10**18 is ''). */
static bool repeat(jj_ctx *c, const jj_node *n, jj_val seq, int64_t k, jj_val *out) {
    if (k < 0) k = 0;
    if (seq.t == JV_STR) {
        size_t len = seq.u.s->len, tot;
        if (tdm_mul_overflow_size(len, (size_t)k, &tot) || tot > c->lim.max_output)
            return jj_fail(c, n, TANDEM_ERR_NOMEM, "a repeated string longer than %zu bytes", c->lim.max_output);
        jj_str *s = jj_str_alloc(c, tot);
        if (!s) return false;
        if (tot) memcpy(s->s, seq.u.s->s, len);
        fill_repeated(s->s, len, tot);
        *out = jv_str(s);
        return true;
    }
    size_t tot;
    if (tdm_mul_overflow_size(seq.u.l->n, (size_t)k, &tot) || tot > c->lim.max_memory / sizeof(jj_val))
        return jj_fail(c, n, TANDEM_ERR_NOMEM, "a repeated list too long");
    jj_list *l = jj_list_new(c, tot);
    if (!l) return false;
    if (tot) memcpy(l->v, seq.u.l->v, seq.u.l->n * sizeof *l->v);
    fill_repeated((char *)l->v, seq.u.l->n * sizeof *l->v, tot * sizeof *l->v);
    l->n = tot;
    l->tuple = seq.u.l->tuple;
    *out = jv_list(l);
    return true;
}

static bool concat(jj_ctx *c, jj_val a, jj_val b, jj_val *out) {
    if (a.t == JV_STR && b.t == JV_STR) {
        jj_str *s = jj_str_alloc(c, a.u.s->len + b.u.s->len);
        if (!s) return false;
        memcpy(s->s, a.u.s->s, a.u.s->len);
        memcpy(s->s + a.u.s->len, b.u.s->s, b.u.s->len);
        *out = jv_str(s);
        return true;
    }
    jj_list *l = jj_list_new(c, a.u.l->n + b.u.l->n);
    if (!l) return false;
    for (size_t i = 0; i < a.u.l->n; i++) l->v[l->n++] = a.u.l->v[i];
    for (size_t i = 0; i < b.u.l->n; i++) l->v[l->n++] = b.u.l->v[i];
    l->tuple = a.u.l->tuple;
    *out = jv_list(l);
    return true;
}

static bool int_pow(jj_ctx *c, const jj_node *n, int64_t x, int64_t e, jj_val *out) {
    int64_t r = 1;
    while (e > 0) {
        if (e & 1 && __builtin_mul_overflow(r, x, &r)) return overflow(c, n);
        e >>= 1;
        if (e && __builtin_mul_overflow(x, x, &x)) return overflow(c, n);
    }
    *out = jv_int(r);
    return true;
}

static bool arith(jj_ctx *c, const jj_node *n, jj_val a, jj_val b, jj_val *out) {
    const int op = n->op;
    if (op == OP_ADD && ((a.t == JV_STR && b.t == JV_STR) || (a.t == JV_LIST && b.t == JV_LIST && a.u.l->tuple == b.u.l->tuple)))
        return concat(c, a, b, out);
    if (op == OP_MUL && (a.t == JV_STR || a.t == JV_LIST) && is_int(b)) return repeat(c, n, a, ival(b), out);
    if (op == OP_MUL && (b.t == JV_STR || b.t == JV_LIST) && is_int(a)) return repeat(c, n, b, ival(a), out);
    if (!is_num(a) || !is_num(b)) return type_error(c, n, a, b);
    if (is_int(a) && is_int(b) && op != OP_DIV) {
        int64_t x = ival(a), y = ival(b), r;
        switch (op) {
        case OP_ADD: if (__builtin_add_overflow(x, y, &r)) return overflow(c, n); break;
        case OP_SUB: if (__builtin_sub_overflow(x, y, &r)) return overflow(c, n); break;
        case OP_MUL: if (__builtin_mul_overflow(x, y, &r)) return overflow(c, n); break;
        case OP_FLOORDIV:
        case OP_MOD:
            if (y == 0) return jj_fail(c, n, TANDEM_ERR_FORMAT, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1) return overflow(c, n);
            r = op == OP_FLOORDIV ? x / y : x % y;
            if (op == OP_FLOORDIV && (x % y != 0) && ((x < 0) != (y < 0))) r--;
            if (op == OP_MOD && r != 0 && ((r < 0) != (y < 0))) r += y;
            break;
        case OP_POW:
            if (y < 0) {
                *out = jv_float(pow((double)x, (double)y));
                return true;
            }
            return int_pow(c, n, x, y, out);
        default: return type_error(c, n, a, b);
        }
        *out = jv_int(r);
        return true;
    }
    double x = fval(a), y = fval(b), r;
    switch (op) {
    case OP_ADD: r = x + y; break;
    case OP_SUB: r = x - y; break;
    case OP_MUL: r = x * y; break;
    case OP_DIV:
        if (y == 0) return jj_fail(c, n, TANDEM_ERR_FORMAT, "division by zero");
        r = x / y;
        break;
    case OP_FLOORDIV:
    case OP_MOD:
        if (y == 0) return jj_fail(c, n, TANDEM_ERR_FORMAT, "float division or modulo by zero");
        if (op == OP_FLOORDIV) {
            r = floor(x / y);
        } else {
            r = fmod(x, y);
            if (r != 0 && ((r < 0) != (y < 0))) r += y;
        }
        break;
    case OP_POW: r = pow(x, y); break;
    default: return type_error(c, n, a, b);
    }
    *out = jv_float(r);
    return true;
}

static bool contains(jj_ctx *c, const jj_node *n, jj_val needle, jj_val hay, bool *out) {
    switch (hay.t) {
    case JV_STR:
        if (needle.t != JV_STR)
            return jj_fail(c, n, TANDEM_ERR_FORMAT, "'in <string>' requires string as left operand, not %s",
                           jv_type_name(needle));
        *out = jj_s_find(c, hay.u.s->s, hay.u.s->len, 0, needle.u.s) != SIZE_MAX;
        return !jj_over(c);
    case JV_LIST:
        *out = false;
        for (size_t i = 0; i < hay.u.l->n && !*out; i++) *out = jj_equal(c, hay.u.l->v[i], needle);
        return !jj_over(c);
    case JV_DICT:
    case JV_NS: *out = jj_dict_find(c, hay.u.d, needle) != NULL; return !jj_over(c);
    case JV_UNDEF: *out = false; return true;
    default:
        return jj_fail(c, n, TANDEM_ERR_FORMAT, "argument of type '%s' is not iterable", jv_type_name(hay));
    }
}

bool jj_eval_binary(jj_ctx *c, const jj_node *n, jj_val a, jj_val b, jj_val *out) {
    int cmp;
    bool r = false;
    switch (n->op) {
    case OP_CONCAT: {
        jj_val x, y;
        return jj_to_str(c, a, &x) && jj_to_str(c, b, &y) && concat(c, x, y, out);
    }
    case OP_EQ: *out = jv_bool(jj_equal(c, a, b)); return !jj_over(c);
    case OP_NE: *out = jv_bool(!jj_equal(c, a, b)); return !jj_over(c);
    case OP_LT: case OP_LE: case OP_GT: case OP_GE:
        if (a.t == JV_UNDEF || b.t == JV_UNDEF) return type_error(c, n, a, b);
        if (!jj_compare(c, n, a, b, &cmp)) return false;
        r = cmp == 2 ? false
          : n->op == OP_LT ? cmp < 0 : n->op == OP_LE ? cmp <= 0 : n->op == OP_GT ? cmp > 0 : cmp >= 0;
        *out = jv_bool(r);
        return true;
    case OP_IN:
    case OP_NOTIN:
        if (!contains(c, n, a, b, &r)) return false;
        *out = jv_bool(n->op == OP_IN ? r : !r);
        return true;
    default:
        return arith(c, n, a, b, out);
    }
}
