/*
 * mts-tokenize: the tokenizer test driver. Loads a tokenizer (vocab.txt or tokenizer.json) and
 * encodes texts read as JSON strings, one per line, printing one line of space-separated ids per
 * text (or "ERROR <message>"). Used by tests/text/test_tokenizer_oracle.py to compare with the
 * reference implementation, and to measure tokens per second (--bench N: encode everything N
 * times, print the rate to stderr).
 *
 *     mts-tokenize [--lowercase 0|1] [--max N] [--types] [--bench N] TOKENIZER TEXTS.jsonl
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "text/tokenizer.h"
#include "util/json.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    int lowercase = -1, max = 0, types = 0, bench = 0;
    int i = 1;
    for (; i < argc && argv[i][0] == '-' && argv[i][1] == '-'; i++) {
        if (!strcmp(argv[i], "--lowercase") && i + 1 < argc) lowercase = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--max") && i + 1 < argc) max = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--bench") && i + 1 < argc) bench = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--types")) types = 1;
        else {
            fprintf(stderr, "mts-tokenize: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (argc - i != 2) {
        fprintf(stderr, "usage: mts-tokenize [--lowercase 0|1] [--max N] [--types] [--bench N] TOKENIZER TEXTS.jsonl\n");
        return 2;
    }
    char err[512];
    mts_tokenizer *t = mts_tokenizer_load(argv[i], lowercase, err, sizeof err);
    if (!t) {
        fprintf(stderr, "mts-tokenize: %s\n", err);
        return 1;
    }
    FILE *f = fopen(argv[i + 1], "rb");
    if (!f) {
        perror(argv[i + 1]);
        return 1;
    }
    char **texts = NULL;
    size_t *lens = NULL;
    int n = 0, cap = 0;
    char *line = NULL;
    size_t lcap = 0;
    ssize_t ll;
    while ((ll = getline(&line, &lcap, f)) > 0) {
        mts_json_doc *doc;
        mts_err e = {0};
        if (mts_json_parse(line, (size_t)ll, &doc, &e)) {
            fprintf(stderr, "mts-tokenize: line %d: %s\n", n + 1, e.msg);
            return 1;
        }
        size_t sl;
        const char *s = mts_json_str(mts_json_root(doc), &sl);
        if (!s) {
            fprintf(stderr, "mts-tokenize: line %d is not a JSON string\n", n + 1);
            return 1;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 256;
            texts = realloc(texts, (size_t)cap * sizeof *texts);
            lens = realloc(lens, (size_t)cap * sizeof *lens);
        }
        texts[n] = malloc(sl + 1);
        memcpy(texts[n], s, sl + 1);
        lens[n] = sl;
        n++;
        mts_json_free(doc);
    }
    free(line);
    fclose(f);
    int idcap = max > 0 ? max : 1 << 20;
    int64_t *ids = malloc((size_t)idcap * sizeof *ids), *tids = malloc((size_t)idcap * sizeof *tids);
    for (int k = 0; k < n; k++) {
        int m = mts_tokenize(t, texts[k], lens[k], max, ids, tids, idcap, err, sizeof err);
        if (m < 0) {
            printf("ERROR %s\n", err);
            continue;
        }
        for (int j = 0; j < m; j++) printf(j ? " %lld" : "%lld", (long long)ids[j]);
        if (types) {
            printf(" | ");
            for (int j = 0; j < m; j++) printf(j ? " %lld" : "%lld", (long long)tids[j]);
        }
        printf("\n");
    }
    if (bench > 0) {
        long long tokens = 0;
        double t0 = now_s();
        for (int r = 0; r < bench; r++)
            for (int k = 0; k < n; k++) {
                int m = mts_tokenize(t, texts[k], lens[k], max, ids, NULL, idcap, err, sizeof err);
                if (m > 0) tokens += m;
            }
        double dt = now_s() - t0;
        fprintf(stderr, "bench: %d texts x %d, %lld tokens in %.3f s: %.0f tokens/s, %.1f us/text\n", n, bench, tokens,
                dt, (double)tokens / dt, dt * 1e6 / ((double)n * bench));
    }
    for (int k = 0; k < n; k++) free(texts[k]);
    free(texts);
    free(lens);
    free(ids);
    free(tids);
    mts_tokenizer_free(t);
    return 0;
}
