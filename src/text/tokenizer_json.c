/*
 * Hugging Face tokenizer.json for the tokenizers (tokenizer.h): reads the pipeline description
 * with the project's JSON parser into the steps tokenizer.c runs, and implements the BPE,
 * Unigram and WordLevel models.
 *
 * Implemented (the constructs common sentence-embedding and LLM tokenizers use):
 *   normalizer     BertNormalizer, Lowercase, NFD, NFC, NFKC, NFKD, StripAccents, Strip, Replace
 *                  (string pattern), Prepend, Sequence
 *   pre_tokenizer  BertPreTokenizer, Whitespace, WhitespaceSplit, Punctuation, Digits, Metaspace,
 *                  ByteLevel (GPT-2 pattern), CharDelimiterSplit, Split (string pattern, or
 *                  exactly the GPT-2, cl100k / Llama 3 or Qwen 2 regex), Sequence
 *   model          WordPiece, BPE (merges in either spelling, byte_fallback, fuse_unk,
 *                  ignore_merges, continuing_subword_prefix, end_of_word_suffix), Unigram
 *                  (Viterbi over the scores, unknowns fused, byte_fallback), WordLevel
 *   post_processor TemplateProcessing, BertProcessing, RobertaProcessing, ByteLevel, Sequence
 *   added_tokens   matched in the raw text (normalized: false) or in the normalized text, with
 *                  lstrip / rstrip; truncation (max_length, direction); padding (pad_id)
 * Declined, with a message naming the construct: the Precompiled normalizer (SentencePiece's
 * character map, applied per grapheme cluster) and Nmt, other regular expressions,
 * UnicodeScripts, BPE dropout, single_word added tokens, inverted splits, special-token ids
 * outside the vocabulary. Every size read from the file is checked (ids below MTS_TOK_MAX_VOCAB,
 * step counts below MTS_TOK_MAX_STEPS) before it is used.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer_impl.h"
#include "text/unicode.h"
#include "util/json.h"

#define GPT2_PATTERN "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
/* cl100k_base's pattern (GPT-3.5/4, Llama 3), and Qwen 2's, which takes digits one at a time */
#define CL100K_PATTERN                                                                            \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|" \
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define QWEN2_PATTERN                                                                             \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|" \
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* ---- BPE ---------------------------------------------------------------------------------------- */

typedef struct bpe_merge {
    uint64_t key;  /* id_a << 32 | id_b; UINT64_MAX: empty slot */
    int32_t rank;
    int32_t new_id;
} bpe_merge;

typedef struct bpe {
    bpe_merge *slots;
    size_t mask;
    int byte_fallback, fuse_unk, ignore_merges;
    char *prefix, *suffix; /* continuing_subword_prefix, end_of_word_suffix (NULL: none) */
    int32_t byte_ids[256]; /* <0xXX> tokens, -1 when absent */
} bpe;

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static const bpe_merge *bpe_find(const bpe *b, int32_t x, int32_t y)
{
    uint64_t key = (uint64_t)(uint32_t)x << 32 | (uint32_t)y;
    for (size_t i = mix64(key) & b->mask;; i = (i + 1) & b->mask) {
        if (b->slots[i].key == UINT64_MAX) return NULL;
        if (b->slots[i].key == key) return &b->slots[i];
    }
}

static void bpe_free(bpe *b)
{
    if (!b) return;
    free(b->slots);
    free(b->prefix);
    free(b->suffix);
    free(b);
}

/* A candidate merge in the queue: smallest rank first, then leftmost. */
typedef struct qitem {
    int32_t rank, pos, new_id;
} qitem;

static int q_less(const qitem *a, const qitem *b) { return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos; }

static void q_push(qitem *h, size_t *n, qitem x)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!q_less(&x, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
}

static qitem q_pop(qitem *h, size_t *n)
{
    qitem top = h[0], x = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const qitem *best = &x;
        if (l < *n && q_less(&h[l], best)) m = l, best = &h[l];
        if (r < *n && q_less(&h[r], best)) m = r;
        if (m == i) break;
        h[i] = h[m];
        i = m;
    }
    if (*n) h[i] = x;
    return top;
}

typedef struct sym {
    int32_t id, prev, next;
    int unk;
} sym;

static int bpe_word(const mts_tokenizer *t, const bpe *b, const uint32_t *w, size_t n, mts_ids *out)
{
    size_t plen = b->prefix ? strlen(b->prefix) : 0, slen = b->suffix ? strlen(b->suffix) : 0;
    /* at most one symbol per UTF-8 byte (byte fallback); the queue gets the initial pairs plus
     * at most two per merge, and there are fewer merges than symbols */
    size_t bytes = 0;
    for (size_t i = 0; i < n; i++) bytes += w[i] < 0x80 ? 1 : w[i] < 0x800 ? 2 : w[i] < 0x10000 ? 3 : 4;
    char *u8 = malloc(bytes + plen + slen + 4);
    sym *s = malloc((bytes + 1) * sizeof *s);
    qitem *q = malloc(3 * (bytes + 1) * sizeof *q);
    int rc = -1;
    if (!u8 || !s || !q) goto done;
    memset(u8, 0, 4);
    if (b->ignore_merges && !plen && !slen) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++) m += (size_t)mts_utf8_encode(w[i], u8 + m);
        int64_t id = mts_vocab_get(&t->vocab, u8, m);
        if (id >= 0) {
            rc = mts_ids_push(out, id);
            goto done;
        }
    }
    int ns = 0;
    for (size_t i = 0; i < n; i++) {
        size_t m = 0;
        if (plen && i > 0) memcpy(u8, b->prefix, plen), m = plen;
        int cl = mts_utf8_encode(w[i], u8 + m);
        m += (size_t)cl;
        if (slen && i + 1 == n) memcpy(u8 + m, b->suffix, slen), m += slen;
        int64_t id = mts_vocab_get(&t->vocab, u8, m);
        if (id >= 0) {
            s[ns] = (sym){(int32_t)id, ns - 1, ns + 1, 0};
            ns++;
            continue;
        }
        if (b->byte_fallback) {
            char c8[4];
            mts_utf8_encode(w[i], c8);
            int ok = 1;
            for (int k = 0; k < cl; k++)
                if (b->byte_ids[(unsigned char)c8[k]] < 0) ok = 0;
            if (ok) {
                for (int k = 0; k < cl; k++, ns++) s[ns] = (sym){b->byte_ids[(unsigned char)c8[k]], ns - 1, ns + 1, 0};
                continue;
            }
        }
        if (t->unk_id >= 0) {
            if (b->fuse_unk && ns > 0 && s[ns - 1].unk) continue;
            s[ns] = (sym){(int32_t)t->unk_id, ns - 1, ns + 1, 1};
            ns++;
        }
        /* no unknown token: the character is dropped, as the reference does */
    }
    if (ns == 0) {
        rc = 0;
        goto done;
    }
    s[ns - 1].next = -1;
    size_t nq = 0;
    for (int i = 0; i + 1 < ns; i++) {
        const bpe_merge *m = bpe_find(b, s[i].id, s[i + 1].id);
        if (m) q_push(q, &nq, (qitem){m->rank, i, m->new_id});
    }
    while (nq) {
        qitem top = q_pop(q, &nq);
        sym *cur = &s[top.pos];
        if (cur->id < 0 || cur->next < 0) continue;
        sym *right = &s[cur->next];
        const bpe_merge *m = bpe_find(b, cur->id, right->id);
        if (!m || m->new_id != top.new_id) continue; /* stale */
        cur->id = top.new_id;
        cur->unk = 0;
        int rn = right->next;
        right->id = -1;
        cur->next = rn;
        if (rn >= 0) s[rn].prev = top.pos;
        if (cur->prev >= 0) {
            const bpe_merge *pm = bpe_find(b, s[cur->prev].id, cur->id);
            if (pm) q_push(q, &nq, (qitem){pm->rank, cur->prev, pm->new_id});
        }
        if (rn >= 0) {
            const bpe_merge *nm = bpe_find(b, cur->id, s[rn].id);
            if (nm) q_push(q, &nq, (qitem){nm->rank, top.pos, nm->new_id});
        }
    }
    rc = 0;
    for (int i = 0; i >= 0 && i < ns; i = s[i].next)
        if (mts_ids_push(out, s[i].id)) {
            rc = -1;
            break;
        }
done:
    free(u8);
    free(s);
    free(q);
    return rc;
}

/* ---- Unigram ------------------------------------------------------------------------------------ */

typedef struct unigram {
    double *score;         /* per id */
    double unk_score;      /* lowest score - 10, as the reference's K_UNK_PENALTY */
    int byte_fallback;
    int32_t byte_ids[256];
} unigram;

static void unigram_free(unigram *u)
{
    if (!u) return;
    free(u->score);
    free(u);
}

/* Viterbi over the characters of w: the best-scoring segmentation into vocabulary tokens, a
 * character without a token of its own costing unk_score; ties keep the first (shortest)
 * candidate, consecutive unknowns fuse into one, as the reference does. */
static int unigram_word(const mts_tokenizer *t, const unigram *u, const uint32_t *w, size_t n, mts_ids *out)
{
    size_t *off = malloc((n + 1) * sizeof *off);
    double *best = malloc((n + 1) * sizeof *best);
    int64_t *id = malloc((n + 1) * sizeof *id);
    size_t *from = malloc((n + 1) * sizeof *from);
    char *u8 = malloc(4 * n + 4);
    int rc = -1;
    if (!off || !best || !id || !from || !u8) goto done;
    off[0] = 0;
    for (size_t i = 0; i < n; i++) off[i + 1] = off[i] + (size_t)mts_utf8_encode(w[i], u8 + off[i]);
    for (size_t i = 0; i <= n; i++) from[i] = SIZE_MAX;
    best[0] = 0;
    for (size_t i = 0; i < n; i++) {
        int single = 0;
        for (size_t e = i + 1; e <= n && off[e] - off[i] <= t->vocab.max_len; e++) {
            int64_t k = mts_vocab_get(&t->vocab, u8 + off[i], off[e] - off[i]);
            if (k < 0) continue;
            double c = u->score[k] + best[i];
            if (from[e] == SIZE_MAX || c > best[e]) best[e] = c, from[e] = i, id[e] = k;
            if (e == i + 1) single = 1;
        }
        if (!single) {
            double c = u->unk_score + best[i];
            if (from[i + 1] == SIZE_MAX || c > best[i + 1]) best[i + 1] = c, from[i + 1] = i, id[i + 1] = t->unk_id;
        }
    }
    /* back from the end: collect pieces (reversed), fusing runs of unknowns */
    size_t np = 0;
    size_t *ps = malloc((n + 1) * sizeof *ps), *pe = malloc((n + 1) * sizeof *pe);
    int64_t *pid = malloc((n + 1) * sizeof *pid);
    if (!ps || !pe || !pid) {
        free(ps), free(pe), free(pid);
        goto done;
    }
    for (size_t e = n; e > 0;) {
        size_t b = from[e];
        if (id[e] == t->unk_id && np > 0 && pid[np - 1] == t->unk_id && ps[np - 1] == e) {
            ps[np - 1] = b; /* extend the fused unknown leftwards */
        } else {
            ps[np] = b, pe[np] = e, pid[np] = id[e];
            np++;
        }
        e = b;
    }
    rc = 0;
    for (size_t k = np; k-- > 0 && !rc;) {
        int64_t x = pid[k];
        if (x == t->unk_id) {
            /* a fused run: its text may still be a token; else bytes, else <unk> */
            int64_t y = mts_vocab_get(&t->vocab, u8 + off[ps[k]], off[pe[k]] - off[ps[k]]);
            if (y >= 0) {
                rc = mts_ids_push(out, y);
                continue;
            }
            if (u->byte_fallback) {
                int ok = 1;
                for (size_t j = off[ps[k]]; j < off[pe[k]]; j++)
                    if (u->byte_ids[(unsigned char)u8[j]] < 0) ok = 0;
                if (ok) {
                    for (size_t j = off[ps[k]]; j < off[pe[k]] && !rc; j++)
                        rc = mts_ids_push(out, u->byte_ids[(unsigned char)u8[j]]);
                    continue;
                }
            }
        }
        rc = mts_ids_push(out, x);
    }
    free(ps), free(pe), free(pid);
done:
    free(off), free(best), free(id), free(from), free(u8);
    return rc;
}

int mts_tok_model_word_ext(const mts_tokenizer *t, const uint32_t *w, size_t n, mts_ids *out)
{
    if (t->kind == MTS_TOK_BPE) return bpe_word(t, t->ext, w, n, out);
    if (t->kind == MTS_TOK_UNIGRAM) return n ? unigram_word(t, t->ext, w, n, out) : 0;
    if (t->kind == MTS_TOK_WORDLEVEL) {
        /* the whole word or <unk> */
        char *u8 = malloc(4 * n + 1);
        if (!u8) return -1;
        size_t m = 0;
        for (size_t i = 0; i < n; i++) m += (size_t)mts_utf8_encode(w[i], u8 + m);
        int64_t id = mts_vocab_get(&t->vocab, u8, m);
        free(u8);
        return mts_ids_push(out, id >= 0 ? id : t->unk_id);
    }
    return -1;
}

int mts_norm_apply_ext(const mts_norm_step *s, mts_cps *in, mts_cps *out)
{
    out->n = 0;
    switch (s->kind) {
    case MTS_NORM_STRIP: {
        size_t a = 0, b = in->n;
        if (s->left)
            while (a < b && mts_uc_is_white_space(in->v[a])) a++;
        if (s->right)
            while (b > a && mts_uc_is_white_space(in->v[b - 1])) b--;
        for (size_t i = a; i < b; i++)
            if (mts_cps_push(out, in->v[i])) return -1;
        return 0;
    }
    case MTS_NORM_REPLACE:
        for (size_t i = 0; i < in->n;) {
            if (s->pat_n && i + s->pat_n <= in->n && memcmp(in->v + i, s->pat, s->pat_n * sizeof *s->pat) == 0) {
                for (size_t k = 0; k < s->rep_n; k++)
                    if (mts_cps_push(out, s->rep[k])) return -1;
                i += s->pat_n;
            } else {
                if (mts_cps_push(out, in->v[i])) return -1;
                i++;
            }
        }
        return 0;
    case MTS_NORM_PREPEND:
        if (in->n)
            for (size_t k = 0; k < s->rep_n; k++)
                if (mts_cps_push(out, s->rep[k])) return -1;
        for (size_t i = 0; i < in->n; i++)
            if (mts_cps_push(out, in->v[i])) return -1;
        return 0;
    default:
        return -1;
    }
}

void mts_tokenizer_free_ext(mts_tokenizer *t)
{
    if (t->kind == MTS_TOK_BPE) bpe_free(t->ext);
    if (t->kind == MTS_TOK_UNIGRAM) unigram_free(t->ext);
    t->ext = NULL;
}

/* ---- loading -------------------------------------------------------------------------------------- */

typedef struct ld {
    mts_tokenizer *t;
    char *err;
    size_t errlen;
} ld;

#define FAIL(...) mts_tok_err(L->err, L->errlen, "tokenizer.json: " __VA_ARGS__)

static const char *jstr(const mts_json *o, const char *key, size_t *n)
{
    return mts_json_str(mts_json_get(o, key), n);
}

/* Optional bool member: def when absent or null; -1 when of another type. */
static int jbool(const mts_json *o, const char *key, int def)
{
    const mts_json *v = mts_json_get(o, key);
    if (!v || mts_json_type(v) == MTS_JSON_NULL) return def;
    if (mts_json_type(v) != MTS_JSON_BOOL) return -1;
    return mts_json_bool(v);
}

static int utf8_to_cps(const char *s, size_t n, uint32_t **out, size_t *nout)
{
    *out = malloc((n ? n : 1) * sizeof **out);
    *nout = 0;
    if (!*out) return -1;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = mts_utf8_decode((const unsigned char *)s + i, n - i, &cp);
        if (!k) return -1;
        (*out)[(*nout)++] = cp;
        i += (size_t)k;
    }
    return 0;
}

static int add_norm(ld *L, int kind, mts_norm_step **st)
{
    mts_tokenizer *t = L->t;
    if (t->n_norm >= MTS_TOK_MAX_STEPS) return FAIL("normalizer: more than %d steps", MTS_TOK_MAX_STEPS);
    *st = &t->norm[t->n_norm++];
    memset(*st, 0, sizeof **st);
    (*st)->kind = kind;
    return 0;
}

static int parse_pattern(ld *L, const mts_json *p, const char *where, const char **s, size_t *n, int *is_regex)
{
    *s = jstr(p, "String", n);
    *is_regex = 0;
    if (*s) return 0;
    *s = jstr(p, "Regex", n);
    if (*s) {
        *is_regex = 1;
        return 0;
    }
    return FAIL("%s: pattern is neither {\"String\": ...} nor {\"Regex\": ...}", where);
}

static int parse_normalizer(ld *L, const mts_json *n, int depth)
{
    if (!n || mts_json_type(n) == MTS_JSON_NULL) return 0;
    if (depth > 4) return FAIL("normalizer: Sequence nested too deeply");
    const char *type = jstr(n, "type", NULL);
    if (!type) return FAIL("normalizer: no \"type\"");
    mts_norm_step *st = NULL;
    if (!strcmp(type, "Sequence")) {
        const mts_json *list = mts_json_get(n, "normalizers");
        if (mts_json_type(list) != MTS_JSON_ARRAY) return FAIL("normalizer Sequence: no \"normalizers\" array");
        for (size_t i = 0; i < mts_json_len(list); i++)
            if (parse_normalizer(L, mts_json_at(list, i), depth + 1)) return -1;
        return 0;
    }
    if (!strcmp(type, "BertNormalizer")) {
        int clean = jbool(n, "clean_text", 1), cjk = jbool(n, "handle_chinese_chars", 1);
        int lower = jbool(n, "lowercase", 1), strip = jbool(n, "strip_accents", -2);
        if (clean < 0 || cjk < 0 || lower < 0 || strip == -1)
            return FAIL("normalizer BertNormalizer: a flag is not a bool");
        if (strip == -2) strip = lower;
        if (clean && add_norm(L, MTS_NORM_BERT_CLEAN, &st)) return -1;
        if (cjk && add_norm(L, MTS_NORM_BERT_CJK, &st)) return -1;
        if (strip && add_norm(L, MTS_NORM_STRIP_ACCENTS_NFD, &st)) return -1;
        if (lower && add_norm(L, MTS_NORM_LOWER, &st)) return -1;
        return 0;
    }
    if (!strcmp(type, "Lowercase")) return add_norm(L, MTS_NORM_LOWER, &st);
    if (!strcmp(type, "NFD")) return add_norm(L, MTS_NORM_NFD, &st);
    if (!strcmp(type, "NFC")) return add_norm(L, MTS_NORM_NFC, &st);
    if (!strcmp(type, "NFKC")) return add_norm(L, MTS_NORM_NFKC, &st);
    if (!strcmp(type, "NFKD")) return add_norm(L, MTS_NORM_NFKD, &st);
    if (!strcmp(type, "StripAccents")) return add_norm(L, MTS_NORM_STRIP_M, &st);
    if (!strcmp(type, "Strip")) {
        int l = jbool(n, "strip_left", 1), r = jbool(n, "strip_right", 1);
        if (l < 0 || r < 0) return FAIL("normalizer Strip: a flag is not a bool");
        if (add_norm(L, MTS_NORM_STRIP, &st)) return -1;
        st->left = l;
        st->right = r;
        return 0;
    }
    if (!strcmp(type, "Replace")) {
        const char *p, *c;
        size_t pn, cn;
        int re;
        if (parse_pattern(L, mts_json_get(n, "pattern"), "normalizer Replace", &p, &pn, &re)) return -1;
        if (re) return FAIL("normalizer Replace: regular-expression patterns are not supported (\"%.60s\")", p);
        if (!(c = jstr(n, "content", &cn))) return FAIL("normalizer Replace: no \"content\" string");
        if (add_norm(L, MTS_NORM_REPLACE, &st)) return -1;
        if (utf8_to_cps(p, pn, &st->pat, &st->pat_n) || utf8_to_cps(c, cn, &st->rep, &st->rep_n))
            return FAIL("normalizer Replace: out of memory");
        return 0;
    }
    if (!strcmp(type, "Prepend")) {
        const char *p;
        size_t pn;
        if (!(p = jstr(n, "prepend", &pn))) return FAIL("normalizer Prepend: no \"prepend\" string");
        if (add_norm(L, MTS_NORM_PREPEND, &st)) return -1;
        if (utf8_to_cps(p, pn, &st->rep, &st->rep_n)) return FAIL("normalizer Prepend: out of memory");
        return 0;
    }
    return FAIL("normalizer %s is not supported (implemented: BertNormalizer, Lowercase, NFD, NFC, NFKC, NFKD, "
                "StripAccents, Strip, Replace, Prepend, Sequence)", type);
}

static int behavior_of(ld *L, const mts_json *o, const char *where, int def, int *out)
{
    const char *b = jstr(o, "behavior", NULL);
    if (!b) {
        *out = def;
        return 0;
    }
    static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    for (int i = 0; i < 5; i++)
        if (!strcmp(b, names[i])) {
            *out = i;
            return 0;
        }
    return FAIL("%s: unknown behavior \"%.40s\"", where, b);
}

static int add_pre(ld *L, int kind, mts_pre_step **st)
{
    mts_tokenizer *t = L->t;
    if (t->n_pre >= MTS_TOK_MAX_STEPS) return FAIL("pre_tokenizer: more than %d steps", MTS_TOK_MAX_STEPS);
    *st = &t->pre[t->n_pre++];
    memset(*st, 0, sizeof **st);
    (*st)->kind = kind;
    return 0;
}

static int parse_pre(ld *L, const mts_json *n, int depth)
{
    if (!n || mts_json_type(n) == MTS_JSON_NULL) return 0;
    if (depth > 4) return FAIL("pre_tokenizer: Sequence nested too deeply");
    const char *type = jstr(n, "type", NULL);
    if (!type) return FAIL("pre_tokenizer: no \"type\"");
    mts_pre_step *st = NULL;
    if (!strcmp(type, "Sequence")) {
        const mts_json *list = mts_json_get(n, "pretokenizers");
        if (mts_json_type(list) != MTS_JSON_ARRAY) return FAIL("pre_tokenizer Sequence: no \"pretokenizers\" array");
        for (size_t i = 0; i < mts_json_len(list); i++)
            if (parse_pre(L, mts_json_at(list, i), depth + 1)) return -1;
        return 0;
    }
    if (!strcmp(type, "BertPreTokenizer")) return add_pre(L, MTS_PRE_BERT, &st);
    if (!strcmp(type, "Whitespace")) return add_pre(L, MTS_PRE_WHITESPACE, &st);
    if (!strcmp(type, "WhitespaceSplit")) return add_pre(L, MTS_PRE_WS_SPLIT, &st);
    if (!strcmp(type, "Punctuation")) {
        int b;
        if (behavior_of(L, n, "pre_tokenizer Punctuation", MTS_SPLIT_ISOLATED, &b) || add_pre(L, MTS_PRE_PUNCT, &st))
            return -1;
        st->behavior = b;
        return 0;
    }
    if (!strcmp(type, "Digits")) {
        int ind = jbool(n, "individual_digits", 0);
        if (ind < 0) return FAIL("pre_tokenizer Digits: individual_digits is not a bool");
        if (add_pre(L, MTS_PRE_DIGITS, &st)) return -1;
        st->flag1 = ind;
        return 0;
    }
    if (!strcmp(type, "Metaspace")) {
        size_t rn;
        const char *r = jstr(n, "replacement", &rn);
        uint32_t cp;
        if (!r || rn == 0 || (size_t)mts_utf8_decode((const unsigned char *)r, rn, &cp) != rn)
            return FAIL("pre_tokenizer Metaspace: \"replacement\" is not one character");
        int scheme = 1;
        const char *ps = jstr(n, "prepend_scheme", NULL);
        if (ps) {
            if (!strcmp(ps, "always")) scheme = 1;
            else if (!strcmp(ps, "first")) scheme = 2;
            else if (!strcmp(ps, "never")) scheme = 0;
            else return FAIL("pre_tokenizer Metaspace: unknown prepend_scheme \"%.20s\"", ps);
        } else {
            int aps = jbool(n, "add_prefix_space", 1);
            if (aps < 0) return FAIL("pre_tokenizer Metaspace: add_prefix_space is not a bool");
            scheme = aps;
        }
        int split = jbool(n, "split", 1);
        if (split < 0) return FAIL("pre_tokenizer Metaspace: split is not a bool");
        if (add_pre(L, MTS_PRE_METASPACE, &st)) return -1;
        st->repl = cp;
        st->flag1 = scheme;
        st->flag2 = split;
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) {
        int aps = jbool(n, "add_prefix_space", 1), re = jbool(n, "use_regex", 1);
        if (aps < 0 || re < 0) return FAIL("pre_tokenizer ByteLevel: a flag is not a bool");
        if (add_pre(L, MTS_PRE_BYTELEVEL, &st)) return -1;
        st->flag1 = aps;
        st->flag2 = re;
        return 0;
    }
    if (!strcmp(type, "CharDelimiterSplit")) {
        size_t dn;
        const char *d = jstr(n, "delimiter", &dn);
        uint32_t cp;
        if (!d || dn == 0 || (size_t)mts_utf8_decode((const unsigned char *)d, dn, &cp) != dn)
            return FAIL("pre_tokenizer CharDelimiterSplit: \"delimiter\" is not one character");
        if (add_pre(L, MTS_PRE_SPLIT_STR, &st)) return -1;
        st->behavior = MTS_SPLIT_REMOVED;
        if (utf8_to_cps(d, dn, &st->pat, &st->pat_n)) return FAIL("out of memory");
        return 0;
    }
    if (!strcmp(type, "Split")) {
        const char *p;
        size_t pn;
        int re, b;
        if (parse_pattern(L, mts_json_get(n, "pattern"), "pre_tokenizer Split", &p, &pn, &re)) return -1;
        if (behavior_of(L, n, "pre_tokenizer Split", MTS_SPLIT_REMOVED, &b)) return -1;
        int inv = jbool(n, "invert", 0);
        if (inv != 0) return FAIL("pre_tokenizer Split: invert is not supported");
        if (re) {
            int kind = 0, digits = 0;
            if (strlen(GPT2_PATTERN) == pn && memcmp(p, GPT2_PATTERN, pn) == 0)
                kind = MTS_PRE_SPLIT_GPT2;
            else if (strlen(CL100K_PATTERN) == pn && memcmp(p, CL100K_PATTERN, pn) == 0)
                kind = MTS_PRE_SPLIT_CL100K, digits = 3;
            else if (strlen(QWEN2_PATTERN) == pn && memcmp(p, QWEN2_PATTERN, pn) == 0)
                kind = MTS_PRE_SPLIT_CL100K, digits = 1;
            else
                return FAIL("pre_tokenizer Split: regular expression \"%.80s\" is not supported (only the GPT-2, "
                            "cl100k / Llama 3 and Qwen 2 patterns are)", p);
            if (b != MTS_SPLIT_ISOLATED)
                return FAIL("pre_tokenizer Split: a regex pattern with a behavior other than Isolated");
            if (add_pre(L, kind, &st)) return -1;
            st->flag1 = digits;
            return 0;
        }
        if (add_pre(L, MTS_PRE_SPLIT_STR, &st)) return -1;
        st->behavior = b;
        if (utf8_to_cps(p, pn, &st->pat, &st->pat_n)) return FAIL("out of memory");
        return 0;
    }
    return FAIL("pre_tokenizer %s is not supported (implemented: BertPreTokenizer, Whitespace, WhitespaceSplit, "
                "Punctuation, Digits, Metaspace, ByteLevel, CharDelimiterSplit, Split, Sequence)", type);
}

/* Token id of a vocabulary or added token named s. */
static int64_t token_id(ld *L, const char *s)
{
    int64_t id = mts_vocab_get(&L->t->vocab, s, strlen(s));
    if (id >= 0) return id;
    for (int i = 0; i < L->t->n_added; i++) {
        const mts_added *a = &L->t->added[i];
        uint32_t *c;
        size_t n;
        if (utf8_to_cps(s, strlen(s), &c, &n)) {
            free(c);
            return -1;
        }
        int eq = n == a->n && memcmp(c, a->cps, n * sizeof *c) == 0;
        free(c);
        if (eq) return a->id;
    }
    return -1;
}

static int post_piece(ld *L, int is_seq, int64_t id, int64_t type_id)
{
    mts_post *p = &L->t->post;
    if (p->n_single >= MTS_TOK_MAX_POST) return FAIL("post_processor: more than %d pieces", MTS_TOK_MAX_POST);
    p->single[p->n_single++] = (mts_post_piece){is_seq, id, type_id};
    if (!is_seq) p->n_special_single++;
    return 0;
}

static int parse_post(ld *L, const mts_json *n, int depth, int *have)
{
    if (!n || mts_json_type(n) == MTS_JSON_NULL) return 0;
    if (depth > 4) return FAIL("post_processor: Sequence nested too deeply");
    const char *type = jstr(n, "type", NULL);
    if (!type) return FAIL("post_processor: no \"type\"");
    if (!strcmp(type, "Sequence")) {
        const mts_json *list = mts_json_get(n, "processors");
        if (mts_json_type(list) != MTS_JSON_ARRAY) return FAIL("post_processor Sequence: no \"processors\" array");
        for (size_t i = 0; i < mts_json_len(list); i++)
            if (parse_post(L, mts_json_at(list, i), depth + 1, have)) return -1;
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) return 0; /* offsets only */
    if (*have) return FAIL("post_processor: more than one processor adds special tokens");
    *have = 1;
    L->t->post.n_single = 0;
    L->t->post.n_special_single = 0;
    if (!strcmp(type, "BertProcessing") || !strcmp(type, "RobertaProcessing")) {
        const mts_json *cls = mts_json_get(n, "cls"), *sep = mts_json_get(n, "sep");
        int64_t c, s;
        if (mts_json_int(mts_json_at(cls, 1), &c) || mts_json_int(mts_json_at(sep, 1), &s))
            return FAIL("post_processor %s: \"cls\" / \"sep\" are not [token, id] pairs", type);
        return post_piece(L, 0, c, 0) || post_piece(L, 1, -1, 0) || post_piece(L, 0, s, 0) ? -1 : 0;
    }
    if (!strcmp(type, "TemplateProcessing")) {
        const mts_json *single = mts_json_get(n, "single"), *sp = mts_json_get(n, "special_tokens");
        if (mts_json_type(single) != MTS_JSON_ARRAY)
            return FAIL("post_processor TemplateProcessing: no \"single\" array");
        int seqs = 0;
        for (size_t i = 0; i < mts_json_len(single); i++) {
            const mts_json *e = mts_json_at(single, i), *x;
            int64_t type_id = 0;
            if ((x = mts_json_get(e, "Sequence"))) {
                const mts_json *ti = mts_json_get(x, "type_id");
                if (ti && mts_json_int(ti, &type_id)) return FAIL("post_processor TemplateProcessing: bad type_id");
                if (seqs++) return FAIL("post_processor TemplateProcessing: \"single\" uses the sequence twice");
                if (post_piece(L, 1, -1, type_id)) return -1;
            } else if ((x = mts_json_get(e, "SpecialToken"))) {
                const char *name = jstr(x, "id", NULL);
                const mts_json *ti = mts_json_get(x, "type_id");
                if (!name) return FAIL("post_processor TemplateProcessing: special token without \"id\"");
                if (ti && mts_json_int(ti, &type_id)) return FAIL("post_processor TemplateProcessing: bad type_id");
                const mts_json *ids = mts_json_get(mts_json_get(sp, name), "ids");
                if (mts_json_type(ids) != MTS_JSON_ARRAY)
                    return FAIL("post_processor TemplateProcessing: special token \"%.40s\" not in special_tokens",
                                name);
                for (size_t k = 0; k < mts_json_len(ids); k++) {
                    int64_t id;
                    if (mts_json_int(mts_json_at(ids, k), &id) || id < 0 || id >= MTS_TOK_MAX_VOCAB)
                        return FAIL("post_processor TemplateProcessing: bad id for \"%.40s\"", name);
                    if (post_piece(L, 0, id, type_id)) return -1;
                }
            } else {
                return FAIL("post_processor TemplateProcessing: piece %zu is neither Sequence nor SpecialToken", i);
            }
        }
        if (!seqs) return FAIL("post_processor TemplateProcessing: \"single\" has no sequence");
        return 0;
    }
    return FAIL("post_processor %s is not supported (implemented: TemplateProcessing, BertProcessing, "
                "RobertaProcessing, ByteLevel, Sequence)", type);
}

/* Reads the {token: id} vocabulary of a WordPiece or BPE model, and the added tokens' ids into
 * account for the id range. */
static int load_vocab_map(ld *L, const mts_json *v, int64_t min_ids)
{
    if (mts_json_type(v) != MTS_JSON_OBJECT) return FAIL("model: \"vocab\" is not an object");
    size_t n = mts_json_len(v), bytes = 0;
    int64_t max_id = min_ids - 1;
    for (size_t i = 0; i < n; i++) {
        int64_t id;
        size_t kl;
        mts_json_key_at_n(v, i, &kl);
        if (mts_json_int(mts_json_at(v, i), &id) || id < 0 || id >= MTS_TOK_MAX_VOCAB)
            return FAIL("model: vocab entry %zu has an id that is not an integer in [0, %d)", i, MTS_TOK_MAX_VOCAB);
        if (id > max_id) max_id = id;
        bytes += kl;
    }
    if (mts_vocab_init(&L->t->vocab, (int)(max_id + 1), bytes)) return FAIL("out of memory");
    for (size_t i = 0; i < n; i++) {
        int64_t id;
        size_t kl;
        const char *k = mts_json_key_at_n(v, i, &kl);
        mts_json_int(mts_json_at(v, i), &id);
        if (L->t->vocab.tok_off[id] != UINT32_MAX)
            return FAIL("model: id %lld is given to two tokens", (long long)id);
        if (mts_vocab_add(&L->t->vocab, k, kl, (int32_t)id)) return FAIL("out of memory");
    }
    return 0;
}

static int unk_of(ld *L, const mts_json *m)
{
    const mts_json *u = mts_json_get(m, "unk_token");
    L->t->unk_id = -1;
    if (!u || mts_json_type(u) == MTS_JSON_NULL) return 0;
    size_t n;
    const char *s = mts_json_str(u, &n);
    if (!s) return FAIL("model: unk_token is not a string");
    L->t->unk_id = mts_vocab_get(&L->t->vocab, s, n);
    if (L->t->unk_id < 0) return FAIL("model: unk_token \"%.40s\" is not in the vocabulary", s);
    return 0;
}

static int parse_bpe(ld *L, const mts_json *m)
{
    mts_tokenizer *t = L->t;
    bpe *b = calloc(1, sizeof *b);
    if (!b) return FAIL("out of memory");
    t->ext = b;
    t->kind = MTS_TOK_BPE;
    const mts_json *dr = mts_json_get(m, "dropout");
    if (dr && mts_json_type(dr) != MTS_JSON_NULL && !(mts_json_num(dr) == 0.0))
        return FAIL("model BPE: dropout is not supported (it makes the ids random)");
    b->byte_fallback = jbool(m, "byte_fallback", 0);
    b->fuse_unk = jbool(m, "fuse_unk", 0);
    b->ignore_merges = jbool(m, "ignore_merges", 0);
    if (b->byte_fallback < 0 || b->fuse_unk < 0 || b->ignore_merges < 0) return FAIL("model BPE: a flag is not a bool");
    size_t n;
    const char *s;
    if ((s = jstr(m, "continuing_subword_prefix", &n)) && n) b->prefix = strndup(s, n);
    if ((s = jstr(m, "end_of_word_suffix", &n)) && n) b->suffix = strndup(s, n);
    if (unk_of(L, m)) return -1;
    for (int i = 0; i < 256; i++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", i);
        b->byte_ids[i] = (int32_t)mts_vocab_get(&t->vocab, name, 6);
    }
    const mts_json *merges = mts_json_get(m, "merges");
    if (mts_json_type(merges) != MTS_JSON_ARRAY) return FAIL("model BPE: no \"merges\" array");
    size_t nm = mts_json_len(merges), cap = 16;
    while (cap < nm * 2 + 16) cap *= 2;
    b->slots = malloc(cap * sizeof *b->slots);
    if (!b->slots) return FAIL("out of memory");
    for (size_t i = 0; i < cap; i++) b->slots[i].key = UINT64_MAX;
    b->mask = cap - 1;
    size_t plen = b->prefix ? strlen(b->prefix) : 0;
    char *buf = NULL;
    size_t bufcap = 0;
    for (size_t i = 0; i < nm; i++) {
        const mts_json *e = mts_json_at(merges, i);
        const char *x, *y;
        size_t xn, yn;
        if (mts_json_type(e) == MTS_JSON_STRING) {
            x = mts_json_str(e, &xn);
            const char *sp = memchr(x, ' ', xn);
            if (!sp || memchr(sp + 1, ' ', xn - (size_t)(sp + 1 - x))) {
                free(buf);
                return FAIL("model BPE: merge %zu is not \"a b\"", i);
            }
            y = sp + 1;
            yn = xn - (size_t)(y - x);
            xn = (size_t)(sp - x);
        } else if (mts_json_type(e) == MTS_JSON_ARRAY && mts_json_len(e) == 2 &&
                   (x = mts_json_str(mts_json_at(e, 0), &xn)) && (y = mts_json_str(mts_json_at(e, 1), &yn))) {
        } else {
            free(buf);
            return FAIL("model BPE: merge %zu is neither \"a b\" nor [\"a\", \"b\"]", i);
        }
        int64_t ia = mts_vocab_get(&t->vocab, x, xn), ib = mts_vocab_get(&t->vocab, y, yn);
        /* the merged token: a + b without b's continuing-subword prefix */
        size_t skip = (plen && yn >= plen && memcmp(y, b->prefix, plen) == 0) ? plen : 0;
        if (xn + yn > bufcap) {
            bufcap = (xn + yn) * 2;
            char *p = realloc(buf, bufcap);
            if (!p) {
                free(buf);
                return FAIL("out of memory");
            }
            buf = p;
        }
        memcpy(buf, x, xn);
        memcpy(buf + xn, y + skip, yn - skip);
        int64_t inew = mts_vocab_get(&t->vocab, buf, xn + yn - skip);
        if (ia < 0 || ib < 0 || inew < 0) {
            free(buf);
            return FAIL("model BPE: merge %zu (\"%.*s\" \"%.*s\") has a token that is not in the vocabulary", i,
                        (int)(xn > 40 ? 40 : xn), x, (int)(yn > 40 ? 40 : yn), y);
        }
        uint64_t key = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib;
        for (size_t k = mix64(key) & b->mask;; k = (k + 1) & b->mask) {
            if (b->slots[k].key == key) break; /* a repeated pair keeps its first (best) rank */
            if (b->slots[k].key == UINT64_MAX) {
                b->slots[k] = (bpe_merge){key, (int32_t)i, (int32_t)inew};
                break;
            }
        }
    }
    free(buf);
    return 0;
}

static int parse_unigram(ld *L, const mts_json *m, int64_t min_ids)
{
    mts_tokenizer *t = L->t;
    const mts_json *v = mts_json_get(m, "vocab");
    if (mts_json_type(v) != MTS_JSON_ARRAY) return FAIL("model Unigram: \"vocab\" is not an array");
    size_t n = mts_json_len(v), bytes = 0;
    if (n == 0) return FAIL("model Unigram: empty vocabulary");
    if (n >= MTS_TOK_MAX_VOCAB) return FAIL("model Unigram: more than %d tokens", MTS_TOK_MAX_VOCAB);
    for (size_t i = 0; i < n; i++) {
        const mts_json *e = mts_json_at(v, i);
        size_t k;
        if (mts_json_len(e) != 2 || !mts_json_str(mts_json_at(e, 0), &k) ||
            mts_json_type(mts_json_at(e, 1)) != MTS_JSON_NUMBER)
            return FAIL("model Unigram: vocab entry %zu is not [token, score]", i);
        bytes += k;
    }
    unigram *u = calloc(1, sizeof *u);
    if (!u) return FAIL("out of memory");
    t->ext = u;
    t->kind = MTS_TOK_UNIGRAM;
    int64_t ids = (int64_t)n > min_ids ? (int64_t)n : min_ids;
    u->score = malloc((size_t)ids * sizeof *u->score);
    if (!u->score || mts_vocab_init(&t->vocab, (int)ids, bytes)) return FAIL("out of memory");
    double lo = 0;
    for (size_t i = 0; i < n; i++) {
        const mts_json *e = mts_json_at(v, i);
        size_t k;
        const char *tok = mts_json_str(mts_json_at(e, 0), &k);
        double sc = mts_json_num(mts_json_at(e, 1));
        u->score[i] = sc;
        if (i == 0 || sc < lo) lo = sc;
        /* a repeated token keeps its first id (the reference's map is filled in order and only
         * inserts new tokens) */
        if (mts_vocab_get(&t->vocab, tok, k) >= 0) {
            t->vocab.tok_off[i] = 0, t->vocab.tok_len[i] = 0;
            continue;
        }
        if (mts_vocab_add(&t->vocab, tok, k, (int32_t)i)) return FAIL("out of memory");
    }
    for (int64_t i = (int64_t)n; i < ids; i++) u->score[i] = lo;
    u->unk_score = lo - 10.0;
    const mts_json *uk = mts_json_get(m, "unk_id");
    t->unk_id = -1;
    if (uk && mts_json_type(uk) != MTS_JSON_NULL &&
        (mts_json_int(uk, &t->unk_id) || t->unk_id < 0 || t->unk_id >= (int64_t)n))
        return FAIL("model Unigram: unk_id is not an id of the vocabulary");
    if (t->unk_id < 0) return FAIL("model Unigram: no unk_id (the reference fails on unknown characters)");
    u->byte_fallback = jbool(m, "byte_fallback", 0);
    if (u->byte_fallback < 0) return FAIL("model Unigram: byte_fallback is not a bool");
    for (int i = 0; i < 256; i++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", i);
        u->byte_ids[i] = (int32_t)mts_vocab_get(&t->vocab, name, 6);
    }
    return 0;
}

static int parse_model(ld *L, const mts_json *m, int64_t min_ids)
{
    mts_tokenizer *t = L->t;
    if (mts_json_type(m) != MTS_JSON_OBJECT) return FAIL("no \"model\" object");
    const char *type = jstr(m, "type", NULL);
    const mts_json *vocab = mts_json_get(m, "vocab");
    if (!type) { /* older files: tell the model by its members */
        if (mts_json_get(m, "merges")) type = "BPE";
        else if (mts_json_type(vocab) == MTS_JSON_ARRAY) type = "Unigram";
        else if (mts_json_get(m, "continuing_subword_prefix")) type = "WordPiece";
        else type = "WordLevel";
    }
    if (!strcmp(type, "WordPiece")) {
        if (load_vocab_map(L, vocab, min_ids) || unk_of(L, m)) return -1;
        if (t->unk_id < 0) return FAIL("model WordPiece: no unk_token");
        t->kind = MTS_TOK_WORDPIECE;
        size_t n;
        const char *p = jstr(m, "continuing_subword_prefix", &n);
        if (!p) p = "##", n = 2;
        if (n >= sizeof t->wp_prefix) return FAIL("model WordPiece: continuing_subword_prefix is too long");
        memcpy(t->wp_prefix, p, n);
        t->wp_prefix[n] = 0;
        const mts_json *mc = mts_json_get(m, "max_input_chars_per_word");
        int64_t mcv = 100;
        if (mc && (mts_json_int(mc, &mcv) || mcv < 0 || mcv > 1 << 20))
            return FAIL("model WordPiece: bad max_input_chars_per_word");
        t->wp_max_chars = (int)mcv;
        return 0;
    }
    if (!strcmp(type, "BPE")) {
        if (load_vocab_map(L, vocab, min_ids)) return -1;
        return parse_bpe(L, m);
    }
    if (!strcmp(type, "Unigram")) return parse_unigram(L, m, min_ids);
    if (!strcmp(type, "WordLevel")) {
        if (load_vocab_map(L, vocab, min_ids)) return -1;
        t->kind = MTS_TOK_WORDLEVEL;
        const mts_json *u = mts_json_get(m, "unk_token");
        size_t un = 5;
        const char *us = u ? mts_json_str(u, &un) : "<unk>";
        if (!us) return FAIL("model WordLevel: unk_token is not a string");
        t->unk_id = mts_vocab_get(&t->vocab, us, un);
        if (t->unk_id < 0)
            return FAIL("model WordLevel: unk_token \"%.40s\" is not in the vocabulary (the reference fails on "
                        "unknown words)", us);
        return 0;
    }
    return FAIL("model %s is not supported (implemented: WordPiece, BPE, Unigram, WordLevel)", type);
}

static mts_tokenizer *load_json(ld *L, const char *data, size_t len)
{
    mts_json_doc *doc = NULL;
    mts_err e = {0};
    if (mts_json_parse(data, len, &doc, &e)) {
        FAIL("%s", e.msg);
        return NULL;
    }
    const mts_json *root = mts_json_root(doc);
    mts_tokenizer *t = L->t = calloc(1, sizeof *t);
    if (!t) {
        FAIL("out of memory");
        goto fail;
    }
    if (mts_json_type(root) != MTS_JSON_OBJECT) {
        FAIL("the document is not an object");
        goto fail;
    }
    /* added tokens: their ids widen the id range */
    const mts_json *added = mts_json_get(root, "added_tokens");
    int64_t min_ids = 0;
    if (added && mts_json_type(added) != MTS_JSON_NULL && mts_json_type(added) != MTS_JSON_ARRAY) {
        FAIL("\"added_tokens\" is not an array");
        goto fail;
    }
    for (size_t i = 0; i < mts_json_len(added); i++) {
        const mts_json *a = mts_json_at(added, i);
        int64_t id;
        if (mts_json_int(mts_json_get(a, "id"), &id) || id < 0 || id >= MTS_TOK_MAX_VOCAB) {
            FAIL("added token %zu: no id in [0, %d)", i, MTS_TOK_MAX_VOCAB);
            goto fail;
        }
        if (id + 1 > min_ids) min_ids = id + 1;
    }
    if (parse_model(L, mts_json_get(root, "model"), min_ids)) goto fail;
    if (parse_normalizer(L, mts_json_get(root, "normalizer"), 0)) goto fail;
    if (parse_pre(L, mts_json_get(root, "pre_tokenizer"), 0)) goto fail;
    for (size_t i = 0; i < mts_json_len(added); i++) {
        const mts_json *a = mts_json_at(added, i);
        int64_t id;
        size_t n;
        mts_json_int(mts_json_get(a, "id"), &id);
        const char *c = jstr(a, "content", &n);
        int sw = jbool(a, "single_word", 0), ls = jbool(a, "lstrip", 0), rs = jbool(a, "rstrip", 0);
        int norm = jbool(a, "normalized", 1), special = jbool(a, "special", 0);
        if (!c || sw < 0 || ls < 0 || rs < 0 || norm < 0 || special < 0) {
            FAIL("added token %zu: no content or a flag that is not a bool", i);
            goto fail;
        }
        if (sw) {
            FAIL("added token %zu (\"%.40s\"): single_word is not supported", i, c);
            goto fail;
        }
        /* special tokens are never normalized; a normalized one is matched in normalized text,
         * so its content goes through the normalizer too */
        if (norm && !special && t->n_norm) {
            mts_cps x = {0}, y = {0};
            uint32_t *cp;
            size_t cn;
            if (utf8_to_cps(c, n, &cp, &cn)) {
                free(cp);
                FAIL("out of memory");
                goto fail;
            }
            x.v = cp, x.n = cn, x.cap = cn ? cn : 1;
            for (int k = 0; k < t->n_norm; k++) {
                if (mts_norm_apply(&t->norm[k], &x, &y)) break;
                mts_cps z = x;
                x = y;
                y = z;
            }
            char *u8 = malloc(4 * x.n + 1);
            size_t m = 0;
            if (u8)
                for (size_t k = 0; k < x.n; k++) m += (size_t)mts_utf8_encode(x.v[k], u8 + m);
            int rc = u8 ? mts_tok_add_added(t, u8, m, id, 1, ls, rs) : -1;
            free(u8);
            free(x.v);
            free(y.v);
            if (rc) {
                FAIL("out of memory");
                goto fail;
            }
        } else if (mts_tok_add_added(t, c, n, id, 0, ls, rs)) {
            FAIL("out of memory");
            goto fail;
        }
    }
    mts_tok_sort_added(t);
    /* post-processor (default: no special tokens) */
    t->post.n_single = 1;
    t->post.single[0] = (mts_post_piece){1, -1, 0};
    t->post.n_special_single = 0;
    int have = 0;
    if (parse_post(L, mts_json_get(root, "post_processor"), 0, &have)) goto fail;
    /* the ids a model is fed must index its embedding table */
    for (int i = 0; i < t->post.n_single; i++)
        if (!t->post.single[i].is_seq && (t->post.single[i].id < 0 || t->post.single[i].id >= t->vocab.n_ids)) {
            FAIL("post_processor: special token id %lld is outside the vocabulary (%d ids)",
                 (long long)t->post.single[i].id, t->vocab.n_ids);
            goto fail;
        }
    const mts_json *tr = mts_json_get(root, "truncation");
    if (tr && mts_json_type(tr) != MTS_JSON_NULL) {
        int64_t ml;
        if (mts_json_int(mts_json_get(tr, "max_length"), &ml) || ml < 1 || ml > 1 << 24) {
            FAIL("truncation: max_length is not a positive integer");
            goto fail;
        }
        t->max_len = (int)ml;
        const char *dir = jstr(tr, "direction", NULL);
        t->trunc_left = dir && !strcmp(dir, "Left");
    }
    const mts_json *pad = mts_json_get(root, "padding");
    int64_t pid = -1;
    if (pad && mts_json_type(pad) != MTS_JSON_NULL) mts_json_int(mts_json_get(pad, "pad_id"), &pid);
    if (pid < 0) pid = token_id(L, "[PAD]");
    if (pid < 0) pid = token_id(L, "<pad>");
    t->pad_id = pid < 0 ? 0 : pid;
    mts_json_free(doc);
    return t;
fail:
    mts_json_free(doc);
    mts_tokenizer_free(t);
    return NULL;
}

mts_tokenizer *mts_tokenizer_load_json(const char *data, size_t len, int lowercase, char *err, size_t errlen)
{
    (void)lowercase; /* the file decides */
    ld L = {NULL, err, errlen};
    return load_json(&L, data, len);
}
