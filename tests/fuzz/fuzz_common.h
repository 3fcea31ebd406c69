/*
 * Helpers shared by the libFuzzer targets in this folder: splitting an input into a header line
 * and a payload, and a NUL-terminated copy of a byte range.
 */
#ifndef MTS_FUZZ_COMMON_H
#define MTS_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Splits data at its first '\n': *line gets a malloc'd NUL-terminated copy of what comes before
 * (at most cap bytes), *rest/*rest_len the bytes after it. Without a newline the line is empty
 * and rest is the whole input. Returns 0, or -1 when out of memory. */
static inline int fuzz_split_line(const uint8_t *data, size_t size, size_t cap, char **line,
                                  const uint8_t **rest, size_t *rest_len)
{
    const uint8_t *nl = memchr(data, '\n', size);
    size_t ll = nl ? (size_t)(nl - data) : 0;
    if (ll > cap) ll = cap;
    *line = malloc(ll + 1);
    if (!*line) return -1;
    memcpy(*line, data, ll);
    (*line)[ll] = '\0';
    *rest = nl ? nl + 1 : data;
    *rest_len = nl ? size - (size_t)(nl + 1 - data) : size;
    return 0;
}

/* A malloc'd copy of data with a NUL after it (NULL when out of memory). */
static inline char *fuzz_strndup(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s) return NULL;
    if (size) memcpy(s, data, size);
    s[size] = '\0';
    return s;
}

#endif
