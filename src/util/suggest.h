/*
 * "Did you mean ...?" suggestions: the known name nearest to a misspelt one by edit distance
 * (Damerau-Levenshtein, optimal string alignment: insert, delete, substitute, swap two adjacent
 * characters, each costing 1). Used for unknown configuration keys and command-line options.
 */
#ifndef MTS_UTIL_SUGGEST_H
#define MTS_UTIL_SUGGEST_H

#include <stddef.h>

/* Edit distance between a and b; names longer than 127 bytes return a large number. */
int mts_edit_distance(const char *a, const char *b);
/* The entry of names[0..n) nearest to word, or NULL when none is close enough to be a likely
 * typo: the distance must be at most 2, or at most a third of word's length when that is larger
 * (at most 4), and below the word's own length. Ties go to the earlier entry. */
const char *mts_suggest(const char *word, const char *const *names, size_t n);

#endif
