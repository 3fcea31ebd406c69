/*
 * JSON parser and writer (see json.h for the contract).
 *
 * Parser: one iterative pass driven by a small goto state machine and an explicit stack of
 * open containers (at most MTS_JSON_MAX_DEPTH). Finished values are pushed as 16-byte nodes on
 * a scratch stack; when a container closes, its children -- the top of that stack -- move in
 * one memcpy into the document arena and are replaced by the container's node. A large array
 * whose children fill most of the scratch buffer takes over that buffer as its arena block
 * instead (no second copy; this is what keeps a 1M-number tensor at ~1x its node size). The
 * arena is a list of malloc'd blocks growing by half of what it already holds, with dedicated
 * blocks for big requests. Numbers: the literal is scanned once into a 19-digit decimal
 * significand and exponent; exact integers become int64; otherwise Clinger's fast path
 * (significand <= 2^53, |exponent| <= 22) or, on x86, an 80-bit long double product that is
 * checked for double-rounding ambiguity produce the correctly rounded double, and only the
 * rest (more than 19 digits, huge exponents, ambiguous roundings) goes to strtod_l.
 *
 * Writer: appends to a doubling buffer with a sticky status. Floats are printed by finding the
 * decimal with fewest digits strictly inside the float32's rounding interval (computed in
 * double arithmetic with a safety margin far above its rounding error), so any correctly
 * rounding reader -- and strtod followed by a cast to float -- gets the same float back.
 */
#include "util/json.h"

#include <errno.h>
#include <float.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- nodes and arena -------------------------------------------------------------------- */

enum { NUM_INT = 1, NUM_NEGZERO = 2 };

struct mts_json {
    uint8_t type;  /* mts_json_type */
    uint8_t flags; /* numbers: NUM_INT (u.i holds the exact value), NUM_NEGZERO ("-0") */
    uint16_t pad;
    uint32_t len;  /* string bytes; array elements; object members (kids holds 2*len nodes) */
    union {
        double d;
        int64_t i; /* integers (NUM_INT) and bools */
        const char *s;
        const mts_json *kids;
    } u;
};

typedef struct arena_block {
    struct arena_block *next;
    size_t size; /* bytes of the whole malloc'd block, header included */
} arena_block;

#define BLOCK_HDR 16 /* sizeof(arena_block) rounded to 16: payload stays 16-byte aligned */
#define BLOCK_MIN ((size_t)16 << 10)
#define BLOCK_MAX ((size_t)8 << 20)

struct mts_json_doc {
    arena_block *blocks;
    char *cur, *end; /* free part of the current regular block */
    size_t total;    /* bytes of all blocks */
    mts_json root;
};

_Static_assert(sizeof(mts_json) == 16, "mts_json nodes are 16 bytes");
_Static_assert(sizeof(arena_block) <= BLOCK_HDR, "block header fits");

static void doc_link(mts_json_doc *d, arena_block *b, size_t size)
{
    b->next = d->blocks;
    b->size = size;
    d->blocks = b;
    d->total += size;
}

static void *arena_alloc_slow(mts_json_doc *d, size_t n)
{
    size_t reg = d->total / 2;
    if (reg < BLOCK_MIN) reg = BLOCK_MIN;
    if (reg > BLOCK_MAX) reg = BLOCK_MAX;
    if (n > (reg - BLOCK_HDR) / 8) { /* big request: its own exact block, keep the current one */
        if (n > SIZE_MAX - BLOCK_HDR) return NULL;
        arena_block *b = malloc(BLOCK_HDR + n);
        if (!b) return NULL;
        doc_link(d, b, BLOCK_HDR + n);
        return (char *)b + BLOCK_HDR;
    }
    arena_block *b = malloc(reg);
    if (!b) return NULL;
    doc_link(d, b, reg);
    d->cur = (char *)b + BLOCK_HDR + n;
    d->end = (char *)b + reg;
    return (char *)b + BLOCK_HDR;
}

/* n bytes, 8-byte aligned. */
static inline void *arena_alloc(mts_json_doc *d, size_t n)
{
    n = (n + 7) & ~(size_t)7;
    if ((size_t)(d->end - d->cur) >= n) {
        void *p = d->cur;
        d->cur += n;
        return p;
    }
    return arena_alloc_slow(d, n);
}

/* Gives back the tail of the most recent allocation p (of old bytes), keeping keep bytes. */
static void arena_shrink(mts_json_doc *d, char *p, size_t old, size_t keep)
{
    old = (old + 7) & ~(size_t)7;
    keep = (keep + 7) & ~(size_t)7;
    if (p + old == d->cur) d->cur = p + keep;
}

void mts_json_free(mts_json_doc *doc)
{
    if (!doc) return;
    arena_block *b = doc->blocks;
    while (b) {
        arena_block *next = b->next;
        free(b);
        b = next;
    }
    free(doc);
}

size_t mts_json_doc_bytes(const mts_json_doc *doc) { return doc ? doc->total + sizeof *doc : 0; }

const mts_json *mts_json_root(const mts_json_doc *doc) { return doc ? &doc->root : NULL; }

/* ---- C locale for strtod / printf of doubles ---------------------------------------------- */

static pthread_once_t c_locale_once = PTHREAD_ONCE_INIT;
static locale_t c_locale;

static void c_locale_init(void) { c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0); }

static locale_t get_c_locale(void)
{
    pthread_once(&c_locale_once, c_locale_init);
    return c_locale;
}

static double strtod_c(const char *s)
{
    locale_t loc = get_c_locale();
    return loc ? strtod_l(s, NULL, loc) : strtod(s, NULL);
}

/* ---- parser ------------------------------------------------------------------------------ */

typedef struct frame {
    uint32_t start; /* scratch index of the container's first child */
    uint8_t is_obj;
} frame;

typedef struct parser {
    const uint8_t *s;
    size_t len;
    mts_err *err;
    mts_json_doc *doc;
    char *sraw;     /* scratch buffer: BLOCK_HDR bytes reserved, then nodes */
    mts_json *stk;  /* = sraw + BLOCK_HDR */
    size_t cap, top;
} parser;

static const double pow10_tab[] = {
    1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11, 1e12, 1e13,
    1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22, 1e23, 1e24, 1e25, 1e26, 1e27,
    1e28, 1e29, 1e30, 1e31, 1e32, 1e33, 1e34, 1e35, 1e36, 1e37, 1e38, 1e39, 1e40, 1e41,
    1e42, 1e43, 1e44, 1e45, 1e46, 1e47, 1e48, 1e49, 1e50, 1e51, 1e52, 1e53,
};

#if (defined(__x86_64__) || defined(__i386__)) && LDBL_MANT_DIG == 64 && FLT_EVAL_METHOD == 0
#define MTS_JSON_X87 1
static const long double pow10_ld[] = {
    1e0L,  1e1L,  1e2L,  1e3L,  1e4L,  1e5L,  1e6L,  1e7L,  1e8L,  1e9L,
    1e10L, 1e11L, 1e12L, 1e13L, 1e14L, 1e15L, 1e16L, 1e17L, 1e18L, 1e19L,
    1e20L, 1e21L, 1e22L, 1e23L, 1e24L, 1e25L, 1e26L, 1e27L,
};
#endif

/* Bytes allowed unescaped inside a string without further thought: printable ASCII except
 * '"' and '\\'. */
static const uint8_t str_plain[256] = {
#define R4(x) x, x, x, x
#define R16(x) R4(x), R4(x), R4(x), R4(x)
    R16(0), R16(0),                        /* 0x00-0x1f */
    1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, /* 0x20-0x2f: '"' */
    R16(1),                                /* 0x30-0x3f */
    R16(1),                                /* 0x40-0x4f */
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, /* 0x50-0x5f: '\\' */
    R16(1), R16(1),                        /* 0x60-0x7f */
    R16(0), R16(0), R16(0), R16(0), R16(0), R16(0), R16(0), R16(0),
#undef R16
#undef R4
};

static void line_col(const uint8_t *s, size_t pos, size_t *line, size_t *col)
{
    size_t l = 1, start = 0;
    for (size_t i = 0; i < pos; i++)
        if (s[i] == '\n') {
            l++;
            start = i + 1;
        }
    *line = l;
    *col = pos - start + 1;
}

/* "JSON: <what> at byte N (line L, column C)" */
__attribute__((format(printf, 3, 4))) static int perr(parser *p, size_t pos, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    size_t line, col;
    line_col(p->s, pos, &line, &col);
    return mts_err_set(p->err, MTS_EINVAL, "JSON: %s at byte %zu (line %zu, column %zu)", what, pos,
                       line, col);
}

/* "JSON: expected X at byte N (...), found 'c'" or, at the end of the input,
 * "JSON: unexpected end of input at byte N (...): expected X". */
static int perr_expected(parser *p, size_t pos, const char *expected)
{
    size_t line, col;
    line_col(p->s, pos, &line, &col);
    if (pos >= p->len)
        return mts_err_set(p->err, MTS_EINVAL,
                           "JSON: unexpected end of input at byte %zu (line %zu, column %zu): expected %s",
                           pos, line, col, expected);
    unsigned c = p->s[pos];
    char found[16];
    if (c >= 0x20 && c < 0x7f)
        snprintf(found, sizeof found, "'%c'", (char)c);
    else
        snprintf(found, sizeof found, "byte 0x%02x", c);
    return mts_err_set(p->err, MTS_EINVAL, "JSON: expected %s at byte %zu (line %zu, column %zu), found %s",
                       expected, pos, line, col, found);
}

static int scratch_grow(parser *p)
{
    size_t ncap = p->cap ? p->cap * 2 : 256;
    if (ncap > (SIZE_MAX - BLOCK_HDR) / sizeof(mts_json)) return mts_err_set(p->err, MTS_ENOMEM, "JSON: out of memory");
    char *n = realloc(p->sraw, BLOCK_HDR + ncap * sizeof(mts_json));
    if (!n) return mts_err_set(p->err, MTS_ENOMEM, "JSON: out of memory");
    p->sraw = n;
    p->stk = (mts_json *)(void *)(n + BLOCK_HDR);
    p->cap = ncap;
    return 0;
}

static inline mts_json *push(parser *p)
{
    if (p->top == p->cap && scratch_grow(p)) return NULL;
    return &p->stk[p->top++];
}

/* Closes the container whose children are stk[start..top): moves them to the arena and
 * pushes the container's node. */
static int close_container(parser *p, const frame *f)
{
    size_t start = f->start, n = p->top - start;
    mts_json node = {.type = f->is_obj ? MTS_JSON_OBJECT : MTS_JSON_ARRAY,
                     .len = (uint32_t)(f->is_obj ? n / 2 : n)};
    if (n == 0) {
        node.u.kids = NULL;
    } else if (n >= 4096 && start <= n / 2) {
        /* Adopt the scratch buffer as this array's block: copy the few nodes below it into a
         * fresh scratch buffer, slide the children down and trim. */
        size_t ncap = start * 2 < 256 ? 256 : start * 2;
        char *fresh = malloc(BLOCK_HDR + ncap * sizeof(mts_json));
        if (!fresh) return mts_err_set(p->err, MTS_ENOMEM, "JSON: out of memory");
        memcpy(fresh + BLOCK_HDR, p->stk, start * sizeof(mts_json));
        memmove(p->stk, p->stk + start, n * sizeof(mts_json));
        size_t bsize = BLOCK_HDR + n * sizeof(mts_json);
        char *blk = realloc(p->sraw, bsize);
        if (!blk) {
            blk = p->sraw;
            bsize = BLOCK_HDR + p->cap * sizeof(mts_json);
        }
        doc_link(p->doc, (arena_block *)(void *)blk, bsize);
        node.u.kids = (const mts_json *)(const void *)(blk + BLOCK_HDR);
        p->sraw = fresh;
        p->stk = (mts_json *)(void *)(fresh + BLOCK_HDR);
        p->cap = ncap;
    } else {
        mts_json *kids = arena_alloc(p->doc, n * sizeof(mts_json));
        if (!kids) return mts_err_set(p->err, MTS_ENOMEM, "JSON: out of memory");
        memcpy(kids, p->stk + start, n * sizeof(mts_json));
        node.u.kids = kids;
    }
    p->top = start;
    mts_json *slot = push(p); /* grows only for an empty container on a full stack */
    if (!slot) return MTS_ENOMEM;
    *slot = node;
    return 0;
}

static inline int is_digit(unsigned c) { return c - '0' < 10; }

/* Eight ASCII digits at s, if they are all digits: their value in *v (SWAR, little-endian). */
static inline bool eight_digits(const uint8_t *s, uint32_t *v)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t x;
    memcpy(&x, s, 8);
    if ((((x & 0xf0f0f0f0f0f0f0f0ull) | (((x + 0x0606060606060606ull) & 0xf0f0f0f0f0f0f0f0ull) >> 4))) !=
        0x3333333333333333ull)
        return false;
    x = (x & 0x0f0f0f0f0f0f0f0full) * 2561 >> 8;
    x = (x & 0x00ff00ff00ff00ffull) * 6553601 >> 16;
    *v = (uint32_t)((x & 0x0000ffff0000ffffull) * 42949672960001ull >> 32);
    return true;
#else
    (void)s;
    (void)v;
    return false;
#endif
}

/* Parses the number starting at s[pos0] ('-' or a digit) into *nd; *end gets the first byte
 * after it. */
static int parse_number(parser *p, size_t pos0, size_t *end, mts_json *nd)
{
    const uint8_t *s = p->s;
    size_t len = p->len, pos = pos0;
    bool neg = false, plain = true, many = false;
    uint64_t m = 0;
    int ndig = 0;
    int64_t e10 = 0;

    if (s[pos] == '-') {
        neg = true;
        pos++;
    }
    if (pos < len && s[pos] == '0') {
        pos++;
        if (pos < len && is_digit(s[pos])) return perr(p, pos0, "leading zero in number");
    } else if (pos < len && is_digit(s[pos])) {
        uint32_t v8;
        while (ndig <= 11 && len - pos >= 8 && eight_digits(s + pos, &v8)) {
            m = m * 100000000 + v8;
            ndig += 8;
            pos += 8;
        }
        if (pos < len && is_digit(s[pos])) do {
            unsigned d = s[pos] - '0';
            if (ndig < 19) {
                m = m * 10 + d;
                ndig++;
            } else {
                e10++;
                if (d) many = true;
            }
            pos++;
        } while (pos < len && is_digit(s[pos]));
    } else {
        return perr_expected(p, pos, "a digit after '-'");
    }
    if (pos < len && s[pos] == '.') {
        plain = false;
        pos++;
        if (pos >= len || !is_digit(s[pos])) return perr_expected(p, pos, "a digit after '.'");
        if (m == 0) /* leading zeros of the fraction only scale */
            while (pos < len && s[pos] == '0') {
                e10--;
                pos++;
            }
        {
            uint32_t v8;
            while (ndig <= 11 && len - pos >= 8 && eight_digits(s + pos, &v8)) {
                m = m * 100000000 + v8;
                ndig += 8;
                e10 -= 8;
                pos += 8;
            }
        }
        if (pos < len && is_digit(s[pos])) do {
            unsigned d = s[pos] - '0';
            if (m == 0 && d == 0) {
                e10--;
            } else if (ndig < 19) {
                m = m * 10 + d;
                ndig++;
                e10--;
            } else if (d) {
                many = true;
            }
            pos++;
        } while (pos < len && is_digit(s[pos]));
    }
    if (pos < len && (s[pos] == 'e' || s[pos] == 'E')) {
        plain = false;
        pos++;
        bool eneg = false;
        if (pos < len && (s[pos] == '+' || s[pos] == '-')) {
            eneg = s[pos] == '-';
            pos++;
        }
        if (pos >= len || !is_digit(s[pos])) return perr_expected(p, pos, "a digit in the exponent");
        int64_t ev = 0;
        do {
            if (ev < 100000000) ev = ev * 10 + (s[pos] - '0');
            pos++;
        } while (pos < len && is_digit(s[pos]));
        e10 += eneg ? -ev : ev;
    }
    *end = pos;
    nd->type = MTS_JSON_NUMBER;
    nd->pad = 0;
    nd->len = 0;

    if (m == 0) { /* any spelling of zero */
        nd->flags = NUM_INT | (neg ? NUM_NEGZERO : 0);
        nd->u.i = 0;
        return 0;
    }
    if (!many) {
        /* Exact integer? value = m * 10^e10 exactly. */
        uint64_t mi = m;
        int64_t e = e10;
        if (!plain)
            while (e < 0 && mi % 10 == 0) {
                mi /= 10;
                e++;
            }
        if (e >= 0 && e <= 19) {
            uint64_t lim = neg ? (uint64_t)1 << 63 : ((uint64_t)1 << 63) - 1;
            bool ok = mi <= lim;
            for (int64_t k = 0; k < e && ok; k++) {
                if (mi > lim / 10) ok = false;
                else mi *= 10;
            }
            if (ok && mi <= lim) {
                nd->flags = NUM_INT;
                nd->u.i = neg ? (mi == (uint64_t)1 << 63 ? INT64_MIN : -(int64_t)mi) : (int64_t)mi;
                return 0;
            }
        }
        nd->flags = 0;
#if FLT_EVAL_METHOD == 0 /* Clinger: both operands exact, so one correctly rounded operation */
        if (m <= ((uint64_t)1 << 53) && e10 >= -22 && e10 <= 22) {
            double d = e10 < 0 ? (double)m / pow10_tab[-e10] : (double)m * pow10_tab[e10];
            nd->u.d = neg ? -d : d;
            return 0;
        }
#endif
#ifdef MTS_JSON_X87
        if (e10 >= -27 && e10 <= 27) {
            long double x = e10 < 0 ? (long double)m / pow10_ld[-e10] : (long double)m * pow10_ld[e10];
            uint64_t sig;
            memcpy(&sig, &x, sizeof sig); /* the 64-bit significand of the x87 format */
            if ((sig & 0x7ff) != 0x400) { /* not on a double midpoint: one rounding is exact */
                double d = (double)x;
                nd->u.d = neg ? -d : d;
                return 0;
            }
        }
#endif
    }
    nd->flags = 0;
    /* Slow path: strtod on a NUL-terminated copy of the literal. */
    size_t n = pos - pos0;
    char small[128], *tmp = n < sizeof small ? small : malloc(n + 1);
    if (!tmp) return mts_err_set(p->err, MTS_ENOMEM, "JSON: out of memory");
    memcpy(tmp, s + pos0, n);
    tmp[n] = '\0';
    double d = strtod_c(tmp);
    if (tmp != small) free(tmp);
    if (isinf(d)) return perr(p, pos0, "number out of range");
    nd->u.d = d;
    return 0;
}

static int hex4(const uint8_t *s, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned c = s[i], d;
        if (c - '0' < 10) d = c - '0';
        else if ((c | 0x20) - 'a' < 6) d = (c | 0x20) - 'a' + 10;
        else return -1;
        v = v * 16 + d;
    }
    *out = v;
    return 0;
}

/* Length of the valid UTF-8 sequence at s (n bytes available, s[0] >= 0x80), or 0. */
static size_t utf8_valid(const uint8_t *s, size_t n)
{
    unsigned c = s[0];
    if (c >= 0xc2 && c <= 0xdf) return n >= 2 && (s[1] & 0xc0) == 0x80 ? 2 : 0;
    if (c >= 0xe0 && c <= 0xef) {
        if (n < 3 || (s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80) return 0;
        if (c == 0xe0 && s[1] < 0xa0) return 0; /* overlong */
        if (c == 0xed && s[1] > 0x9f) return 0; /* UTF-16 surrogate */
        return 3;
    }
    if (c >= 0xf0 && c <= 0xf4) {
        if (n < 4 || (s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80 || (s[3] & 0xc0) != 0x80) return 0;
        if (c == 0xf0 && s[1] < 0x90) return 0; /* overlong */
        if (c == 0xf4 && s[1] > 0x8f) return 0; /* > U+10FFFF */
        return 4;
    }
    return 0;
}

static size_t put_utf8(char *w, unsigned cp)
{
    if (cp < 0x80) {
        w[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        w[0] = (char)(0xc0 | (cp >> 6));
        w[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        w[0] = (char)(0xe0 | (cp >> 12));
        w[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        w[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    w[0] = (char)(0xf0 | (cp >> 18));
    w[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    w[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    w[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Parses the string whose opening quote is s[pos0] into a STRING node. */
static int parse_string(parser *p, size_t pos0, size_t *end, mts_json *nd)
{
    const uint8_t *s = p->s;
    size_t len = p->len, i = pos0 + 1;
    while (i < len && str_plain[s[i]]) i++;
    nd->type = MTS_JSON_STRING;
    nd->flags = 0;
    nd->pad = 0;
    if (i < len && s[i] == '"') { /* common case: nothing to decode */
        size_t n = i - pos0 - 1;
        char *dst = arena_alloc(p->doc, n + 1);
        if (!dst) return mts_err_set(p->err, MTS_ENOMEM, "JSON: out of memory");
        memcpy(dst, s + pos0 + 1, n);
        dst[n] = '\0';
        nd->len = (uint32_t)n;
        nd->u.s = dst;
        *end = i + 1;
        return 0;
    }
    /* Find the closing quote, then decode into at most that many bytes. */
    size_t j = i;
    for (;;) {
        if (j >= len) return perr(p, pos0, "unterminated string starting");
        if (s[j] == '"') break;
        j += s[j] == '\\' ? 2 : 1;
    }
    size_t raw = j - pos0 - 1;
    char *dst = arena_alloc(p->doc, raw + 1);
    if (!dst) return mts_err_set(p->err, MTS_ENOMEM, "JSON: out of memory");
    size_t w = i - pos0 - 1;
    memcpy(dst, s + pos0 + 1, w);
    size_t k = i;
    while (k < j) {
        unsigned c = s[k];
        if (str_plain[c]) {
            dst[w++] = (char)c;
            k++;
        } else if (c == '\\') {
            unsigned e = s[k + 1]; /* k + 1 < j: the scan above skipped it */
            char out;
            switch (e) {
            case '"': out = '"'; break;
            case '\\': out = '\\'; break;
            case '/': out = '/'; break;
            case 'b': out = '\b'; break;
            case 'f': out = '\f'; break;
            case 'n': out = '\n'; break;
            case 'r': out = '\r'; break;
            case 't': out = '\t'; break;
            case 'u': {
                unsigned cp, lo;
                if (k + 6 > j || hex4(s + k + 2, &cp))
                    return perr(p, k, "invalid \\u escape (expected 4 hex digits)");
                size_t adv = 6;
                if (cp >= 0xdc00 && cp <= 0xdfff)
                    return perr(p, k, "unpaired surrogate \\u%04x in string", cp);
                if (cp >= 0xd800 && cp <= 0xdbff) {
                    if (k + 12 > j || s[k + 6] != '\\' || s[k + 7] != 'u' || hex4(s + k + 8, &lo) ||
                        lo < 0xdc00 || lo > 0xdfff)
                        return perr(p, k, "unpaired surrogate \\u%04x in string", cp);
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                    adv = 12;
                }
                w += put_utf8(dst + w, cp);
                k += adv;
                continue;
            }
            default:
                if (e >= 0x20 && e < 0x7f) return perr(p, k, "invalid escape '\\%c' in string", (char)e);
                return perr(p, k, "invalid escape (backslash followed by byte 0x%02x) in string", e);
            }
            dst[w++] = out;
            k += 2;
        } else if (c < 0x20) {
            return perr(p, k, "unescaped control character 0x%02x in string", c);
        } else {
            size_t n = utf8_valid(s + k, j - k);
            if (!n) return perr(p, k, "invalid UTF-8 in string");
            memcpy(dst + w, s + k, n);
            w += n;
            k += n;
        }
    }
    dst[w] = '\0';
    arena_shrink(p->doc, dst, raw + 1, w + 1);
    nd->len = (uint32_t)w;
    nd->u.s = dst;
    *end = j + 1;
    return 0;
}

static inline size_t skip_ws(const uint8_t *s, size_t len, size_t pos)
{
    while (pos < len && (s[pos] == ' ' || s[pos] == '\n' || s[pos] == '\r' || s[pos] == '\t')) pos++;
    return pos;
}

static int parse_doc(parser *p)
{
    const uint8_t *s = p->s;
    size_t len = p->len, pos;
    frame fr[MTS_JSON_MAX_DEPTH];
    int depth = 0, rc;
    mts_json *nd;

    pos = skip_ws(s, len, 0);
    if (pos == len) return mts_err_set(p->err, MTS_EINVAL, "JSON: empty input");

value:
    if (pos >= len) return perr_expected(p, pos, "a value");
    switch (s[pos]) {
    case '[':
    case '{': {
        if (depth == MTS_JSON_MAX_DEPTH) return perr(p, pos, "nesting deeper than %d", MTS_JSON_MAX_DEPTH);
        bool obj = s[pos] == '{';
        fr[depth].start = (uint32_t)p->top;
        fr[depth].is_obj = obj;
        depth++;
        pos = skip_ws(s, len, pos + 1);
        if (pos < len && s[pos] == (obj ? '}' : ']')) {
            pos++;
            depth--;
            if ((rc = close_container(p, &fr[depth]))) return rc;
            goto after;
        }
        if (obj) goto key;
        goto value;
    }
    case '"':
        if (!(nd = push(p))) return MTS_ENOMEM;
        if ((rc = parse_string(p, pos, &pos, nd))) return rc;
        goto after;
    case 't':
    case 'f':
    case 'n': {
        const char *lit = s[pos] == 't' ? "true" : s[pos] == 'f' ? "false" : "null";
        size_t n = strlen(lit), have = len - pos < n ? len - pos : n;
        if (memcmp(s + pos, lit, have) != 0) return perr(p, pos, "invalid literal (expected true, false or null)");
        if (have < n) return perr_expected(p, len, lit);
        if (!(nd = push(p))) return MTS_ENOMEM;
        memset(nd, 0, sizeof *nd);
        nd->type = lit[0] == 'n' ? MTS_JSON_NULL : MTS_JSON_BOOL;
        nd->u.i = lit[0] == 't';
        pos += n;
        goto after;
    }
    case '-':
    case '0': case '1': case '2': case '3': case '4':
    case '5': case '6': case '7': case '8': case '9':
        if (!(nd = push(p))) return MTS_ENOMEM;
        if ((rc = parse_number(p, pos, &pos, nd))) return rc;
        goto after;
    default:
        return perr_expected(p, pos, "a value");
    }

key:
    if (pos >= len || s[pos] != '"') return perr_expected(p, pos, "'\"' (a member name)");
    if (!(nd = push(p))) return MTS_ENOMEM;
    if ((rc = parse_string(p, pos, &pos, nd))) return rc;
    pos = skip_ws(s, len, pos);
    if (pos >= len || s[pos] != ':') return perr_expected(p, pos, "':'");
    pos = skip_ws(s, len, pos + 1);
    goto value;

after:
    if (depth == 0) {
        pos = skip_ws(s, len, pos);
        if (pos != len) return perr(p, pos, "unexpected data after the document");
        return 0;
    }
    pos = skip_ws(s, len, pos);
    {
        bool obj = fr[depth - 1].is_obj;
        if (pos < len && s[pos] == ',') {
            pos = skip_ws(s, len, pos + 1);
            if (obj) goto key;
            goto value;
        }
        if (pos < len && s[pos] == (obj ? '}' : ']')) {
            pos++;
            depth--;
            if ((rc = close_container(p, &fr[depth]))) return rc;
            goto after;
        }
        return perr_expected(p, pos, obj ? "',' or '}'" : "',' or ']'");
    }
}

int mts_json_parse(const char *buf, size_t len, mts_json_doc **out, mts_err *err)
{
    *out = NULL;
    if (len > UINT32_MAX)
        return mts_err_set(err, MTS_ELIMIT, "JSON: document of %zu bytes exceeds the 4 GiB limit", len);
    if (!buf && len) return mts_err_set(err, MTS_EINVAL, "JSON: no input");
    mts_json_doc *doc = calloc(1, sizeof *doc);
    if (!doc) return mts_err_set(err, MTS_ENOMEM, "JSON: out of memory");
    parser p = {.s = (const uint8_t *)buf, .len = len, .err = err, .doc = doc};
    int rc = len ? scratch_grow(&p) : 0;
    if (!rc) rc = parse_doc(&p);
    if (rc == MTS_ENOMEM && err && err->code != MTS_ENOMEM) mts_err_set(err, MTS_ENOMEM, "JSON: out of memory");
    if (!rc) doc->root = p.stk[0];
    free(p.sraw);
    if (rc) {
        mts_json_free(doc);
        return rc;
    }
    *out = doc;
    return 0;
}

/* ---- access ------------------------------------------------------------------------------ */

const char *mts_json_type_name(mts_json_type t)
{
    switch (t) {
    case MTS_JSON_NONE: return "nothing";
    case MTS_JSON_NULL: return "null";
    case MTS_JSON_BOOL: return "bool";
    case MTS_JSON_NUMBER: return "number";
    case MTS_JSON_STRING: return "string";
    case MTS_JSON_ARRAY: return "array";
    case MTS_JSON_OBJECT: return "object";
    }
    return "?";
}

mts_json_type mts_json_type_of(const mts_json *v) { return v ? (mts_json_type)v->type : MTS_JSON_NONE; }

const mts_json *mts_json_get_n(const mts_json *obj, const char *key, size_t key_len)
{
    if (!obj || obj->type != MTS_JSON_OBJECT || !key) return NULL;
    for (size_t i = obj->len; i-- > 0;) { /* backwards: the last duplicate wins */
        const mts_json *k = &obj->u.kids[2 * i];
        if (k->len == key_len && memcmp(k->u.s, key, key_len) == 0) return k + 1;
    }
    return NULL;
}

const mts_json *mts_json_get(const mts_json *obj, const char *key)
{
    return key ? mts_json_get_n(obj, key, strlen(key)) : NULL;
}

size_t mts_json_len(const mts_json *v)
{
    return v && (v->type == MTS_JSON_ARRAY || v->type == MTS_JSON_OBJECT) ? v->len : 0;
}

const mts_json *mts_json_at(const mts_json *v, size_t i)
{
    if (!v || i >= v->len) return NULL;
    if (v->type == MTS_JSON_ARRAY) return &v->u.kids[i];
    if (v->type == MTS_JSON_OBJECT) return &v->u.kids[2 * i + 1];
    return NULL;
}

const char *mts_json_key_at_n(const mts_json *obj, size_t i, size_t *key_len)
{
    if (!obj || obj->type != MTS_JSON_OBJECT || i >= obj->len) return NULL;
    const mts_json *k = &obj->u.kids[2 * i];
    if (key_len) *key_len = k->len;
    return k->u.s;
}

const char *mts_json_key_at(const mts_json *obj, size_t i) { return mts_json_key_at_n(obj, i, NULL); }

const char *mts_json_str(const mts_json *v, size_t *len)
{
    if (!v || v->type != MTS_JSON_STRING) return NULL;
    if (len) *len = v->len;
    return v->u.s;
}

static inline double num_value(const mts_json *v)
{
    if (v->flags & NUM_INT) return (v->flags & NUM_NEGZERO) ? -0.0 : (double)v->u.i;
    return v->u.d;
}

double mts_json_num(const mts_json *v)
{
    if (!v || v->type != MTS_JSON_NUMBER) return NAN;
    return num_value(v);
}

bool mts_json_is_int(const mts_json *v) { return v && v->type == MTS_JSON_NUMBER && (v->flags & NUM_INT); }

int mts_json_int(const mts_json *v, int64_t *out)
{
    if (!mts_json_is_int(v)) return MTS_EINVAL;
    *out = v->u.i;
    return MTS_OK;
}

bool mts_json_bool(const mts_json *v) { return v && v->type == MTS_JSON_BOOL && v->u.i; }

/* ---- flattening -------------------------------------------------------------------------- */

typedef struct walk_frame {
    const mts_json *kids;
    uint32_t n, i;
} walk_frame;

int64_t mts_json_numel(const mts_json *v)
{
    if (!v) return 0;
    if (v->type != MTS_JSON_ARRAY) return 1;
    walk_frame st[MTS_JSON_MAX_DEPTH];
    int d = 0;
    int64_t count = 0;
    st[0] = (walk_frame){v->u.kids, v->len, 0};
    for (;;) {
        walk_frame *f = &st[d];
        if (f->i == f->n) {
            if (d-- == 0) return count;
            continue;
        }
        const mts_json *c = &f->kids[f->i++];
        if (c->type == MTS_JSON_ARRAY && d + 1 < MTS_JSON_MAX_DEPTH) st[++d] = (walk_frame){c->u.kids, c->len, 0};
        else count++;
    }
}

static const char *a_type(const mts_json *v)
{
    switch (v->type) {
    case MTS_JSON_NULL: return "null";
    case MTS_JSON_STRING: return "a string";
    case MTS_JSON_OBJECT: return "an object";
    case MTS_JSON_ARRAY: return "an array";
    default: return "a value of unknown type";
    }
}

static int bad_value(const mts_json *v, int64_t k, mts_dtype dt, mts_err *err)
{
    char num[MTS_JSON_DOUBLE_MAX];
    if (v->flags & NUM_INT) snprintf(num, sizeof num, "%lld", (long long)v->u.i);
    else mts_json_format_double(v->u.d, num);
    const char *name = mts_dtype_name(dt);
    if (dt == MTS_DTYPE_BOOL)
        return mts_err_set(err, MTS_EINVAL, "data element %lld (%s) is not a bool (expected true, false, 0 or 1)",
                           (long long)k, num);
    bool fp = dt == MTS_DTYPE_FLOAT || dt == MTS_DTYPE_DOUBLE || dt == MTS_DTYPE_FLOAT16 || dt == MTS_DTYPE_BFLOAT16;
    if (!fp && !(v->flags & NUM_INT) && v->u.d != trunc(v->u.d))
        return mts_err_set(err, MTS_EINVAL, "data element %lld (%s) is not an integer (%s)", (long long)k, num, name);
    return mts_err_set(err, MTS_EINVAL, "data element %lld (%s) is out of range for %s", (long long)k, num, name);
}

/* Stores leaf v as element k of out. */
static inline int put_elem(const mts_json *v, mts_dtype dt, void *out, int64_t k, mts_err *err)
{
    int64_t iv;
    if (v->type == MTS_JSON_NUMBER) {
        if (dt == MTS_DTYPE_FLOAT) {
            float f;
            if (v->flags & NUM_INT) f = (v->flags & NUM_NEGZERO) ? -0.0f : (float)v->u.i;
            else if (isinf(f = (float)v->u.d)) return bad_value(v, k, dt, err);
            ((float *)out)[k] = f;
            return 0;
        }
        if (dt == MTS_DTYPE_DOUBLE || dt == MTS_DTYPE_FLOAT16 || dt == MTS_DTYPE_BFLOAT16) {
            double d = (v->flags & NUM_INT) ? ((v->flags & NUM_NEGZERO) ? -0.0 : (double)v->u.i) : v->u.d;
            if (isinf(d)) return bad_value(v, k, dt, err);
            if (dt == MTS_DTYPE_DOUBLE) {
                ((double *)out)[k] = d;
                return 0;
            }
            uint16_t h = dt == MTS_DTYPE_FLOAT16 ? mts_f64_to_f16(d) : mts_f64_to_bf16(d);
            if ((h & 0x7fffu) == (dt == MTS_DTYPE_FLOAT16 ? 0x7c00u : 0x7f80u)) return bad_value(v, k, dt, err);
            ((uint16_t *)out)[k] = h;
            return 0;
        }
        if (!(v->flags & NUM_INT)) {
            /* uint64 beyond int64's range arrives as a double */
            if (dt == MTS_DTYPE_UINT64 && v->u.d >= 9223372036854775808.0 && v->u.d < 18446744073709551616.0 &&
                v->u.d == trunc(v->u.d)) {
                ((uint64_t *)out)[k] = (uint64_t)v->u.d;
                return 0;
            }
            return bad_value(v, k, dt, err);
        }
        iv = v->u.i;
    } else if (v->type == MTS_JSON_BOOL) {
        iv = v->u.i;
        switch (dt) {
        case MTS_DTYPE_FLOAT: ((float *)out)[k] = (float)iv; return 0;
        case MTS_DTYPE_DOUBLE: ((double *)out)[k] = (double)iv; return 0;
        case MTS_DTYPE_FLOAT16: ((uint16_t *)out)[k] = iv ? 0x3c00u : 0; return 0;
        case MTS_DTYPE_BFLOAT16: ((uint16_t *)out)[k] = iv ? 0x3f80u : 0; return 0;
        default: break;
        }
    } else {
        return mts_err_set(err, MTS_EINVAL, "data element %lld is %s, expected a number or bool", (long long)k,
                           a_type(v));
    }
    switch (dt) {
    case MTS_DTYPE_INT64: ((int64_t *)out)[k] = iv; return 0;
    case MTS_DTYPE_INT32:
        if (iv < INT32_MIN || iv > INT32_MAX) return bad_value(v, k, dt, err);
        ((int32_t *)out)[k] = (int32_t)iv;
        return 0;
    case MTS_DTYPE_INT8:
        if (iv < INT8_MIN || iv > INT8_MAX) return bad_value(v, k, dt, err);
        ((int8_t *)out)[k] = (int8_t)iv;
        return 0;
    case MTS_DTYPE_UINT8:
        if (iv < 0 || iv > UINT8_MAX) return bad_value(v, k, dt, err);
        ((uint8_t *)out)[k] = (uint8_t)iv;
        return 0;
    case MTS_DTYPE_INT16:
        if (iv < INT16_MIN || iv > INT16_MAX) return bad_value(v, k, dt, err);
        ((int16_t *)out)[k] = (int16_t)iv;
        return 0;
    case MTS_DTYPE_UINT16:
        if (iv < 0 || iv > UINT16_MAX) return bad_value(v, k, dt, err);
        ((uint16_t *)out)[k] = (uint16_t)iv;
        return 0;
    case MTS_DTYPE_UINT32:
        if (iv < 0 || iv > (int64_t)UINT32_MAX) return bad_value(v, k, dt, err);
        ((uint32_t *)out)[k] = (uint32_t)iv;
        return 0;
    case MTS_DTYPE_UINT64:
        if (iv < 0) return bad_value(v, k, dt, err);
        ((uint64_t *)out)[k] = (uint64_t)iv;
        return 0;
    default: /* BOOL */
        if (iv != 0 && iv != 1) return bad_value(v, k, dt, err);
        ((uint8_t *)out)[k] = (uint8_t)iv;
        return 0;
    }
}

int mts_json_flatten(const mts_json *arr, mts_dtype dtype, void *out, int64_t n_expected, mts_err *err)
{
    switch (dtype) {
    case MTS_DTYPE_FLOAT: case MTS_DTYPE_INT64: case MTS_DTYPE_INT32:
    case MTS_DTYPE_INT8: case MTS_DTYPE_UINT8: case MTS_DTYPE_BOOL:
    case MTS_DTYPE_DOUBLE: case MTS_DTYPE_FLOAT16: case MTS_DTYPE_BFLOAT16:
    case MTS_DTYPE_INT16: case MTS_DTYPE_UINT16: case MTS_DTYPE_UINT32: case MTS_DTYPE_UINT64:
        break;
    default:
        return mts_err_set(err, MTS_EUNSUPPORTED, "JSON data of type %s is not supported", mts_dtype_name(dtype));
    }
    if (!arr) return mts_err_set(err, MTS_EINVAL, "data is missing");
    int64_t n = mts_json_numel(arr);
    if (n != n_expected)
        return mts_err_set(err, MTS_EINVAL, "data has %lld elements, expected %lld", (long long)n, (long long)n_expected);
    if (arr->type != MTS_JSON_ARRAY) return put_elem(arr, dtype, out, 0, err);

    walk_frame st[MTS_JSON_MAX_DEPTH];
    int d = 0, rc;
    int64_t k = 0;
    st[0] = (walk_frame){arr->u.kids, arr->len, 0};
    for (;;) {
        walk_frame *f = &st[d];
        const mts_json *kids = f->kids;
        uint32_t i = f->i, nk = f->n;
        if (dtype == MTS_DTYPE_FLOAT) { /* hot loop: float tensors */
            float *o = out;
            for (; i < nk && kids[i].type == MTS_JSON_NUMBER && !(kids[i].flags & NUM_INT); i++, k++) {
                float v = (float)kids[i].u.d;
                if (isinf(v)) return bad_value(&kids[i], k, dtype, err);
                o[k] = v;
            }
        }
        for (; i < nk; i++) {
            const mts_json *c = &kids[i];
            if (c->type == MTS_JSON_ARRAY && d + 1 < MTS_JSON_MAX_DEPTH) break;
            if ((rc = put_elem(c, dtype, out, k, err))) return rc;
            k++;
        }
        if (i == nk) {
            if (d-- == 0) return 0;
            continue;
        }
        f->i = i + 1;
        st[++d] = (walk_frame){kids[i].u.kids, kids[i].len, 0};
    }
}

/* ---- number formatting ------------------------------------------------------------------- */

static const char digits2[201] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

static const uint64_t pow10_u64[20] = {
    1ull, 10ull, 100ull, 1000ull, 10000ull, 100000ull, 1000000ull, 10000000ull, 100000000ull,
    1000000000ull, 10000000000ull, 100000000000ull, 1000000000000ull, 10000000000000ull,
    100000000000000ull, 1000000000000000ull, 10000000000000000ull, 100000000000000000ull,
    1000000000000000000ull, 10000000000000000000ull,
};

static inline int count_digits(uint64_t v)
{
    int n = 1;
    while (n < 20 && v >= pow10_u64[n]) n++;
    return n;
}

/* Decimal digits of v into p (written back to front, no temporary); returns the count. */
static size_t fmt_u64(uint64_t v, char *p)
{
    int n = count_digits(v);
    char *q = p + n;
    while (v >= 100) {
        unsigned r = (unsigned)(v % 100);
        v /= 100;
        q -= 2;
        memcpy(q, digits2 + 2 * r, 2);
    }
    if (v >= 10) {
        q -= 2;
        memcpy(q, digits2 + 2 * v, 2);
    } else {
        *--q = (char)('0' + v);
    }
    return (size_t)n;
}

static size_t fmt_i64(int64_t v, char *p)
{
    if (v < 0) {
        *p = '-';
        return 1 + fmt_u64((uint64_t)0 - (uint64_t)v, p + 1);
    }
    return fmt_u64((uint64_t)v, p);
}

/* x / 10^q with constant divisors (multiplications) for the common small q. */
static inline uint64_t div_pow10(uint64_t x, int q)
{
    switch (q) {
    case 0: return x;
    case 1: return x / 10;
    case 2: return x / 100;
    case 3: return x / 1000;
    case 4: return x / 10000;
    default: {
        uint64_t p = 1;
        for (int i = 0; i < q; i++) p *= 10;
        return x / p;
    }
    }
}

static inline double scale10(double v, int e) { return e >= 0 ? v * pow10_tab[e] : v / pow10_tab[-e]; }

static inline double pow2d(int e) /* 2^e for -1022 <= e <= 1023 */
{
    uint64_t b = (uint64_t)(e + 1023) << 52;
    double d;
    memcpy(&d, &b, sizeof d);
    return d;
}

/* Writes digits c (no trailing zeros, at most 16 of them) times 10^exp: plain notation for
 * 1e-4 <= value < 1e9 (as %g with 9 digits, so never longer than "%.9g"), otherwise
 * d.ddde[-]x. No NUL. Copies are fixed-size (16 bytes) for speed, so p needs 28 bytes of room
 * even though the text itself is at most 15 bytes for up to 9 digits. */
static size_t fmt_decimal(uint64_t c, int exp, char *p)
{
    char dg[32];
    int nd = (int)fmt_u64(c, dg);
    int x = nd - 1 + exp; /* scientific exponent */
    char *q = p;
    if (x >= -4 && x < 9) {
        int dp = nd + exp; /* digits before the point: -3..9 */
        if (dp <= 0) {
            memcpy(q, "0.000", 5);
            q += 2 - dp;
            memcpy(q, dg, 16);
            q += nd;
        } else if (dp < nd) {
            memcpy(q, dg, 16);
            q += dp;
            *q++ = '.';
            memcpy(q, dg + dp, 16);
            q += nd - dp;
        } else {
            memcpy(q, dg, 16);
            q += nd;
            memcpy(q, "00000000", 8);
            q += dp - nd;
        }
    } else {
        *q++ = dg[0];
        if (nd > 1) {
            *q++ = '.';
            memcpy(q, dg + 1, 16);
            q += nd - 1;
        }
        *q++ = 'e';
        if (x < 0) {
            *q++ = '-';
            x = -x;
        }
        q += fmt_u64((uint64_t)x, q);
    }
    return (size_t)(q - p);
}

/* Shortest float32 text, no NUL; "null" for NaN/inf. At most 16 bytes of text, but out needs
 * MTS_JSON_FLOAT_MAX bytes of room (see fmt_decimal). */
static size_t fmt_float(float f, char *out)
{
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    char *p = out;
    if ((bits & 0x7f800000) == 0x7f800000) {
        memcpy(p, "null", 4);
        return 4;
    }
    if (bits >> 31) *p++ = '-';
    bits &= 0x7fffffff;
    if (bits == 0) {
        *p++ = '0';
        return (size_t)(p - out);
    }
    uint32_t be = bits >> 23, bm = bits & 0x7fffff, m2;
    int e2;
    bool closer;
    if (be == 0) {
        m2 = bm;
        e2 = -149;
        closer = false;
    } else {
        m2 = bm | 0x800000;
        e2 = (int)be - 150;
        closer = bm == 0 && be > 1;
    }
    /* Exact in double: v and the midpoints to its float neighbours. */
    double half = pow2d(e2 - 1);
    double v = (double)m2 * pow2d(e2);
    double hi = v + half, lo = v - (closer ? half / 2 : half);
    uint64_t vb;
    memcpy(&vb, &v, sizeof vb);
    int k2 = (int)((vb >> 52) & 0x7ff) - 1023;
    int E = (k2 * 1233) >> 12; /* ~floor(log10 v), corrected below */
    double sv = scale10(v, 8 - E);
    if (sv >= 1e9) {
        E++;
        sv = scale10(v, 8 - E);
    } else if (sv < 1e8) {
        E--;
        sv = scale10(v, 8 - E);
    }
    /* Integer interval [L, H] strictly inside (lo, hi) * 10^(8-E), with a relative margin of
     * 1e-15 (>> the ~4e-16 error of the scaling) so no reader can round the result away. */
    double sl = scale10(lo, 8 - E) * (1 + 1e-15), sh = scale10(hi, 8 - E) * (1 - 1e-15);
    uint64_t L = (uint64_t)sl;
    if ((double)L < sl) L++;
    uint64_t H = (uint64_t)sh;
    if (H < L) { /* cannot happen (the interval is >= ~3 units wide); stay correct anyway */
        int n = snprintf(p, 16, "%.9g", (double)f < 0 ? -(double)f : (double)f);
        return (size_t)(p - out) + (size_t)n;
    }
    uint64_t W = H - L, pw = 1;
    int q = 0;
    while (q < 18 && pw * 10 <= W + 1) {
        pw *= 10;
        q++;
    }
    /* A multiple of 10^q lies in [L, H]; try 10^(q+1) first. */
    uint64_t c = 0;
    for (int t = 0; t < 2; t++) {
        int qq = t == 0 ? q + 1 : q;
        uint64_t P = t == 0 ? pw * 10 : pw;
        uint64_t clo = div_pow10(L + P - 1, qq), chi = div_pow10(H, qq);
        if (clo <= chi) {
            static const double inv10[] = {1, 1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8, 1e-9, 1e-10};
            /* nearest candidate to v (an approximate quotient is fine: c is clamped below) */
            c = (uint64_t)(sv * (qq <= 10 ? inv10[qq] : 1.0 / (double)P) + 0.5);
            if (c < clo) c = clo;
            if (c > chi) c = chi;
            q = t == 0 ? q + 1 : q;
            break;
        }
    }
    int exp = q + E - 8;
    while (c % 10 == 0) {
        c /= 10;
        exp++;
    }
    p += fmt_decimal(c, exp, p);
    return (size_t)(p - out);
}

size_t mts_json_format_float(float v, char *buf)
{
    size_t n = fmt_float(v, buf);
    buf[n] = '\0';
    return n;
}

/* Fewest of 15..17 significant digits that read back as v; "null" for NaN/inf. */
static size_t fmt_double(double v, char *out)
{
    if (!isfinite(v)) {
        memcpy(out, "null", 5);
        return 4;
    }
    if (v == trunc(v) && fabs(v) < 1e15) {
        if (v == 0 && signbit(v)) {
            memcpy(out, "-0", 3);
            return 2;
        }
        size_t n = fmt_i64((int64_t)v, out);
        out[n] = '\0';
        return n;
    }
    locale_t loc = get_c_locale(), old = loc ? uselocale(loc) : (locale_t)0;
    int n = 0;
    for (int prec = 15; prec <= 17; prec++) {
        n = snprintf(out, MTS_JSON_DOUBLE_MAX, "%.*g", prec, v);
        if (prec == 17 || strtod(out, NULL) == v) break;
    }
    if (loc) uselocale(old);
    return (size_t)n;
}

size_t mts_json_format_double(double v, char *buf) { return fmt_double(v, buf); }

/* ---- writer ------------------------------------------------------------------------------ */

enum { JW_OBJ = 1, JW_ITEMS = 2 };

void mts_jw_init(mts_jw *w) { memset(w, 0, sizeof *w); }

void mts_jw_free(mts_jw *w)
{
    free(w->buf);
    memset(w, 0, sizeof *w);
}

void mts_jw_reset(mts_jw *w)
{
    char *buf = w->buf;
    size_t cap = w->cap;
    memset(w, 0, sizeof *w);
    w->buf = buf;
    w->cap = cap;
    if (buf) buf[0] = '\0';
}

__attribute__((format(printf, 2, 3))) static void jw_misuse(mts_jw *w, const char *fmt, ...)
{
    if (w->status) return;
    w->status = MTS_EINVAL;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->what, sizeof w->what, fmt, ap);
    va_end(ap);
}

/* Room for extra more bytes plus a NUL. */
static bool jw_reserve(mts_jw *w, size_t extra)
{
    if (w->status) return false;
    if (extra < w->cap - w->len) return true;
    if (extra > SIZE_MAX / 2 - w->len - 1) {
        w->status = MTS_ENOMEM;
        return false;
    }
    size_t need = w->len + extra + 1, ncap = w->cap ? w->cap : 256;
    while (ncap < need) ncap *= 2;
    char *n = realloc(w->buf, ncap);
    if (!n) {
        w->status = MTS_ENOMEM;
        return false;
    }
    w->buf = n;
    w->cap = ncap;
    return true;
}

/* Before a value: checks placement and writes the separating comma. extra: bytes to reserve. */
static bool jw_value(mts_jw *w, size_t extra)
{
    if (w->status) return false;
    if (w->depth == 0) {
        if (w->top_done) {
            jw_misuse(w, "a second top-level value");
            return false;
        }
        return jw_reserve(w, extra);
    }
    uint8_t *t = &w->stack[w->depth - 1];
    if (*t & JW_OBJ) {
        if (!w->want_value) {
            jw_misuse(w, "a value inside an object without a key");
            return false;
        }
        w->want_value = false;
        return jw_reserve(w, extra);
    }
    if (!jw_reserve(w, extra + 1)) return false;
    if (*t & JW_ITEMS) w->buf[w->len++] = ',';
    *t |= JW_ITEMS;
    return true;
}

static inline void jw_done(mts_jw *w)
{
    if (w->depth == 0) w->top_done = true;
}

static void jw_begin(mts_jw *w, bool obj)
{
    if (!jw_value(w, 1)) return;
    if (w->depth == MTS_JSON_MAX_DEPTH) {
        jw_misuse(w, "nesting deeper than %d", MTS_JSON_MAX_DEPTH);
        return;
    }
    w->stack[w->depth++] = obj ? JW_OBJ : 0;
    w->buf[w->len++] = obj ? '{' : '[';
}

static void jw_end(mts_jw *w, bool obj)
{
    if (w->status) return;
    if (w->depth == 0 || (w->stack[w->depth - 1] & JW_OBJ) != (obj ? JW_OBJ : 0)) {
        jw_misuse(w, "%s without a matching %s", obj ? "end_object" : "end_array",
                  obj ? "begin_object" : "begin_array");
        return;
    }
    if (w->want_value) {
        jw_misuse(w, "end_object right after a key");
        return;
    }
    if (!jw_reserve(w, 1)) return;
    w->depth--;
    w->buf[w->len++] = obj ? '}' : ']';
    jw_done(w);
}

void mts_jw_begin_object(mts_jw *w) { jw_begin(w, true); }
void mts_jw_end_object(mts_jw *w) { jw_end(w, true); }
void mts_jw_begin_array(mts_jw *w) { jw_begin(w, false); }
void mts_jw_end_array(mts_jw *w) { jw_end(w, false); }

static const char hexdig[] = "0123456789abcdef";

/* Appends the quoted, escaped string; space must already be reserved (6 * len + 2). */
static void jw_put_string(mts_jw *w, const char *str, size_t len)
{
    const uint8_t *s = (const uint8_t *)str;
    char *o = w->buf + w->len;
    *o++ = '"';
    size_t i = 0;
    while (i < len) {
        size_t j = i;
        while (j < len && str_plain[s[j]]) j++;
        memcpy(o, s + i, j - i);
        o += j - i;
        i = j;
        if (i == len) break;
        unsigned c = s[i];
        if (c == '"' || c == '\\') {
            *o++ = '\\';
            *o++ = (char)c;
            i++;
        } else if (c < 0x20) {
            *o++ = '\\';
            switch (c) {
            case '\b': *o++ = 'b'; break;
            case '\f': *o++ = 'f'; break;
            case '\n': *o++ = 'n'; break;
            case '\r': *o++ = 'r'; break;
            case '\t': *o++ = 't'; break;
            default:
                memcpy(o, "u00", 3);
                o[3] = hexdig[c >> 4];
                o[4] = hexdig[c & 15];
                o += 5;
            }
            i++;
        } else {
            size_t n = utf8_valid(s + i, len - i);
            if (n) {
                memcpy(o, s + i, n);
                o += n;
                i += n;
            } else { /* invalid UTF-8: U+FFFD */
                memcpy(o, "\\ufffd", 6);
                o += 6;
                i++;
            }
        }
    }
    *o++ = '"';
    w->len = (size_t)(o - w->buf);
}

static bool string_room(mts_jw *w, size_t len, size_t *need)
{
    if (len > (SIZE_MAX - 8) / 6) {
        if (!w->status) w->status = MTS_ENOMEM;
        return false;
    }
    *need = 6 * len + 3;
    return true;
}

void mts_jw_key_n(mts_jw *w, const char *key, size_t len)
{
    size_t need;
    if (w->status || !string_room(w, len, &need)) return;
    if (w->depth == 0 || !(w->stack[w->depth - 1] & JW_OBJ) || w->want_value) {
        jw_misuse(w, w->want_value ? "two keys in a row" : "a key outside an object");
        return;
    }
    if (!key) {
        jw_misuse(w, "a NULL key");
        return;
    }
    if (!jw_reserve(w, need + 1)) return;
    uint8_t *t = &w->stack[w->depth - 1];
    if (*t & JW_ITEMS) w->buf[w->len++] = ',';
    *t |= JW_ITEMS;
    jw_put_string(w, key, len);
    w->buf[w->len++] = ':';
    w->want_value = true;
}

void mts_jw_key(mts_jw *w, const char *key) { mts_jw_key_n(w, key, key ? strlen(key) : 0); }

void mts_jw_string_n(mts_jw *w, const char *s, size_t len)
{
    size_t need;
    if (!s) {
        mts_jw_null(w);
        return;
    }
    if (w->status || !string_room(w, len, &need) || !jw_value(w, need)) return;
    jw_put_string(w, s, len);
    jw_done(w);
}

void mts_jw_string(mts_jw *w, const char *s) { mts_jw_string_n(w, s, s ? strlen(s) : 0); }

void mts_jw_int(mts_jw *w, int64_t v)
{
    if (!jw_value(w, 20)) return;
    w->len += fmt_i64(v, w->buf + w->len);
    jw_done(w);
}

void mts_jw_uint(mts_jw *w, uint64_t v)
{
    if (!jw_value(w, 20)) return;
    w->len += fmt_u64(v, w->buf + w->len);
    jw_done(w);
}

void mts_jw_double(mts_jw *w, double v)
{
    if (!jw_value(w, MTS_JSON_DOUBLE_MAX)) return;
    w->len += fmt_double(v, w->buf + w->len);
    jw_done(w);
}

void mts_jw_float(mts_jw *w, float v)
{
    if (!jw_value(w, MTS_JSON_FLOAT_MAX)) return;
    w->len += fmt_float(v, w->buf + w->len);
    jw_done(w);
}

void mts_jw_bool(mts_jw *w, bool v)
{
    if (!jw_value(w, 5)) return;
    memcpy(w->buf + w->len, v ? "true" : "false", v ? 4 : 5);
    w->len += v ? 4 : 5;
    jw_done(w);
}

void mts_jw_null(mts_jw *w)
{
    if (!jw_value(w, 4)) return;
    memcpy(w->buf + w->len, "null", 4);
    w->len += 4;
    jw_done(w);
}

void mts_jw_raw(mts_jw *w, const char *json, size_t len)
{
    if (!json || !len) {
        jw_misuse(w, "an empty raw value");
        return;
    }
    if (!jw_value(w, len)) return;
    memcpy(w->buf + w->len, json, len);
    w->len += len;
    jw_done(w);
}

void mts_jw_tensor_data(mts_jw *w, mts_dtype dtype, const void *data, int64_t n)
{
    size_t per;
    switch (dtype) {
    case MTS_DTYPE_FLOAT: per = 17; break;
    case MTS_DTYPE_DOUBLE: per = MTS_JSON_DOUBLE_MAX + 1; break;
    case MTS_DTYPE_INT64: per = 21; break;
    case MTS_DTYPE_INT32: per = 12; break;
    case MTS_DTYPE_INT8: case MTS_DTYPE_UINT8: per = 5; break;
    case MTS_DTYPE_BOOL: per = 6; break;
    case MTS_DTYPE_FLOAT16: case MTS_DTYPE_BFLOAT16: per = 17; break;
    case MTS_DTYPE_INT16: case MTS_DTYPE_UINT16: per = 7; break;
    case MTS_DTYPE_UINT32: per = 12; break;
    case MTS_DTYPE_UINT64: per = 21; break;
    default: jw_misuse(w, "tensor data of type %s", mts_dtype_name(dtype)); return;
    }
    if (n < 0 || (n > 0 && !data)) {
        jw_misuse(w, "tensor data with %lld elements at %p", (long long)n, data);
        return;
    }
    if (!jw_value(w, 2)) return;
    w->buf[w->len++] = '[';
    const int64_t chunk = 4096;
    for (int64_t base = 0; base < n; base += chunk) {
        int64_t end = n - base < chunk ? n : base + chunk;
        if (!jw_reserve(w, (size_t)(end - base) * per + MTS_JSON_FLOAT_MAX)) return; /* + scratch room */
        char *o = w->buf + w->len;
        for (int64_t i = base; i < end; i++) {
            if (i) *o++ = ',';
            switch (dtype) {
            case MTS_DTYPE_FLOAT: o += fmt_float(((const float *)data)[i], o); break;
            case MTS_DTYPE_DOUBLE: o += fmt_double(((const double *)data)[i], o); break;
            case MTS_DTYPE_INT64: o += fmt_i64(((const int64_t *)data)[i], o); break;
            case MTS_DTYPE_INT32: o += fmt_i64(((const int32_t *)data)[i], o); break;
            case MTS_DTYPE_INT8: o += fmt_i64(((const int8_t *)data)[i], o); break;
            case MTS_DTYPE_UINT8: o += fmt_u64(((const uint8_t *)data)[i], o); break;
            case MTS_DTYPE_FLOAT16: o += fmt_float(mts_f16_to_f32(((const uint16_t *)data)[i]), o); break;
            case MTS_DTYPE_BFLOAT16: o += fmt_float(mts_bf16_to_f32(((const uint16_t *)data)[i]), o); break;
            case MTS_DTYPE_INT16: o += fmt_i64(((const int16_t *)data)[i], o); break;
            case MTS_DTYPE_UINT16: o += fmt_u64(((const uint16_t *)data)[i], o); break;
            case MTS_DTYPE_UINT32: o += fmt_u64(((const uint32_t *)data)[i], o); break;
            case MTS_DTYPE_UINT64: o += fmt_u64(((const uint64_t *)data)[i], o); break;
            default:
                if (((const uint8_t *)data)[i]) {
                    memcpy(o, "true", 4);
                    o += 4;
                } else {
                    memcpy(o, "false", 5);
                    o += 5;
                }
            }
        }
        w->len = (size_t)(o - w->buf);
    }
    if (!jw_reserve(w, 1)) return;
    w->buf[w->len++] = ']';
    jw_done(w);
}

int mts_jw_finish(mts_jw *w, const char **text, size_t *len, mts_err *err)
{
    if (w->status == MTS_ENOMEM) return mts_err_set(err, MTS_ENOMEM, "JSON writer: out of memory");
    if (w->status) return mts_err_set(err, w->status, "JSON writer: %s", w->what);
    if (w->depth) return mts_err_set(err, MTS_EINVAL, "JSON writer: %d unclosed container(s)", w->depth);
    if (!w->top_done) return mts_err_set(err, MTS_EINVAL, "JSON writer: nothing written");
    if (!jw_reserve(w, 0)) return mts_err_set(err, MTS_ENOMEM, "JSON writer: out of memory");
    w->buf[w->len] = '\0';
    if (text) *text = w->buf;
    if (len) *len = w->len;
    return 0;
}

char *mts_jw_take(mts_jw *w, size_t *len)
{
    if (mts_jw_finish(w, NULL, len, NULL)) return NULL;
    char *buf = w->buf;
    memset(w, 0, sizeof *w);
    return buf;
}
