/*
 * Unicode helpers for the tokenizers: strict UTF-8 decoding and encoding, lower-case mapping,
 * canonical and compatibility decomposition and canonical composition over the generated tables
 * (binary search; Hangul syllables are handled arithmetically as the standard specifies), and
 * the character classes BERT's basic tokenizer uses.
 */
#include "text/unicode.h"

int mts_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp)
{
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    int len;
    uint32_t v, min;
    if (c >= 0xC2 && c <= 0xDF) len = 2, v = c & 0x1F, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF) len = 3, v = c & 0x0F, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4) len = 4, v = c & 0x07, min = 0x10000;
    else return 0;
    if (n < (size_t)len) return 0;
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = v << 6 | (s[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v < 0xE000)) return 0;
    *cp = v;
    return len;
}

int mts_utf8_encode(uint32_t cp, char *out)
{
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | cp >> 6);
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | cp >> 12);
        o[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | cp >> 18);
    o[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Index of cp in a sorted (code point, value) table, or -1. */
static int pair_find(const uint32_t (*tab)[2], int n, uint32_t cp)
{
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (tab[mid][0] == cp) return mid;
        if (tab[mid][0] < cp) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

int mts_uc_lower_full(uint32_t cp, uint32_t out[3])
{
    if (cp < 0x80) {
        out[0] = (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
        return 1;
    }
    if (cp == 0x130) { /* LATIN CAPITAL LETTER I WITH DOT ABOVE: "i" + COMBINING DOT ABOVE */
        out[0] = 'i';
        out[1] = 0x307;
        return 2;
    }
    int i = pair_find(mts_uc_lower, mts_uc_lower_n, cp);
    out[0] = i < 0 ? cp : mts_uc_lower[i][1];
    return 1;
}

#define SBASE 0xAC00u
#define LBASE 0x1100u
#define VBASE 0x1161u
#define TBASE 0x11A7u
#define TCOUNT 28u
#define NCOUNT (21u * TCOUNT)
#define SCOUNT (19u * NCOUNT)

int mts_uc_decompose(uint32_t cp, uint32_t out[MTS_UC_DECOMP_MAX])
{
    if (cp < 0xC0) {
        out[0] = cp;
        return 1;
    }
    if (cp >= SBASE && cp < SBASE + SCOUNT) {
        uint32_t s = cp - SBASE;
        out[0] = LBASE + s / NCOUNT;
        out[1] = VBASE + (s % NCOUNT) / TCOUNT;
        if (s % TCOUNT == 0) return 2;
        out[2] = TBASE + s % TCOUNT;
        return 3;
    }
    int i = pair_find(mts_uc_decomp, mts_uc_decomp_n, cp);
    if (i < 0) {
        out[0] = cp;
        return 1;
    }
    uint32_t off = mts_uc_decomp[i][1] >> 3, n = mts_uc_decomp[i][1] & 7;
    for (uint32_t k = 0; k < n; k++) out[k] = mts_uc_decomp_data[off + k];
    return (int)n;
}

int mts_uc_decompose_compat(uint32_t cp, uint32_t out[MTS_UC_KDECOMP_MAX])
{
    if (cp >= 0xA0) {
        int i = pair_find(mts_uc_kdecomp, mts_uc_kdecomp_n, cp);
        if (i >= 0) {
            uint32_t off = mts_uc_kdecomp[i][1] >> 5, n = mts_uc_kdecomp[i][1] & 31;
            for (uint32_t k = 0; k < n; k++) out[k] = mts_uc_decomp_data[off + k];
            return (int)n;
        }
    }
    return mts_uc_decompose(cp, out);
}

uint32_t mts_uc_compose(uint32_t a, uint32_t b)
{
    if (a >= LBASE && a < LBASE + 19 && b >= VBASE && b < VBASE + 21)
        return SBASE + ((a - LBASE) * 21 + (b - VBASE)) * TCOUNT;
    if (a >= SBASE && a < SBASE + SCOUNT && (a - SBASE) % TCOUNT == 0 && b > TBASE && b < TBASE + TCOUNT)
        return a + (b - TBASE);
    int lo = 0, hi = mts_uc_comp_n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const uint32_t *c = mts_uc_comp[mid];
        if (c[0] == a && c[1] == b) return c[2];
        if (c[0] < a || (c[0] == a && c[1] < b)) lo = mid + 1;
        else hi = mid - 1;
    }
    return 0;
}

bool mts_uc_is_white_space(uint32_t cp)
{
    if (cp <= 0x20) return cp == 0x20 || (cp >= 9 && cp <= 13);
    switch (cp) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
        return true;
    default:
        return cp >= 0x2000 && cp <= 0x200A;
    }
}

bool mts_uc_is_bert_punct(uint32_t cp)
{
    if ((cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) || (cp >= 123 && cp <= 126))
        return true;
    if (cp < 128) return false;
    int c = mts_uc_category(cp);
    return c >= MTS_UC_Pc && c <= MTS_UC_Po;
}

bool mts_uc_is_bert_control(uint32_t cp)
{
    if (cp == '\t' || cp == '\n' || cp == '\r') return false;
    int c = mts_uc_category(cp);
    return c == MTS_UC_Cc || c == MTS_UC_Cf || c == MTS_UC_Cn || c == MTS_UC_Co || c == MTS_UC_Cs;
}

bool mts_uc_is_bert_cjk(uint32_t cp)
{
    return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
           (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B820 && cp <= 0x2CEAF) ||
           (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}
