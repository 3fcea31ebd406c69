/*
 * ONNX backend-test conformance runner.
 *
 * Walks directories of ONNX backend tests (each test: model.onnx plus test_data_set_N/ with
 * input_K.pb and output_K.pb serialized TensorProtos, as shipped by Debian's libonnx-testdata),
 * runs every data set through the engine and compares outputs within a tolerance of
 * |got - want| <= atol + rtol * |want|. A test is:
 *   pass         every output matches;
 *   unsupported  the engine declines it on purpose (unknown op, unsupported type or attribute
 *                combination: status MTS_EUNSUPPORTED) — listed with the reason under --verbose;
 *   fail         anything else: a wrong value, a shape mismatch, or an error.
 * Prints a per-op table and closes with `conformance: N passed, N failed, N skipped` where
 * skipped counts the unsupported tests. Exits 1 if any test failed. --backend runs the tests on one
 * backend (default: oneDNN + optimizer; reference: the plain-C kernels only).
 */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/engine.h"
#include "engine/seqval.h"

enum outcome { PASS, FAIL, UNSUP };

typedef struct op_row {
    char name[64];
    int n[3];
} op_row;

static struct {
    double rtol, atol;
    int verbose;
    int threads;
    const char *filter;
    const char *backend; /* --backend: NULL = $MTS_BACKEND or the build default */
    op_row ops[512];
    int n_ops;
    int total[3];
    int tol_override; /* a per-test tolerance is in force: it applies to double/float16/bfloat16 too */
} g = {1e-4, 2e-5, 0, 1, NULL, NULL, {{{0}, {0}}}, 0, {0}, 0};

/* Tests whose stored data contradicts their own model: a failure of one of them is counted as
 * unsupported, with the reason. */
static const struct {
    const char *name, *why;
} data_defects[] = {
    {"test_castlike_BFLOAT16_to_FLOAT", "the data feeds 'like' as [1], the model declares [3,4]"},
    {"test_castlike_BFLOAT16_to_FLOAT_expanded", "the data feeds 'like' as [1], the model declares [3,4]"},
    {"test_castlike_FLOAT_to_BFLOAT16", "the data feeds 'like' as [1], the model declares [3,4]"},
    {"test_castlike_FLOAT_to_BFLOAT16_expanded", "the data feeds 'like' as [1], the model declares [3,4]"},
};

/* Per-test tolerance overrides (--tolerances FILE): name, rtol, atol. */
static struct {
    char name[128];
    double rtol, atol;
} tol_over[64];
static int n_tol_over;

/* Tests listed as `TEST random` (--tolerances FILE): their outputs are random draws. */
static char random_tests[64][128];
static int n_random;
static bool values_random; /* the test running is one of them */

static void load_tolerances(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "conformance: cannot read %s\n", path);
        exit(2);
    }
    char line[512];
    while (fgets(line, sizeof line, f) && n_tol_over < 64) {
        if (line[0] == '#' || line[0] == '\n') continue;
        char word[16];
        if (sscanf(line, "%127s %lf %lf", tol_over[n_tol_over].name, &tol_over[n_tol_over].rtol,
                   &tol_over[n_tol_over].atol) == 3)
            n_tol_over++;
        else if (n_random < 64 && sscanf(line, "%127s %15s", random_tests[n_random], word) == 2 &&
                 !strcmp(word, "random"))
            n_random++;
    }
    fclose(f);
}

static void count_op(const char *op, enum outcome o)
{
    for (int i = 0; i < g.n_ops; i++)
        if (strcmp(g.ops[i].name, op) == 0) {
            g.ops[i].n[o]++;
            return;
        }
    if (g.n_ops < 512) {
        snprintf(g.ops[g.n_ops].name, sizeof g.ops[0].name, "%s", op);
        g.ops[g.n_ops].n[o] = 1;
        g.n_ops++;
    }
}

static int read_file(const char *path, void **data, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (n < 0) {
        fclose(f);
        return -1;
    }
    *data = malloc((size_t)n + 1);
    if (!*data || fread(*data, 1, (size_t)n, f) != (size_t)n) {
        free(*data);
        fclose(f);
        return -1;
    }
    fclose(f);
    *len = (size_t)n;
    return 0;
}

/* A TensorProto, or a SequenceProto / OptionalProto where the model declares that type. */
static int load_pb(const char *path, const mts_value *decl, mts_tensor *t, mts_err *err)
{
    void *data;
    size_t len;
    if (read_file(path, &data, &len)) return mts_err_set(err, MTS_EIO, "cannot read %s", path);
    int rc = decl && mts_dtype_is_seq(decl->dtype)       ? mts_seq_parse_pb(data, len, decl->dtype, t, err)
             : decl && decl->dtype == MTS_DTYPE_STRINGS ? mts_str_parse_pb(data, len, t, err)
                                                        : mts_tensor_parse_pb(data, len, t, NULL, err);
    free(data);
    if (rc) mts_err_prefix(err, "%s: ", path);
    return rc;
}

static bool is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

static bool compare_tensor(const mts_tensor *got, const mts_tensor *want, char *msg, size_t len);

/* Compares one output (a tensor, or a sequence / optional element by element); writes the first
 * mismatch into msg. */
static bool compare(const mts_tensor *got, const mts_tensor *want, char *msg, size_t len)
{
    mts_err err = {0};
    if (want->dtype == MTS_DTYPE_STRINGS && got->dtype == MTS_DTYPE_STRINGS) {
        mts_strv gs, ws;
        char a[128], b[128];
        if (mts_str_view(got, &gs, &err) || mts_str_view(want, &ws, &err)) {
            snprintf(msg, len, "%s", err.msg);
            return false;
        }
        mts_tensor gsh = {MTS_DTYPE_UINT8, gs.rank, {0}, NULL}, wsh = {MTS_DTYPE_UINT8, ws.rank, {0}, NULL};
        memcpy(gsh.dims, gs.dims, sizeof gsh.dims);
        memcpy(wsh.dims, ws.dims, sizeof wsh.dims);
        if (!mts_shape_equal(&gsh, &wsh)) {
            snprintf(msg, len, "shape %s, expected %s", mts_shape_str(&gsh, a, sizeof a), mts_shape_str(&wsh, b, sizeof b));
            return false;
        }
        for (int64_t i = 0; i < ws.count; i++) {
            int64_t gl, wl;
            const char *gp = mts_str_at(&gs, i, &gl), *wp = mts_str_at(&ws, i, &wl);
            if (gl != wl || memcmp(gp, wp, (size_t)gl)) {
                snprintf(msg, len, "string %lld is '%.*s', expected '%.*s'", (long long)i, (int)(gl > 60 ? 60 : gl), gp,
                         (int)(wl > 60 ? 60 : wl), wp);
                return false;
            }
        }
        return true;
    }
    if (!mts_dtype_is_blob(want->dtype) && !mts_dtype_is_blob(got->dtype)) return compare_tensor(got, want, msg, len);
    mts_seqv gv, wv;
    if (got->dtype != want->dtype) {
        snprintf(msg, len, "got a %s, expected a %s", mts_dtype_name(got->dtype), mts_dtype_name(want->dtype));
        return false;
    }
    if (mts_seq_view(got, &gv, &err) || mts_seq_view(want, &wv, &err)) {
        snprintf(msg, len, "%s", err.msg);
        return false;
    }
    if (gv.kind != wv.kind || gv.count != wv.count) {
        snprintf(msg, len, "kind %d with %lld elements, expected kind %d with %lld", gv.kind, (long long)gv.count,
                 wv.kind, (long long)wv.count);
        return false;
    }
    for (int64_t i = 0; i < wv.count; i++) {
        mts_tensor ge, we;
        char sub[200];
        mts_seq_item(&gv, i, &ge);
        mts_seq_item(&wv, i, &we);
        if (!compare_tensor(&ge, &we, sub, sizeof sub)) {
            snprintf(msg, len, "element %lld: %s", (long long)i, sub);
            return false;
        }
    }
    return true;
}

static bool compare_tensor(const mts_tensor *got, const mts_tensor *want, char *msg, size_t len)
{
    char a[128], b[128];
    if (got->dtype != want->dtype) {
        snprintf(msg, len, "dtype %s, expected %s", mts_dtype_name(got->dtype), mts_dtype_name(want->dtype));
        return false;
    }
    if (!mts_shape_equal(got, want)) {
        snprintf(msg, len, "shape %s, expected %s", mts_shape_str(got, a, sizeof a), mts_shape_str(want, b, sizeof b));
        return false;
    }
    if (values_random) return true; /* random draws: dtype and shape are all that can be checked */
    int64_t n = mts_tensor_numel(want);
    for (int64_t i = 0; i < n; i++) {
        double x = mts_tensor_get_f64(got, i), y = mts_tensor_get_f64(want, i);
        bool fp = want->dtype == MTS_DTYPE_FLOAT ||
                  (g.tol_override && (want->dtype == MTS_DTYPE_DOUBLE || want->dtype == MTS_DTYPE_FLOAT16 ||
                                      want->dtype == MTS_DTYPE_BFLOAT16));
        if (fp) {
            if (isnan(x) && isnan(y)) continue;
            if (isinf(y) && x == y) continue;
            if (fabs(x - y) <= g.atol + g.rtol * fabs(y)) continue;
        } else if (x == y) {
            continue;
        }
        snprintf(msg, len, "element %lld is %.9g, expected %.9g", (long long)i, x, y);
        return false;
    }
    return true;
}

static enum outcome run_test_inner(const char *dir, char *why, size_t wlen, mts_model **model_out)
{
    char path[4096];
    mts_err err = {0};
    mts_model *m = NULL;
    snprintf(path, sizeof path, "%s/model.onnx", dir);
    mts_load_opts opts = {0};
    opts.backend = g.backend;
    int rc = mts_model_load(path, &opts, &m, &err);
    if (rc) {
        snprintf(why, wlen, "%s", err.msg);
        return rc == MTS_EUNSUPPORTED ? UNSUP : FAIL;
    }
    *model_out = m;
    mts_model_info info;
    mts_model_get_info(m, &info);
    mts_ctx *ctx = NULL;
    if (mts_ctx_create(m, g.threads, &ctx, &err)) {
        snprintf(why, wlen, "%s", err.msg);
        return FAIL;
    }
    enum outcome result = PASS;
    int sets = 0;
    for (int ds = 0; ds < 64 && result == PASS; ds++) {
        char dsdir[3000];
        snprintf(dsdir, sizeof dsdir, "%s/test_data_set_%d", dir, ds);
        if (!is_dir(dsdir)) break;
        sets++;
        mts_tensor in[64] = {{0}}, want[64] = {{0}};
        int n_in = 0, n_want = 0;
        for (; n_in < 64; n_in++) {
            snprintf(path, sizeof path, "%s/input_%d.pb", dsdir, n_in);
            if (!exists(path)) break;
            if ((rc = load_pb(path, n_in < info.n_inputs ? mts_model_input(m, n_in) : NULL, &in[n_in], &err))) {
                snprintf(why, wlen, "%s", err.msg);
                result = rc == MTS_EUNSUPPORTED ? UNSUP : FAIL;
                break;
            }
        }
        for (; result == PASS && n_want < 64; n_want++) {
            snprintf(path, sizeof path, "%s/output_%d.pb", dsdir, n_want);
            if (!exists(path)) break;
            if ((rc = load_pb(path, n_want < info.n_outputs ? mts_model_output(m, n_want) : NULL, &want[n_want],
                              &err))) {
                snprintf(why, wlen, "%s", err.msg);
                result = rc == MTS_EUNSUPPORTED ? UNSUP : FAIL;
                break;
            }
        }
        if (result == PASS && n_in != info.n_inputs) {
            /* Some tests feed fewer inputs than the graph declares (optional inputs). */
            snprintf(why, wlen, "test feeds %d inputs, model declares %d", n_in, info.n_inputs);
            result = UNSUP;
        }
        /* ONNX's bfloat16 test data (onnx 1.12) is stored as uint16 tensors of the same bits. */
        for (int i = 0; result == PASS && i < n_in && i < info.n_inputs; i++)
            if (in[i].dtype == MTS_DTYPE_UINT16 && mts_model_input(m, i)->dtype == MTS_DTYPE_BFLOAT16)
                in[i].dtype = MTS_DTYPE_BFLOAT16;
        for (int i = 0; result == PASS && i < n_want && i < info.n_outputs; i++)
            if (want[i].dtype == MTS_DTYPE_UINT16 && mts_model_output(m, i)->dtype == MTS_DTYPE_BFLOAT16)
                want[i].dtype = MTS_DTYPE_BFLOAT16;
        if (result == PASS) {
            const mts_tensor *outs[64];
            rc = mts_ctx_run(ctx, in, n_in, outs, &err);
            if (rc) {
                snprintf(why, wlen, "%s", err.msg);
                result = rc == MTS_EUNSUPPORTED ? UNSUP : FAIL;
            } else if (n_want != info.n_outputs) {
                snprintf(why, wlen, "test expects %d outputs, model has %d", n_want, info.n_outputs);
                result = FAIL;
            } else {
                for (int o = 0; o < n_want; o++) {
                    char msg[256];
                    if (!compare(outs[o], &want[o], msg, sizeof msg)) {
                        snprintf(why, wlen, "data set %d output %d ('%s'): %s", ds, o, mts_model_output(m, o)->name, msg);
                        result = FAIL;
                        break;
                    }
                }
            }
        }
        for (int i = 0; i < n_in; i++) free(in[i].data);
        for (int i = 0; i < n_want; i++) free(want[i].data);
    }
    if (result == PASS && sets == 0) {
        snprintf(why, wlen, "no test_data_set_N directories");
        result = FAIL;
    }
    mts_ctx_free(ctx);
    return result;
}

static enum outcome run_test(const char *dir, char *why, size_t wlen, mts_model **model_out)
{
    const char *base = strrchr(dir, '/');
    base = base ? base + 1 : dir;
    double saved_rtol = g.rtol, saved_atol = g.atol;
    for (int i = 0; i < n_tol_over; i++)
        if (!strcmp(tol_over[i].name, base)) {
            g.rtol = tol_over[i].rtol;
            g.atol = tol_over[i].atol;
            g.tol_override = 1;
        }
    enum outcome o = run_test_inner(dir, why, wlen, model_out);
    g.rtol = saved_rtol;
    g.atol = saved_atol;
    g.tol_override = 0;
    for (size_t i = 0; o == FAIL && i < sizeof data_defects / sizeof data_defects[0]; i++)
        if (!strcmp(data_defects[i].name, base)) {
            char detail[512];
            snprintf(detail, sizeof detail, "%s", why);
            snprintf(why, wlen, "test data contradicts the model: %s (%s)", data_defects[i].why, detail);
            o = UNSUP;
        }
    return o;
}

/* run_test, except for a test listed as random: it runs with any value accepted (errors,
 * output types and shapes still count), and a run that completes is reported as unsupported, since
 * random draws cannot reproduce the stored ones. */
static enum outcome run_test_or_random(const char *dir, char *why, size_t wlen, mts_model **model_out)
{
    const char *base = strrchr(dir, '/');
    base = base ? base + 1 : dir;
    bool random = false;
    for (int i = 0; i < n_random; i++)
        if (!strcmp(random_tests[i], base)) random = true;
    if (!random) return run_test(dir, why, wlen, model_out);
    values_random = true;
    enum outcome o = run_test_inner(dir, why, wlen, model_out);
    values_random = false;
    if (o == PASS) {
        o = UNSUP;
        snprintf(why, wlen, "outputs are random draws, which cannot reproduce the stored ones (ran; shapes checked)");
    }
    return o;
}

static void record(const char *dir, enum outcome o, const char *why, mts_model *m)
{
    static const char *names[] = {"pass", "FAIL", "unsupported"};
    const char *base = strrchr(dir, '/');
    base = base ? base + 1 : dir;
    g.total[o]++;
    if (o == FAIL || g.verbose) printf("%-12s %s%s%s\n", names[o], base, why[0] ? ": " : "", why);
    /* Attribute the outcome to every distinct op of the model (one op for node tests). */
    if (m) {
        mts_model_info info;
        mts_model_get_info(m, &info);
        const char *seen[256];
        int n_seen = 0;
        for (int i = 0; i < info.n_nodes && n_seen < 256; i++) {
            const char *op = mts_model_node(m, i)->op_type;
            bool dup = false;
            for (int j = 0; j < n_seen; j++) dup |= strcmp(seen[j], op) == 0;
            if (!dup) {
                seen[n_seen++] = op;
                count_op(op, o);
            }
        }
    } else {
        /* Not loadable: take the op named in "unsupported op 'X'" when present. */
        const char *q = strstr(why, "op '");
        char op[64] = "(load)";
        if (q) {
            q += 4;
            size_t l = strcspn(q, "'");
            if (l > 0 && l < sizeof op) {
                memcpy(op, q, l);
                op[l] = '\0';
            }
        }
        count_op(op, o);
    }
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int cmp_op(const void *a, const void *b)
{
    return strcmp(((const op_row *)a)->name, ((const op_row *)b)->name);
}

static void run_dir(const char *dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/model.onnx", dir);
    if (exists(path)) {
        if (g.filter && !strstr(dir, g.filter)) return;
        char why[1024] = "";
        mts_model *m = NULL;
        enum outcome o = run_test_or_random(dir, why, sizeof why, &m);
        record(dir, o, why, m);
        mts_model_free(m);
        return;
    }
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "conformance: cannot open %s\n", dir);
        g.total[FAIL]++;
        return;
    }
    char **names = NULL;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        names = realloc(names, sizeof *names * (n + 1));
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (is_dir(path)) run_dir(path);
        free(names[i]);
    }
    free(names);
}

int main(int argc, char **argv)
{
    int first = 1;
    for (; first < argc && argv[first][0] == '-'; first++) {
        const char *a = argv[first];
        if (!strcmp(a, "--verbose") || !strcmp(a, "-v")) g.verbose = 1;
        else if (!strcmp(a, "--filter") && first + 1 < argc) g.filter = argv[++first];
        else if (!strcmp(a, "--threads") && first + 1 < argc) g.threads = atoi(argv[++first]);
        else if (!strcmp(a, "--rtol") && first + 1 < argc) g.rtol = atof(argv[++first]);
        else if (!strcmp(a, "--atol") && first + 1 < argc) g.atol = atof(argv[++first]);
        else if (!strcmp(a, "--tolerances") && first + 1 < argc) load_tolerances(argv[++first]);
        else if (!strcmp(a, "--backend") && first + 1 < argc) g.backend = argv[++first];
        else {
            printf("usage: mts-conformance [--verbose] [--filter SUBSTRING] [--threads N] [--rtol R] [--atol A]\n"
                   "                       [--tolerances FILE] [--backend default|reference] DIR...\n"
                   "  --backend picks the kernels (default: $MTS_BACKEND, else the build's default)\n"
                   "  DIR is an ONNX backend test directory (with model.onnx) or a folder of them,\n"
                   "  e.g. /usr/share/libonnx-testdata/data/node\n");
            return strcmp(a, "--help") == 0 ? 0 : 2;
        }
    }
    if (first >= argc) {
        fprintf(stderr, "mts-conformance: no test directory given (try --help)\n");
        return 2;
    }
    for (int i = first; i < argc; i++) run_dir(argv[i]);
    qsort(g.ops, (size_t)g.n_ops, sizeof g.ops[0], cmp_op);
    printf("\n%-28s %6s %6s %12s\n", "op", "pass", "fail", "unsupported");
    for (int i = 0; i < g.n_ops; i++)
        printf("%-28s %6d %6d %12d\n", g.ops[i].name, g.ops[i].n[PASS], g.ops[i].n[FAIL], g.ops[i].n[UNSUP]);
    printf("\n%d tests unsupported (unknown op, type or attribute combination; --verbose lists reasons)\n",
           g.total[UNSUP]);
    printf("conformance: %d passed, %d failed, %d skipped\n", g.total[PASS], g.total[FAIL], g.total[UNSUP]);
    return g.total[FAIL] ? 1 : 0;
}
