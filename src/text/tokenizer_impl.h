/*
 * Internals shared by the tokenizer sources (tokenizer.c: vocab.txt, WordPiece, the encoding
 * pipeline; tokenizer_json.c: tokenizer.json, BPE, Unigram and the other pipeline steps). Not
 * part of the public interface (tokenizer.h).
 */
#ifndef MTS_TEXT_TOKENIZER_IMPL_H
#define MTS_TEXT_TOKENIZER_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "text/tokenizer.h"

#define MTS_TOK_MAX_TEXT (16 << 20)   /* bytes of one text */
#define MTS_TOK_MAX_FILE (256 << 20)  /* bytes of a tokenizer file */
#define MTS_TOK_MAX_VOCAB (4 << 20)   /* tokens */
#define MTS_TOK_MAX_STEPS 16          /* normalizer or pre-tokenizer steps */
#define MTS_TOK_MAX_POST 16           /* pieces of a post-processor template */

enum { MTS_TOK_WORDPIECE = 1, MTS_TOK_BPE, MTS_TOK_UNIGRAM, MTS_TOK_WORDLEVEL };

/* Token bytes <-> id: open addressing over ids; the token texts live in one arena. */
typedef struct mts_vocab {
    int32_t *slots;    /* hash slots: id or -1 */
    size_t mask;
    char *arena;
    size_t arena_len, arena_cap;
    uint32_t *tok_off, *tok_len; /* per id; tok_off UINT32_MAX: no token has that id */
    int n_ids;         /* ids are 0..n_ids-1 */
    int count;         /* distinct tokens */
    size_t max_len;    /* longest token, bytes */
} mts_vocab;

int mts_vocab_init(mts_vocab *v, int n_tokens, size_t bytes);
int mts_vocab_add(mts_vocab *v, const char *s, size_t n, int32_t id);
int64_t mts_vocab_get(const mts_vocab *v, const char *s, size_t n);
void mts_vocab_free(mts_vocab *v);

typedef struct mts_cps {
    uint32_t *v;
    size_t n, cap;
} mts_cps;
int mts_cps_reserve(mts_cps *c, size_t n);
int mts_cps_push(mts_cps *c, uint32_t cp);

typedef struct mts_ids {
    int64_t *v;
    size_t n, cap;
} mts_ids;
int mts_ids_push(mts_ids *o, int64_t id);

/* Normalizer steps. */
enum {
    MTS_NORM_BERT_CLEAN = 1,      /* drop NUL, U+FFFD, controls; White_Space -> ' ' */
    MTS_NORM_BERT_CJK,            /* ' ' around CJK ideographs */
    MTS_NORM_NFD,                 /* canonical decomposition + ordering */
    MTS_NORM_STRIP_ACCENTS_NFD,   /* NFD, then drop Mn (BERT's strip_accents) */
    MTS_NORM_STRIP_MN,            /* drop Mn */
    MTS_NORM_STRIP_M,             /* drop M* (StripAccents) */
    MTS_NORM_LOWER,               /* per-character full lower-case mapping */
    MTS_NORM_EXT = 100,           /* steps implemented in tokenizer_json.c from here on */
    MTS_NORM_STRIP,
    MTS_NORM_REPLACE,
    MTS_NORM_PREPEND,
    MTS_NORM_NFKC,
    MTS_NORM_NFC,
    MTS_NORM_NFKD,
};

typedef struct mts_norm_step {
    int kind;
    int left, right;          /* Strip */
    uint32_t *pat, *rep;      /* Replace (literal pattern), Prepend (rep) */
    size_t pat_n, rep_n;
} mts_norm_step;

int mts_norm_apply(const mts_norm_step *s, mts_cps *in, mts_cps *out);
int mts_norm_apply_ext(const mts_norm_step *s, mts_cps *in, mts_cps *out);

/* Post-processor: the single-sequence template. */
typedef struct mts_post_piece {
    int is_seq;       /* 1: the sequence's tokens; 0: special token id */
    int64_t id;
    int64_t type_id;
} mts_post_piece;

typedef struct mts_post {
    mts_post_piece single[MTS_TOK_MAX_POST];
    int n_single;
    int n_special_single;
} mts_post;

void mts_post_bert(mts_post *p, int64_t cls, int64_t sep);

/* Pre-tokenizer steps: each splits every piece of the previous step's output. */
enum {
    MTS_PRE_BERT = 1,      /* White_Space removed, punctuation isolated */
    MTS_PRE_WHITESPACE,    /* \w+|[^\w\s]+ */
    MTS_PRE_WS_SPLIT,      /* White_Space removed */
    MTS_PRE_PUNCT,         /* punctuation, per behavior */
    MTS_PRE_DIGITS,        /* digits isolated (flag1: one by one) */
    MTS_PRE_METASPACE,     /* ' ' -> repl, prepend (flag1: 0 never, 1 always, 2 first), split (flag2) */
    MTS_PRE_BYTELEVEL,     /* prefix space (flag1), GPT-2 regex (flag2), bytes -> printable chars */
    MTS_PRE_SPLIT_STR,     /* literal pattern, per behavior */
    MTS_PRE_SPLIT_GPT2,    /* GPT-2 regex, isolated */
    MTS_PRE_SPLIT_CL100K,  /* cl100k / Llama 3 regex (flag1: digits per match, 3; Qwen 2: 1), isolated */
};
enum { MTS_SPLIT_REMOVED, MTS_SPLIT_ISOLATED, MTS_SPLIT_PREV, MTS_SPLIT_NEXT, MTS_SPLIT_CONTIGUOUS };

typedef struct mts_pre_step {
    int kind;
    int flag1, flag2;
    int behavior;
    uint32_t repl;         /* Metaspace replacement */
    uint32_t *pat;         /* Split: literal pattern */
    size_t pat_n;
} mts_pre_step;

typedef struct mts_added {
    uint32_t *cps;         /* content (normalized when `normalized`) */
    size_t n;
    int64_t id;
    int normalized, lstrip, rstrip;
} mts_added;

struct mts_tokenizer {
    int kind;
    mts_vocab vocab;
    int64_t unk_id;        /* -1: none */
    int64_t pad_id;
    int max_len;           /* truncation limit from the file; 0: none */
    mts_norm_step norm[MTS_TOK_MAX_STEPS];
    int n_norm;
    mts_pre_step pre[MTS_TOK_MAX_STEPS];
    int n_pre;
    mts_added *added;      /* sorted by first code point */
    int n_added;
    int trunc_left;        /* truncation keeps the last tokens */
    /* WordPiece */
    char wp_prefix[32];
    int wp_max_chars;
    /* BPE / Unigram data, owned by tokenizer_json.c */
    void *ext;
    mts_post post;
};

int mts_tok_err(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int mts_wordpiece_word(const mts_tokenizer *t, const uint32_t *w, size_t n, mts_ids *out);
int mts_tok_model_word(const mts_tokenizer *t, const uint32_t *w, size_t n, mts_ids *out);

/* Adds an added token (UTF-8 content); sort once all are in. */
int mts_tok_add_added(mts_tokenizer *t, const char *s, size_t n, int64_t id, int normalized, int lstrip, int rstrip);
void mts_tok_sort_added(mts_tokenizer *t);

/* tokenizer_json.c */
mts_tokenizer *mts_tokenizer_load_json(const char *data, size_t len, int lowercase, char *err, size_t errlen);
int mts_tok_model_word_ext(const mts_tokenizer *t, const uint32_t *w, size_t n, mts_ids *out);
void mts_tokenizer_free_ext(mts_tokenizer *t);

#endif
