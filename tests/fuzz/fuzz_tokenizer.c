/*
 * libFuzzer target for the tokenizers (src/text): the input's first line picks what is fuzzed.
 *   "text"   the rest is a text, encoded by a built-in WordPiece vocabulary (lower-cased and
 *            cased) and a built-in byte-fallback BPE tokenizer.json, unlimited and at 8 tokens;
 *   "vocab"  the rest is a vocab.txt, a NUL byte, then a text to encode with it;
 *   "json"   the rest is a tokenizer.json, a NUL byte, then a text to encode with it.
 * Every encoding must stay within its budget and return ids inside the vocabulary.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "text/tokenizer.h"

static const char VOCAB[] = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n##s\nun\n##aff\n##able\n,\n!\n"
                            "cafe\n\xe4\xb8\xad\n##\xc3\xa9\na\n##a\n";
static const char BPE[] =
    "{\"added_tokens\":[{\"id\":0,\"content\":\"<s>\",\"special\":true,\"normalized\":false},"
    "{\"id\":14,\"content\":\"ab\",\"normalized\":true,\"lstrip\":true,\"rstrip\":true}],"
    "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFD\"},{\"type\":\"Prepend\",\"prepend\":"
    "\"\xe2\x96\x81\"},{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\xe2\x96\x81\"}]},"
    "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\",\"individual_digits\":true},"
    "{\"type\":\"Punctuation\",\"behavior\":\"Contiguous\"}]},"
    "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},"
    "{\"Sequence\":{\"id\":\"A\",\"type_id\":1}}],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[0]}}},"
    "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"fuse_unk\":true,\"byte_fallback\":true,"
    "\"vocab\":{\"<s>\":0,\"<unk>\":1,\"<0xC3>\":2,\"<0xA9>\":3,\"\xe2\x96\x81\":4,\"h\":5,\"e\":6,\"l\":7,\"o\":8,"
    "\"he\":9,\"ll\":10,\"llo\":11,\"hello\":12,\"\xe2\x96\x81hello\":13},"
    "\"merges\":[\"h e\",\"l l\",\"ll o\",\"he llo\",\"\xe2\x96\x81 hello\"]}}";

static void check(const mts_tokenizer *t, const uint8_t *text, size_t n)
{
    static int64_t ids[4096], types[4096];
    char err[256];
    int vs = mts_tokenizer_vocab_size(t);
    for (int max = 0; max <= 8; max += 8) {
        int k = mts_tokenize(t, (const char *)text, n, max, ids, types, 4096, err, sizeof err);
        if (k < 0) continue;
        if (max && k > max) abort();
        for (int i = 0; i < k; i++)
            if (ids[i] < 0 || ids[i] >= vs) abort();
    }
}

static mts_tokenizer *wp_lower, *wp_cased, *bpe;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[256];
    if (!wp_lower) {
        wp_lower = mts_tokenizer_load_mem(VOCAB, strlen(VOCAB), 0, 1, err, sizeof err);
        wp_cased = mts_tokenizer_load_mem(VOCAB, strlen(VOCAB), 0, 0, err, sizeof err);
        bpe = mts_tokenizer_load_mem(BPE, strlen(BPE), 1, -1, err, sizeof err);
        if (!wp_lower || !wp_cased || !bpe) abort();
    }
    char *line;
    const uint8_t *rest;
    size_t rest_len;
    if (fuzz_split_line(data, size, 16, &line, &rest, &rest_len)) return 0;
    if (!strcmp(line, "text")) {
        check(wp_lower, rest, rest_len);
        check(wp_cased, rest, rest_len);
        check(bpe, rest, rest_len);
    } else if (!strcmp(line, "vocab") || !strcmp(line, "json")) {
        const uint8_t *nul = memchr(rest, 0, rest_len);
        size_t flen = nul ? (size_t)(nul - rest) : rest_len;
        mts_tokenizer *t = mts_tokenizer_load_mem((const char *)rest, flen, line[0] == 'j', -1, err, sizeof err);
        if (t) {
            if (nul) check(t, nul + 1, rest_len - flen - 1);
            mts_tokenizer_free(t);
        }
    }
    free(line);
    return 0;
}
