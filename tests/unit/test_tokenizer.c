/*
 * Tokenizer unit tests (src/text): small hand-made WordPiece, BPE and Unigram tokenizers
 * with known encodings; the errors a caller meets (invalid UTF-8 with its byte offset, an output
 * array or max_tokens below the special tokens; a short array truncates); rejected files (empty or malformed
 * vocab.txt, malformed JSON, and every declined tokenizer.json construct, which must name
 * itself); hostile texts (256 KiB runs of one character or of combining marks) in bounded
 * time; and 8 threads sharing one tokenizer getting identical ids. The comparison with the
 * reference implementation on real files is tests/text/test_tokenizer_oracle.py.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "text/tokenizer.h"
#include "text/unicode.h"

static const char VOCAB[] = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n##s\nun\n##aff\n##able\n,\n!\n"
                            "cafe\n\xe4\xb8\xad\n##\xc3\xa9\na\ncaf\n";
/* ids:                      0      1      2      3      4       5      6      7   8   9     10     11 12
                             13    14 (中)  15 (##é)  16 (a)  17 (caf) */

static int enc(const mts_tokenizer *t, const char *s, int max, int64_t *ids, int cap, char *err)
{
    return mts_tokenize(t, s, strlen(s), max, ids, NULL, cap, err, 256);
}

static void expect(const mts_tokenizer *t, const char *s, const int64_t *want, int n)
{
    int64_t ids[64];
    char err[256] = "";
    int got = enc(t, s, 0, ids, 64, err);
    if (got != n) fail_msg("\"%s\": %d ids, expected %d (%s)", s, got, n, err);
    for (int i = 0; i < n; i++)
        if (ids[i] != want[i])
            fail_msg("\"%s\": id %d is %lld, expected %lld", s, i, (long long)ids[i], (long long)want[i]);
}

static void test_wordpiece(void **state)
{
    (void)state;
    char err[256];
    mts_tokenizer *t = mts_tokenizer_load_mem(VOCAB, strlen(VOCAB), 0, -1, err, sizeof err);
    assert_non_null(t);
    assert_string_equal(mts_tokenizer_kind(t), "wordpiece");
    assert_int_equal(mts_tokenizer_vocab_size(t), 18);
    assert_int_equal(mts_tokenizer_pad_id(t), 0);
    expect(t, "Hello, worlds!", (int64_t[]){2, 5, 11, 6, 7, 12, 3}, 7);
    expect(t, "unaffable", (int64_t[]){2, 8, 9, 10, 3}, 5);
    expect(t, "unknownword", (int64_t[]){2, 1, 3}, 3);
    expect(t, "  \t\n ", (int64_t[]){2, 3}, 2);
    expect(t, "", (int64_t[]){2, 3}, 2);
    /* accents stripped when lower-casing (auto: the vocabulary has no capitals) */
    expect(t, "CAF\xc3\x89", (int64_t[]){2, 13, 3}, 3);
    /* CJK split off, control characters dropped, [MASK] matched in the text */
    expect(t, "a\xe4\xb8\xad" "a\x01[MASK]", (int64_t[]){2, 16, 14, 16, 4, 3}, 6);
    int64_t ids[8];
    /* truncation keeps [CLS] ... [SEP] */
    assert_int_equal(enc(t, "hello world hello", 4, ids, 8, err), 4);
    assert_int_equal(ids[3], 3);
    assert_int_equal(ids[2], 6);
    mts_tokenizer_free(t);
    /* cased: no lower-casing, no accent stripping */
    t = mts_tokenizer_load_mem(VOCAB, strlen(VOCAB), 0, 0, err, sizeof err);
    assert_non_null(t);
    expect(t, "Hello caf\xc3\xa9", (int64_t[]){2, 1, 17, 15, 3}, 5);
    mts_tokenizer_free(t);
}

static void test_errors(void **state)
{
    (void)state;
    char err[256];
    mts_tokenizer *t = mts_tokenizer_load_mem(VOCAB, strlen(VOCAB), 0, -1, err, sizeof err);
    assert_non_null(t);
    int64_t ids[8];
    assert_int_equal(mts_tokenize(t, "hello \xff", 7, 0, ids, NULL, 8, err, sizeof err), -1);
    assert_non_null(strstr(err, "invalid UTF-8 at byte 6"));
    assert_int_equal(mts_tokenize(t, "ab\xe4\xb8", 4, 0, ids, NULL, 8, err, sizeof err), -1); /* truncated */
    assert_non_null(strstr(err, "at byte 2"));
    assert_int_equal(mts_tokenize(t, "\xed\xa0\x80", 3, 0, ids, NULL, 8, err, sizeof err), -1); /* surrogate */
    assert_int_equal(mts_tokenize(t, "\xc0\xaf", 2, 0, ids, NULL, 8, err, sizeof err), -1);     /* overlong */
    /* a short output array truncates like max_tokens (special tokens kept) */
    assert_int_equal(enc(t, "hello world hello", 0, ids, 3, err), 3);
    assert_int_equal(ids[1], 5);
    assert_int_equal(ids[2], 3);
    assert_int_equal(enc(t, "hello", 0, ids, 1, err), -1);
    assert_int_equal(enc(t, "hello", 1, ids, 8, err), -1);
    assert_non_null(strstr(err, "special tokens"));
    assert_int_equal(enc(t, "hello", -1, ids, 8, err), -1);
    mts_tokenizer_free(t);

    struct {
        const char *text;
        int is_json;
        const char *msg;
    } bad[] = {
        {"", 0, "empty"},
        {"hello\nworld\n", 0, "no [UNK]"},
        {"[UNK]\n[CLS]\n\xff\n", 0, "invalid UTF-8 at byte 12"},
        {"{", 1, "JSON"},
        {"[]", 1, "not an object"},
        {"{}", 1, "model"},
        {"{\"model\":{\"type\":\"Unigram\",\"vocab\":[[\"a\",0.0]]}}", 1, "no unk_id"},
        {"{\"model\":{\"type\":\"Unigram\",\"unk_id\":0,\"vocab\":[[\"a\",\"x\"]]}}", 1, "vocab entry 0"},
        {"{\"model\":{\"type\":\"WordLevel\",\"vocab\":{\"a\":0},\"unk_token\":\"b\"}}", 1, "model WordLevel"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a b\"]}}", 1, "not in the vocabulary"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a\"]}}", 1, "merge 0"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-1},\"merges\":[]}}", 1, "vocab entry 0"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":99999999},\"merges\":[]}}", 1, "vocab entry 0"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":0},\"merges\":[]}}", 1, "two tokens"},
        {"{\"model\":{\"type\":\"BPE\",\"dropout\":0.1,\"vocab\":{\"a\":0},\"merges\":[]}}", 1, "dropout"},
        {"{\"normalizer\":{\"type\":\"Nmt\"},\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}", 1,
         "normalizer Nmt is not supported"},
        {"{\"normalizer\":{\"type\":\"Precompiled\",\"precompiled_charsmap\":\"\"},\"model\":{\"type\":\"BPE\","
         "\"vocab\":{\"a\":0},\"merges\":[]}}", 1, "normalizer Precompiled"},
        {"{\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"Regex\":\"\\\\s+\"},\"content\":\" \"},\"model\":{"
         "\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}", 1, "regular-expression"},
        {"{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\p{L}+\"},\"behavior\":\"Isolated\"},"
         "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}", 1, "regular expression"},
        {"{\"pre_tokenizer\":{\"type\":\"UnicodeScripts\"},\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},"
         "\"merges\":[]}}", 1, "pre_tokenizer UnicodeScripts"},
        {"{\"post_processor\":{\"type\":\"Nope\"},\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}", 1,
         "post_processor Nope"},
        {"{\"post_processor\":{\"type\":\"BertProcessing\",\"sep\":[\"a\",0],\"cls\":[\"b\",7]},\"model\":{"
         "\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}", 1, "outside the vocabulary"},
        {"{\"added_tokens\":[{\"id\":0,\"content\":\"a\",\"single_word\":true}],\"model\":{\"type\":\"BPE\","
         "\"vocab\":{\"a\":0},\"merges\":[]}}", 1, "single_word"},
        {"{\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Sequence\",\"normalizers\":[{\"type\":"
         "\"Sequence\",\"normalizers\":[{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Sequence\","
         "\"normalizers\":[{\"type\":\"Sequence\",\"normalizers\":[]}]}]}]}]}]},\"model\":{\"type\":\"BPE\","
         "\"vocab\":{\"a\":0},\"merges\":[]}}", 1, "nested too deeply"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        t = mts_tokenizer_load_mem(bad[i].text, strlen(bad[i].text), bad[i].is_json, -1, err, sizeof err);
        if (t) fail_msg("case %zu loaded", i);
        if (!strstr(err, bad[i].msg)) fail_msg("case %zu: message \"%s\" lacks \"%s\"", i, err, bad[i].msg);
    }
    assert_null(mts_tokenizer_load("/nonexistent/vocab.txt", -1, err, sizeof err));
    assert_non_null(strstr(err, "/nonexistent/vocab.txt"));
}

/* A small byte-level-free BPE: merges build "hello" and "world" with a Metaspace-like prefix. */
static const char BPE_JSON[] =
    "{\"added_tokens\":[{\"id\":0,\"content\":\"<s>\",\"special\":true,\"normalized\":false}],"
    "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"\xe2\x96\x81\"},"
    "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\xe2\x96\x81\"}]},"
    "\"pre_tokenizer\":null,"
    "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},"
    "{\"Sequence\":{\"id\":\"A\",\"type_id\":1}}],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[0]}}},"
    "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"fuse_unk\":true,\"byte_fallback\":true,"
    "\"vocab\":{\"<s>\":0,\"<unk>\":1,\"<0xC3>\":2,\"<0xA9>\":3,\"\xe2\x96\x81\":4,\"h\":5,\"e\":6,\"l\":7,\"o\":8,"
    "\"he\":9,\"ll\":10,\"llo\":11,\"hello\":12,\"\xe2\x96\x81hello\":13},"
    "\"merges\":[\"h e\",\"l l\",\"ll o\",\"he llo\",\"\xe2\x96\x81 hello\"]}}";

static void test_bpe(void **state)
{
    (void)state;
    char err[256];
    mts_tokenizer *t = mts_tokenizer_load_mem(BPE_JSON, strlen(BPE_JSON), -1, -1, err, sizeof err);
    if (!t) fail_msg("%s", err);
    assert_string_equal(mts_tokenizer_kind(t), "bpe");
    expect(t, "hello", (int64_t[]){0, 13}, 2);
    expect(t, "hello hello", (int64_t[]){0, 13, 13}, 3);
    /* é has no token: byte fallback; x has neither: one fused <unk> for "xx" */
    expect(t, "h\xc3\xa9xxo", (int64_t[]){0, 4, 5, 2, 3, 1, 8}, 7);
    /* <s> in the text is the special token; the text after it is normalized on its own */
    expect(t, "hello<s>hello", (int64_t[]){0, 13, 0, 13}, 4);
    int64_t ids[8], types[8];
    assert_int_equal(mts_tokenize(t, "hello", 5, 0, ids, types, 8, err, sizeof err), 2);
    assert_int_equal(types[0], 0);
    assert_int_equal(types[1], 1);
    mts_tokenizer_free(t);
}

static void test_unigram(void **state)
{
    (void)state;
    static const char J[] = "{\"model\":{\"type\":\"Unigram\",\"unk_id\":0,\"vocab\":[[\"<unk>\",0],[\"a\",-1],"
                            "[\"b\",-1],[\"ab\",-1.5],[\"abc\",-9],[\"c\",-3]]},"
                            "\"pre_tokenizer\":{\"type\":\"WhitespaceSplit\"}}";
    char err[256];
    mts_tokenizer *t = mts_tokenizer_load_mem(J, strlen(J), 1, -1, err, sizeof err);
    if (!t) fail_msg("%s", err);
    assert_string_equal(mts_tokenizer_kind(t), "unigram");
    expect(t, "ab", (int64_t[]){3}, 1);        /* -1.5 beats a + b = -2 */
    expect(t, "abc", (int64_t[]){3, 5}, 2);    /* ab + c = -4.5 beats abc = -9 */
    expect(t, "axyb a", (int64_t[]){1, 0, 2, 1}, 4); /* x, y: one fused unknown */
    mts_tokenizer_free(t);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void test_hostile(void **state)
{
    (void)state;
    char err[256];
    mts_tokenizer *wp = mts_tokenizer_load_mem(VOCAB, strlen(VOCAB), 0, -1, err, sizeof err);
    mts_tokenizer *bpe = mts_tokenizer_load_mem(BPE_JSON, strlen(BPE_JSON), 1, -1, err, sizeof err);
    assert_non_null(wp);
    assert_non_null(bpe);
    size_t n = 1 << 18;
    char *s = malloc(n + 8);
    int64_t *ids = malloc(600 * sizeof *ids);
    const char *units[] = {"a", " ", "\xcc\x81" /* combining acute */, "\xe4\xb8\xad", "!", "l", "\xe2\x80\x8b"};
    double t0 = now_s();
    for (size_t u = 0; u < sizeof units / sizeof units[0]; u++) {
        size_t ul = strlen(units[u]), k = 0;
        while (k + ul <= n) memcpy(s + k, units[u], ul), k += ul;
        double t1 = now_s();
        int a = mts_tokenize(wp, s, k, 512, ids, NULL, 600, err, sizeof err);
        double t2 = now_s();
        int b = mts_tokenize(bpe, s, k, 512, ids, NULL, 600, err, sizeof err);
        print_message("256 KiB run of unit %zu: WordPiece %.0f ms, BPE %.0f ms\n", u, (t2 - t1) * 1e3,
                      (now_s() - t2) * 1e3);
        if (a < 2 || b < 1) fail_msg("unit %zu: %d %d %s", u, a, b, err);
    }
    /* 256 KiB of mixed text */
    for (size_t k = 0; k < n; k++) s[k] = "hello wrld, \xc3\xa9"[k % 14];
    s[n - 1] = 'x';
    assert_true(mts_tokenize(wp, s, n, 512, ids, NULL, 600, err, sizeof err) == 512);
    assert_true(mts_tokenize(bpe, s, n, 512, ids, NULL, 600, err, sizeof err) == 512);
    double dt = now_s() - t0;
    print_message("hostile texts: 16 tokenizations of 256 KiB in %.2f s\n", dt);
    assert_true(dt < 20.0);
    free(s);
    free(ids);
    mts_tokenizer_free(wp);
    mts_tokenizer_free(bpe);
}

static void test_unicode(void **state)
{
    (void)state;
    uint32_t out[MTS_UC_DECOMP_MAX];
    assert_int_equal(mts_uc_decompose(0xE9, out), 2); /* é = e + U+0301 */
    assert_int_equal(out[0], 'e');
    assert_int_equal(out[1], 0x301);
    assert_int_equal(mts_uc_decompose(0xD55C, out), 3); /* 한 = ᄒ ᅡ ᆫ */
    assert_int_equal(out[0], 0x1112);
    assert_int_equal(mts_uc_decompose(0x1E09, out), 3); /* ḉ */
    uint32_t lo[3];
    assert_int_equal(mts_uc_lower_full(0x130, lo), 2);
    assert_int_equal(mts_uc_lower_full(0x3A3, lo), 1); /* Σ -> σ (no final-sigma rule) */
    assert_int_equal(lo[0], 0x3C3);
    assert_int_equal(mts_uc_category(0x4E2D), MTS_UC_Lo);
    assert_int_equal(mts_uc_category(0x301), MTS_UC_Mn);
    assert_int_equal(mts_uc_category(0x10FFFF), MTS_UC_Cn);
    assert_int_equal(mts_uc_category(0x110000), MTS_UC_Cn);
    assert_true(mts_uc_is_bert_punct('$'));
    assert_true(mts_uc_is_bert_punct(0x3001));
    assert_false(mts_uc_is_bert_punct(0x20AC)); /* € is Sc */
    assert_int_equal(mts_uc_compose('e', 0x301), 0xE9);
    assert_int_equal(mts_uc_compose(0x1112, 0x1161), 0xD558); /* 하 */
    assert_int_equal(mts_uc_compose(0xD558, 0x11AB), 0xD55C); /* 한 */
    assert_int_equal(mts_uc_compose(0x0F71, 0x0F72), 0);      /* excluded from composition */
    uint32_t kd[MTS_UC_KDECOMP_MAX];
    assert_int_equal(mts_uc_decompose_compat(0xFB01, kd), 2); /* ﬁ -> f i */
    assert_int_equal(mts_uc_decompose_compat(0xFDFA, kd), 18);
    assert_true(mts_uc_is_white_space(0x3000));
    assert_false(mts_uc_is_white_space(0x200B));
}

static mts_tokenizer *shared;

static void *worker(void *arg)
{
    int64_t ids[64], ref[64];
    char err[256];
    static const char *texts[] = {"Hello, worlds!", "unaffable caf\xc3\xa9", "a\xe4\xb8\xad!", "[MASK] hello"};
    long bad = 0;
    for (int r = 0; r < 2000; r++) {
        const char *s = texts[(r + (int)(intptr_t)arg) % 4];
        int n = mts_tokenize(shared, s, strlen(s), 0, ids, NULL, 64, err, sizeof err);
        int m = mts_tokenize(shared, s, strlen(s), 0, ref, NULL, 64, err, sizeof err);
        if (n < 0 || n != m || memcmp(ids, ref, (size_t)n * sizeof *ids)) bad++;
    }
    return (void *)bad;
}

static void test_threads(void **state)
{
    (void)state;
    char err[256];
    shared = mts_tokenizer_load_mem(VOCAB, strlen(VOCAB), 0, -1, err, sizeof err);
    assert_non_null(shared);
    pthread_t th[8];
    for (intptr_t i = 0; i < 8; i++) pthread_create(&th[i], NULL, worker, (void *)i);
    long bad = 0;
    for (int i = 0; i < 8; i++) {
        void *r;
        pthread_join(th[i], &r);
        bad += (long)(intptr_t)r;
    }
    assert_int_equal(bad, 0);
    mts_tokenizer_free(shared);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wordpiece), cmocka_unit_test(test_errors),  cmocka_unit_test(test_bpe),
        cmocka_unit_test(test_unigram),
        cmocka_unit_test(test_hostile),   cmocka_unit_test(test_unicode), cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
