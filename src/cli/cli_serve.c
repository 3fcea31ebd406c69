/*
 * `mtserve serve`: loads the configuration (a design-document config.yaml and/or a model
 * repository folder), starts the server core and the KServe v2 HTTP front end, and runs until
 * SIGTERM or SIGINT. Shutdown is graceful: stop accepting connections, finish queued work within
 * server.shutdown_grace_s, fail what is left, exit 0. With --model-control-mode poll a poller
 * thread rescans the repository: changed model files reload, new model and version folders are
 * served, removed ones dropped, and lip-sync asset folders rechecked (docs/server.md, "Poll mode").
 */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "api/auth.h"
#include "api/grpc_server.h"
#include "api/rest.h"
#include "cli/cli.h"
#include "config/config.h"
#include "serve/server.h"
#include "util/log.h"
#include "util/suggest.h"

static void warn_cb(void *user, const char *msg)
{
    (void)user;
    MTS_WARN("config: %s", msg);
}

static void note_cb(void *user, const char *msg)
{
    (void)user;
    MTS_INFO("config: %s", msg);
}

static const char *env_get(const char *name)
{
    return getenv(name);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: mtserve serve [--config FILE.yaml] [--model-repository DIR] [--host ADDR] [--http-port PORT]\n"
               "                     [--grpc-port PORT] [--metrics-port PORT]\n"
               "                     [--tls-cert PEM --tls-key PEM [--tls-client-ca PEM]]\n"
               "                     [--grace S] [--max-connections N] [--keepalive-timeout S]\n"
               "                     [--header-timeout S] [--http-thread-count N] [--max-connections-per-client N]\n"
               "                     [--auth-token-file FILE]\n"
               "                     [--model-control-mode none|explicit|poll] [--repository-poll-secs N]\n"
               "                     [--log-level debug|info|warn|error] [--log-verbose N] [--log-format text|json]\n"
               "                     [--version]\n"
               "  Serves every model of the configuration and/or of DIR (one folder per model holding model.onnx\n"
               "  and an optional config.yaml) over KServe v2 HTTP and gRPC. Stops gracefully on SIGTERM/SIGINT.\n"
               "  Options take their value as the next argument or after '=' (--http-port=8000).\n"
               "  --auth-token-file FILE: lines '<token> infer|admin|infer,admin'; requests then need\n"
               "  'Authorization: Bearer <token>' (HTTP header or gRPC metadata); health stays open.\n"
               "  --model-control-mode: default, a model loads on its first request (or at start with preload/pin)\n"
               "  and is evicted by capacity; none: every model loads at start; explicit: models load only through\n"
               "  the load API (and preload/pin at start); poll: the default plus a rescan of the repository every\n"
               "  --repository-poll-secs (default 15): changed model files reload, new model and version folders\n"
               "  are served and removed ones dropped, without a restart.\n"
               "  --metrics-port PORT: also serve GET /metrics (only) on PORT, as Triton does; /metrics stays on\n"
               "  the HTTP port.\n"
               "  --log-verbose N: 0 info, 1 or more debug (Triton's meaning). --log-format json: one JSON object\n"
               "  per line (time, level, event, model, msg).\n");
}

/* Every option of `serve`: its name, the kind of value, and for numbers the range. */
typedef enum { OPT_STR, OPT_INT, OPT_FLAG } opt_kind;
typedef struct serve_opt {
    const char *name;
    opt_kind kind;
    long lo, hi;
} serve_opt;

enum {
    O_CONFIG, O_REPO, O_HOST, O_HTTP_PORT, O_GRPC_PORT, O_GRACE, O_MAXCONN, O_KEEPALIVE, O_HEADER_TO, O_HTTP_THREADS,
    O_MAXCONN_CLIENT, O_TLS_CERT, O_TLS_KEY, O_TLS_CA, O_AUTH, O_LOG_LEVEL, O_LOG_VERBOSE, O_LOG_FORMAT,
    O_CONTROL, O_POLL_SECS, O_METRICS_PORT, O_VERSION, O_HELP, O_COUNT
};

static const serve_opt serve_opts[O_COUNT] = {
    [O_CONFIG] = {"--config", OPT_STR, 0, 0},
    [O_REPO] = {"--model-repository", OPT_STR, 0, 0},
    [O_HOST] = {"--host", OPT_STR, 0, 0},
    [O_HTTP_PORT] = {"--http-port", OPT_INT, 0, 65535},
    [O_GRPC_PORT] = {"--grpc-port", OPT_INT, 0, 65535},
    [O_GRACE] = {"--grace", OPT_INT, 0, 3600},
    [O_MAXCONN] = {"--max-connections", OPT_INT, 1, 1000000},
    [O_KEEPALIVE] = {"--keepalive-timeout", OPT_INT, 1, 86400},
    [O_HEADER_TO] = {"--header-timeout", OPT_INT, 1, 3600},
    [O_HTTP_THREADS] = {"--http-thread-count", OPT_INT, 1, 64},
    [O_MAXCONN_CLIENT] = {"--max-connections-per-client", OPT_INT, 1, 1000000},
    [O_TLS_CERT] = {"--tls-cert", OPT_STR, 0, 0},
    [O_TLS_KEY] = {"--tls-key", OPT_STR, 0, 0},
    [O_TLS_CA] = {"--tls-client-ca", OPT_STR, 0, 0},
    [O_AUTH] = {"--auth-token-file", OPT_STR, 0, 0},
    [O_LOG_LEVEL] = {"--log-level", OPT_STR, 0, 0},
    [O_LOG_VERBOSE] = {"--log-verbose", OPT_INT, 0, 1000},
    [O_LOG_FORMAT] = {"--log-format", OPT_STR, 0, 0},
    [O_CONTROL] = {"--model-control-mode", OPT_STR, 0, 0},
    [O_POLL_SECS] = {"--repository-poll-secs", OPT_INT, 1, 86400},
    [O_METRICS_PORT] = {"--metrics-port", OPT_INT, 0, 65535},
    [O_VERSION] = {"--version", OPT_FLAG, 0, 0},
    [O_HELP] = {"--help", OPT_FLAG, 0, 0},
};

/* A whole decimal number in [lo, hi]; anything else (empty, trailing text, sign where the range
 * has none, overflow) fails. */
static bool parse_long(const char *s, long lo, long hi, long *out)
{
    if (!*s || !((*s >= '0' && *s <= '9') || *s == '-')) return false;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

/* Parsed values: strings (NULL when not given) and numbers (-1 when not given). */
typedef struct serve_args {
    const char *str[O_COUNT];
    long num[O_COUNT];
    bool flag[O_COUNT];
} serve_args;

/* True when s names an option of serve ("--http-port" or "--http-port=..."): it is then not
 * taken as the value of the option before it. */
static bool is_option(const char *s)
{
    if (strncmp(s, "--", 2)) return false;
    size_t nl = strcspn(s, "=");
    for (int k = 0; k < O_COUNT; k++)
        if (strlen(serve_opts[k].name) == nl && !strncmp(serve_opts[k].name, s, nl)) return true;
    return false;
}

/* Returns -1 to go on, else the exit status (0 after --help / --version, 2 on a bad option). */
static int parse_args(int argc, char **argv, serve_args *a)
{
    for (int k = 0; k < O_COUNT; k++) a->str[k] = NULL, a->num[k] = -1, a->flag[k] = false;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *eq = strchr(arg, '=');
        size_t nl = eq && !strncmp(arg, "--", 2) ? (size_t)(eq - arg) : strlen(arg);
        int k = 0;
        while (k < O_COUNT && !(strlen(serve_opts[k].name) == nl && !strncmp(serve_opts[k].name, arg, nl))) k++;
        if (k == O_COUNT) {
            const char *names[O_COUNT];
            for (int j = 0; j < O_COUNT; j++) names[j] = serve_opts[j].name;
            char word[128];
            snprintf(word, sizeof word, "%.*s", (int)(nl < 127 ? nl : 127), arg);
            const char *near = mts_suggest(word, names, O_COUNT);
            if (near) fprintf(stderr, "mtserve serve: unknown option '%s' (did you mean '%s'?)\n", word, near);
            else fprintf(stderr, "mtserve serve: unknown option '%s' (see mtserve serve --help)\n", word);
            return 2;
        }
        const serve_opt *o = &serve_opts[k];
        if (o->kind == OPT_FLAG) {
            if (eq && nl < strlen(arg)) {
                fprintf(stderr, "mtserve serve: option %s takes no value\n", o->name);
                return 2;
            }
            a->flag[k] = true;
            continue;
        }
        const char *val;
        if (eq && nl < strlen(arg)) val = eq + 1;
        else if (i + 1 < argc && !is_option(argv[i + 1])) val = argv[++i];
        else {
            fprintf(stderr, "mtserve serve: option %s needs a value\n", o->name);
            return 2;
        }
        if (o->kind == OPT_INT) {
            long v;
            if (!parse_long(val, o->lo, o->hi, &v)) {
                fprintf(stderr, "mtserve serve: %s wants a whole number from %ld to %ld, not '%s'\n", o->name, o->lo,
                        o->hi, val);
                return 2;
            }
            a->num[k] = v;
        } else {
            a->str[k] = val;
        }
    }
    if (a->flag[O_HELP]) {
        usage(stdout);
        return 0;
    }
    if (a->flag[O_VERSION]) {
        printf("mtserve %s\n", mts_version_string());
        return 0;
    }
    static const struct {
        int opt;
        const char *values;
    } enums[] = {{O_LOG_LEVEL, "debug|info|warn|error"}, {O_LOG_FORMAT, "text|json"}, {O_CONTROL, "none|explicit|poll"}};
    for (size_t e = 0; e < sizeof enums / sizeof enums[0]; e++) {
        const char *v = a->str[enums[e].opt];
        if (!v) continue;
        bool ok = false;
        const char *p = enums[e].values;
        while (*p && !ok) {
            size_t l = strcspn(p, "|");
            ok = strlen(v) == l && !strncmp(v, p, l);
            p += l + (p[l] == '|');
        }
        if (!ok) {
            fprintf(stderr, "mtserve serve: %s wants one of %s, not '%s'\n", serve_opts[enums[e].opt].name,
                    enums[e].values, v);
            return 2;
        }
    }
    if (a->num[O_POLL_SECS] > 0 && (!a->str[O_CONTROL] || strcmp(a->str[O_CONTROL], "poll"))) {
        fprintf(stderr, "mtserve serve: --repository-poll-secs applies only with --model-control-mode poll\n");
        return 2;
    }
    return -1;
}

/* Checks that nothing listens on host:port yet (port 0: any free port, nothing to check).
 * Returns 0, -1 with the reason in why, or -2 when host does not resolve. */
static int port_free(const char *host, int port, char *why, size_t len)
{
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int gai = getaddrinfo(host, ps, &hints, &ai);
    if (gai) {
        snprintf(why, len, "%s", gai_strerror(gai));
        return -2;
    }
    int rc = 0;
    int fd = port ? socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0) : -1;
    if (fd >= 0) {
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
            snprintf(why, len, "%s", errno == EADDRINUSE ? "already in use" : strerror(errno));
            rc = -1;
        }
        close(fd);
    }
    freeaddrinfo(ai);
    return rc;
}

/* Warns when the memory budget exceeds physical memory, and when devices x workers x threads
 * oversubscribe the online cores. */
static void check_resources(const mts_config *c)
{
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (pages > 0 && psz > 0) {
        double phys_gb = (double)pages * (double)psz / (1024.0 * 1024.0 * 1024.0);
        double budget = c->memory_gb_per_device * c->device_count;
        if (c->max_memory_gb > budget) budget = c->max_memory_gb;
        if (budget > phys_gb)
            MTS_WARN("event=memory_overcommit budget_gb=%.1f physical_gb=%.1f: the memory budget (%d device%s x %.1f "
                     "GB, capacity.max_memory_gb %.1f) is above this machine's physical memory; models may be "
                     "loaded until the kernel's OOM killer stops the server",
                     budget, phys_gb, c->device_count, c->device_count == 1 ? "" : "s", c->memory_gb_per_device,
                     c->max_memory_gb);
    }
    /* A device's workers share its threads_per_device cores (each batch gets a share, at least
     * one thread), so a device keeps max(workers, threads) threads busy. */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    long per_dev = c->workers_per_device > c->threads_per_device ? c->workers_per_device : c->threads_per_device;
    long want = (long)c->device_count * per_dev;
    if (cores > 0 && want > cores)
        MTS_WARN("event=cpu_oversubscribed threads=%ld cores=%ld: %d device%s x max(%d workers, %d threads) = %ld "
                 "threads on %ld online cores; batches will contend for cores (lower gpus.count, "
                 "worker_count_per_gpu or threads_per_gpu)",
                 want, cores, c->device_count, c->device_count == 1 ? "" : "s", c->workers_per_device,
                 c->threads_per_device, want, cores);
}

/* ---- --model-control-mode poll: rescan the repository every repository_poll_s seconds ---- */

typedef struct file_sig {
    bool exists;
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
} file_sig;

/* A served model the poller watches. */
typedef struct tracked {
    char *name;
    bool in_repo;     /* its folder is in the repository: rescanned each poll (versions, removal) */
    char *path;       /* the model file served */
    int version;
    file_sig sig;
    char *cand_path;  /* another version's file the rescan found, added once it stays unchanged */
    file_sig cand_sig;
    bool cfg_known;   /* cfg_sig holds the folder's config.yaml and config.pbtxt as served */
    file_sig cfg_sig[2];
    char msg[256];    /* the folder's problem last logged (logged once) */
} tracked;

/* A repository folder that serves no model (yet). */
typedef struct pending_dir {
    char *name;
    bool have_sig, seen;
    file_sig sig;     /* its model file at the last poll: added once unchanged for one interval */
    char msg[256];    /* the problem last logged (logged once) */
} pending_dir;

typedef struct poller {
    mts_server *srv;
    const mts_config *cfg;
    const char *repo; /* NULL: only the configured model files are watched */
    tracked *models;
    int n_models, cap_models;
    pending_dir *dirs;
    int n_dirs, cap_dirs;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cv;
    bool stop, started;
} poller;

static file_sig sig_of(const char *path)
{
    file_sig f = {0};
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) {
        f.exists = true;
        f.dev = sb.st_dev;
        f.ino = sb.st_ino;
        f.size = sb.st_size;
        f.mtime = sb.st_mtim;
    }
    return f;
}

static bool sig_same(const file_sig *a, const file_sig *b)
{
    return a->exists == b->exists && a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
           a->mtime.tv_sec == b->mtime.tv_sec && a->mtime.tv_nsec == b->mtime.tv_nsec;
}

/* Keeps the first configuration warning of a folder scan (the poller logs it once). */
static void collect_cb(void *user, const char *msg)
{
    char *buf = user;
    if (!buf[0]) snprintf(buf, 256, "%s", msg);
}

/* Logs a folder's problem when it differs from the one logged last; "" clears it. */
static void note_once(char *last, const char *folder, const char *event, const char *msg)
{
    if (!strcmp(last, msg)) return;
    snprintf(last, 256, "%s", msg);
    if (msg[0]) MTS_WARN("event=%s folder=%s error=\"%s\"", event, folder, msg);
}

static tracked *track(poller *p, const char *name, bool in_repo, const char *path, int version)
{
    if (p->n_models == p->cap_models) {
        int cap = p->cap_models ? p->cap_models * 2 : 16;
        tracked *t = realloc(p->models, sizeof *t * (size_t)cap);
        if (!t) return NULL;
        p->models = t;
        p->cap_models = cap;
    }
    tracked *t = &p->models[p->n_models];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name)) || !(t->path = strdup(path))) {
        free(t->name);
        return NULL;
    }
    t->in_repo = in_repo;
    t->version = version;
    t->sig = sig_of(path);
    p->n_models++;
    return t;
}

static void untrack(poller *p, int i)
{
    free(p->models[i].name);
    free(p->models[i].path);
    free(p->models[i].cand_path);
    p->models[i] = p->models[--p->n_models];
}

static pending_dir *pending_get(poller *p, const char *name)
{
    for (int i = 0; i < p->n_dirs; i++)
        if (!strcmp(p->dirs[i].name, name)) return &p->dirs[i];
    if (p->n_dirs == p->cap_dirs) {
        int cap = p->cap_dirs ? p->cap_dirs * 2 : 16;
        pending_dir *d = realloc(p->dirs, sizeof *d * (size_t)cap);
        if (!d) return NULL;
        p->dirs = d;
        p->cap_dirs = cap;
    }
    pending_dir *d = &p->dirs[p->n_dirs];
    memset(d, 0, sizeof *d);
    if (!(d->name = strdup(name))) return NULL;
    p->n_dirs++;
    return d;
}

static void pending_drop(poller *p, int i)
{
    free(p->dirs[i].name);
    p->dirs[i] = p->dirs[--p->n_dirs];
}

static bool is_tracked(const poller *p, const char *name)
{
    for (int i = 0; i < p->n_models; i++)
        if (!strcmp(p->models[i].name, name)) return true;
    return false;
}

/* A served model of the repository: a new version folder is switched to (once its file stays
 * unchanged for one interval, or at once when the served version's file is gone), a folder
 * without a model any more removes the model. Returns false when the model was removed (and
 * untracked). */
static bool rescan_model(poller *p, int i)
{
    tracked *t = &p->models[i];
    char warn[256] = "", folder[1100];
    snprintf(folder, sizeof folder, "%s/%s", p->repo, t->name);
    mts_model_config *m = NULL;
    mts_err err = {0};
    if (mts_config_scan_model(p->cfg, p->repo, t->name, env_get, &m, collect_cb, warn, &err)) {
        note_once(t->msg, folder, "poll_config_error", err.msg); /* the served version stays */
        return true;
    }
    if (!m) {
        MTS_INFO("event=poll_removed model=%s reason=\"%s\"", t->name, warn[0] ? warn : "folder removed");
        if (mts_server_remove_model(p->srv, t->name, &err))
            MTS_WARN("model=%s event=poll_remove_failed error=\"%s\"", t->name, err.msg);
        untrack(p, i);
        return false;
    }
    note_once(t->msg, folder, "poll_config_error", "");
    /* the folder's configuration files: an edit applies the new configuration (the model reloads
     * with it when loaded; the loaded one answers until then) */
    file_sig cfg_now[2];
    char cpath[1200];
    static const char *const cfg_files[2] = {"config.yaml", "config.pbtxt"};
    for (int k = 0; k < 2; k++) {
        snprintf(cpath, sizeof cpath, "%s/%s", folder, cfg_files[k]);
        cfg_now[k] = sig_of(cpath);
    }
    bool cfg_changed = t->cfg_known && (!sig_same(&cfg_now[0], &t->cfg_sig[0]) || !sig_same(&cfg_now[1], &t->cfg_sig[1]));
    t->cfg_known = true;
    t->cfg_sig[0] = cfg_now[0];
    t->cfg_sig[1] = cfg_now[1];
    if (!strcmp(m->model_path, t->path)) {
        free(t->cand_path);
        t->cand_path = NULL;
        if (!cfg_changed) {
            mts_model_config_free(m);
            return true;
        }
        MTS_INFO("event=poll_config_changed model=%s version=%d", t->name, t->version);
        if (mts_server_update_model(p->srv, m, &err)) /* takes m */
            MTS_WARN("model=%s event=poll_config_failed error=\"%s\"", t->name, err.msg);
        return true;
    }
    file_sig now = sig_of(m->model_path), served = sig_of(t->path);
    /* the served version's folder is gone: switch at once (nothing else could load) */
    bool settled = !served.exists ||
                   (t->cand_path && !strcmp(t->cand_path, m->model_path) && sig_same(&now, &t->cand_sig));
    if (!settled) {
        free(t->cand_path);
        t->cand_path = strdup(m->model_path); /* settles for one interval */
        t->cand_sig = now;
        mts_model_config_free(m);
        return true;
    }
    int version = m->version;
    char *path = strdup(m->model_path);
    if (!path) {
        mts_model_config_free(m);
        return true; /* out of memory: the next poll tries again */
    }
    MTS_INFO("event=poll_version model=%s version=%d previous=%d", t->name, version, t->version);
    if (mts_server_update_model(p->srv, m, &err)) { /* takes m */
        MTS_WARN("model=%s event=poll_version_failed error=\"%s\"", t->name, err.msg);
        free(path);
        return true;
    }
    free(t->path);
    t->path = path;
    free(t->cand_path);
    t->cand_path = NULL;
    t->version = version;
    t->sig = now;
    return true;
}

/* A folder not served yet: added once its model file stays unchanged for one interval. */
static void rescan_dir(poller *p, pending_dir *d)
{
    char warn[256] = "", folder[1100];
    snprintf(folder, sizeof folder, "%s/%s", p->repo, d->name);
    mts_model_config *m = NULL;
    mts_err err = {0};
    if (mts_config_scan_model(p->cfg, p->repo, d->name, env_get, &m, collect_cb, warn, &err)) {
        note_once(d->msg, folder, "poll_config_error", err.msg);
        d->have_sig = false;
        return;
    }
    if (!m) {
        note_once(d->msg, folder, "poll_skipped", warn);
        d->have_sig = false;
        return;
    }
    file_sig now = sig_of(m->model_path);
    if (!d->have_sig || !sig_same(&now, &d->sig)) {
        d->have_sig = true;
        d->sig = now;
        mts_model_config_free(m);
        return;
    }
    int version = m->version;
    bool pin = m->pin || m->preload;
    char *path = strdup(m->model_path);
    if (!path) {
        mts_model_config_free(m);
        return;
    }
    if (mts_server_add_model(p->srv, m, &err)) { /* takes m */
        note_once(d->msg, folder, "poll_skipped", err.msg);
        free(path);
        return;
    }
    MTS_INFO("event=poll_added model=%s version=%d load=%s%s%s", d->name, version, pin ? "now" : "on_use",
             warn[0] ? " warning=" : "", warn);
    if (!track(p, d->name, true, path, version)) MTS_WARN("model=%s event=poll_untracked: out of memory", d->name);
    free(path);
    d->name[0] = '\0'; /* dropped by the caller */
}

static void poll_once(poller *p)
{
    for (int i = 0; i < p->n_models;) {
        if (p->models[i].in_repo && p->repo && !rescan_model(p, i)) continue; /* removed: slot i refilled */
        tracked *t = &p->models[i++];
        file_sig now = sig_of(t->path);
        /* a repository model's file that went away was handled by its rescan (version switch or
         * removal); the version loaded keeps serving until then */
        bool rescanned_gone = t->in_repo && p->repo && !now.exists;
        if (!rescanned_gone && !sig_same(&now, &t->sig)) {
            bool was = t->sig.exists;
            t->sig = now;
            mts_model_status st;
            if (!mts_server_model_status_by_name(p->srv, t->name, &st)) {
                bool resident = st.state == MTS_MODEL_READY || st.state == MTS_MODEL_LOADING;
                mts_err err = {0};
                if (!now.exists) {
                    MTS_WARN("model=%s event=repository_changed change=removed action=%s path=%s", t->name,
                             resident ? "unload" : "none", t->path);
                    if (resident && mts_server_unload(p->srv, t->name, NULL, NULL, &err))
                        MTS_WARN("model=%s event=poll_unload_failed error=\"%s\"", t->name, err.msg);
                } else {
                    MTS_INFO("model=%s event=repository_changed change=%s action=%s path=%s", t->name,
                             was ? "modified" : "added", resident ? "reload" : "none (loads on use)", t->path);
                    if (resident && mts_server_load(p->srv, t->name, true, NULL, NULL, &err))
                        MTS_WARN("model=%s event=poll_reload_failed error=\"%s\"", t->name, err.msg);
                }
            }
        }
        mts_server_recheck_assets(p->srv, t->name); /* logs a change itself */
    }
    if (!p->repo) return;
    DIR *dp = opendir(p->repo);
    if (!dp) return;
    for (int i = 0; i < p->n_dirs; i++) p->dirs[i].seen = false;
    struct dirent *e;
    while ((e = readdir(dp))) {
        if (e->d_name[0] == '.' || is_tracked(p, e->d_name)) continue;
        pending_dir *d = pending_get(p, e->d_name);
        if (!d) break;
        d->seen = true;
        rescan_dir(p, d);
    }
    closedir(dp);
    for (int i = 0; i < p->n_dirs;) /* added, or gone from the repository */
        if (!p->dirs[i].seen || !p->dirs[i].name[0]) pending_drop(p, i);
        else i++;
}

static void *poll_main(void *arg)
{
    poller *p = arg;
    pthread_mutex_lock(&p->lock);
    while (!p->stop) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += p->cfg->repository_poll_s;
        while (!p->stop && pthread_cond_timedwait(&p->cv, &p->lock, &until) == 0) {
        }
        if (p->stop) break;
        pthread_mutex_unlock(&p->lock);
        poll_once(p);
        pthread_mutex_lock(&p->lock);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

/* True when path lies in the repository folder of model name (<repo>/<name>/...). */
static bool in_repo_folder(const char *repo, const char *name, const char *path)
{
    size_t rl = strlen(repo), nl = strlen(name);
    while (rl > 1 && repo[rl - 1] == '/') rl--;
    return !strncmp(path, repo, rl) && path[rl] == '/' && !strncmp(path + rl + 1, name, nl) && path[rl + 1 + nl] == '/';
}

/* Records the model files and repository folders as they are before anything is announced
 * (a change made after the serving line is then always seen); the problems of folders that
 * serve nothing were logged by the start-up scan and are not logged again. poller_start starts
 * the rescans. */
static int poller_init(poller *p, mts_server *srv, const mts_config *cfg, const char *repo)
{
    memset(p, 0, sizeof *p);
    p->srv = srv;
    p->cfg = cfg;
    p->repo = repo;
    for (int i = 0; i < cfg->n_models; i++) {
        const mts_model_config *m = &cfg->models[i];
        if (!track(p, m->name, repo && in_repo_folder(repo, m->name, m->model_path), m->model_path, m->version))
            return -1;
    }
    DIR *dp = repo ? opendir(repo) : NULL;
    struct dirent *e;
    while (dp && (e = readdir(dp))) {
        if (e->d_name[0] == '.' || is_tracked(p, e->d_name)) continue;
        pending_dir *d = pending_get(p, e->d_name);
        if (!d) break;
        mts_model_config *m = NULL;
        mts_err err = {0};
        if (mts_config_scan_model(cfg, repo, e->d_name, env_get, &m, collect_cb, d->msg, &err))
            snprintf(d->msg, sizeof d->msg, "%s", err.msg);
        mts_model_config_free(m);
    }
    if (dp) closedir(dp);
    return 0;
}

static int poller_start(poller *p)
{
    const mts_config *cfg = p->cfg;
    if (!p->srv) return -1;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (pthread_create(&p->thread, NULL, poll_main, p)) return -1;
    p->started = true;
    MTS_INFO("event=repository_poll every_s=%d models=%d repository=%s", cfg->repository_poll_s, cfg->n_models,
             p->repo ? p->repo : "(none: model files only)");
    return 0;
}

static void poller_stop(poller *p)
{
    if (p->started) {
        pthread_mutex_lock(&p->lock);
        p->stop = true;
        pthread_cond_signal(&p->cv);
        pthread_mutex_unlock(&p->lock);
        pthread_join(p->thread, NULL);
        pthread_mutex_destroy(&p->lock);
        pthread_cond_destroy(&p->cv);
    }
    while (p->n_models) untrack(p, p->n_models - 1);
    free(p->models);
    while (p->n_dirs) pending_drop(p, p->n_dirs - 1);
    free(p->dirs);
    memset(p, 0, sizeof *p);
}

int mts_cli_serve(int argc, char **argv)
{
    serve_args a;
    int prc = parse_args(argc, argv, &a);
    if (prc >= 0) return prc;
    const char *config_path = a.str[O_CONFIG], *repo = a.str[O_REPO], *host = a.str[O_HOST];
    int port = (int)a.num[O_HTTP_PORT], grpc_port = (int)a.num[O_GRPC_PORT], grace = (int)a.num[O_GRACE];
    int conn_opts[5] = {(int)a.num[O_MAXCONN], (int)a.num[O_KEEPALIVE], (int)a.num[O_HEADER_TO],
                        (int)a.num[O_HTTP_THREADS], (int)a.num[O_MAXCONN_CLIENT]};
    const char *tls[3] = {a.str[O_TLS_CERT], a.str[O_TLS_KEY], a.str[O_TLS_CA]};
    const char *auth_file = a.str[O_AUTH];
    int metrics_port = (int)a.num[O_METRICS_PORT]; /* -1: none */
    if (a.str[O_LOG_LEVEL]) {
        const char *l = a.str[O_LOG_LEVEL];
        mts_log_set_level(!strcmp(l, "debug") ? MTS_LOG_DEBUG : !strcmp(l, "warn") ? MTS_LOG_WARN
                                             : !strcmp(l, "error")                  ? MTS_LOG_ERROR
                                                                                      : MTS_LOG_INFO);
    }
    if (a.num[O_LOG_VERBOSE] >= 0) mts_log_set_level(a.num[O_LOG_VERBOSE] > 0 ? MTS_LOG_DEBUG : MTS_LOG_INFO);
    if (a.str[O_LOG_FORMAT]) mts_log_set_json(!strcmp(a.str[O_LOG_FORMAT], "json"));
    mts_model_control control = MTS_CONTROL_AUTO;
    if (a.str[O_CONTROL])
        control = !strcmp(a.str[O_CONTROL], "none") ? MTS_CONTROL_NONE
                  : !strcmp(a.str[O_CONTROL], "explicit") ? MTS_CONTROL_EXPLICIT
                                                         : MTS_CONTROL_POLL;
    if (!config_path && !repo) {
        fprintf(stderr, "mtserve serve: give --config FILE or --model-repository DIR\n");
        return 2;
    }
    mts_config cfg;
    mts_err err = {0};
    int rc;
    if (config_path) rc = mts_config_load_yaml(config_path, &cfg, warn_cb, NULL, &err);
    else {
        mts_config_defaults(&cfg);
        rc = MTS_OK;
    }
    if (!rc && repo) rc = mts_config_scan_repository(&cfg, repo, warn_cb, NULL, &err);
    if (!rc && !repo && cfg.model_repository) rc = mts_config_scan_repository(&cfg, cfg.model_repository, warn_cb, NULL, &err);
    if (!rc) {
        if (host) {
            free(cfg.host);
            cfg.host = strdup(host);
        }
        if (port >= 0) cfg.http_port = port;
        if (grpc_port >= 0) cfg.grpc_port = grpc_port;
        if (grace >= 0) cfg.shutdown_grace_s = grace;
        if (conn_opts[0] > 0) cfg.max_connections = conn_opts[0];
        if (conn_opts[1] > 0) cfg.keepalive_timeout_s = conn_opts[1];
        if (conn_opts[2] > 0) cfg.header_timeout_s = conn_opts[2];
        if (conn_opts[3] > 0) cfg.http_threads = conn_opts[3];
        if (conn_opts[4] > 0) cfg.max_connections_per_client = conn_opts[4];
        char **tls_dst[3] = {&cfg.tls_cert_path, &cfg.tls_key_path, &cfg.tls_client_ca_path};
        for (int i = 0; i < 3; i++)
            if (tls[i]) {
                free(*tls_dst[i]);
                *tls_dst[i] = strdup(tls[i]);
            }
        if (auth_file) {
            free(cfg.auth_token_file);
            cfg.auth_token_file = strdup(auth_file);
        }
        cfg.model_control = control;
        cfg.repository_poll_s = a.num[O_POLL_SECS] > 0 ? (int)a.num[O_POLL_SECS] : 15;
        rc = mts_config_apply_env(&cfg, env_get, note_cb, NULL, &err);
        if (!rc) rc = mts_config_finalize(&cfg, &err);
    }
    if (rc) {
        fprintf(stderr, "mtserve: %s\n", err.msg);
        mts_config_free(&cfg);
        return 1;
    }
    if (cfg.n_models == 0) MTS_WARN("config: no models configured");
    check_resources(&cfg);
    /* Both ports are checked before anything starts: one line naming the flag that moves it. */
    char why[200];
    const char *proto = NULL, *flag = NULL;
    int bad_port = 0;
    if ((prc = port_free(cfg.host, cfg.http_port, why, sizeof why)) == -2) {
        fprintf(stderr, "mtserve: cannot resolve host '%s' (--host or server.host): %s\n", cfg.host, why);
        mts_config_free(&cfg);
        return 1;
    }
    if (prc) proto = "HTTP", flag = "--http-port", bad_port = cfg.http_port;
    else if (cfg.grpc_port != 0 && cfg.grpc_port == cfg.http_port)
        proto = "gRPC", flag = "--grpc-port", bad_port = cfg.grpc_port, snprintf(why, sizeof why, "it is the HTTP port");
    else if (port_free(cfg.host, cfg.grpc_port, why, sizeof why))
        proto = "gRPC", flag = "--grpc-port", bad_port = cfg.grpc_port;
    else if (metrics_port > 0 && (metrics_port == cfg.http_port || metrics_port == cfg.grpc_port))
        proto = "metrics", flag = "--metrics-port", bad_port = metrics_port,
        snprintf(why, sizeof why, "it is the %s port", metrics_port == cfg.http_port ? "HTTP" : "gRPC");
    else if (metrics_port > 0 && port_free(cfg.host, metrics_port, why, sizeof why))
        proto = "metrics", flag = "--metrics-port", bad_port = metrics_port;
    if (proto) {
        fprintf(stderr, "mtserve: cannot listen for %s on %s:%d: %s (choose another port with %s)\n", proto, cfg.host,
                bad_port, why, flag);
        mts_config_free(&cfg);
        return 1;
    }
    mts_auth *auth = NULL;
    if (cfg.auth_token_file) {
        if ((rc = mts_auth_load(cfg.auth_token_file, &auth, &err))) {
            fprintf(stderr, "mtserve: %s\n", err.msg);
            mts_auth_free(auth);
            mts_config_free(&cfg);
            return 1;
        }
        MTS_INFO("event=auth tokens=%d file=%s (health open; inference needs infer, load/unload admin)",
                 mts_auth_count(auth), cfg.auth_token_file);
    } else if (!mts_auth_host_is_loopback(cfg.host)) {
        MTS_WARN("event=no_auth host=%s: listening beyond loopback without authentication: anyone who reaches "
                 "the ports can run inference and load or unload models (set --auth-token-file)",
                 cfg.host);
    }
    /* Signals are taken by sigwait below; block them before any thread starts. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    poller poll;
    memset(&poll, 0, sizeof poll);
    mts_server *srv = NULL;
    if ((rc = mts_server_create(&cfg, &srv, &err))) {
        fprintf(stderr, "mtserve: %s\n", err.msg);
        mts_auth_free(auth);
        mts_config_free(&cfg);
        return 1;
    }
    if (cfg.model_control == MTS_CONTROL_POLL) poller_init(&poll, srv, &cfg, repo ? repo : cfg.model_repository);
    /* light I/O threads and small gRPC connections real-time: server.light_io_realtime, else
     * on unless MTS_LIGHT_REALTIME=0 (util/rtprio.h) */
    const char *rt_env = getenv("MTS_LIGHT_REALTIME");
    bool light_rt = cfg.light_io_realtime >= 0 ? cfg.light_io_realtime : !(rt_env && !strcmp(rt_env, "0"));
    mts_rest_opts ho = {cfg.host,
                        cfg.http_port,
                        cfg.http_threads,
                        (size_t)cfg.max_message_size_mb << 20,
                        cfg.max_connections,
                        cfg.max_connections_per_client,
                        cfg.keepalive_timeout_s * 1000,
                        cfg.header_timeout_s * 1000,
                        auth,
                        cfg.tls_cert_path,
                        cfg.tls_key_path,
                        cfg.tls_client_ca_path,
                        false,
                        light_rt};
    mts_rest *http = NULL;
    if ((rc = mts_rest_start(srv, &ho, &http, &err))) {
        fprintf(stderr, "mtserve: HTTP on %s:%d: %s (choose another port with --http-port)\n", cfg.host, cfg.http_port,
                err.msg);
        mts_server_shutdown(srv, 0);
        mts_server_free(srv);
        poller_stop(&poll);
        mts_auth_free(auth);
        mts_config_free(&cfg);
        return 1;
    }
    mts_rest *metrics = NULL;
    if (metrics_port >= 0) {
        mts_rest_opts mo = ho;
        mo.metrics_only = true;
        mo.port = metrics_port;
        mo.io_threads = 1;
        if ((rc = mts_rest_start(srv, &mo, &metrics, &err))) {
            fprintf(stderr, "mtserve: metrics on %s:%d: %s (choose another port with --metrics-port)\n", cfg.host,
                    metrics_port, err.msg);
            mts_rest_stop_accepting(http);
            mts_server_shutdown(srv, 0);
            mts_rest_stop(http);
            mts_server_free(srv);
            mts_auth_free(auth);
            mts_config_free(&cfg);
            return 1;
        }
        MTS_INFO("event=listening protocol=metrics url=%s://%s:%d/metrics", cfg.tls_cert_path ? "https" : "http",
                 cfg.host, mts_rest_port(metrics));
    }
    int bound = mts_rest_port(http);
    const char *scheme = cfg.tls_cert_path ? "https" : "http";
    MTS_INFO("event=listening protocol=http url=%s://%s:%d models=%d unavailable=%d tls=%s", scheme, cfg.host, bound,
             cfg.n_models - mts_server_unavailable_at_start(srv), mts_server_unavailable_at_start(srv),
             cfg.tls_cert_path ? (cfg.tls_client_ca_path ? "mutual" : "on") : "off");
    int unavailable = mts_server_unavailable_at_start(srv), servable = cfg.n_models - unavailable;
    if (unavailable)
        printf("mtserve: %d model%s unavailable (model file or background_dir missing; see the log)\n", unavailable,
               unavailable == 1 ? " is" : "s are");
    printf("mtserve: serving %d model%s on %s://%s:%d (KServe v2)\n", servable, servable == 1 ? "" : "s", scheme,
           cfg.host, bound);
    fflush(stdout);
    mts_grpc_opts go = {cfg.host,
                        cfg.grpc_port,
                        2,
                        (size_t)cfg.max_message_size_mb << 20,
                        cfg.tls_cert_path,
                        cfg.tls_key_path,
                        cfg.tls_client_ca_path,
                        auth,
                        cfg.grpc_transport,
                        light_rt};
    mts_grpc *grpc = NULL;
    if ((rc = mts_grpc_start(srv, &go, &grpc, &err))) {
        fprintf(stderr, "mtserve: gRPC: %s%s\n", err.msg,
                rc == MTS_EIO ? " (choose another port with --grpc-port)" : "");
        mts_rest_stop_accepting(http);
        if (metrics) mts_rest_stop_accepting(metrics);
        mts_server_shutdown(srv, 0);
        mts_rest_stop(http);
        mts_rest_stop(metrics);
        mts_server_free(srv);
        poller_stop(&poll);
        mts_auth_free(auth);
        mts_config_free(&cfg);
        return 1;
    }
    MTS_INFO("event=listening protocol=grpc address=%s:%d", cfg.host, mts_grpc_port(grpc));
    printf("mtserve: serving gRPC on %s:%d (inference.GRPCInferenceService, inference.InferenceService)\n", cfg.host,
           mts_grpc_port(grpc));
    fflush(stdout);
    if (cfg.model_control == MTS_CONTROL_POLL && poller_start(&poll))
        MTS_ERROR("event=repository_poll_failed: cannot start the repository poller; changes are not picked up");
    int sig = 0;
    sigwait(&set, &sig);
    poller_stop(&poll);
    MTS_INFO("event=signal signal=%s", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    mts_rest_stop_accepting(http);
    if (metrics) mts_rest_stop_accepting(metrics);
    mts_grpc_stop_accepting(grpc);
    mts_server_shutdown(srv, cfg.shutdown_grace_s);
    mts_rest_stop(http);
    mts_rest_stop(metrics);
    mts_grpc_stop(grpc);
    mts_server_free(srv);
    mts_auth_free(auth);
    mts_config_free(&cfg);
    return 0;
}
