/*
 * Unit tests of the multipart/form-data parser (util/multipart.h): a body as curl and Python
 * requests write it (text fields and a binary file whose bytes include CR, LF and "--"), bare-LF
 * line ends, quoted and unquoted boundaries, preamble and epilogue, empty parts, one test per
 * class of malformed input with the message checked, the part and header limits, and every
 * truncation and many single-byte corruptions of a valid body (run under ASan+UBSan by the
 * sanitizer build): each must parse or fail cleanly, never read outside the body.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/multipart.h"

#define CT "multipart/form-data; boundary=XyZ123"

static const char body_crlf[] = "--XyZ123\r\n"
                                "Content-Disposition: form-data; name=\"model\"\r\n"
                                "\r\n"
                                "seg_unet\r\n"
                                "--XyZ123\r\n"
                                "Content-Disposition: form-data; name=\"file\"; filename=\"cell 1.png\"\r\n"
                                "Content-Type: image/png\r\n"
                                "\r\n"
                                "\x89PNG\r\n--XyZ12\n\r\x00\x01--\r\n"
                                "--XyZ123\r\n"
                                "content-disposition: FORM-DATA; filename=empty.bin; name=empty\r\n"
                                "\r\n"
                                "\r\n"
                                "--XyZ123--\r\n";

static void parse_ok(const char *ct, const char *body, size_t len, mts_multipart *m)
{
    mts_err err = {0};
    int rc = mts_multipart_parse(ct, body, len, m, &err);
    if (rc) fail_msg("parse failed: %s", err.msg);
}

static void parse_bad(const char *ct, const char *body, size_t len, int code, const char *want)
{
    mts_multipart m;
    mts_err err = {0};
    int rc = mts_multipart_parse(ct, body, len, &m, &err);
    if (rc != code) fail_msg("expected %d, got %d (%s) for want '%s'", code, rc, err.msg, want);
    if (!strstr(err.msg, want)) fail_msg("message '%s' does not contain '%s'", err.msg, want);
    assert_int_equal(m.n, 0);
    assert_null(m.parts);
}

static void test_valid(void **state)
{
    (void)state;
    mts_multipart m;
    parse_ok(CT, body_crlf, sizeof body_crlf - 1, &m);
    assert_int_equal(m.n, 3);
    assert_string_equal(m.parts[0].name, "model");
    assert_string_equal(m.parts[0].filename, "");
    assert_int_equal(m.parts[0].len, 8);
    assert_memory_equal(m.parts[0].data, "seg_unet", 8);
    const mts_multipart_part *f = mts_multipart_get(&m, "file");
    assert_non_null(f);
    assert_string_equal(f->filename, "cell 1.png");
    assert_string_equal(f->content_type, "image/png");
    static const char data[] = "\x89PNG\r\n--XyZ12\n\r\x00\x01--";
    assert_int_equal(f->len, sizeof data - 1);
    assert_memory_equal(f->data, data, sizeof data - 1);
    const mts_multipart_part *e = mts_multipart_get(&m, "empty");
    assert_non_null(e);
    assert_string_equal(e->filename, "empty.bin");
    assert_int_equal(e->len, 0);
    assert_null(mts_multipart_get(&m, "nope"));
    mts_multipart_free(&m);
}

static void test_variants(void **state)
{
    (void)state;
    mts_multipart m;
    /* bare LF, quoted boundary with a space, preamble and epilogue, uppercase type */
    static const char lf[] = "This is a preamble.\n--a b\n"
                             "Content-Disposition: form-data; name=x\n\nhello\n--a b--\nepilogue";
    parse_ok("MULTIPART/FORM-DATA;boundary=\"a b\"", lf, sizeof lf - 1, &m);
    assert_int_equal(m.n, 1);
    assert_string_equal(m.parts[0].name, "x");
    assert_int_equal(m.parts[0].len, 5);
    assert_memory_equal(m.parts[0].data, "hello", 5);
    mts_multipart_free(&m);
    /* no parts at all */
    static const char none[] = "--b--\r\n";
    parse_ok("multipart/form-data; charset=utf-8; boundary=b", none, sizeof none - 1, &m);
    assert_int_equal(m.n, 0);
    mts_multipart_free(&m);
    /* escaped quote in a name, transport padding after the delimiter */
    static const char esc[] = "--b  \r\nContent-Disposition: form-data; name=\"a\\\"q\"\r\n\r\nv\r\n--b--";
    parse_ok("multipart/form-data; boundary=b", esc, sizeof esc - 1, &m);
    assert_string_equal(m.parts[0].name, "a\"q");
    mts_multipart_free(&m);
}

static void test_malformed(void **state)
{
    (void)state;
    const char *b = body_crlf;
    size_t n = sizeof body_crlf - 1;
    parse_bad(NULL, b, n, MTS_EINVAL, "no Content-Type");
    parse_bad("application/json", b, n, MTS_EINVAL, "expected multipart/form-data");
    parse_bad("multipart/form-data", b, n, MTS_EINVAL, "no boundary");
    parse_bad("multipart/form-data; boundary=\"unterminated", b, n, MTS_EINVAL, "invalid boundary");
    parse_bad("multipart/form-data; boundary=", b, n, MTS_EINVAL, "boundary");
    char longb[120] = "multipart/form-data; boundary=";
    memset(longb + strlen(longb), 'k', 71);
    parse_bad(longb, b, n, MTS_EINVAL, "invalid boundary");
    parse_bad("multipart/form-data; boundary=other", b, n, MTS_EINVAL, "no '--other' delimiter");
    static const char nodisp[] = "--b\r\nContent-Type: text/plain\r\n\r\nx\r\n--b--";
    parse_bad("multipart/form-data; boundary=b", nodisp, sizeof nodisp - 1, MTS_EINVAL, "no Content-Disposition");
    static const char noname[] = "--b\r\nContent-Disposition: form-data; filename=a\r\n\r\nx\r\n--b--";
    parse_bad("multipart/form-data; boundary=b", noname, sizeof noname - 1, MTS_EINVAL, "no name parameter");
    static const char attach[] = "--b\r\nContent-Disposition: attachment; name=a\r\n\r\nx\r\n--b--";
    parse_bad("multipart/form-data; boundary=b", attach, sizeof attach - 1, MTS_EINVAL, "not form-data");
    static const char badline[] = "--b\r\nno colon here\r\n\r\nx\r\n--b--";
    parse_bad("multipart/form-data; boundary=b", badline, sizeof badline - 1, MTS_EINVAL, "without a name at byte 5");
    static const char unterminated[] = "--b\r\nContent-Disposition: form-data; name=a\r\n\r\nxyz";
    parse_bad("multipart/form-data; boundary=b", unterminated, sizeof unterminated - 1, MTS_EINVAL,
              "part 0 ('a', data from byte 47) is not terminated");
    static const char noclose[] = "--b\r\nContent-Disposition: form-data; name=a\r\n\r\nxyz\r\n--b";
    parse_bad("multipart/form-data; boundary=b", noclose, sizeof noclose - 1, MTS_EINVAL, "without the closing");
    static const char junk[] = "--bjunk\r\n";
    parse_bad("multipart/form-data; boundary=b", junk, sizeof junk - 1, MTS_EINVAL, "unexpected characters");
    static const char hdrtrunc[] = "--b\r\nContent-Disposition: form-data; name=a\r\n";
    parse_bad("multipart/form-data; boundary=b", hdrtrunc, sizeof hdrtrunc - 1, MTS_EINVAL, "truncated");
    char longname[400];
    snprintf(longname, sizeof longname, "--b\r\nContent-Disposition: form-data; name=\"%0200d\"\r\n\r\nx\r\n--b--", 7);
    parse_bad("multipart/form-data; boundary=b", longname, strlen(longname), MTS_EINVAL, "too long");
}

static void test_limits(void **state)
{
    (void)state;
    /* a header block over the limit */
    size_t cap = MTS_MULTIPART_MAX_HEADER + 200;
    char *big = malloc(cap);
    int k = snprintf(big, cap, "--b\r\nContent-Disposition: form-data; name=a\r\nX-Pad: ");
    memset(big + k, 'p', MTS_MULTIPART_MAX_HEADER);
    memcpy(big + k + MTS_MULTIPART_MAX_HEADER, "\r\n\r\nx\r\n--b--", 13);
    parse_bad("multipart/form-data; boundary=b", big, (size_t)k + MTS_MULTIPART_MAX_HEADER + 13, MTS_ELIMIT,
              "exceed 8192 bytes");
    free(big);
    /* too many parts; exactly the limit is fine */
    for (int parts = MTS_MULTIPART_MAX_PARTS; parts <= MTS_MULTIPART_MAX_PARTS + 1; parts++) {
        size_t bcap = (size_t)parts * 64 + 16, len = 0;
        char *b = malloc(bcap);
        for (int i = 0; i < parts; i++)
            len += (size_t)snprintf(b + len, bcap - len, "--b\r\nContent-Disposition: form-data; name=p%d\r\n\r\n\r\n", i);
        len += (size_t)snprintf(b + len, bcap - len, "--b--");
        if (parts == MTS_MULTIPART_MAX_PARTS) {
            mts_multipart m;
            parse_ok("multipart/form-data; boundary=b", b, len, &m);
            assert_int_equal(m.n, parts);
            mts_multipart_free(&m);
        } else {
            parse_bad("multipart/form-data; boundary=b", b, len, MTS_ELIMIT, "more than 256 parts");
        }
        free(b);
    }
}

/* Every prefix and many corruptions: parse or fail cleanly, data always inside the body. */
static void test_truncation_and_corruption(void **state)
{
    (void)state;
    size_t n = sizeof body_crlf - 1;
    char *b = malloc(n);
    for (size_t len = 0; len + 2 < n; len++) { /* the final CRLF after "--XyZ123--" is optional */
        char *exact /* a fresh allocation of exactly len bytes, for ASan */ = malloc(len ? len : 1);
        memcpy(exact, body_crlf, len);
        mts_multipart m;
        mts_err err = {0};
        int rc = mts_multipart_parse(CT, exact, len, &m, &err);
        if (rc == 0) fail_msg("a %zu-byte prefix of the %zu-byte body parsed", len, n);
        assert_true(err.msg[0] != 0);
        free(exact);
    }
    unsigned seed = 1;
    for (int it = 0; it < 3000; it++) {
        memcpy(b, body_crlf, n);
        for (int k = 0; k < 1 + it % 3; k++) {
            seed = seed * 1103515245u + 12345u;
            b[(seed >> 8) % n] = (char)(seed >> 20);
        }
        mts_multipart m;
        mts_err err = {0};
        if (mts_multipart_parse(CT, b, n, &m, &err) == 0) {
            for (int i = 0; i < m.n; i++) {
                assert_true(m.parts[i].data >= b && m.parts[i].data + m.parts[i].len <= b + n);
                assert_true(strlen(m.parts[i].name) > 0);
            }
            mts_multipart_free(&m);
        } else {
            assert_true(err.msg[0] != 0);
        }
    }
    free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid),
        cmocka_unit_test(test_variants),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_truncation_and_corruption),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
