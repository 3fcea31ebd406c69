/*
 * Edit distance (optimal string alignment) and the nearest-name suggestion built on it; see
 * suggest.h.
 */
#include "util/suggest.h"

#include <string.h>

#define SUGGEST_MAX_LEN 127

int mts_edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > SUGGEST_MAX_LEN || lb > SUGGEST_MAX_LEN) return 1 << 20;
    /* three rows: i-2, i-1, i */
    int rows[3][SUGGEST_MAX_LEN + 1];
    for (size_t j = 0; j <= lb; j++) rows[0][j] = (int)j;
    int *pp = NULL, *p = rows[0], *c = rows[1];
    for (size_t i = 1; i <= la; i++) {
        c[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int cost = a[i - 1] != b[j - 1];
            int v = p[j] + 1;                            /* delete */
            if (c[j - 1] + 1 < v) v = c[j - 1] + 1;      /* insert */
            if (p[j - 1] + cost < v) v = p[j - 1] + cost; /* substitute */
            if (pp && i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && pp[j - 2] + 1 < v)
                v = pp[j - 2] + 1;                       /* swap */
            c[j] = v;
        }
        int *spare = pp ? pp : rows[2];
        pp = p;
        p = c;
        c = spare;
    }
    return p[lb];
}

const char *mts_suggest(const char *word, const char *const *names, size_t n)
{
    size_t len = strlen(word);
    int limit = (int)(len / 3);
    if (limit < 2) limit = 2;
    if (limit > 4) limit = 4;
    if ((size_t)limit >= len) limit = len > 0 ? (int)len - 1 : 0;
    const char *best = NULL;
    int best_d = limit + 1;
    for (size_t i = 0; i < n; i++) {
        int d = mts_edit_distance(word, names[i]);
        if (d < best_d) {
            best_d = d;
            best = names[i];
        }
    }
    return best;
}
