/*
 * The broken-file corpus (tests/corpus/make_corpus.py) through the loader and executor: every
 * file must fail at the stage the manifest names with a message containing the expected text,
 * or (for random bit flips) either fail cleanly or load and run — never crash, hang or leak.
 * Run under ASan+UBSan in `make test`, which turns any memory error or leak into a failure.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "test_util.h"

static void run_one(const char *dir, const char *file, const char *phase, const char *expect, int *bad)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    mts_err err = {0};
    mts_model *m = NULL;
    int rc = mts_model_load(path, NULL, &m, &err);
    if (rc) {
        if (!strcmp(phase, "run")) {
            printf("FAIL %s: expected to load, got: %s\n", file, err.msg);
            (*bad)++;
        } else if (expect[0] && !strstr(err.msg, expect)) {
            printf("FAIL %s: message lacks '%s': %s\n", file, expect, err.msg);
            (*bad)++;
        } else if (!err.msg[0]) {
            printf("FAIL %s: error without a message\n", file);
            (*bad)++;
        } else {
            printf("ok   %-26s load error: %s\n", file, err.msg);
        }
        return;
    }
    if (!strcmp(phase, "load")) {
        printf("FAIL %s: loaded, expected a load error containing '%s'\n", file, expect);
        (*bad)++;
        mts_model_free(m);
        return;
    }
    mts_tensor *in = test_make_inputs(m, 1, 42);
    mts_model_info info;
    mts_model_get_info(m, &info);
    mts_ctx *ctx = NULL;
    const mts_tensor *outs[64];
    int inputs_small = 1;
    for (int i = 0; i < info.n_inputs; i++)
        if (mts_tensor_nbytes(&in[i]) > (64 << 20)) inputs_small = 0;
    rc = MTS_OK;
    if (inputs_small && info.n_outputs <= 64 && !(rc = mts_ctx_create(m, 1, &ctx, &err)))
        rc = mts_ctx_run(ctx, in, info.n_inputs, outs, &err);
    if (!strcmp(phase, "run")) {
        if (!rc || (expect[0] && !strstr(err.msg, expect))) {
            printf("FAIL %s: expected a run error containing '%s', got rc %d: %s\n", file, expect, rc, err.msg);
            (*bad)++;
        } else {
            printf("ok   %-26s run error: %s\n", file, err.msg);
        }
    } else {
        printf("ok   %-26s %s%s\n", file, rc ? "run error: " : "loaded and ran", rc ? err.msg : "");
    }
    mts_ctx_free(ctx);
    test_free_inputs(m, in);
    mts_model_free(m);
}

static void test_corpus(void **state)
{
    (void)state;
    char dir[4096], mpath[4200];
    const char *env = getenv("MTS_CORPUS_DIR");
    if (env) snprintf(dir, sizeof dir, "%s", env);
    else test_path(dir, sizeof dir, "tests/corpus/out");
    snprintf(mpath, sizeof mpath, "%s/manifest.tsv", dir);
    FILE *f = fopen(mpath, "r");
    if (!f) fail_msg("no corpus at %s: run tests/corpus/make_corpus.py (make test does)", mpath);
    char line[1024];
    int n = 0, bad = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *file = strtok(line, "\t"), *phase = strtok(NULL, "\t"), *expect = strtok(NULL, "\t");
        if (!file || !phase) continue;
        run_one(dir, file, phase, expect ? expect : "", &bad);
        n++;
    }
    fclose(f);
    printf("corpus: %d files, %d wrong\n", n, bad);
    assert_true(n >= 50);
    assert_int_equal(bad, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_corpus)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
