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
            /* stable counting sort by class: linear in the run's length */
            uint32_t *tmp = malloc(len * sizeof *tmp);
            uint8_t *cls = malloc(len);
            if (tmp && cls) {
                size_t start[257] = {0};
                for (size_t a = 0; a < len; a++) {
                    cls[a] = (uint8_t)mts_uc_ccc(v[i + a]);
                    start[cls[a] + 1]++;
                }
                for (int c = 1; c <= 256; c++) start[c] += start[c - 1];
                for (size_t a = 0; a < len; a++) tmp[start[cls[a]]++] = v[i + a];
                memcpy(v + i, tmp, len * sizeof *tmp);
            }
            free(tmp);
            free(cls);
        }
        i = j;
    }
}

/* Canonical composition of a decomposed, canonically ordered string, in place (the algorithm of
 * UAX #15: a character combines with the last starter unless a character of the same or a
 * higher class sits between them). */
static void compose(mts_cps *c)
{
    if (c->n == 0) return;
    uint32_t *v = c->v;
    size_t starter = 0, k = 1;
    int last = mts_uc_ccc(v[0]) ? 256 : 0;
    for (size_t i = 1; i < c->n; i++) {
        uint32_t ch = v[i];
        int cls = mts_uc_ccc(ch);
        uint32_t comp = mts_uc_compose(v[starter], ch);
        if (comp && (last < cls || last == 0)) {
            v[starter] = comp;
            continue;
        }
        if (cls == 0) starter = k;
        last = cls;
        v[k++] = ch;
    }
    c->n = k;
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
    case MTS_NORM_STRIP_M:
        for (size_t i = 0; i < in->n; i++) {
            int k = mts_uc_category(in->v[i]);
            if (k != MTS_UC_Mn && k != MTS_UC_Mc && k != MTS_UC_Me && mts_cps_push(out, in->v[i])) return -1;
        }
        return 0;
    case MTS_NORM_LOWER:
        for (size_t i = 0; i < in->n; i++) {
            int k = mts_uc_lower_full(in->v[i], buf);
            for (int j = 0; j < k; j++)
                if (mts_cps_push(out, buf[j])) return -1;
        }
        return 0;
    case MTS_NORM_NFKD:
    case MTS_NORM_NFC:
    case MTS_NORM_NFKC: {
        uint32_t kb[MTS_UC_KDECOMP_MAX];
        int compat = s->kind != MTS_NORM_NFC;
        for (size_t i = 0; i < in->n; i++) {
            int k = compat ? mts_uc_decompose_compat(in->v[i], kb) : mts_uc_decompose(in->v[i], kb);
            for (int j = 0; j < k; j++)
                if (mts_cps_push(out, kb[j])) return -1;
        }
        canonical_order(out->v, out->n);
        if (s->kind != MTS_NORM_NFKD) compose(out);
        return 0;
    }
    default:
        return mts_norm_apply_ext(s, in, out);
    }
}

/* ---- pre-tokenizer ------------------------------------------------------------------------------ */

/* Pieces of text: one code-point buffer, piece i is buf[off[i]..off[i+1]); first[i] marks the
 * piece that starts the text (Metaspace's prepend_scheme "first"). */
typedef struct pieces {
    mts_cps buf;
    size_t *off;
    uint8_t *first;
    size_t n, cap;
} pieces;

static void pieces_free(pieces *p)
{
    free(p->buf.v);
    free(p->off);
    free(p->first);
}

static int pieces_add(pieces *p, const uint32_t *v, size_t n, int first)
{
    if (n == 0) return 0; /* empty pieces are dropped, as the reference does */
    if (p->n + 2 > p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 64;
        size_t *o = realloc(p->off, cap * sizeof *o);
        if (!o) return -1;
        p->off = o;
        uint8_t *f = realloc(p->first, cap);
        if (!f) return -1;
        p->first = f;
        p->cap = cap;
    }
    if (p->n == 0) p->off[0] = 0;
    if (mts_cps_reserve(&p->buf, p->buf.n + n)) return -1;
    memcpy(p->buf.v + p->buf.n, v, n * sizeof *v);
    p->buf.n += n;
    p->first[p->n] = (uint8_t)first;
    p->off[++p->n] = p->buf.n;
    return 0;
}

/* Delimiter spans [s, e) of one piece, in order, not overlapping. */
typedef struct spans {
    size_t *v; /* s0, e0, s1, e1, ... */
    size_t n, cap;
} spans;

static int spans_add(spans *s, size_t a, size_t b)
{
    if (s->n + 2 > s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        size_t *p = realloc(s->v, cap * sizeof *p);
        if (!p) return -1;
        s->v = p;
        s->cap = cap;
    }
    s->v[s->n++] = a;
    s->v[s->n++] = b;
    return 0;
}

/* Emits the pieces of v[0..n) given its delimiter spans, per behavior (SplitDelimiterBehavior). */
static int split_by_spans(const uint32_t *v, size_t n, int first, const spans *sp, int behavior, pieces *out)
{
    size_t pos = 0;   /* start of the pending text */
    size_t k = 0;
    int f = first;
    while (k < sp->n) {
        size_t a = sp->v[k], b = sp->v[k + 1];
        k += 2;
        if (behavior == MTS_SPLIT_CONTIGUOUS)
            while (k < sp->n && sp->v[k] == b) b = sp->v[k + 1], k += 2;
        switch (behavior) {
        case MTS_SPLIT_REMOVED:
            if (pieces_add(out, v + pos, a - pos, f && pos == 0)) return -1;
            pos = b;
            break;
        case MTS_SPLIT_ISOLATED:
        case MTS_SPLIT_CONTIGUOUS:
            if (pieces_add(out, v + pos, a - pos, f && pos == 0) || pieces_add(out, v + a, b - a, f && a == 0))
                return -1;
            pos = b;
            break;
        case MTS_SPLIT_PREV:
            if (pieces_add(out, v + pos, b - pos, f && pos == 0)) return -1;
            pos = b;
            break;
        case MTS_SPLIT_NEXT:
            if (pieces_add(out, v + pos, a - pos, f && pos == 0)) return -1;
            pos = a; /* the delimiter starts the next piece */
            break;
        }
    }
    return pieces_add(out, v + pos, n - pos, f && pos == 0);
}

static bool is_numeric(uint32_t c)
{
    int k = mts_uc_category(c);
    return k == MTS_UC_Nd || k == MTS_UC_Nl || k == MTS_UC_No;
}

static bool is_letter(uint32_t c)
{
    int k = mts_uc_category(c);
    return k >= MTS_UC_Lu && k <= MTS_UC_Lo;
}

/* \w: alphabetic, marks, decimal digits, connector punctuation, joiners. Alphabetic is letters,
 * Nl and Other_Alphabetic (marks, plus the circled and squared Latin letters). */
static bool is_word_char(uint32_t c)
{
    if (c < 128) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    int k = mts_uc_category(c);
    if ((k >= MTS_UC_Lu && k <= MTS_UC_Lo) || k == MTS_UC_Mn || k == MTS_UC_Mc || k == MTS_UC_Me || k == MTS_UC_Nd ||
        k == MTS_UC_Nl || k == MTS_UC_Pc)
        return true;
    return c == 0x200C || c == 0x200D || (c >= 0x24B6 && c <= 0x24E9) || (c >= 0x1F130 && c <= 0x1F149) ||
           (c >= 0x1F150 && c <= 0x1F169) || (c >= 0x1F170 && c <= 0x1F189);
}

/* Matches of GPT-2's pattern
 *     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * over v[0..n): they tile the text, so they are returned as spans. */
static int gpt2_spans(const uint32_t *v, size_t n, spans *sp)
{
    size_t i = 0;
    while (i < n) {
        uint32_t c = v[i];
        size_t j = i;
        if (c == '\'' && i + 1 < n) {
            uint32_t d = v[i + 1];
            if (d == 's' || d == 't' || d == 'm' || d == 'd') j = i + 2;
            else if (i + 2 < n && ((d == 'r' && v[i + 2] == 'e') || (d == 'v' && v[i + 2] == 'e') ||
                                   (d == 'l' && v[i + 2] == 'l')))
                j = i + 3;
        }
        if (j == i) {
            size_t s = (c == ' ' && i + 1 < n) ? i + 1 : i;
            uint32_t e = v[s];
            if (is_letter(e)) {
                j = s + 1;
                while (j < n && is_letter(v[j])) j++;
            } else if (mts_uc_category(e) >= MTS_UC_Nd && mts_uc_category(e) <= MTS_UC_No) {
                j = s + 1;
                while (j < n && is_numeric(v[j])) j++;
            } else if (!mts_uc_is_white_space(e)) {
                j = s + 1;
                while (j < n && !mts_uc_is_white_space(v[j]) && !is_letter(v[j]) && !is_numeric(v[j])) j++;
            } else {
                /* c is white space (if c was ' ' followed by more white space, e is too) */
                size_t k = i;
                while (k < n && mts_uc_is_white_space(v[k])) k++;
                if (k == n) j = n;
                else if (k - i >= 2) j = k - 1;
                else j = i + 1;
            }
        }
        if (spans_add(sp, i, j)) return -1;
        i = j;
    }
    return 0;
}

static bool is_cr_lf(uint32_t c) { return c == '\r' || c == '\n'; }

/* Case-insensitive contraction at v[i] ('s 't 're 've 'm 'll 'd, the (?i:...) group of the
 * cl100k pattern): its length, or 0. Unicode simple case folding adds U+017F (long s) as an
 * 's' and U+212A (Kelvin) is irrelevant here. */
static size_t contraction_ci(const uint32_t *v, size_t n, size_t i)
{
    if (v[i] != '\'' || i + 1 >= n) return 0;
    uint32_t a = v[i + 1] | 0x20, b = i + 2 < n ? (v[i + 2] | 0x20) : 0;
    if (v[i + 1] == 0x17F) a = 's';
    if (v[i + 1] > 0x7F && v[i + 1] != 0x17F) return 0;
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (i + 2 < n && v[i + 2] <= 0x7F && ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')))
        return 3;
    return 0;
}

/* Matches of the pattern of cl100k / Llama 3 (digits = 3) and Qwen 2 (digits = 1):
 *     (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,D}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 *     \s*[\r\n]+|\s+(?!\S)|\s+
 * over v[0..n), alternatives tried in order at each position (leftmost-first); the matches
 * tile the text. */
static int cl100k_spans(const uint32_t *v, size_t n, int digits, spans *sp)
{
    size_t i = 0;
    while (i < n) {
        uint32_t c = v[i];
        size_t j = i + contraction_ci(v, n, i);
        if (j == i) {
            size_t s = i;
            if (!is_cr_lf(c) && !is_letter(c) && !is_numeric(c) && i + 1 < n && is_letter(v[i + 1])) s = i + 1;
            if (is_letter(v[s])) {
                j = s + 1;
                while (j < n && is_letter(v[j])) j++;
            }
        }
        if (j == i && is_numeric(c)) {
            j = i + 1;
            while (j < n && (int)(j - i) < digits && is_numeric(v[j])) j++;
        }
        if (j == i) {
            size_t s = (c == ' ' && i + 1 < n) ? i + 1 : i;
            uint32_t e = v[s];
            if (!mts_uc_is_white_space(e) && !is_letter(e) && !is_numeric(e)) {
                j = s + 1;
                while (j < n && !mts_uc_is_white_space(v[j]) && !is_letter(v[j]) && !is_numeric(v[j])) j++;
                while (j < n && is_cr_lf(v[j])) j++;
            }
        }
        if (j == i && mts_uc_is_white_space(c)) {
            size_t k = i;
            while (k < n && mts_uc_is_white_space(v[k])) k++;
            size_t last = SIZE_MAX; /* \s*[\r\n]+: up to the last CR/LF of the run */
            for (size_t q = i; q < k; q++)
                if (is_cr_lf(v[q])) last = q;
            if (last != SIZE_MAX) j = last + 1;
            else if (k == n) j = n;
            else if (k - i >= 2) j = k - 1;
            else j = i + 1;
        }
        if (j == i) j = i + 1; /* not reached: every character matches one alternative */
        if (spans_add(sp, i, j)) return -1;
        i = j;
    }
    return 0;
}

/* GPT-2's bytes_to_unicode: printable bytes stand for themselves, the other 68 bytes take
 * U+0100, U+0101, ... in byte order (0x00-0x20, then 0x7F-0xA0, then 0xAD). */
static uint32_t byte_char(unsigned b)
{
    if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) return b;
    if (b <= 0x20) return 256 + b;
    if (b >= 0x7F && b <= 0xA0) return 256 + 33 + (b - 0x7F);
    return 256 + 33 + 34; /* 0xAD */
}

static int pre_step(const mts_pre_step *s, const uint32_t *v, size_t n, int first, pieces *out, spans *sp,
                    mts_cps *tmp)
{
    sp->n = 0;
    switch (s->kind) {
    case MTS_PRE_BERT: {
        size_t i = 0;
        while (i < n) {
            if (mts_uc_is_white_space(v[i])) {
                i++;
                continue;
            }
            size_t j = i + 1;
            if (!mts_uc_is_bert_punct(v[i]))
                while (j < n && !mts_uc_is_white_space(v[j]) && !mts_uc_is_bert_punct(v[j])) j++;
            if (pieces_add(out, v + i, j - i, first && i == 0)) return -1;
            i = j;
        }
        return 0;
    }
    case MTS_PRE_WHITESPACE: {
        size_t i = 0;
        while (i < n) {
            if (mts_uc_is_white_space(v[i]) && !is_word_char(v[i])) {
                i++;
                continue;
            }
            bool w = is_word_char(v[i]);
            size_t j = i + 1;
            while (j < n && is_word_char(v[j]) == w && (w || !mts_uc_is_white_space(v[j]))) j++;
            if (pieces_add(out, v + i, j - i, first && i == 0)) return -1;
            i = j;
        }
        return 0;
    }
    case MTS_PRE_WS_SPLIT:
    case MTS_PRE_PUNCT:
    case MTS_PRE_DIGITS:
        for (size_t i = 0; i < n; i++) {
            bool d = s->kind == MTS_PRE_WS_SPLIT ? mts_uc_is_white_space(v[i])
                     : s->kind == MTS_PRE_PUNCT  ? mts_uc_is_bert_punct(v[i])
                                                 : is_numeric(v[i]);
            if (d && spans_add(sp, i, i + 1)) return -1;
        }
        return split_by_spans(v, n, first, sp,
                              s->kind == MTS_PRE_WS_SPLIT ? MTS_SPLIT_REMOVED
                              : s->kind == MTS_PRE_PUNCT  ? s->behavior
                              : s->flag1                  ? MTS_SPLIT_ISOLATED
                                                          : MTS_SPLIT_CONTIGUOUS,
                              out);
    case MTS_PRE_METASPACE: {
        tmp->n = 0;
        int prepend = s->flag1 == 1 || (s->flag1 == 2 && first);
        if (prepend && (n == 0 || (v[0] != ' ' && v[0] != s->repl)) && mts_cps_push(tmp, s->repl)) return -1;
        for (size_t i = 0; i < n; i++)
            if (mts_cps_push(tmp, v[i] == ' ' ? s->repl : v[i])) return -1;
        if (!s->flag2) return pieces_add(out, tmp->v, tmp->n, first);
        for (size_t i = 0; i < tmp->n; i++)
            if (tmp->v[i] == s->repl && spans_add(sp, i, i + 1)) return -1;
        return split_by_spans(tmp->v, tmp->n, first, sp, MTS_SPLIT_NEXT, out);
    }
    case MTS_PRE_BYTELEVEL: {
        tmp->n = 0;
        if (s->flag1 && (n == 0 || v[0] != ' ') && mts_cps_push(tmp, ' ')) return -1;
        for (size_t i = 0; i < n; i++)
            if (mts_cps_push(tmp, v[i])) return -1;
        if (s->flag2) {
            if (gpt2_spans(tmp->v, tmp->n, sp)) return -1;
        } else if (spans_add(sp, 0, tmp->n)) {
            return -1;
        }
        /* each span's UTF-8 bytes, as printable characters */
        mts_cps bytes = {0};
        for (size_t k = 0; k < sp->n; k += 2) {
            bytes.n = 0;
            for (size_t i = sp->v[k]; i < sp->v[k + 1]; i++) {
                char u[4];
                int m = mts_utf8_encode(tmp->v[i], u);
                for (int j = 0; j < m; j++)
                    if (mts_cps_push(&bytes, byte_char((unsigned char)u[j]))) {
                        free(bytes.v);
                        return -1;
                    }
            }
            if (pieces_add(out, bytes.v, bytes.n, first && sp->v[k] == 0)) {
                free(bytes.v);
                return -1;
            }
        }
        free(bytes.v);
        return 0;
    }
    case MTS_PRE_SPLIT_STR:
        if (s->pat_n)
            for (size_t i = 0; i + s->pat_n <= n;) {
                if (memcmp(v + i, s->pat, s->pat_n * sizeof *v) == 0) {
                    if (spans_add(sp, i, i + s->pat_n)) return -1;
                    i += s->pat_n;
                } else {
                    i++;
                }
            }
        return split_by_spans(v, n, first, sp, s->behavior, out);
    case MTS_PRE_SPLIT_GPT2:
        if (gpt2_spans(v, n, sp)) return -1;
        return split_by_spans(v, n, first, sp, MTS_SPLIT_ISOLATED, out);
    case MTS_PRE_SPLIT_CL100K:
        if (cl100k_spans(v, n, s->flag1, sp)) return -1;
        return split_by_spans(v, n, first, sp, MTS_SPLIT_ISOLATED, out);
    default:
        return -1;
    }
}

/* Runs the pre-tokenizer steps over v[0..n) and the model over each resulting piece. */
static int pretok_and_model(const mts_tokenizer *t, const uint32_t *v, size_t n, int first, mts_ids *out,
                            size_t limit)
{
    if (t->n_pre == 0) return n ? mts_tok_model_word(t, v, n, out) : 0;
    pieces a = {0}, b = {0};
    spans sp = {0};
    mts_cps tmp = {0};
    int rc = -1;
    if (pieces_add(&a, v, n, first)) goto done;
    for (int k = 0; k < t->n_pre; k++) {
        b.n = 0;
        b.buf.n = 0;
        for (size_t i = 0; i < a.n; i++)
            if (pre_step(&t->pre[k], a.buf.v + a.off[i], a.off[i + 1] - a.off[i], a.first[i], &b, &sp, &tmp))
                goto done;
        pieces x = a;
        a = b;
        b = x;
    }
    for (size_t i = 0; i < a.n && out->n < limit; i++)
        if (mts_tok_model_word(t, a.buf.v + a.off[i], a.off[i + 1] - a.off[i], out)) goto done;
    rc = 0;
done:
    pieces_free(&a);
    pieces_free(&b);
    free(sp.v);
    free(tmp.v);
    return rc;
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

int mts_tok_model_word(const mts_tokenizer *t, const uint32_t *w, size_t n, mts_ids *out)
{
    if (t->kind == MTS_TOK_WORDPIECE) return mts_wordpiece_word(t, w, n, out);
    return mts_tok_model_word_ext(t, w, n, out);
}

/* The longest added token (of the given normalized kind) starting at v[i], or NULL. The table
 * is sorted by first code point, so only the tokens sharing v[i] are compared. */
static const mts_added *added_at(const mts_tokenizer *t, const uint32_t *v, size_t n, size_t i, int normalized)
{
    int lo = 0, hi = t->n_added;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (t->added[mid].cps[0] < v[i]) lo = mid + 1;
        else hi = mid;
    }
    const mts_added *best = NULL;
    for (int k = lo; k < t->n_added && t->added[k].cps[0] == v[i]; k++) {
        const mts_added *a = &t->added[k];
        if (a->normalized != normalized || a->n > n - i || (best && a->n <= best->n)) continue;
        if (memcmp(a->cps, v + i, a->n * sizeof *v) == 0) best = a;
    }
    return best;
}

typedef struct enc_ctx {
    const mts_tokenizer *t;
    mts_ids *out;
    size_t limit; /* stop once this many tokens are out */
} enc_ctx;

/* Splits v[0..n) on added tokens of one kind: the text between them goes to fn, the tokens'
 * ids to the output. lstrip / rstrip tokens take the white space beside them. */
static int split_added(enc_ctx *c, const uint32_t *v, size_t n, int first, int normalized,
                       int (*fn)(enc_ctx *, const uint32_t *, size_t, int))
{
    const mts_tokenizer *t = c->t;
    size_t pos = 0;
    for (size_t i = 0; i < n && c->out->n < c->limit;) {
        const mts_added *a = t->n_added ? added_at(t, v, n, i, normalized) : NULL;
        if (!a) {
            i++;
            continue;
        }
        size_t s = i, e = i + a->n;
        if (a->lstrip)
            while (s > pos && mts_uc_is_white_space(v[s - 1])) s--;
        if (a->rstrip)
            while (e < n && mts_uc_is_white_space(v[e])) e++;
        if (s > pos && fn(c, v + pos, s - pos, first && pos == 0)) return -1;
        if (c->out->n < c->limit && mts_ids_push(c->out, a->id)) return -1;
        pos = i = e;
    }
    if (pos < n && c->out->n < c->limit && fn(c, v + pos, n - pos, first && pos == 0)) return -1;
    return 0;
}

static int do_pieces(enc_ctx *c, const uint32_t *v, size_t n, int first)
{
    return pretok_and_model(c->t, v, n, first, c->out, c->limit);
}

/* One stretch of the original text between added tokens: normalize, then split on the
 * normalized added tokens. */
static int do_segment(enc_ctx *c, const uint32_t *v, size_t n, int first)
{
    const mts_tokenizer *t = c->t;
    mts_cps a = {0}, b = {0};
    int rc = -1;
    if (mts_cps_reserve(&a, n + 1)) goto done;
    memcpy(a.v, v, n * sizeof *v);
    a.n = n;
    for (int i = 0; i < t->n_norm; i++) {
        if (mts_norm_apply(&t->norm[i], &a, &b)) goto done;
        mts_cps x = a;
        a = b;
        b = x;
    }
    rc = split_added(c, a.v, a.n, first, 1, do_pieces);
done:
    free(a.v);
    free(b.v);
    return rc;
}

int mts_tokenize(const mts_tokenizer *t, const char *text, size_t len, int max_tokens,
                 int64_t *ids, int64_t *type_ids, int cap, char *err, size_t errlen)
{
    if (!t) return mts_tok_err(err, errlen, "tokenize: no tokenizer");
    if (!text && len) return mts_tok_err(err, errlen, "tokenize: no text");
    if (cap < 0 || (!ids && cap > 0)) return mts_tok_err(err, errlen, "tokenize: no output array");
    if (len > MTS_TOK_MAX_TEXT)
        return mts_tok_err(err, errlen, "tokenize: text of %zu bytes is longer than the limit of %d bytes", len,
                           MTS_TOK_MAX_TEXT);
    if (max_tokens < 0) return mts_tok_err(err, errlen, "tokenize: max_tokens %d is negative", max_tokens);
    if (max_tokens == 0) max_tokens = t->max_len > 0 ? t->max_len : 512;
    /* the output array bounds the encoding too: it is truncated (special tokens kept) to fit */
    if (max_tokens > cap) max_tokens = cap;
    int n_special = t->post.n_special_single;
    if (max_tokens < n_special)
        return mts_tok_err(err, errlen, "tokenize: a limit of %d tokens (max_tokens or the output's size) leaves no "
                           "room for the %d special tokens", max_tokens, n_special);
    const unsigned char *s = (const unsigned char *)text;
    mts_cps a = {0};
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
    size_t budget = (size_t)(max_tokens - n_special);
    /* Truncation on the right stops the work once the budget is spent; on the left every token
     * is needed (the last ones are kept). */
    enc_ctx c = {t, &out, t->trunc_left ? SIZE_MAX : budget};
    if (split_added(&c, a.v, a.n, 1, 0, do_segment)) goto oom;
    const int64_t *seq = out.v;
    size_t nseq = out.n;
    if (nseq > budget) {
        if (t->trunc_left) seq += nseq - budget;
        nseq = budget;
    }
    int k = 0;
    for (int i = 0; i < t->post.n_single; i++) {
        const mts_post_piece *p = &t->post.single[i];
        if (p->is_seq) {
            for (size_t j = 0; j < nseq; j++) {
                ids[k] = seq[j];
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
    free(out.v);
    return rc;
}

/* ---- added tokens ----------------------------------------------------------------------------------- */

int mts_tok_add_added(mts_tokenizer *t, const char *s, size_t n, int64_t id, int normalized, int lstrip, int rstrip)
{
    if (n == 0) return 0; /* an empty added token never matches */
    mts_added *p = realloc(t->added, (size_t)(t->n_added + 1) * sizeof *p);
    if (!p) return -1;
    t->added = p;
    mts_added *a = &p[t->n_added];
    memset(a, 0, sizeof *a);
    a->cps = malloc(n * sizeof *a->cps);
    if (!a->cps) return -1;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = mts_utf8_decode((const unsigned char *)s + i, n - i, &cp);
        if (!k) { /* callers pass valid UTF-8 (JSON strings are checked) */
            free(a->cps);
            return -1;
        }
        a->cps[a->n++] = cp;
        i += (size_t)k;
    }
    a->id = id;
    a->normalized = normalized;
    a->lstrip = lstrip;
    a->rstrip = rstrip;
    t->n_added++;
    return 0;
}

static int added_cmp(const void *x, const void *y)
{
    const mts_added *a = x, *b = y;
    if (a->cps[0] != b->cps[0]) return a->cps[0] < b->cps[0] ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

void mts_tok_sort_added(mts_tokenizer *t)
{
    if (t->n_added > 1) qsort(t->added, (size_t)t->n_added, sizeof *t->added, added_cmp);
}

/* ---- vocab.txt -------------------------------------------------------------------------------------- */

static mts_tokenizer *wordpiece_finish(mts_tokenizer *t, int cased, int lowercase, int64_t unk, int64_t cls,
                                       int64_t sep, int64_t pad, const char *what, char *err, size_t errlen);

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
    return wordpiece_finish(t, cased, lowercase, -1, -1, -1, -1, "vocab.txt", err, errlen);
}

/* The rest of a WordPiece tokenizer once its vocabulary is in: the special tokens (an id < 0 is
 * looked up by its usual name), BERT's normalizer and pre-tokenizer, the post-processor. Frees t
 * on error. */
static mts_tokenizer *wordpiece_finish(mts_tokenizer *t, int cased, int lowercase, int64_t unk, int64_t cls,
                                       int64_t sep, int64_t pad, const char *what, char *err, size_t errlen)
{
    int64_t *ids[3] = {&unk, &cls, &sep};
    static const char *const names[3] = {"[UNK]", "[CLS]", "[SEP]"};
    for (int k = 0; k < 3; k++) {
        if (*ids[k] < 0) *ids[k] = mts_vocab_get(&t->vocab, names[k], strlen(names[k]));
        if (*ids[k] < 0 || *ids[k] >= t->vocab.n_ids) {
            mts_tok_err(err, errlen, "%s: no %s token", what, names[k]);
            mts_tokenizer_free(t);
            return NULL;
        }
    }
    t->unk_id = unk;
    t->pad_id = pad >= 0 && pad < t->vocab.n_ids ? pad : mts_vocab_get(&t->vocab, "[PAD]", 5);
    if (t->pad_id < 0) t->pad_id = 0;
    int lc = lowercase < 0 ? !cased : lowercase != 0;
    t->norm[t->n_norm++].kind = MTS_NORM_BERT_CLEAN;
    t->norm[t->n_norm++].kind = MTS_NORM_BERT_CJK;
    if (lc) {
        t->norm[t->n_norm++].kind = MTS_NORM_STRIP_ACCENTS_NFD;
        t->norm[t->n_norm++].kind = MTS_NORM_LOWER;
    }
    t->pre[t->n_pre++].kind = MTS_PRE_BERT;
    /* As transformers' BertTokenizerFast: the special tokens are matched in the text. */
    static const char *const specials[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
    for (int k = 0; k < 5; k++) {
        int64_t sid = mts_vocab_get(&t->vocab, specials[k], strlen(specials[k]));
        if (sid >= 0 && mts_tok_add_added(t, specials[k], strlen(specials[k]), sid, 0, 0, 0)) {
            mts_tokenizer_free(t);
            mts_tok_err(err, errlen, "%s: out of memory", what);
            return NULL;
        }
    }
    mts_tok_sort_added(t);
    snprintf(t->wp_prefix, sizeof t->wp_prefix, "##");
    t->wp_max_chars = 100;
    t->max_len = 512;
    mts_post_bert(&t->post, cls, sep);
    return t;
}

mts_tokenizer *mts_tokenizer_wordpiece(const char *const *tokens, const size_t *lens, int n, int64_t unk_id,
                                       int64_t cls_id, int64_t sep_id, int64_t pad_id, int lowercase, char *err,
                                       size_t errlen)
{
    if (n < 1 || n > MTS_TOK_MAX_VOCAB) {
        mts_tok_err(err, errlen, "token list: %d tokens (1 to %d allowed)", n, MTS_TOK_MAX_VOCAB);
        return NULL;
    }
    size_t bytes = 0;
    for (int i = 0; i < n; i++) {
        if (lens[i] > MTS_TOK_MAX_FILE - bytes) {
            mts_tok_err(err, errlen, "token list: more than %d MiB of token text", MTS_TOK_MAX_FILE >> 20);
            return NULL;
        }
        bytes += lens[i];
        for (size_t k = 0; k < lens[i];) {
            uint32_t cp;
            int m = mts_utf8_decode((const unsigned char *)tokens[i] + k, lens[i] - k, &cp);
            if (!m) {
                mts_tok_err(err, errlen, "token list: token %d: invalid UTF-8 at byte %zu", i, k);
                return NULL;
            }
            k += (size_t)m;
        }
    }
    mts_tokenizer *t = calloc(1, sizeof *t);
    if (!t || mts_vocab_init(&t->vocab, n, bytes + 1)) {
        free(t);
        mts_tok_err(err, errlen, "token list: out of memory");
        return NULL;
    }
    t->kind = MTS_TOK_WORDPIECE;
    int cased = 0;
    for (int i = 0; i < n; i++) {
        const char *s = tokens[i];
        size_t e = lens[i];
        mts_vocab_add(&t->vocab, s, e, i);
        if (!(e && s[0] == '[' && s[e - 1] == ']'))
            for (size_t k = 0; k < e && !cased; k++)
                if (s[k] >= 'A' && s[k] <= 'Z') cased = 1;
    }
    return wordpiece_finish(t, cased, lowercase, unk_id, cls_id, sep_id, pad_id, "token list", err, errlen);
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
    char magic[4];
    size_t pl = strlen(path);
    int named_gguf = pl > 5 && !strcmp(path + pl - 5, ".gguf");
    if ((fread(magic, 1, 4, f) == 4 && memcmp(magic, "GGUF", 4) == 0) || named_gguf) { /* a GGUF model's vocabulary */
        fclose(f);
        return mts_tokenizer_load_gguf(path, lowercase, err, errlen);
    }
    rewind(f);
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
    for (int i = 0; i < t->n_added; i++) free(t->added[i].cps);
    free(t->added);
    for (int i = 0; i < t->n_norm; i++) {
        free(t->norm[i].pat);
        free(t->norm[i].rep);
    }
    for (int i = 0; i < t->n_pre; i++) free(t->pre[i].pat);
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
    case MTS_TOK_WORDLEVEL: return "wordlevel";
    default: return "unknown";
    }
}
