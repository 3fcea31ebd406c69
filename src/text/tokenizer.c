/*
 * Tokenizers (see tokenizer.h): a BERT vocab.txt read as a WordPiece tokenizer with BERT's basic
 * tokenization, and Hugging Face tokenizer.json files (tokenizer_json.c builds the same pipeline
 * from the JSON description).
 *
 * The pipeline of one mts_tokenize call: validate the UTF-8 (an error names the byte offset),
 * decode to code points, run the normalizer steps in order (each rewrites the code-point array),
 * split into words with the pre-tokenizer steps, run the model on each word (WordPiece, BPE or
 * Unigram) until the token budget is spent, then wrap with the post-processor's special tokens.
 * Character semantics follow the reference implementation (Hugging Face `tokenizers`, Rust):
 * per-character lower-casing (no final-sigma rule), NFD with canonical reordering, Rust's
 * White_Space and punctuation classes.
 *
 * Bounds: every step's output is a small multiple of its input (a code point becomes at most
 * MTS_UC_DECOMP_MAX + 2 code points), scratch arrays grow geometrically from the text's length,
 * and WordPiece tries at most as many candidate lengths per position as the longest vocabulary
 * entry has characters, so a call is linear in the text's length.
 */
#include "text/tokenizer_impl.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/unicode.h"

int mts_tok_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* ---- vocabulary: token bytes <-> id ------------------------------------------------------- */

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

void mts_vocab_free(mts_vocab *v)
{
    free(v->slots);
    free(v->arena);
    free(v->tok_off);
    free(v->tok_len);
    memset(v, 0, sizeof *v);
}

int mts_vocab_init(mts_vocab *v, int n_tokens, size_t bytes)
{
    memset(v, 0, sizeof *v);
    size_t cap = 16;
    while (cap < (size_t)n_tokens * 2 + 16) cap *= 2;
    v->slots = malloc(cap * sizeof *v->slots);
    v->arena = malloc(bytes + 1);
    v->n_ids = n_tokens;
    v->tok_off = malloc((size_t)(n_tokens ? n_tokens : 1) * sizeof *v->tok_off);
    v->tok_len = malloc((size_t)(n_tokens ? n_tokens : 1) * sizeof *v->tok_len);
    if (!v->slots || !v->arena || !v->tok_off || !v->tok_len) {
        mts_vocab_free(v);
        return -1;
    }
    for (size_t i = 0; i < cap; i++) v->slots[i] = -1;
    for (int i = 0; i < n_tokens; i++) v->tok_off[i] = UINT32_MAX, v->tok_len[i] = 0;
    v->mask = cap - 1;
    v->arena_cap = bytes + 1;
    return 0;
}

int64_t mts_vocab_get(const mts_vocab *v, const char *s, size_t n)
{
    if (!v->slots) return -1;
    for (size_t i = hash_bytes(s, n) & v->mask;; i = (i + 1) & v->mask) {
        int32_t id = v->slots[i];
        if (id < 0) return -1;
        if (v->tok_len[id] == n && memcmp(v->arena + v->tok_off[id], s, n) == 0) return id;
    }
}

/* Adds token s with the given id (0 <= id < n_ids; the id must be new). When the token is
 * already present under another id, the later id wins the lookup (as a hash map insert would)
 * but both ids keep their text. Returns 0, or -1 when the arena is full (a caller bug). */
int mts_vocab_add(mts_vocab *v, const char *s, size_t n, int32_t id)
{
    if (id < 0 || id >= v->n_ids || v->arena_len + n > v->arena_cap) return -1;
    memcpy(v->arena + v->arena_len, s, n);
    v->tok_off[id] = (uint32_t)v->arena_len;
    v->tok_len[id] = (uint32_t)n;
    v->arena_len += n;
    if (n > v->max_len) v->max_len = n;
    for (size_t i = hash_bytes(s, n) & v->mask;; i = (i + 1) & v->mask) {
        int32_t o = v->slots[i];
        if (o < 0) {
            v->slots[i] = id;
            v->count++;
            return 0;
        }
        if (v->tok_len[o] == n && memcmp(v->arena + v->tok_off[o], s, n) == 0) {
            v->slots[i] = id; /* duplicate token: the later id wins */
            return 0;
        }
    }
}

/* ---- code-point buffers --------------------------------------------------------------------- */

int mts_cps_reserve(mts_cps *c, size_t n)
{
    if (n <= c->cap) return 0;
    size_t cap = c->cap ? c->cap : 64;
    while (cap < n) cap *= 2;
    uint32_t *p = realloc(c->v, cap * sizeof *p);
    if (!p) return -1;
    c->v = p;
    c->cap = cap;
    return 0;
}

int mts_cps_push(mts_cps *c, uint32_t cp)
{
    if (c->n == c->cap && mts_cps_reserve(c, c->n + 1)) return -1;
    c->v[c->n++] = cp;
    return 0;
}

/* ---- normalizer steps ------------------------------------------------------------------------ */

/* Canonical ordering of combining marks (stable sort by combining class of each run of
 * non-starters), in place. Runs are short in real text; a hostile run of N marks costs N^2 /
 * 2 comparisons, so runs longer than 64 are sorted with a counting pass instead. */
static void canonical_order(uint32_t *v, size_t n)
{
    size_t i = 0;
    while (i < n) {
        if (mts_uc_ccc(v[i]) == 0) {
            i++;
            continue;
        }
        size_t j = i;
        while (j < n && mts_uc_ccc(v[j]) != 0) j++;
        size_t len = j - i;
        if (len <= 64) {
            for (size_t a = i + 1; a < j; a++) {
                uint32_t x = v[a];
                int cx = mts_uc_ccc(x);
                size_t b = a;
                while (b > i && mts_uc_ccc(v[b - 1]) > cx) {
                    v[b] = v[b - 1];
                    b--;
                }
                v[b] = x;
            }
        } else {
            /* stable counting sort by class over the run: 255 classes, one scratch pass */
            uint32_t *tmp = malloc(len * sizeof *tmp);
            if (tmp) {
                size_t k = 0;
                for (int cls = 1; cls < 256; cls++)
                    for (size_t a = i; a < j; a++)
                        if (mts_uc_ccc(v[a]) == cls) tmp[k++] = v[a];
                memcpy(v + i, tmp, len * sizeof *tmp);
                free(tmp);
            }
        }
        i = j;
    }
}

int mts_norm_apply(const mts_norm_step *s, mts_cps *in, mts_cps *out)
{
    out->n = 0;
    uint32_t buf[MTS_UC_DECOMP_MAX];
    switch (s->kind) {
    case MTS_NORM_BERT_CLEAN:
        for (size_t i = 0; i < in->n; i++) {
            uint32_t c = in->v[i];
            if (c == 0 || c == 0xFFFD || mts_uc_is_bert_control(c)) continue;
            if (mts_cps_push(out, mts_uc_is_white_space(c) ? ' ' : c)) return -1;
        }
        return 0;
    case MTS_NORM_BERT_CJK:
        for (size_t i = 0; i < in->n; i++) {
            uint32_t c = in->v[i];
            if (mts_uc_is_bert_cjk(c)) {
                if (mts_cps_push(out, ' ') || mts_cps_push(out, c) || mts_cps_push(out, ' ')) return -1;
            } else if (mts_cps_push(out, c)) {
                return -1;
            }
        }
        return 0;
    case MTS_NORM_NFD:
    case MTS_NORM_STRIP_ACCENTS_NFD:
        for (size_t i = 0; i < in->n; i++) {
            int k = mts_uc_decompose(in->v[i], buf);
            for (int j = 0; j < k; j++)
                if (mts_cps_push(out, buf[j])) return -1;
        }
        canonical_order(out->v, out->n);
        if (s->kind == MTS_NORM_STRIP_ACCENTS_NFD) {
            size_t k = 0;
            for (size_t i = 0; i < out->n; i++)
                if (!mts_uc_is_mn(out->v[i])) out->v[k++] = out->v[i];
            out->n = k;
        }
        return 0;
    case MTS_NORM_STRIP_MN:
        for (size_t i = 0; i < in->n; i++)
            if (!mts_uc_is_mn(in->v[i]) && mts_cps_push(out, in->v[i])) return -1;
        return 0;
    case MTS_NORM_LOWER:
        for (size_t i = 0; i < in->n; i++) {
            int k = mts_uc_lower_full(in->v[i], buf);
            for (int j = 0; j < k; j++)
                if (mts_cps_push(out, buf[j])) return -1;
        }
        return 0;
    default:
        return mts_norm_apply_ext(s, in, out);
    }
}

/* ---- pre-tokenizer: BERT ---------------------------------------------------------------------- */

/* Splits v[0..n) into words: runs between White_Space characters, each punctuation character a
 * word of its own. Calls fn for each; stops early when fn returns non-zero (returned). */
static int bert_words(const uint32_t *v, size_t n, mts_word_fn fn, void *arg)
{
    size_t i = 0;
    while (i < n) {
        uint32_t c = v[i];
        if (mts_uc_is_white_space(c)) {
            i++;
            continue;
        }
        if (mts_uc_is_bert_punct(c)) {
            int r = fn(arg, v + i, 1);
            if (r) return r;
            i++;
            continue;
        }
        size_t j = i + 1;
        while (j < n && !mts_uc_is_white_space(v[j]) && !mts_uc_is_bert_punct(v[j])) j++;
        int r = fn(arg, v + i, j - i);
        if (r) return r;
        i = j;
    }
    return 0;
}

/* ---- WordPiece ---------------------------------------------------------------------------------- */

int mts_wordpiece_word(const mts_tokenizer *t, const uint32_t *w, size_t n, mts_ids *out)
{
    if (n > (size_t)t->wp_max_chars) return mts_ids_push(out, t->unk_id);
    /* UTF-8 of the word, and the byte offset of every character */
    size_t plen = strlen(t->wp_prefix);
    char stackbuf[1024];
    size_t off_stack[257];
    size_t need = plen + 4 * n + 1;
    char *u8 = need <= sizeof stackbuf ? stackbuf : malloc(need);
    size_t *off = n + 1 <= 257 ? off_stack : malloc((n + 1) * sizeof *off);
    if (!u8 || !off) {
        if (u8 != stackbuf) free(u8);
        if (off != off_stack) free(off);
        return -1;
    }
    memcpy(u8, t->wp_prefix, plen);
    size_t b = plen;
    for (size_t i = 0; i < n; i++) {
        off[i] = b;
        b += (size_t)mts_utf8_encode(w[i], u8 + b);
    }
    off[n] = b;
    size_t mark = out->n;
    size_t start = 0;
    int rc = 0;
    while (start < n) {
        int64_t id = -1;
        size_t end = n;
        /* A continuation is looked up with the prefix right before the piece: write it over the
         * bytes before off[start], which are consumed (off[start] >= plen always). */
        size_t pre = start > 0 ? plen : 0;
        if (pre) memcpy(u8 + off[start] - plen, t->wp_prefix, plen);
        /* a candidate longer (in bytes) than the longest vocabulary entry cannot match */
        while (end > start && off[end] - off[start] + pre > t->vocab.max_len) end--;
        for (; end > start; end--) {
            id = mts_vocab_get(&t->vocab, u8 + off[start] - pre, off[end] - off[start] + pre);
            if (id >= 0) break;
        }
        if (id < 0) {
            out->n = mark;
            rc = mts_ids_push(out, t->unk_id);
            goto done;
        }
        if (mts_ids_push(out, id)) {
            rc = -1;
            goto done;
        }
        start = end;
    }
done:
    if (u8 != stackbuf) free(u8);
    if (off != off_stack) free(off);
    return rc;
}

int mts_ids_push(mts_ids *o, int64_t id)
{
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 64;
        int64_t *p = realloc(o->v, cap * sizeof *p);
        if (!p) return -1;
        o->v = p;
        o->cap = cap;
    }
    o->v[o->n++] = id;
    return 0;
}

/* ---- encoding ------------------------------------------------------------------------------------- */

typedef struct word_ctx {
    const mts_tokenizer *t;
    mts_ids *out;
    size_t limit; /* stop once this many tokens are out */
    int failed;
} word_ctx;

static int on_word(void *arg, const uint32_t *w, size_t n)
{
    word_ctx *c = arg;
    if (mts_tok_model_word(c->t, w, n, c->out)) {
        c->failed = 1;
        return 1;
    }
    return c->out->n >= c->limit ? 2 : 0;
}

int mts_tok_model_word(const mts_tokenizer *t, const uint32_t *w, size_t n, mts_ids *out)
{
    if (t->kind == MTS_TOK_WORDPIECE) return mts_wordpiece_word(t, w, n, out);
    return mts_tok_model_word_ext(t, w, n, out);
}

int mts_tokenize(const mts_tokenizer *t, const char *text, size_t len, int max_tokens,
                 int64_t *ids, int64_t *type_ids, int cap, char *err, size_t errlen)
{
    if (!t) return mts_tok_err(err, errlen, "tokenize: no tokenizer");
    if (!text && len) return mts_tok_err(err, errlen, "tokenize: no text");
    if (len > MTS_TOK_MAX_TEXT)
        return mts_tok_err(err, errlen, "tokenize: text of %zu bytes is longer than the limit of %d bytes", len,
                           MTS_TOK_MAX_TEXT);
    if (max_tokens < 0) return mts_tok_err(err, errlen, "tokenize: max_tokens %d is negative", max_tokens);
    if (max_tokens == 0) max_tokens = t->max_len > 0 ? t->max_len : 512;
    int n_special = t->post.n_special_single;
    if (max_tokens < n_special)
        return mts_tok_err(err, errlen, "tokenize: max_tokens %d leaves no room for the %d special tokens", max_tokens,
                           n_special);
    const unsigned char *s = (const unsigned char *)text;
    mts_cps a = {0}, b = {0};
    mts_ids out = {0};
    int rc = -1;
    if (mts_cps_reserve(&a, len + 1)) goto oom;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int k = mts_utf8_decode(s + i, len - i, &cp);
        if (!k) {
            mts_tok_err(err, errlen, "tokenize: invalid UTF-8 at byte %zu (0x%02X)", i, s[i]);
            goto fail;
        }
        a.v[a.n++] = cp;
        i += (size_t)k;
    }
    for (int i = 0; i < t->n_norm; i++) {
        if (mts_norm_apply(&t->norm[i], &a, &b)) goto oom;
        mts_cps tmp = a;
        a = b;
        b = tmp;
    }
    size_t budget = (size_t)(max_tokens - n_special);
    word_ctx c = {t, &out, budget, 0};
    if (t->n_pre == 0 && t->pre_bert) {
        bert_words(a.v, a.n, on_word, &c);
    } else {
        if (mts_pretok_run(t, &a, on_word, &c)) goto oom;
    }
    if (c.failed) goto oom;
    if (out.n > budget) out.n = budget;
    int total = (int)out.n + n_special;
    if (total > cap) {
        mts_tok_err(err, errlen, "tokenize: the encoding has %d tokens but the output holds only %d", total, cap);
        goto fail;
    }
    int k = 0;
    for (int i = 0; i < t->post.n_single; i++) {
        const mts_post_piece *p = &t->post.single[i];
        if (p->is_seq) {
            for (size_t j = 0; j < out.n; j++) {
                ids[k] = out.v[j];
                if (type_ids) type_ids[k] = p->type_id;
                k++;
            }
        } else {
            ids[k] = p->id;
            if (type_ids) type_ids[k] = p->type_id;
            k++;
        }
    }
    rc = k;
    goto fail;
oom:
    mts_tok_err(err, errlen, "tokenize: out of memory (text of %zu bytes)", len);
fail:
    free(a.v);
    free(b.v);
    free(out.v);
    return rc;
}

/* ---- vocab.txt -------------------------------------------------------------------------------------- */

static int find_special(mts_tokenizer *t, const char *name, int64_t *id, char *err, size_t errlen)
{
    *id = mts_vocab_get(&t->vocab, name, strlen(name));
    if (*id < 0) return mts_tok_err(err, errlen, "vocab.txt: no %s token", name);
    return 0;
}

static mts_tokenizer *load_vocab_txt(const char *data, size_t len, int lowercase, char *err, size_t errlen)
{
    if (len == 0) {
        mts_tok_err(err, errlen, "vocab.txt: empty file");
        return NULL;
    }
    /* count lines and check the text */
    int lines = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int k = mts_utf8_decode((const unsigned char *)data + i, len - i, &cp);
        if (!k) {
            mts_tok_err(err, errlen, "vocab.txt: invalid UTF-8 at byte %zu", i);
            return NULL;
        }
        if (cp == '\n') lines++;
        i += (size_t)k;
    }
    if (data[len - 1] != '\n') lines++;
    if (lines > MTS_TOK_MAX_VOCAB) {
        mts_tok_err(err, errlen, "vocab.txt: %d lines, more than the limit of %d", lines, MTS_TOK_MAX_VOCAB);
        return NULL;
    }
    mts_tokenizer *t = calloc(1, sizeof *t);
    if (!t || mts_vocab_init(&t->vocab, lines, len)) {
        free(t);
        mts_tok_err(err, errlen, "vocab.txt: out of memory");
        return NULL;
    }
    t->kind = MTS_TOK_WORDPIECE;
    int id = 0, cased = 0;
    size_t i = 0;
    while (i < len && id < lines) {
        size_t j = i;
        while (j < len && data[j] != '\n') j++;
        size_t e = j;
        /* trailing white space (Rust's trim_end; '\r' of CRLF files included) */
        while (e > i && (data[e - 1] == ' ' || data[e - 1] == '\t' || data[e - 1] == '\r' || data[e - 1] == '\v' ||
                         data[e - 1] == '\f'))
            e--;
        mts_vocab_add(&t->vocab, data + i, e - i, id);
        if (!(e > i && data[i] == '[' && data[e - 1] == ']'))
            for (size_t k = i; k < e && !cased; k++)
                if (data[k] >= 'A' && data[k] <= 'Z') cased = 1;
        id++;
        i = j + 1;
    }
    int64_t cls, sep;
    if (find_special(t, "[UNK]", &t->unk_id, err, errlen) || find_special(t, "[CLS]", &cls, err, errlen) ||
        find_special(t, "[SEP]", &sep, err, errlen)) {
        mts_tokenizer_free(t);
        return NULL;
    }
    t->pad_id = mts_vocab_get(&t->vocab, "[PAD]", 5);
    if (t->pad_id < 0) t->pad_id = 0;
    int lc = lowercase < 0 ? !cased : lowercase != 0;
    t->norm[t->n_norm++].kind = MTS_NORM_BERT_CLEAN;
    t->norm[t->n_norm++].kind = MTS_NORM_BERT_CJK;
    if (lc) {
        t->norm[t->n_norm++].kind = MTS_NORM_STRIP_ACCENTS_NFD;
        t->norm[t->n_norm++].kind = MTS_NORM_LOWER;
    }
    t->pre_bert = 1;
    snprintf(t->wp_prefix, sizeof t->wp_prefix, "##");
    t->wp_max_chars = 100;
    t->max_len = 512;
    mts_post_bert(&t->post, cls, sep);
    return t;
}

void mts_post_bert(mts_post *p, int64_t cls, int64_t sep)
{
    p->n_single = 3;
    p->single[0] = (mts_post_piece){0, cls, 0};
    p->single[1] = (mts_post_piece){1, -1, 0};
    p->single[2] = (mts_post_piece){0, sep, 0};
    p->n_special_single = 2;
}

/* ---- public API --------------------------------------------------------------------------------------- */

mts_tokenizer *mts_tokenizer_load_mem(const char *data, size_t len, int is_json, int lowercase, char *err,
                                      size_t errlen)
{
    if (!data && len) {
        mts_tok_err(err, errlen, "tokenizer: no data");
        return NULL;
    }
    if (len > MTS_TOK_MAX_FILE) {
        mts_tok_err(err, errlen, "tokenizer: file of %zu bytes is larger than the limit of %d MiB", len,
                    MTS_TOK_MAX_FILE >> 20);
        return NULL;
    }
    if (is_json < 0) {
        size_t i = 0;
        while (i < len && (data[i] == ' ' || data[i] == '\t' || data[i] == '\r' || data[i] == '\n')) i++;
        is_json = i < len && data[i] == '{';
    }
    if (is_json) return mts_tokenizer_load_json(data, len, lowercase, err, errlen);
    return load_vocab_txt(data, len, lowercase, err, errlen);
}

mts_tokenizer *mts_tokenizer_load(const char *path, int lowercase, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        mts_tok_err(err, errlen, "tokenizer %s: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            if (cap >= MTS_TOK_MAX_FILE) {
                fclose(f);
                free(buf);
                mts_tok_err(err, errlen, "tokenizer %s: larger than the limit of %d MiB", path, MTS_TOK_MAX_FILE >> 20);
                return NULL;
            }
            cap = cap ? cap * 2 : 1 << 16;
            char *p = realloc(buf, cap + 1);
            if (!p) {
                fclose(f);
                free(buf);
                mts_tok_err(err, errlen, "tokenizer %s: out of memory", path);
                return NULL;
            }
            buf = p;
        }
        size_t k = fread(buf + len, 1, cap - len, f);
        if (k == 0) break;
        len += k;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        mts_tok_err(err, errlen, "tokenizer %s: read error", path);
        return NULL;
    }
    char msg[400];
    mts_tokenizer *t = mts_tokenizer_load_mem(buf ? buf : "", len, -1, lowercase, msg, sizeof msg);
    free(buf);
    if (!t) mts_tok_err(err, errlen, "tokenizer %s: %s", path, msg);
    return t;
}

void mts_tokenizer_free(mts_tokenizer *t)
{
    if (!t) return;
    mts_vocab_free(&t->vocab);
    mts_tokenizer_free_ext(t);
    free(t);
}

int64_t mts_tokenizer_pad_id(const mts_tokenizer *t) { return t ? t->pad_id : 0; }

int mts_tokenizer_vocab_size(const mts_tokenizer *t) { return t ? t->vocab.n_ids : 0; }

const char *mts_tokenizer_kind(const mts_tokenizer *t)
{
    if (!t) return "none";
    switch (t->kind) {
    case MTS_TOK_WORDPIECE: return "wordpiece";
    case MTS_TOK_BPE: return "bpe";
    case MTS_TOK_UNIGRAM: return "unigram";
    default: return "unknown";
    }
}
