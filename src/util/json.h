/*
 * JSON for the KServe v2 REST front end: a strict RFC 8259 parser producing a read-only DOM,
 * and a streaming writer into a growable buffer.
 *
 * Parser. mts_json_parse reads one complete document from (buf, len) -- buf need not be
 * NUL-terminated -- into a DOM whose nodes and strings live in one arena owned by an
 * mts_json_doc (a few big blocks, released by one mts_json_free). It is iterative, never
 * recursing; nesting is limited to MTS_JSON_MAX_DEPTH containers. Every malformed input is
 * rejected with MTS_EINVAL and a message naming what is wrong and where, e.g.
 *     JSON: expected ',' or ']' at byte 1234 (line 3, column 17), found 'x'
 * (bytes count from 0, lines and columns -- in bytes -- from 1). Rejected: empty input,
 * truncation, trailing data, invalid literals, leading zeros, '+1', '.5', '1.', NaN/Infinity,
 * numbers whose magnitude overflows a double (underflow quietly becomes 0 or a subnormal),
 * unescaped control characters, invalid escapes, unpaired UTF-16 surrogates in \u escapes,
 * invalid UTF-8 (overlong, surrogate or > U+10FFFF), and a byte-order mark. Duplicate object
 * keys are accepted and kept; mts_json_get returns the LAST one (as JavaScript and Python do).
 * Numbers are converted with the C locale regardless of setlocale.
 *
 * Numbers keep a double and, when the literal's exact value is an integer that fits int64
 * ("42", "-7", "1.0", "3e2" -- at most 19 significant digits), that int64 exactly, flagged so
 * KServe INT64 tensors never pass through a double. Strings are decoded, NUL-terminated and
 * carry their length (they may contain "\u0000"). Arrays and objects store their children in
 * one contiguous run of 16-byte nodes (an object as key, value, key, value, ... in input
 * order), so element access is O(1) and key lookup a linear scan.
 *
 * Memory. Every value (object keys included) costs one 16-byte node; strings cost their decoded
 * length + 1, rounded up to 8. A value takes at least 2 input bytes counting its separator, so
 * the DOM holds at most 8 * len + O(1) bytes of payload ("[0,0,0,...]" and "[\"\",\"\",...]"
 * are the worst cases: 16 bytes of node, or 24 with an empty string, per 2 or 3 input bytes).
 * Arena blocks add at most 71% to that (a block is given up with at most 1/8 of it free; the
 * newest block, possibly unused, is at most half the size of all before it), hence the bound
 *     mts_json_doc_bytes(doc) <= 14 * len + 64 KiB.
 * Typical tensor data is far below that: 1M floats printed with 9 digits (~11 bytes each) take
 * ~1.5 bytes of DOM per input byte. While parsing, children of still-open containers sit on a
 * scratch stack of the same 16-byte nodes (doubling growth) that is freed -- or, for a large
 * array, adopted as its final storage without a copy -- before mts_json_parse returns.
 * Parsing is linear in len, and the peak during a parse stays close to the final DOM (measured:
 * 15.5 MB above the input while parsing 1M floats into a 16.0 MB DOM).
 * Everything here is reentrant: a document or writer belongs to one thread at a time, and the
 * only shared state is a lazily created "C" locale (pthread_once).
 *
 * Writer. mts_jw builds JSON text in a growable buffer: containers, keys and scalars, with
 * commas and colons inserted automatically. Errors are sticky: calls return nothing, and
 * mts_jw_finish reports the first problem (out of memory, or misuse such as a key outside an
 * object or an unbalanced end). Strings are escaped (quote, backslash, control characters);
 * valid UTF-8 passes through and invalid byte sequences become U+FFFD so the output is always
 * valid JSON. NaN and infinities are written as null (JSON has no spelling for them). Floats are
 * written with the fewest digits (at most 9) that read back to the same float32 through a
 * correctly rounding parser AND through strtod followed by a cast to float (checked for all 2^31
 * non-negative finite floats); a decimal lying exactly halfway between two floats is never
 * chosen, which costs one extra digit for ~0.4% of floats. Notation is as %g: plain for
 * 1e-4 <= |v| < 1e9 ("0.1", "-2.5", "16777216"), else "1.5e-7" / "3.4028235e38", so the text
 * is never longer than "%.9g". Doubles get the fewest of 15..17 digits that read back to the
 * same double ("0.1", "1e+21").
 */
#ifndef MTS_UTIL_JSON_H
#define MTS_UTIL_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/tensor.h"
#include "util/status.h"

#define MTS_JSON_MAX_DEPTH 64

typedef enum mts_json_type {
    MTS_JSON_NONE = 0, /* no value: a NULL pointer (missing key, index out of range) */
    MTS_JSON_NULL,
    MTS_JSON_BOOL,
    MTS_JSON_NUMBER,
    MTS_JSON_STRING,
    MTS_JSON_ARRAY,
    MTS_JSON_OBJECT,
} mts_json_type;

typedef struct mts_json mts_json;         /* one value in a parsed document (read-only) */
typedef struct mts_json_doc mts_json_doc; /* a parsed document: owns every node and string */

/* ---- parsing ------------------------------------------------------------------------------ */

/* Parses the complete document in buf[0..len) (len < 4 GiB, else MTS_ELIMIT). On success *out
 * owns the DOM; on failure *out is NULL and err says what and where (MTS_EINVAL), or MTS_ENOMEM. */
int mts_json_parse(const char *buf, size_t len, mts_json_doc **out, mts_err *err);
const mts_json *mts_json_root(const mts_json_doc *doc);
/* Frees the document and every value in it. NULL is a no-op. */
void mts_json_free(mts_json_doc *doc);
/* Bytes the document holds (arena blocks and bookkeeping). */
size_t mts_json_doc_bytes(const mts_json_doc *doc);

/* Name of a type ("array", "number", ...). */
const char *mts_json_type_name(mts_json_type t);

/* ---- access (every accessor accepts NULL and returns the neutral answer) ------------------- */

mts_json_type mts_json_type_of(const mts_json *v);
#define mts_json_type(v) mts_json_type_of(v)
/* Member of an object by key (NUL-terminated, or key_len bytes); NULL if v is not an object
 * or has no such key. With duplicate keys the last one wins. O(members). */
const mts_json *mts_json_get(const mts_json *obj, const char *key);
const mts_json *mts_json_get_n(const mts_json *obj, const char *key, size_t key_len);
/* Elements of an array or members of an object; 0 for anything else. */
size_t mts_json_len(const mts_json *v);
/* Element i of an array, or the value of member i of an object; NULL when out of range. */
const mts_json *mts_json_at(const mts_json *arr, size_t i);
/* Key of member i of an object (NUL-terminated; key_len, if not NULL, gets its length). */
const char *mts_json_key_at(const mts_json *obj, size_t i);
const char *mts_json_key_at_n(const mts_json *obj, size_t i, size_t *key_len);
/* Decoded string (NUL-terminated) and its length; NULL if v is not a string. */
const char *mts_json_str(const mts_json *v, size_t *len);
/* Value of a number (correctly rounded); NaN if v is not a number. */
double mts_json_num(const mts_json *v);
/* True when v is a number whose exact value is an integer that fits int64. */
bool mts_json_is_int(const mts_json *v);
/* Exact int64 value of v: MTS_OK, or MTS_EINVAL (out untouched) if v is not such a number. */
int mts_json_int(const mts_json *v, int64_t *out);
/* Value of a bool; false for anything else. */
bool mts_json_bool(const mts_json *v);

/* Number of leaves (non-array values) in a possibly nested array; 1 for a scalar, 0 for NULL.
 * Lets a caller compare the data's element count with a shape before flattening. */
int64_t mts_json_numel(const mts_json *v);

/* Flattens a (possibly nested, row-major) array of numbers/bools -- or a single number/bool --
 * into out, n_expected elements of dtype FLOAT, DOUBLE, FLOAT16, BFLOAT16 (stored as their
 * 16-bit patterns), INT64/32/16/8, UINT64/32/16/8 or BOOL. Only the
 * leaf count is checked against n_expected, not the nesting. Conversions: to float types,
 * rounding to nearest (magnitudes beyond the type's range are errors); to integer types, only exact integers
 * within the type's range; to bool, true/false/0/1; bools count as 1/0 for numeric types.
 * Errors (MTS_EINVAL; out's contents then unspecified):
 *     "data has 5 elements, expected 6"
 *     "data element 4 is a string, expected a number or bool"
 *     "data element 2 (300) is out of range for uint8"
 *     "data element 1 (1.5) is not an integer (int64)"
 * and MTS_EUNSUPPORTED for other dtypes. */
int mts_json_flatten(const mts_json *arr, mts_dtype dtype, void *out, int64_t n_expected,
                     mts_err *err);

/* ---- writing ------------------------------------------------------------------------------- */

typedef struct mts_jw {
    char *buf;   /* the text so far (NUL-terminated by mts_jw_finish) */
    size_t len;  /* its length */
    size_t cap;
    int status;  /* first error, sticky: MTS_ENOMEM or MTS_EINVAL (misuse) */
    char what[96]; /* description of a misuse */
    int depth;
    bool top_done;  /* a complete top-level value has been written */
    bool want_value; /* a key was written; a value must follow */
    uint8_t stack[MTS_JSON_MAX_DEPTH]; /* per open container: kind (bit 0: object), bit 1: has items */
} mts_jw;

void mts_jw_init(mts_jw *w);
/* Releases the buffer; the writer may be initialised again. */
void mts_jw_free(mts_jw *w);
/* Empties the writer for a new document, keeping the buffer's memory. */
void mts_jw_reset(mts_jw *w);
/* Checks that exactly one complete value was written and no error occurred. On success
 * text and len (either may be NULL) get the NUL-terminated output, still owned by w. */
int mts_jw_finish(mts_jw *w, const char **text, size_t *len, mts_err *err);
/* Hands the buffer (malloc'd, NUL-terminated) to the caller and resets w; NULL if
 * mts_jw_finish would fail (w is then unchanged). */
char *mts_jw_take(mts_jw *w, size_t *len);

void mts_jw_begin_object(mts_jw *w);
void mts_jw_end_object(mts_jw *w);
void mts_jw_begin_array(mts_jw *w);
void mts_jw_end_array(mts_jw *w);
/* Writes a member key inside an object; the next call writes its value. */
void mts_jw_key(mts_jw *w, const char *key);
void mts_jw_key_n(mts_jw *w, const char *key, size_t len);
void mts_jw_string(mts_jw *w, const char *s); /* NULL writes null */
void mts_jw_string_n(mts_jw *w, const char *s, size_t len);
void mts_jw_int(mts_jw *w, int64_t v);
void mts_jw_uint(mts_jw *w, uint64_t v);
void mts_jw_double(mts_jw *w, double v); /* NaN/inf -> null */
void mts_jw_float(mts_jw *w, float v);   /* shortest float32 round trip; NaN/inf -> null */
void mts_jw_bool(mts_jw *w, bool v);
void mts_jw_null(mts_jw *w);
/* Writes len bytes of already-serialised JSON as one value (not checked). */
void mts_jw_raw(mts_jw *w, const char *json, size_t len);
/* Writes a flat array of n elements of tensor data: FLOAT, DOUBLE, FLOAT16/BFLOAT16 (16-bit
 * patterns, written as the numbers they hold), INT64/32/16/8, UINT64/32/16/8 or BOOL (as
 * true/false). Other dtypes are a misuse (MTS_EINVAL). */
void mts_jw_tensor_data(mts_jw *w, mts_dtype dtype, const void *data, int64_t n);

/* Formats v into buf (at least MTS_JSON_FLOAT_MAX bytes: the text is at most 16 bytes, the rest
 * is scratch) as mts_jw_float would, NUL-terminated; returns the length. Exposed for tests and
 * for callers building text by hand. */
#define MTS_JSON_FLOAT_MAX 32
size_t mts_json_format_float(float v, char *buf);
#define MTS_JSON_DOUBLE_MAX 32
size_t mts_json_format_double(double v, char *buf);

#endif
