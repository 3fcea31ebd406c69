/*
 * Unicode character properties and UTF-8 decoding for the tokenizers: general category,
 * canonical combining class, lower-case mapping and canonical decomposition (NFD) of a code
 * point, compatibility decomposition and canonical composition, from tables generated out of the
 * Unicode Character Database (unicode_tables.c, made by
 * scripts/gen-unicode-tables.py), plus the derived predicates the tokenizers use (White_Space,
 * BERT's punctuation, control and CJK tests).
 */
#ifndef MTS_TEXT_UNICODE_H
#define MTS_TEXT_UNICODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* General categories, in the order of scripts/gen-unicode-tables.py's CATS. */
enum {
    MTS_UC_Cn, MTS_UC_Lu, MTS_UC_Ll, MTS_UC_Lt, MTS_UC_Lm, MTS_UC_Lo, MTS_UC_Mn, MTS_UC_Mc,
    MTS_UC_Me, MTS_UC_Nd, MTS_UC_Nl, MTS_UC_No, MTS_UC_Pc, MTS_UC_Pd, MTS_UC_Ps, MTS_UC_Pe,
    MTS_UC_Pi, MTS_UC_Pf, MTS_UC_Po, MTS_UC_Sm, MTS_UC_Sc, MTS_UC_Sk, MTS_UC_So, MTS_UC_Zs,
    MTS_UC_Zl, MTS_UC_Zp, MTS_UC_Cc, MTS_UC_Cf, MTS_UC_Cs, MTS_UC_Co,
};

/* Generated tables (unicode_tables.c). */
extern const char mts_uc_version[];
extern const uint8_t mts_uc_records[][2];
extern const uint16_t mts_uc_stage1[];
extern const uint8_t mts_uc_stage2[];
extern const int mts_uc_lower_n;
extern const uint32_t mts_uc_lower[][2];
extern const int mts_uc_decomp_n;
extern const uint32_t mts_uc_decomp[][2];
extern const uint32_t mts_uc_decomp_data[];
extern const int mts_uc_kdecomp_n;
extern const uint32_t mts_uc_kdecomp[][2];
extern const int mts_uc_comp_n;
extern const uint32_t mts_uc_comp[][3];

static inline int mts_uc_category(uint32_t cp)
{
    if (cp > 0x10FFFF) return MTS_UC_Cn;
    return mts_uc_records[mts_uc_stage2[(size_t)mts_uc_stage1[cp >> 7] * 128 + (cp & 127)]][0];
}
static inline int mts_uc_ccc(uint32_t cp)
{
    if (cp > 0x10FFFF) return 0;
    return mts_uc_records[mts_uc_stage2[(size_t)mts_uc_stage1[cp >> 7] * 128 + (cp & 127)]][1];
}

/* Decodes one UTF-8 sequence at s[0..n) (n >= 1) strictly: no overlongs, no surrogates, nothing
 * above U+10FFFF, no truncation. Returns its length (1..4) and sets *cp, or 0 if invalid. */
int mts_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);
/* Encodes cp (<= U+10FFFF) into out (4 bytes); returns the length. */
int mts_utf8_encode(uint32_t cp, char *out);

/* Lower-case mapping (full: U+0130 becomes two code points) into out[0..3); returns the count. */
int mts_uc_lower_full(uint32_t cp, uint32_t out[3]);
/* Canonical decomposition (recursive, NFD, without reordering) into out; returns the count
 * (at most MTS_UC_DECOMP_MAX); 1 and out[0] == cp when the code point does not decompose. */
#define MTS_UC_DECOMP_MAX 8
int mts_uc_decompose(uint32_t cp, uint32_t out[MTS_UC_DECOMP_MAX]);

/* Compatibility decomposition (NFKD, recursive, without reordering) into out; returns the count
 * (at most MTS_UC_KDECOMP_MAX: U+FDFA has 18). */
#define MTS_UC_KDECOMP_MAX 18
int mts_uc_decompose_compat(uint32_t cp, uint32_t out[MTS_UC_KDECOMP_MAX]);
/* The primary composite of a + b (canonical composition, Hangul included), or 0 if none. */
uint32_t mts_uc_compose(uint32_t a, uint32_t b);

/* The White_Space property (Rust's char::is_whitespace). */
bool mts_uc_is_white_space(uint32_t cp);
/* Category Mn (what BERT's accent stripping removes). */
static inline bool mts_uc_is_mn(uint32_t cp) { return mts_uc_category(cp) == MTS_UC_Mn; }
/* BERT punctuation: ASCII 33-47, 58-64, 91-96, 123-126, or a Unicode P* category. */
bool mts_uc_is_bert_punct(uint32_t cp);
/* BERT's "control": a C* category (Cc, Cf, Cn, Co, Cs), except tab, newline and return. */
bool mts_uc_is_bert_control(uint32_t cp);
/* BERT's CJK ideograph ranges (CJK Unified Ideographs and extensions A-E, compatibility). */
bool mts_uc_is_bert_cjk(uint32_t cp);

#endif
