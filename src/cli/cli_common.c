/*
 * Helpers shared by the engine-facing subcommands: timed model loading, `--dim` overrides of
 * symbolic dimensions, and concrete input shapes derived from a model's declared inputs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "config/config.h"

double mts_cli_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int mts_cli_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

const char *mts_cli_token(void)
{
    const char *t = getenv("MTSERVE_TOKEN");
    return t && *t && !strpbrk(t, "\r\n") ? t : NULL;
}

const char *mts_cli_auth_header(void)
{
    static char line[600];
    static int done;
    if (!done) { /* first call on the main thread, before any client thread starts */
        const char *t = mts_cli_token();
        if (t && strlen(t) < sizeof line - 32) snprintf(line, sizeof line, "Authorization: Bearer %s\r\n", t);
        done = 1;
    }
    return line;
}

const char *mts_cli_precision;
double mts_cli_max_error;

int mts_cli_load(const char *path, mts_model **m, double *load_ms)
{
    mts_err err = {0};
    double t0 = mts_cli_now_ms();
    mts_load_opts o = {0};
    o.precision = mts_cli_precision;
    o.max_error = mts_cli_max_error;
    int rc = mts_model_load(path, &o, m, &err);
    *load_ms = mts_cli_now_ms() - t0;
    if (rc) {
        fprintf(stderr, "mtserve: %s (%s)\n", err.msg, mts_status_name(rc));
        return rc;
    }
    const mts_precision_info *pi = mts_model_precision(*m);
    if (strcmp(pi->requested, "fp32") || strcmp(pi->effective, "fp32")) {
        fprintf(stderr, "precision   %s (requested %s: %s", pi->effective, pi->requested, pi->reason);
        if (pi->guard_error >= 0)
            fprintf(stderr, "; guard rel_l2 %.3g <= %.3g? %s, %d %s batch%s", pi->guard_error, pi->max_error,
                    pi->guard_error <= pi->max_error ? "yes" : "no", pi->guard_runs, pi->guard_inputs,
                    pi->guard_runs == 1 ? "" : "es");
        fprintf(stderr, ")\n");
    }
    return rc;
}

int mts_cli_load_config(const mts_model_config *mc, mts_model **m, double *load_ms)
{
    const char *p = mts_cli_precision;
    double e = mts_cli_max_error;
    if (!mts_cli_precision && mc->precision) mts_cli_precision = mc->precision;
    if (!(mts_cli_max_error > 0) && mc->max_error > 0) mts_cli_max_error = mc->max_error;
    int rc = mts_cli_load(mc->model_path, m, load_ms);
    mts_cli_precision = p, mts_cli_max_error = e;
    return rc;
}

int mts_cli_precision_arg(const char *cmd, int argc, char **argv, int *i)
{
    const char *a = argv[*i];
    if (*i + 1 >= argc) return 0;
    if (!strcmp(a, "--precision")) {
        const char *v = argv[++*i];
        if (mts_precision_check(v)) {
            fprintf(stderr, "mtserve %s: bad --precision '%s' (%s)\n", cmd, v, mts_precision_check(v));
            return -1;
        }
        mts_cli_precision = v;
        return 1;
    }
    if (!strcmp(a, "--max-error")) {
        char *end;
        double v = strtod(argv[++*i], &end);
        if (*end || !(v > 0) || v > 1e6) {
            fprintf(stderr, "mtserve %s: bad --max-error '%s' (a number > 0)\n", cmd, argv[*i]);
            return -1;
        }
        mts_cli_max_error = v;
        return 1;
    }
    return 0;
}

int mts_cli_parse_dim(mts_cli_dims *d, const char *arg)
{
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg || d->n >= 16) return -1;
    char *end;
    long long v = strtoll(eq + 1, &end, 10);
    if (*end || v < 0) return -1;
    d->name[d->n] = strndup(arg, (size_t)(eq - arg));
    d->value[d->n++] = v;
    return 0;
}

int mts_cli_input_shape(const mts_model *m, int i, int64_t batch, const mts_cli_dims *dims, mts_tensor *t,
                        mts_err *err)
{
    const mts_value *v = mts_model_input(m, i);
    memset(t, 0, sizeof *t);
    t->dtype = v->dtype;
    if (v->rank < 0) return mts_err_set(err, MTS_EINVAL, "input '%s' has no declared shape; pass --input", v->name);
    t->rank = v->rank;
    bool batch_used = false;
    for (int d = 0; d < v->rank; d++) {
        if (v->dims[d] >= 0) {
            t->dims[d] = v->dims[d];
            continue;
        }
        int64_t val = -1;
        for (int k = 0; dims && k < dims->n; k++)
            if (v->dim_params[d] && !strcmp(dims->name[k], v->dim_params[d])) val = dims->value[k];
        if (val < 0 && !batch_used && d == 0) {
            val = batch;
            batch_used = true;
        }
        t->dims[d] = val < 0 ? 1 : val;
    }
    return MTS_OK;
}

void mts_cli_dims_free(mts_cli_dims *d)
{
    for (int i = 0; i < d->n; i++) free((char *)d->name[i]);
    d->n = 0;
}
