/*
 * Unit tests of the JSON parser and writer (util/json.h): every kind of value and accessor,
 * number conversion against strtod, string escapes and surrogate pairs, one test per class of
 * malformed input with its position in the message, nesting limits, every prefix of a document
 * (truncation) and random corruptions, flattening nested tensor data into each dtype with its
 * errors, writer output and misuse, float32 shortest round trips, writer->parser round trips
 * of tensor data, the documented memory bound, and a small benchmark (1M floats) that prints
 * its timings without asserting on them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/json.h"

static mts_json_doc *parse_ok(const char *text)
{
    mts_json_doc *doc = NULL;
    mts_err err = {0};
    int rc = mts_json_parse(text, strlen(text), &doc, &err);
    if (rc) fail_msg("parse of %s failed: %s", text, err.msg);
    return doc;
}

/* Parses text (len bytes), expects MTS_EINVAL and a message containing want. */
static void parse_bad_n(const char *text, size_t len, const char *want)
{
    mts_json_doc *doc = (mts_json_doc *)1;
    mts_err err = {0};
    int rc = mts_json_parse(text, len, &doc, &err);
    if (rc != MTS_EINVAL) fail_msg("'%.*s': expected MTS_EINVAL, got %d", (int)len, text, rc);
    assert_null(doc);
    assert_int_equal(err.code, MTS_EINVAL);
    if (!strstr(err.msg, want)) fail_msg("'%.*s': message '%s' lacks '%s'", (int)len, text, err.msg, want);
}

static void parse_bad(const char *text, const char *want) { parse_bad_n(text, strlen(text), want); }

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static float rnd_float(void) /* any finite float, denormals included */
{
    for (;;) {
        uint32_t b = (uint32_t)rnd();
        float f;
        memcpy(&f, &b, sizeof f);
        if (isfinite(f)) return f;
    }
}

static void test_values_and_accessors(void **state)
{
    (void)state;
    const char *text = " {\"name\": \"x\", \"shape\": [2, 3], \"ok\": true, \"no\": false,\n"
                       "  \"nil\": null, \"pi\": 3.25, \"big\": -9223372036854775808,\n"
                       "  \"empty_a\": [], \"empty_o\": {}, \"nested\": {\"a\": [{\"b\": [1]}]},\n"
                       "  \"dup\": 1, \"dup\": 2, \"\": \"empty key\"} ";
    mts_json_doc *doc = parse_ok(text);
    const mts_json *r = mts_json_root(doc);
    assert_int_equal(mts_json_type(r), MTS_JSON_OBJECT);
    assert_int_equal(mts_json_len(r), 13);
    assert_string_equal(mts_json_key_at(r, 0), "name");
    assert_string_equal(mts_json_key_at(r, 12), "");
    assert_null(mts_json_key_at(r, 13));
    size_t n;
    assert_string_equal(mts_json_str(mts_json_get(r, "name"), &n), "x");
    assert_int_equal(n, 1);
    assert_string_equal(mts_json_str(mts_json_at(r, 0), NULL), "x"); /* value of member 0 */
    const mts_json *shape = mts_json_get(r, "shape");
    assert_int_equal(mts_json_type(shape), MTS_JSON_ARRAY);
    assert_int_equal(mts_json_len(shape), 2);
    int64_t iv = 0;
    assert_int_equal(mts_json_int(mts_json_at(shape, 1), &iv), MTS_OK);
    assert_int_equal(iv, 3);
    assert_null(mts_json_at(shape, 2));
    assert_true(mts_json_bool(mts_json_get(r, "ok")));
    assert_false(mts_json_bool(mts_json_get(r, "no")));
    assert_int_equal(mts_json_type(mts_json_get(r, "no")), MTS_JSON_BOOL);
    assert_int_equal(mts_json_type(mts_json_get(r, "nil")), MTS_JSON_NULL);
    assert_true(mts_json_num(mts_json_get(r, "pi")) == 3.25);
    assert_false(mts_json_is_int(mts_json_get(r, "pi")));
    assert_int_equal(mts_json_int(mts_json_get(r, "pi"), &iv), MTS_EINVAL);
    assert_int_equal(mts_json_int(mts_json_get(r, "big"), &iv), MTS_OK);
    assert_true(iv == INT64_MIN);
    assert_int_equal(mts_json_len(mts_json_get(r, "empty_a")), 0);
    assert_int_equal(mts_json_type(mts_json_get(r, "empty_o")), MTS_JSON_OBJECT);
    assert_int_equal(mts_json_len(mts_json_get(r, "empty_o")), 0);
    const mts_json *b = mts_json_at(mts_json_get(mts_json_at(mts_json_get(mts_json_get(r, "nested"), "a"), 0), "b"), 0);
    assert_true(mts_json_num(b) == 1.0);
    /* Duplicate keys: both kept in order, lookup finds the last. */
    assert_true(mts_json_num(mts_json_get(r, "dup")) == 2.0);
    assert_string_equal(mts_json_key_at(r, 10), "dup");
    assert_true(mts_json_num(mts_json_at(r, 10)) == 1.0);
    assert_string_equal(mts_json_str(mts_json_get(r, ""), NULL), "empty key");
    /* Accessors on the wrong type or NULL answer neutrally. */
    assert_null(mts_json_get(r, "missing"));
    assert_null(mts_json_get(shape, "x"));
    assert_int_equal(mts_json_type(NULL), MTS_JSON_NONE);
    assert_int_equal(mts_json_len(mts_json_get(r, "name")), 0);
    assert_null(mts_json_str(shape, NULL));
    assert_true(isnan(mts_json_num(mts_json_get(r, "name"))));
    assert_false(mts_json_bool(NULL));
    assert_null(mts_json_key_at(shape, 0));
    assert_string_equal(mts_json_type_name(MTS_JSON_ARRAY), "array");
    mts_json_free(doc);

    /* Scalars at the top level. */
    doc = parse_ok("\"top\"");
    assert_string_equal(mts_json_str(mts_json_root(doc), NULL), "top");
    mts_json_free(doc);
    doc = parse_ok(" null ");
    assert_int_equal(mts_json_type(mts_json_root(doc)), MTS_JSON_NULL);
    mts_json_free(doc);
    doc = parse_ok("-12");
    assert_true(mts_json_num(mts_json_root(doc)) == -12.0);
    mts_json_free(doc);
    mts_json_free(NULL);

    /* The input need not be NUL-terminated: only len bytes are read. */
    char buf[4] = {'[', '7', ']', '9'};
    mts_err err = {0};
    assert_int_equal(mts_json_parse(buf, 3, &doc, &err), 0);
    assert_true(mts_json_num(mts_json_at(mts_json_root(doc), 0)) == 7.0);
    mts_json_free(doc);
}

static void check_num(const char *lit, double want, bool is_int, int64_t want_int)
{
    mts_json_doc *doc = parse_ok(lit);
    const mts_json *v = mts_json_root(doc);
    double got = mts_json_num(v);
    if (memcmp(&got, &want, sizeof got) != 0) fail_msg("%s: got %.17g, want %.17g", lit, got, want);
    if (mts_json_is_int(v) != is_int) fail_msg("%s: is_int %d", lit, mts_json_is_int(v));
    int64_t iv;
    if (is_int) {
        assert_int_equal(mts_json_int(v, &iv), MTS_OK);
        if (iv != want_int) fail_msg("%s: int %lld, want %lld", lit, (long long)iv, (long long)want_int);
    } else {
        assert_int_equal(mts_json_int(v, &iv), MTS_EINVAL);
    }
    mts_json_free(doc);
}

static void test_numbers(void **state)
{
    (void)state;
    check_num("0", 0.0, true, 0);
    check_num("-0", -0.0, true, 0);
    check_num("-0.0e5", -0.0, true, 0);
    check_num("42", 42.0, true, 42);
    check_num("-7", -7.0, true, -7);
    check_num("1.0", 1.0, true, 1);
    check_num("1.50e1", 15.0, true, 15);
    check_num("3E2", 300.0, true, 300);
    check_num("12300e-2", 123.0, true, 123);
    check_num("9223372036854775807", 9223372036854775807.0, true, INT64_MAX);
    check_num("-9223372036854775808", -9223372036854775808.0, true, INT64_MIN);
    check_num("9223372036854775808", 9223372036854775808.0, false, 0);
    check_num("9007199254740993", 9007199254740992.0, true, 9007199254740993LL); /* exact int64 */
    check_num("1.5", 1.5, false, 0);
    check_num("0.1", 0.1, false, 0);
    check_num("-2.5e-3", -2.5e-3, false, 0);
    check_num("1e22", 1e22, false, 0);
    check_num("1e-400", 0.0, false, 0); /* underflow quietly becomes 0 */
    check_num("4.9e-324", 4.9e-324, false, 0);
    check_num("1.7976931348623157e308", 1.7976931348623157e308, false, 0);
    check_num("123456789012345678901234567890", 123456789012345678901234567890.0, false, 0);
    check_num("0.30000000000000004", 0.30000000000000004, false, 0);
    check_num("100000000000000000000000", 1e23, false, 0);
    check_num("0.000000000000000000000000000001", 1e-30, false, 0);
    check_num("1.00000000000000000000000000001", 1.0, false, 0);

    /* Random literals of every length and exponent agree bit for bit with strtod. */
    char lit[64];
    for (int t = 0; t < 200000; t++) {
        int nd = 1 + (int)(rnd() % 22), pt = (int)(rnd() % (unsigned)(nd + 1)), k = 0;
        if (rnd() & 1) lit[k++] = '-';
        for (int i = 0; i < nd; i++) {
            if (i == pt && i > 0) lit[k++] = '.';
            lit[k++] = (char)('0' + (i == 0 ? 1 + rnd() % 9 : rnd() % 10));
        }
        if (rnd() % 3) k += snprintf(lit + k, sizeof lit - (size_t)k, "e%d", (int)(rnd() % 90) - 45);
        lit[k] = '\0';
        mts_json_doc *doc = NULL;
        mts_err err = {0};
        if (mts_json_parse(lit, (size_t)k, &doc, &err)) fail_msg("%s: %s", lit, err.msg);
        double got = mts_json_num(mts_json_root(doc)), want = strtod(lit, NULL);
        if (memcmp(&got, &want, sizeof got) != 0) fail_msg("%s: got %.17g, strtod %.17g", lit, got, want);
        mts_json_free(doc);
    }
    /* Doubles printed with 17 digits (the long double path) too. */
    for (int t = 0; t < 200000; t++) {
        double d;
        uint64_t b = rnd();
        memcpy(&d, &b, sizeof d);
        if (!isfinite(d)) continue;
        snprintf(lit, sizeof lit, "%.17g", d);
        mts_json_doc *doc = parse_ok(lit);
        double got = mts_json_num(mts_json_root(doc));
        if (memcmp(&got, &d, sizeof got) != 0) fail_msg("%s: got %.17g", lit, got);
        mts_json_free(doc);
    }
}

static void test_strings(void **state)
{
    (void)state;
    mts_json_doc *doc = parse_ok("[\"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\t\", \"\\u00e9\\u20AC\", \"\\ud83d\\ude00\","
                                 " \"x\\u0000y\", \"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\", \"\"]");
    const mts_json *r = mts_json_root(doc);
    size_t n;
    assert_string_equal(mts_json_str(mts_json_at(r, 0), &n), "a\"b\\c/d\b\f\n\r\t");
    assert_int_equal(n, 12);
    assert_string_equal(mts_json_str(mts_json_at(r, 1), NULL), "\xc3\xa9\xe2\x82\xac");
    assert_string_equal(mts_json_str(mts_json_at(r, 2), &n), "\xf0\x9f\x98\x80");
    assert_int_equal(n, 4);
    const char *s = mts_json_str(mts_json_at(r, 3), &n);
    assert_int_equal(n, 3);
    assert_memory_equal(s, "x\0y", 4);
    assert_string_equal(mts_json_str(mts_json_at(r, 4), NULL), "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
    assert_string_equal(mts_json_str(mts_json_at(r, 5), &n), "");
    assert_int_equal(n, 0);
    mts_json_free(doc);

    /* Keys are decoded too, and looked up by their decoded bytes. */
    doc = parse_ok("{\"a\\u0062\": 1, \"k\\u0000z\": 2}");
    assert_true(mts_json_num(mts_json_get(mts_json_root(doc), "ab")) == 1.0);
    assert_true(mts_json_num(mts_json_get_n(mts_json_root(doc), "k\0z", 3)) == 2.0);
    size_t kl;
    assert_non_null(mts_json_key_at_n(mts_json_root(doc), 1, &kl));
    assert_int_equal(kl, 3);
    mts_json_free(doc);

    parse_bad("[\"ab\\q\"]", "invalid escape '\\q' in string at byte 4 (line 1, column 5)");
    parse_bad("[\"ab\tc\"]", "unescaped control character 0x09 in string at byte 4");
    parse_bad("\"a\nb\"", "unescaped control character 0x0a in string at byte 2");
    parse_bad("\"\\ud800\"", "unpaired surrogate \\ud800 in string at byte 1");
    parse_bad("\"\\ud800\\u0041\"", "unpaired surrogate \\ud800 in string at byte 1");
    parse_bad("\"xx\\udc00\"", "unpaired surrogate \\udc00 in string at byte 3");
    parse_bad("\"\\u12g4\"", "invalid \\u escape (expected 4 hex digits) at byte 1");
    parse_bad("\"\\u12\"", "invalid \\u escape (expected 4 hex digits) at byte 1");
    parse_bad("\"\xc0\x80\"", "invalid UTF-8 in string at byte 1");
    parse_bad("\"ok\xed\xa0\x80\"", "invalid UTF-8 in string at byte 3");
    parse_bad("\"\xf5\x80\x80\x80\"", "invalid UTF-8 in string at byte 1");
    parse_bad("\"\xe2\x82\"", "invalid UTF-8 in string at byte 1");
    parse_bad("[\"abc", "unterminated string starting at byte 1");
    parse_bad("[\"abc\\\"]", "unterminated string starting at byte 1");
    parse_bad("\"abc\\", "unterminated string starting at byte 0");
}

static void test_errors(void **state)
{
    (void)state;
    parse_bad("", "JSON: empty input");
    parse_bad(" \n\t ", "JSON: empty input");
    parse_bad("[1,2", "JSON: unexpected end of input at byte 4 (line 1, column 5): expected ',' or ']'");
    parse_bad("[1 2]", "JSON: expected ',' or ']' at byte 3 (line 1, column 4), found '2'");
    parse_bad("{\"a\": 1,\n  \"b\" 2}", "JSON: expected ':' at byte 15 (line 2, column 7), found '2'");
    parse_bad("{\"a\": 1\n\n   x}", "expected ',' or '}' at byte 12 (line 3, column 4), found 'x'");
    parse_bad("[1,]", "expected a value at byte 3 (line 1, column 4), found ']'");
    parse_bad("{\"a\":1,}", "expected '\"' (a member name) at byte 7");
    parse_bad("{1:2}", "expected '\"' (a member name) at byte 1");
    parse_bad("{\"a\"", "unexpected end of input at byte 4 (line 1, column 5): expected ':'");
    parse_bad("[01]", "leading zero in number at byte 1");
    parse_bad("-012", "leading zero in number at byte 0");
    parse_bad("-", "unexpected end of input at byte 1 (line 1, column 2): expected a digit after '-'");
    parse_bad("-x", "expected a digit after '-' at byte 1");
    parse_bad("[1.]", "expected a digit after '.' at byte 3");
    parse_bad("1e", "expected a digit in the exponent");
    parse_bad("[1e+]", "expected a digit in the exponent at byte 4");
    parse_bad(".5", "expected a value at byte 0 (line 1, column 1), found '.'");
    parse_bad("+1", "expected a value at byte 0");
    parse_bad("[NaN]", "expected a value at byte 1");
    parse_bad("[Infinity]", "expected a value at byte 1");
    parse_bad("[-Infinity]", "expected a digit after '-' at byte 2");
    parse_bad("[tru]", "invalid literal (expected true, false or null) at byte 1");
    parse_bad("nul", "unexpected end of input at byte 3 (line 1, column 4): expected null");
    parse_bad("truex", "unexpected data after the document at byte 4");
    parse_bad("[1] x", "unexpected data after the document at byte 4 (line 1, column 5)");
    parse_bad("{} {}", "unexpected data after the document at byte 3");
    parse_bad("[1e400]", "number out of range at byte 1");
    parse_bad("-1e99999999999999999999", "number out of range at byte 0");
    parse_bad("\xef\xbb\xbf[]", "expected a value at byte 0 (line 1, column 1), found byte 0xef");
    parse_bad("[1,\x01]", "found byte 0x01");
    parse_bad_n("[1,\0]", 5, "expected a value at byte 3 (line 1, column 4), found byte 0x00");
    parse_bad("'a'", "found '''");

    /* Every strict prefix of a document is truncated input (and never read out of bounds). */
    const char *doc_text = "{\"inputs\":[{\"name\":\"x\\u00e9\",\"shape\":[2,2],\"data\":[[1.5,-2e3],[true,null]]}],"
                           "\"id\":\"r\\n1\",\"n\":-0.25E-2}";
    size_t len = strlen(doc_text);
    for (size_t k = 0; k < len; k++) {
        char *copy = malloc(k ? k : 1); /* exact-size copy: ASan catches any over-read */
        memcpy(copy, doc_text, k);
        mts_json_doc *doc = (mts_json_doc *)1;
        mts_err err = {0};
        assert_int_equal(mts_json_parse(copy, k, &doc, &err), MTS_EINVAL);
        assert_null(doc);
        assert_non_null(strstr(err.msg, "JSON: "));
        free(copy);
    }
    mts_json_doc *doc = parse_ok(doc_text);
    mts_json_free(doc);

    /* Random corruption: must never crash or leak, and a failure always says where. */
    char *mut = malloc(len);
    for (int t = 0; t < 20000; t++) {
        memcpy(mut, doc_text, len);
        int edits = 1 + (int)(rnd() % 3);
        for (int e = 0; e < edits; e++) mut[rnd() % len] = "[]{},:\"\\0-e.9 xtu\x80\x01"[rnd() % 20];
        mts_err err = {0};
        doc = NULL;
        int rc = mts_json_parse(mut, len, &doc, &err);
        if (rc) {
            assert_int_equal(rc, MTS_EINVAL);
            assert_non_null(strstr(err.msg, "JSON: "));
            if (!strstr(err.msg, "at byte ")) fail_msg("no position in '%s'", err.msg);
        }
        mts_json_free(doc);
    }
    free(mut);
}

static void test_nesting_limit(void **state)
{
    (void)state;
    char buf[300];
    for (int depth = 63; depth <= 65; depth++) {
        int k = 0;
        for (int i = 0; i < depth; i++) {
            if (i % 2) {
                buf[k++] = '[';
            } else {
                memcpy(buf + k, "{\"k\":", 5);
                k += 5;
            }
        }
        buf[k++] = '1';
        for (int i = depth - 1; i >= 0; i--) buf[k++] = i % 2 ? ']' : '}';
        buf[k] = '\0';
        mts_json_doc *doc = NULL;
        mts_err err = {0};
        int rc = mts_json_parse(buf, (size_t)k, &doc, &err);
        if (depth <= MTS_JSON_MAX_DEPTH) {
            if (rc) fail_msg("depth %d: %s", depth, err.msg);
            const mts_json *v = mts_json_root(doc);
            for (int i = 0; i < depth; i++) v = i % 2 ? mts_json_at(v, 0) : mts_json_get(v, "k");
            assert_true(mts_json_num(v) == 1.0);
            mts_json_free(doc);
        } else {
            assert_int_equal(rc, MTS_EINVAL);
            assert_non_null(strstr(err.msg, "nesting deeper than 64 at byte"));
        }
    }
    /* A million open brackets fail fast at the 65th, without recursion. */
    size_t n = 1000000;
    char *deep = malloc(n);
    memset(deep, '[', n);
    parse_bad_n(deep, n, "JSON: nesting deeper than 64 at byte 64 (line 1, column 65)");
    free(deep);
}

static void test_flatten(void **state)
{
    (void)state;
    mts_json_doc *doc = parse_ok("{\"a\": [[1, 2, 3], [4, 5, 6]], \"f\": [[0.5, -1.25], [3, true]],"
                                 " \"big\": [9007199254740993, -9223372036854775808, 1.0, 2e3],"
                                 " \"b\": [true, false, 1, 0], \"deep\": [[[[1]], [[2]]]], \"s\": 7, \"e\": [[], []],"
                                 " \"negz\": [-0, -0.0]}");
    const mts_json *r = mts_json_root(doc);
    mts_err err = {0};
    const mts_json *a = mts_json_get(r, "a");
    assert_int_equal(mts_json_numel(a), 6);
    float f[6];
    assert_int_equal(mts_json_flatten(a, MTS_DTYPE_FLOAT, f, 6, &err), 0);
    for (int i = 0; i < 6; i++) assert_true(f[i] == (float)(i + 1));
    int64_t i64[6];
    assert_int_equal(mts_json_flatten(a, MTS_DTYPE_INT64, i64, 6, &err), 0);
    assert_true(i64[5] == 6);
    int32_t i32[6];
    assert_int_equal(mts_json_flatten(a, MTS_DTYPE_INT32, i32, 6, &err), 0);
    assert_int_equal(i32[3], 4);
    int8_t i8[6];
    assert_int_equal(mts_json_flatten(a, MTS_DTYPE_INT8, i8, 6, &err), 0);
    assert_int_equal(i8[2], 3);
    uint8_t u8[6];
    assert_int_equal(mts_json_flatten(a, MTS_DTYPE_UINT8, u8, 6, &err), 0);
    assert_int_equal(u8[0], 1);

    assert_int_equal(mts_json_flatten(mts_json_get(r, "f"), MTS_DTYPE_FLOAT, f, 4, &err), 0);
    assert_true(f[0] == 0.5f && f[1] == -1.25f && f[2] == 3.0f && f[3] == 1.0f);
    assert_int_equal(mts_json_flatten(mts_json_get(r, "big"), MTS_DTYPE_INT64, i64, 4, &err), 0);
    assert_true(i64[0] == 9007199254740993LL && i64[1] == INT64_MIN && i64[2] == 1 && i64[3] == 2000);
    assert_int_equal(mts_json_flatten(mts_json_get(r, "b"), MTS_DTYPE_BOOL, u8, 4, &err), 0);
    assert_true(u8[0] == 1 && u8[1] == 0 && u8[2] == 1 && u8[3] == 0);
    assert_int_equal(mts_json_numel(mts_json_get(r, "deep")), 2);
    assert_int_equal(mts_json_flatten(mts_json_get(r, "deep"), MTS_DTYPE_INT32, i32, 2, &err), 0);
    assert_true(i32[0] == 1 && i32[1] == 2);
    assert_int_equal(mts_json_flatten(mts_json_get(r, "s"), MTS_DTYPE_INT64, i64, 1, &err), 0);
    assert_true(i64[0] == 7);
    assert_int_equal(mts_json_numel(mts_json_get(r, "e")), 0);
    assert_int_equal(mts_json_flatten(mts_json_get(r, "e"), MTS_DTYPE_FLOAT, f, 0, &err), 0);
    assert_int_equal(mts_json_flatten(mts_json_get(r, "negz"), MTS_DTYPE_FLOAT, f, 2, &err), 0);
    assert_true(signbit(f[0]) && signbit(f[1]));

    /* Count mismatch: the caller formats the shape, we report counts. */
    assert_int_equal(mts_json_flatten(a, MTS_DTYPE_FLOAT, f, 5, &err), MTS_EINVAL);
    assert_string_equal(err.msg, "data has 6 elements, expected 5");
    assert_int_equal(mts_json_flatten(NULL, MTS_DTYPE_FLOAT, f, 5, &err), MTS_EINVAL);
    assert_int_equal(mts_json_flatten(a, MTS_DTYPE_STRING, f, 6, &err), MTS_EUNSUPPORTED);
    mts_json_free(doc);

    struct {
        const char *text;
        mts_dtype dt;
        const char *want;
    } bad[] = {
        {"[1, 2, \"x\"]", MTS_DTYPE_FLOAT, "data element 2 is a string, expected a number or bool"},
        {"[[1, 2], [null, 4]]", MTS_DTYPE_INT64, "data element 2 is null, expected a number or bool"},
        {"[[1, {}]]", MTS_DTYPE_INT64, "data element 1 is an object, expected a number or bool"},
        {"[1, 300]", MTS_DTYPE_UINT8, "data element 1 (300) is out of range for uint8"},
        {"[-1]", MTS_DTYPE_UINT8, "data element 0 (-1) is out of range for uint8"},
        {"[127, 128]", MTS_DTYPE_INT8, "data element 1 (128) is out of range for int8"},
        {"[[0], [2147483648]]", MTS_DTYPE_INT32, "data element 1 (2147483648) is out of range for int32"},
        {"[1, 1.5]", MTS_DTYPE_INT64, "data element 1 (1.5) is not an integer (int64)"},
        {"[1e20]", MTS_DTYPE_INT64, "data element 0 (1e+20) is out of range for int64"},
        {"[0.5]", MTS_DTYPE_INT32, "data element 0 (0.5) is not an integer (int32)"},
        {"[1, 1e39]", MTS_DTYPE_FLOAT, "data element 1 (1e+39) is out of range for float"},
        {"[true, 2]", MTS_DTYPE_BOOL, "data element 1 (2) is not a bool (expected true, false, 0 or 1)"},
    };
    for (size_t t = 0; t < sizeof bad / sizeof bad[0]; t++) {
        doc = parse_ok(bad[t].text);
        int64_t out[4];
        const mts_json *v = mts_json_root(doc);
        int rc = mts_json_flatten(v, bad[t].dt, out, mts_json_numel(v), &err);
        assert_int_equal(rc, MTS_EINVAL);
        if (strcmp(err.msg, bad[t].want) != 0) fail_msg("%s: '%s', want '%s'", bad[t].text, err.msg, bad[t].want);
        mts_json_free(doc);
    }
}

static const char *finish(mts_jw *w)
{
    const char *text;
    mts_err err = {0};
    if (mts_jw_finish(w, &text, NULL, &err)) fail_msg("writer: %s", err.msg);
    return text;
}

static void test_writer(void **state)
{
    (void)state;
    mts_jw w;
    mts_jw_init(&w);
    mts_jw_begin_object(&w);
    mts_jw_key(&w, "s");
    mts_jw_string(&w, "q\"\\/\n\t\x01\x1f caf\xc3\xa9 \xf0\x9f\x98\x80");
    mts_jw_key(&w, "bad utf8");
    mts_jw_string(&w, "a\xff" "b\xc3");
    mts_jw_key(&w, "i");
    mts_jw_int(&w, INT64_MIN);
    mts_jw_key(&w, "u");
    mts_jw_uint(&w, UINT64_MAX);
    mts_jw_key(&w, "d");
    mts_jw_begin_array(&w);
    mts_jw_double(&w, 0.1);
    mts_jw_double(&w, -2.5e-300);
    mts_jw_double(&w, 1e21);
    mts_jw_double(&w, 3.0);
    mts_jw_double(&w, -0.0);
    mts_jw_double(&w, NAN);
    mts_jw_double(&w, INFINITY);
    mts_jw_float(&w, 0.1f);
    mts_jw_float(&w, -INFINITY);
    mts_jw_end_array(&w);
    mts_jw_key(&w, "b");
    mts_jw_bool(&w, true);
    mts_jw_key(&w, "f");
    mts_jw_bool(&w, false);
    mts_jw_key(&w, "n");
    mts_jw_null(&w);
    mts_jw_key(&w, "raw");
    mts_jw_raw(&w, "{\"x\":[1]}", 9);
    mts_jw_key(&w, "e");
    mts_jw_begin_array(&w);
    mts_jw_end_array(&w);
    mts_jw_key(&w, "o");
    mts_jw_begin_object(&w);
    mts_jw_end_object(&w);
    mts_jw_key(&w, "t");
    int32_t t32[3] = {-1, 0, INT32_MAX};
    mts_jw_tensor_data(&w, MTS_DTYPE_INT32, t32, 3);
    mts_jw_key(&w, "tb");
    uint8_t tb[2] = {1, 0};
    mts_jw_tensor_data(&w, MTS_DTYPE_BOOL, tb, 2);
    mts_jw_key(&w, "te");
    mts_jw_tensor_data(&w, MTS_DTYPE_FLOAT, NULL, 0);
    mts_jw_key(&w, "null string");
    mts_jw_string(&w, NULL);
    mts_jw_end_object(&w);
    assert_string_equal(finish(&w),
                        "{\"s\":\"q\\\"\\\\/\\n\\t\\u0001\\u001f caf\xc3\xa9 \xf0\x9f\x98\x80\","
                        "\"bad utf8\":\"a\\ufffdb\\ufffd\",\"i\":-9223372036854775808,\"u\":18446744073709551615,"
                        "\"d\":[0.1,-2.5e-300,1e+21,3,-0,null,null,0.1,null],\"b\":true,\"f\":false,\"n\":null,"
                        "\"raw\":{\"x\":[1]},\"e\":[],\"o\":{},\"t\":[-1,0,2147483647],\"tb\":[true,false],\"te\":[],"
                        "\"null string\":null}");
    /* The output parses back. */
    mts_json_doc *doc = parse_ok(w.buf);
    assert_string_equal(mts_json_str(mts_json_get(mts_json_root(doc), "s"), NULL),
                        "q\"\\/\n\t\x01\x1f caf\xc3\xa9 \xf0\x9f\x98\x80");
    assert_true(mts_json_num(mts_json_at(mts_json_get(mts_json_root(doc), "d"), 1)) == -2.5e-300);
    mts_json_free(doc);

    /* Reset and reuse; take() hands the buffer over. */
    mts_jw_reset(&w);
    mts_jw_begin_array(&w);
    mts_jw_int(&w, 1);
    mts_jw_string_n(&w, "a\0b", 3);
    mts_jw_end_array(&w);
    size_t len;
    char *taken = mts_jw_take(&w, &len);
    assert_string_equal(taken, "[1,\"a\\u0000b\"]");
    assert_int_equal(len, strlen(taken));
    free(taken);
    assert_null(w.buf);

    /* Misuse is sticky and reported by finish. */
    struct {
        int kind;
        const char *want;
    } misuse[] = {
        {0, "a key outside an object"},     {1, "a value inside an object without a key"},
        {2, "end_array without a matching begin_array"}, {3, "1 unclosed container(s)"},
        {4, "a second top-level value"},    {5, "nothing written"},
        {6, "two keys in a row"},           {7, "end_object right after a key"},
        {8, "tensor data of type string"},
    };
    for (size_t k = 0; k < sizeof misuse / sizeof misuse[0]; k++) {
        mts_jw_reset(&w);
        switch (misuse[k].kind) {
        case 0: mts_jw_begin_array(&w); mts_jw_key(&w, "x"); break;
        case 1: mts_jw_begin_object(&w); mts_jw_int(&w, 1); break;
        case 2: mts_jw_begin_object(&w); mts_jw_end_array(&w); break;
        case 3: mts_jw_begin_array(&w); break;
        case 4: mts_jw_int(&w, 1); mts_jw_int(&w, 2); break;
        case 5: break;
        case 6: mts_jw_begin_object(&w); mts_jw_key(&w, "a"); mts_jw_key(&w, "b"); break;
        case 7: mts_jw_begin_object(&w); mts_jw_key(&w, "a"); mts_jw_end_object(&w); break;
        case 8: mts_jw_tensor_data(&w, MTS_DTYPE_STRING, "", 1); break;
        }
        mts_err err = {0};
        assert_int_equal(mts_jw_finish(&w, NULL, NULL, &err), MTS_EINVAL);
        if (!strstr(err.msg, misuse[k].want)) fail_msg("misuse %d: '%s'", misuse[k].kind, err.msg);
        assert_null(mts_jw_take(&w, NULL));
    }
    mts_jw_free(&w);
}

static void test_float_format(void **state)
{
    (void)state;
    struct {
        float v;
        const char *want;
    } cases[] = {
        {0.0f, "0"},
        {-0.0f, "-0"},
        {1.0f, "1"},
        {0.1f, "0.1"},
        {-1.5f, "-1.5"},
        {1.0f / 3, "0.33333334"},
        {16777216.0f, "16777216"},
        {123456789.0f, "123456790"},
        {1e10f, "1e10"},
        {1.5e9f, "1.5e9"},
        {1e15f, "1e15"},
        {1e-4f, "0.0001"},
        {1e-5f, "1e-5"},
        {1e-6f, "1e-6"},
        {3.4028235e38f, "3.4028235e38"},
        {1.17549435e-38f, "1.1754944e-38"},
        {1.4e-45f, "1e-45"},
        {123456.7f, "123456.7"},
        {NAN, "null"},
    };
    char buf[MTS_JSON_FLOAT_MAX];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mts_json_format_float(cases[i].v, buf);
        if (strcmp(buf, cases[i].want) != 0) fail_msg("%.9g: '%s', want '%s'", (double)cases[i].v, buf, cases[i].want);
    }
    /* Random floats: strtof and strtod-then-cast both give the same bits back, in at most as
     * many characters as "%.9g" (shorter, mostly). */
    char ref[32];
    for (int t = 0; t < 1000000; t++) {
        float f = rnd_float();
        size_t n = mts_json_format_float(f, buf);
        float g = strtof(buf, NULL), h = (float)strtod(buf, NULL);
        if (memcmp(&f, &g, 4) || memcmp(&f, &h, 4)) fail_msg("%.9g printed as %s", (double)f, buf);
        int rn = snprintf(ref, sizeof ref, "%.9g", (double)f);
        if (n > (size_t)rn) fail_msg("%s longer than %s", buf, ref);
    }
    char dbuf[MTS_JSON_DOUBLE_MAX];
    for (int t = 0; t < 100000; t++) {
        double d;
        uint64_t b = rnd();
        memcpy(&d, &b, sizeof d);
        if (!isfinite(d)) continue;
        mts_json_format_double(d, dbuf);
        double e = strtod(dbuf, NULL);
        if (memcmp(&d, &e, sizeof d)) fail_msg("%.17g printed as %s", d, dbuf);
    }
}

static void test_tensor_roundtrip(void **state)
{
    (void)state;
    enum { N = 5000 };
    static const mts_dtype types[] = {MTS_DTYPE_FLOAT, MTS_DTYPE_INT64, MTS_DTYPE_INT32,
                                      MTS_DTYPE_INT8,  MTS_DTYPE_UINT8, MTS_DTYPE_BOOL};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        mts_dtype dt = types[t];
        size_t es = mts_dtype_size(dt);
        uint8_t *in = malloc(N * es), *out = malloc(N * es);
        for (int i = 0; i < N; i++) {
            uint64_t r = rnd();
            switch (dt) {
            case MTS_DTYPE_FLOAT: ((float *)in)[i] = i < 4 ? (float[]){0.0f, -0.0f, FLT_MAX, -FLT_TRUE_MIN}[i] : rnd_float(); break;
            case MTS_DTYPE_INT64: ((int64_t *)in)[i] = i == 0 ? INT64_MIN : i == 1 ? INT64_MAX : (int64_t)r >> (r % 64); break;
            case MTS_DTYPE_INT32: ((int32_t *)in)[i] = (int32_t)r; break;
            case MTS_DTYPE_INT8: ((int8_t *)in)[i] = (int8_t)r; break;
            case MTS_DTYPE_UINT8: ((uint8_t *)in)[i] = (uint8_t)r; break;
            default: in[i] = (uint8_t)(r & 1); break;
            }
        }
        mts_jw w;
        mts_jw_init(&w);
        mts_jw_begin_object(&w);
        mts_jw_key(&w, "data");
        mts_jw_tensor_data(&w, dt, in, N);
        mts_jw_end_object(&w);
        const char *text = finish(&w);
        mts_json_doc *doc = parse_ok(text);
        mts_err err = {0};
        if (mts_json_flatten(mts_json_get(mts_json_root(doc), "data"), dt, out, N, &err))
            fail_msg("%s: %s", mts_dtype_name(dt), err.msg);
        assert_memory_equal(in, out, N * es);
        mts_json_free(doc);
        mts_jw_free(&w);
        free(in);
        free(out);
    }
}

/* 1M floats: write, parse, flatten; a KServe-shaped request; the memory bound. */
static void test_bench_and_memory(void **state)
{
    (void)state;
    enum { N = 1000000 };
    float *data = malloc(N * sizeof(float)), *back = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) data[i] = (float)(rnd() >> 11) / (float)(1ull << 53) * 2.0f - 1.0f;

    mts_jw w;
    mts_jw_init(&w);
    double t0 = now_ms();
    mts_jw_begin_object(&w);
    mts_jw_key(&w, "inputs");
    mts_jw_begin_array(&w);
    mts_jw_begin_object(&w);
    mts_jw_key(&w, "name");
    mts_jw_string(&w, "x");
    mts_jw_key(&w, "shape");
    mts_jw_begin_array(&w);
    mts_jw_int(&w, 1000);
    mts_jw_int(&w, 1000);
    mts_jw_end_array(&w);
    mts_jw_key(&w, "datatype");
    mts_jw_string(&w, "FP32");
    mts_jw_key(&w, "data");
    mts_jw_tensor_data(&w, MTS_DTYPE_FLOAT, data, N);
    mts_jw_end_object(&w);
    mts_jw_end_array(&w);
    mts_jw_end_object(&w);
    size_t len;
    const char *text;
    mts_err err = {0};
    assert_int_equal(mts_jw_finish(&w, &text, &len, &err), 0);
    double t1 = now_ms();

    mts_json_doc *doc = NULL;
    assert_int_equal(mts_json_parse(text, len, &doc, &err), 0);
    double t2 = now_ms();
    const mts_json *in0 = mts_json_at(mts_json_get(mts_json_root(doc), "inputs"), 0);
    assert_int_equal(mts_json_flatten(mts_json_get(in0, "data"), MTS_DTYPE_FLOAT, back, N, &err), 0);
    double t3 = now_ms();
    assert_memory_equal(data, back, N * sizeof(float));
    size_t bytes = mts_json_doc_bytes(doc);
    printf("[ bench    ] 1M floats: %.1f MB of JSON; write %.1f ms, parse %.1f ms, flatten %.1f ms;"
           " DOM %.1f MB (%.2f x input)\n",
           (double)len / 1e6, t1 - t0, t2 - t1, t3 - t2, (double)bytes / 1e6, (double)bytes / (double)len);
    assert_true(bytes <= 2 * len);
    mts_json_free(doc);

    /* 1M doubles printed with %.17g (the long double path). */
    mts_jw_reset(&w);
    mts_jw_begin_array(&w);
    for (int i = 0; i < N; i++) {
        char num[40];
        int n = snprintf(num, sizeof num, "%.17g", (double)(rnd() >> 11) / (double)(1ull << 53));
        mts_jw_raw(&w, num, (size_t)n);
    }
    mts_jw_end_array(&w);
    assert_int_equal(mts_jw_finish(&w, &text, &len, &err), 0);
    t0 = now_ms();
    assert_int_equal(mts_json_parse(text, len, &doc, &err), 0);
    t1 = now_ms();
    printf("[ bench    ] 1M doubles (%%.17g, %.1f MB): parse %.1f ms\n", (double)len / 1e6, t1 - t0);
    mts_json_free(doc);

    /* Worst case for the memory bound: "[0,0,0,...]" -- and nested small arrays. */
    for (int shape = 0; shape < 2; shape++) {
        mts_jw_reset(&w);
        mts_jw_begin_array(&w);
        for (int i = 0; i < N / 2; i++) {
            if (shape == 0) {
                mts_jw_int(&w, 0);
            } else {
                mts_jw_begin_array(&w);
                mts_jw_int(&w, 0);
                mts_jw_end_array(&w);
            }
        }
        mts_jw_end_array(&w);
        assert_int_equal(mts_jw_finish(&w, &text, &len, &err), 0);
        assert_int_equal(mts_json_parse(text, len, &doc, &err), 0);
        bytes = mts_json_doc_bytes(doc);
        printf("[ memory   ] %s: %zu bytes of JSON -> %zu bytes of DOM (%.2f x)\n",
               shape ? "[[0],[0],...]" : "[0,0,...]", len, bytes, (double)bytes / (double)len);
        assert_true(bytes <= 14 * len + 65536);
        mts_json_free(doc);
    }
    /* Many short strings. */
    mts_jw_reset(&w);
    mts_jw_begin_array(&w);
    for (int i = 0; i < N / 4; i++) mts_jw_string(&w, "");
    mts_jw_end_array(&w);
    assert_int_equal(mts_jw_finish(&w, &text, &len, &err), 0);
    assert_int_equal(mts_json_parse(text, len, &doc, &err), 0);
    bytes = mts_json_doc_bytes(doc);
    printf("[ memory   ] [\"\",\"\",...]: %zu bytes of JSON -> %zu bytes of DOM (%.2f x)\n", len, bytes,
           (double)bytes / (double)len);
    assert_true(bytes <= 14 * len + 65536);
    mts_json_free(doc);

    mts_jw_free(&w);
    free(data);
    free(back);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values_and_accessors),
        cmocka_unit_test(test_numbers),
        cmocka_unit_test(test_strings),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_nesting_limit),
        cmocka_unit_test(test_flatten),
        cmocka_unit_test(test_writer),
        cmocka_unit_test(test_float_format),
        cmocka_unit_test(test_tensor_roundtrip),
        cmocka_unit_test(test_bench_and_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
