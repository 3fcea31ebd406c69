/*
 * The tokenizer of a GGUF model file, from its metadata: tokenizer.ggml.model "bert" gives a
 * WordPiece tokenizer (mts_tokenizer_wordpiece) over tokenizer.ggml.tokens with the special
 * token ids of tokenizer.ggml.{cls,bos}_token_id, {seperator,eos}_token_id (the key is spelled
 * so by the format), unknown_token_id and padding_token_id; tokens missing there are looked up
 * by name ([CLS], [SEP], [UNK], [PAD]). Other tokenizer models are refused.
 *
 * llama.cpp's converter rewrites a WordPiece vocabulary into its "phantom space" spelling: a
 * word-initial token gains a leading U+2581, a continuation loses its "##", control tokens (type 3
 * in tokenizer.ggml.token_type) stay as they are. When the list uses that spelling (some
 * non-control token starts with U+2581) it is turned back: U+2581 dropped, "##" put back, and
 * bracketed tokens such as [unused0] or [CLS] (which older converters left alone) kept.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/gguf.h"
#include "text/tokenizer_impl.h"

static int special(const mts_gguf *g, const char *k1, const char *k2, int64_t n, int64_t *id, char *err, size_t errlen)
{
    const char *keys[2] = {k1, k2};
    mts_err e = {0};
    *id = -1;
    for (int i = 0; i < 2 && *id < 0; i++) {
        if (!keys[i]) continue;
        const mts_gguf_kv *kv = mts_gguf_find(g, keys[i]);
        if (!kv) continue;
        int64_t v;
        if (mts_gguf_get_int(g, keys[i], -1, &v, &e)) return mts_tok_err(err, errlen, "%s", e.msg);
        if (v < 0 || v >= n)
            return mts_tok_err(err, errlen, "GGUF: %s = %lld at byte %zu is not a token id (0 to %lld)", keys[i],
                               (long long)v, kv->off, (long long)n - 1);
        *id = v;
    }
    return 0;
}

static mts_tokenizer *from_gguf(const mts_gguf *g, int lowercase, char *err, size_t errlen)
{
    size_t ml = 0;
    const char *model = mts_gguf_get_str(g, "tokenizer.ggml.model", &ml);
    if (!model) {
        mts_tok_err(err, errlen, "GGUF: no tokenizer.ggml.model (string) in the metadata");
        return NULL;
    }
    if (ml != 4 || memcmp(model, "bert", 4) != 0) {
        mts_tok_err(err, errlen, "GGUF: tokenizer model '%.*s' is not supported (only 'bert' WordPiece)",
                    (int)(ml > 40 ? 40 : ml), model);
        return NULL;
    }
    const mts_gguf_kv *tk = mts_gguf_find(g, "tokenizer.ggml.tokens");
    if (!tk || tk->type != MTS_GGUF_ARRAY || tk->arr_type != MTS_GGUF_STRING) {
        mts_tok_err(err, errlen, "GGUF: no tokenizer.ggml.tokens (array of strings) in the metadata");
        return NULL;
    }
    if (tk->count < 1 || tk->count > MTS_TOK_MAX_VOCAB) {
        mts_tok_err(err, errlen, "GGUF: tokenizer.ggml.tokens at byte %zu has %llu tokens (1 to %d allowed)", tk->off,
                    (unsigned long long)tk->count, MTS_TOK_MAX_VOCAB);
        return NULL;
    }
    int n = (int)tk->count;
    const mts_gguf_kv *types = mts_gguf_find(g, "tokenizer.ggml.token_type");
    int64_t cls, sep, unk, pad;
    if (special(g, "tokenizer.ggml.cls_token_id", "tokenizer.ggml.bos_token_id", n, &cls, err, errlen) ||
        special(g, "tokenizer.ggml.seperator_token_id", "tokenizer.ggml.eos_token_id", n, &sep, err, errlen) ||
        special(g, "tokenizer.ggml.unknown_token_id", NULL, n, &unk, err, errlen) ||
        special(g, "tokenizer.ggml.padding_token_id", NULL, n, &pad, err, errlen))
        return NULL;
    /* the phantom-space spelling? */
    static const char ph[3] = {(char)0xE2, (char)0x96, (char)0x81}; /* U+2581 */
    int phantom = 0;
    size_t pos = tk->off, total = 0;
    for (int i = 0; i < n; i++) {
        size_t len;
        const char *s = mts_gguf_next_str(g, &pos, &len);
        total += len + 2;
        if (!phantom && len >= 3 && !memcmp(s, ph, 3) && mts_gguf_arr_int(g, types, (uint64_t)i, 1) != 3) phantom = 1;
    }
    const char **toks = malloc((size_t)n * sizeof *toks);
    size_t *lens = malloc((size_t)n * sizeof *lens);
    char *buf = malloc(total + 1);
    mts_tokenizer *t = NULL;
    if (!toks || !lens || !buf) {
        mts_tok_err(err, errlen, "GGUF: out of memory for %d tokens", n);
        goto done;
    }
    size_t used = 0;
    pos = tk->off;
    for (int i = 0; i < n; i++) {
        size_t len;
        const char *s = mts_gguf_next_str(g, &pos, &len);
        toks[i] = s;
        lens[i] = len;
        if (!phantom || mts_gguf_arr_int(g, types, (uint64_t)i, 1) == 3) continue;
        if (len >= 3 && !memcmp(s, ph, 3)) {
            toks[i] = s + 3;
            lens[i] = len - 3;
        } else if (!(len >= 2 && s[0] == '[' && s[len - 1] == ']')) {
            memcpy(buf + used, "##", 2);
            memcpy(buf + used + 2, s, len);
            toks[i] = buf + used;
            lens[i] = len + 2;
            used += len + 2;
        }
    }
    char msg[300];
    t = mts_tokenizer_wordpiece(toks, lens, n, unk, cls, sep, pad, lowercase, msg, sizeof msg);
    if (!t) mts_tok_err(err, errlen, "GGUF: tokenizer.ggml.tokens: %s", msg);
done:
    free(toks);
    free(lens);
    free(buf);
    return t;
}

mts_tokenizer *mts_tokenizer_load_gguf(const char *path, int lowercase, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        mts_tok_err(err, errlen, "tokenizer %s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_size < 4) {
        close(fd);
        mts_tok_err(err, errlen, "tokenizer %s: not a regular GGUF file", path);
        return NULL;
    }
    void *addr = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (addr == MAP_FAILED) {
        mts_tok_err(err, errlen, "tokenizer %s: cannot map: %s", path, strerror(errno));
        return NULL;
    }
    mts_gguf g;
    mts_err e = {0};
    mts_tokenizer *t = NULL;
    char msg[400];
    if (mts_gguf_parse(&g, addr, (size_t)st.st_size, path, &e)) {
        mts_tok_err(err, errlen, "tokenizer %s", e.msg);
    } else {
        t = from_gguf(&g, lowercase, msg, sizeof msg);
        if (!t) mts_tok_err(err, errlen, "tokenizer %s: %s", path, msg);
        mts_gguf_free(&g);
    }
    munmap(addr, (size_t)st.st_size);
    return t;
}

mts_tokenizer *mts_tokenizer_load_gguf_mem(const void *data, size_t len, int lowercase, char *err, size_t errlen)
{
    mts_gguf g;
    mts_err e = {0};
    if (mts_gguf_parse(&g, data, len, "gguf", &e)) {
        mts_tok_err(err, errlen, "%s", e.msg);
        return NULL;
    }
    mts_tokenizer *t = from_gguf(&g, lowercase, err, errlen);
    mts_gguf_free(&g);
    return t;
}
