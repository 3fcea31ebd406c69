/*
 * `mtserve cluster-config`: prints an HAProxy (2.6) configuration that puts several mtserve
 * instances behind one HTTP front door and one gRPC front door. Requests are routed by model:
 * a consistent hash of the model name (taken from the KServe, lip-sync and repository-control
 * paths, else the `model` query parameter, else the `mts-model` header; on gRPC the `mts-model`
 * metadata) picks the instance, so each model is resident on one instance and the cluster holds
 * about N times the models one instance can; bounded-load hashing (hash-balance-factor) lets
 * requests leave an instance that holds far more than its share of the requests in flight (a
 * stalled or saturated one). Requests that name no model (health, index, metrics) go
 * round-robin. Failed connections, connections closed without an answer and 503 answers are
 * retried on another instance (requests are buffered whole so that HAProxy keeps the copy a
 * retry needs); health checks on GET /v2/health/ready take a dead or starting instance out and
 * put it back. docs/scale-out.md explains the output line by line.
 */
#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

#define MAX_INSTANCES 256
#define MAX_HOST 253

typedef struct instance {
    char host[MAX_HOST + 3]; /* as HAProxy writes it: a name, an IPv4 address or [IPv6] */
    int http, grpc;
    bool is_name; /* a DNS name (needs a resolvers section), not a literal address */
} instance;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mtserve cluster-config --instances HOST:HTTP:GRPC[,HOST:HTTP:GRPC...] [options]\n"
            "\n"
            "Prints an HAProxy 2.6 configuration for mtserve instances behind one front door, routed by\n"
            "model (consistent hashing with bounded load), with health checks, retries and failover.\n"
            "Check it with `haproxy -c -f FILE`; docs/scale-out.md explains every line.\n"
            "\n"
            "  --instances LIST      the instances: host (name, IPv4, or [IPv6]), HTTP port, gRPC port\n"
            "  --front-http PORT     the front door's HTTP port (default 8080)\n"
            "  --front-grpc PORT     the front door's gRPC port (HTTP/2 cleartext; default 50050)\n"
            "  --bind ADDR           the front door's listen address (default: all addresses)\n"
            "  --balance-factor N    hash-balance-factor: no instance takes more than N %% of the\n"
            "                        average concurrent requests (default 250; 0 turns it off; else 101..1000;\n"
            "                        N >= 100 x instances never spills)\n"
            "  --stats-port P        HAProxy's statistics page on P (/ : HTML, /metrics : Prometheus)\n"
            "  --server-timeout S    how long a request may wait for its answer (default 300)\n"
            "  --retry-body-kb N     requests with bodies up to N KiB are held whole by HAProxy and so\n"
            "                        repeated on another instance when theirs dies before answering\n"
            "                        (tune.bufsize; default: HAProxy's 16 KiB buffers, about 15 KiB of body;\n"
            "                        HAProxy then holds up to two such buffers per request in flight)\n"
            "\n"
            "Routing: the model comes from /v2/models/NAME/..., /v2/repository/models/NAME/...,\n"
            "/api/v1/lipsync/NAME/..., else the query parameter model=NAME (segmentation uploads:\n"
            "/api/v1/segment?model=NAME), else the header mts-model; on gRPC from the mts-model metadata.\n"
            "Requests without one are spread round-robin.\n");
}

/* A port number 1..65535, the whole string. */
static int parse_port(const char *s, size_t len, int *out)
{
    if (len == 0 || len > 5) return -1;
    int v = 0;
    for (size_t i = 0; i < len; i++) {
        if (!isdigit((unsigned char)s[i])) return -1;
        v = v * 10 + (s[i] - '0');
    }
    if (v < 1 || v > 65535) return -1;
    *out = v;
    return 0;
}

static int parse_port_opt(const char *flag, const char *v, int *out)
{
    if (!v || parse_port(v, strlen(v), out)) {
        fprintf(stderr, "mtserve cluster-config: %s wants a port 1..65535, got '%s'\n", flag, v ? v : "");
        return -1;
    }
    return 0;
}

/* One HOST:HTTP:GRPC item (len bytes at s). Messages name the item's position in the list. */
static int parse_instance(const char *s, size_t len, int pos, instance *in)
{
    const char *host = s, *rest;
    size_t hlen;
    if (len && s[0] == '[') { /* [IPv6]:HTTP:GRPC */
        const char *close = memchr(s, ']', len);
        if (!close) {
            fprintf(stderr, "mtserve cluster-config: --instances item %d '%.*s': '[' without ']'\n", pos, (int)len, s);
            return -1;
        }
        host = s + 1;
        hlen = (size_t)(close - host);
        for (size_t i = 0; i < hlen; i++)
            if (!isxdigit((unsigned char)host[i]) && host[i] != ':' && host[i] != '.') {
                fprintf(stderr, "mtserve cluster-config: --instances item %d: '%.*s' is not an IPv6 address\n", pos,
                        (int)hlen, host);
                return -1;
            }
        rest = close + 1;
        in->is_name = false;
    } else {
        const char *c = memchr(s, ':', len);
        hlen = c ? (size_t)(c - s) : len;
        rest = s + hlen;
        bool digits_dots = true;
        for (size_t i = 0; i < hlen; i++) {
            char ch = host[i];
            if (!isalnum((unsigned char)ch) && ch != '.' && ch != '-' && ch != '_') {
                fprintf(stderr, "mtserve cluster-config: --instances item %d: host '%.*s' has a bad character at %zu\n",
                        pos, (int)hlen, host, i + 1);
                return -1;
            }
            if (!isdigit((unsigned char)ch) && ch != '.') digits_dots = false;
        }
        in->is_name = !digits_dots;
    }
    if (hlen == 0 || hlen > MAX_HOST) {
        fprintf(stderr, "mtserve cluster-config: --instances item %d '%.*s': the host must have 1..%d characters\n", pos,
                (int)len, s, MAX_HOST);
        return -1;
    }
    size_t rlen = len - (size_t)(rest - s);
    const char *c2 = rlen > 1 ? memchr(rest + 1, ':', rlen - 1) : NULL;
    if (rlen < 4 || rest[0] != ':' || !c2 || parse_port(rest + 1, (size_t)(c2 - rest - 1), &in->http) ||
        parse_port(c2 + 1, rlen - (size_t)(c2 + 1 - rest), &in->grpc)) {
        fprintf(stderr,
                "mtserve cluster-config: --instances item %d '%.*s': want HOST:HTTP_PORT:GRPC_PORT with ports 1..65535\n",
                pos, (int)len, s);
        return -1;
    }
    if (in->http == in->grpc) {
        fprintf(stderr, "mtserve cluster-config: --instances item %d '%.*s': the HTTP and gRPC ports are the same\n", pos,
                (int)len, s);
        return -1;
    }
    if (s[0] == '[') snprintf(in->host, sizeof in->host, "[%.*s]", (int)hlen, host);
    else snprintf(in->host, sizeof in->host, "%.*s", (int)hlen, host);
    return 0;
}

static int parse_instances(const char *list, instance *ins, int *n)
{
    *n = 0;
    const char *p = list;
    for (int pos = 1;; pos++) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (*n == MAX_INSTANCES) {
            fprintf(stderr, "mtserve cluster-config: --instances: more than %d instances\n", MAX_INSTANCES);
            return -1;
        }
        if (len == 0) {
            fprintf(stderr, "mtserve cluster-config: --instances item %d is empty\n", pos);
            return -1;
        }
        if (parse_instance(p, len, pos, &ins[*n])) return -1;
        for (int j = 0; j < *n; j++)
            if (!strcmp(ins[j].host, ins[*n].host) &&
                (ins[j].http == ins[*n].http || ins[j].grpc == ins[*n].grpc || ins[j].http == ins[*n].grpc ||
                 ins[j].grpc == ins[*n].http)) {
                fprintf(stderr, "mtserve cluster-config: --instances items %d and %d share a port on %s\n", j + 1, pos,
                        ins[j].host);
                return -1;
            }
        (*n)++;
        if (!comma) return 0;
        p = comma + 1;
    }
}

static void print_config(FILE *f, const instance *ins, int n, int front_http, int front_grpc, const char *bind,
                         int factor, int stats_port, int server_timeout, int retry_body_kb)
{
    bool names = false;
    for (int i = 0; i < n; i++) names |= ins[i].is_name;
    fprintf(f, "# HAProxy 2.6 configuration for %d mtserve instance%s, printed by `mtserve cluster-config`.\n", n,
            n == 1 ? "" : "s");
    fprintf(f, "# Check it with `haproxy -c -f FILE`; docs/scale-out.md explains each line.\n");
    fprintf(f, "global\n"
               "    log stderr format short local0 notice\n"
               "    maxconn 8192\n");
    if (retry_body_kb) /* the body plus room for the head and HAProxy's rewrite reserve */
        fprintf(f, "    # requests are retried only when held whole: bodies up to %d KiB\n"
                   "    tune.bufsize %d\n",
                retry_body_kb, (retry_body_kb + 32) * 1024);
    fprintf(f, "\n");
    if (names)
        fprintf(f, "# instance names are resolved at start and re-resolved while running (pods that move)\n"
                   "resolvers dns\n"
                   "    parse-resolv-conf\n"
                   "    hold valid 10s\n"
                   "\n");
    fprintf(f,
            "defaults\n"
            "    mode http\n"
            "    log global\n"
            "    option httplog\n"
            "    option dontlog-normal\n"
            "    option log-separate-errors\n"
            "    timeout connect 3s\n"
            "    timeout client %ds\n"
            "    timeout server %ds\n"
            "    timeout http-request 30s\n"
            "    timeout http-keep-alive 60s\n"
            "    timeout queue 30s\n"
            "    timeout check 2s\n"
            "    retries 3\n"
            "    option redispatch 1\n"
            "    retry-on conn-failure empty-response 503\n"
            "    hash-type consistent\n",
            server_timeout, server_timeout);
    if (factor) fprintf(f, "    hash-balance-factor %d\n", factor);
    fprintf(f, "    option httpchk\n"
               "    http-check send meth GET uri /v2/health/ready ver HTTP/1.1 hdr Host mtserve\n"
               "    http-check expect status 200\n"
               "    default-server inter 1s fastinter 500ms downinter 1s fall 2 rise 2 observe layer4 error-limit 2 "
               "on-error mark-down%s\n",
            names ? " resolvers dns init-addr last,libc,none" : "");
    fprintf(f, "\n");
    /* HTTP */
    fprintf(f,
            "frontend mts_http\n"
            "    bind %s:%d\n"
            "    http-request set-var(txn.model) path,field(4,/) if { path_beg /v2/models/ } !{ path /v2/models/stats }\n"
            "    http-request set-var(txn.model) path,field(5,/) if { path_beg /v2/repository/models/ }\n"
            "    http-request set-var(txn.model) path,field(5,/) if { path_beg /api/v1/lipsync/ }\n"
            "    http-request set-var(txn.model) url_param(model) if !{ var(txn.model) -m found }\n"
            "    http-request set-var(txn.model) req.hdr(mts-model) if !{ var(txn.model) -m found }\n"
            "    default_backend mts_http\n"
            "\n"
            "backend mts_http\n"
            "    balance hash var(txn.model)\n"
            "    option http-buffer-request\n",
            bind, front_http);
    for (int i = 0; i < n; i++)
        fprintf(f, "    server mts%d %s:%d id %d check\n", i + 1, ins[i].host, ins[i].http, i + 1);
    fprintf(f, "\n");
    /* gRPC */
    fprintf(f,
            "frontend mts_grpc\n"
            "    bind %s:%d proto h2\n"
            "    default_backend mts_grpc\n"
            "\n"
            "backend mts_grpc\n"
            "    balance hdr(mts-model)\n"
            "    http-request wait-for-body time 30s unless { path_end /ModelStreamInfer }\n",
            bind, front_grpc);
    for (int i = 0; i < n; i++)
        fprintf(f, "    server mts%d %s:%d id %d proto h2 check port %d check-proto h1\n", i + 1, ins[i].host, ins[i].grpc,
                i + 1, ins[i].http);
    if (stats_port)
        fprintf(f,
                "\n"
                "frontend stats\n"
                "    bind %s:%d\n"
                "    http-request use-service prometheus-exporter if { path /metrics }\n"
                "    stats enable\n"
                "    stats uri /\n"
                "    stats refresh 5s\n",
                bind, stats_port);
}

static int parse_int_opt(const char *flag, const char *v, long lo, long hi, int *out)
{
    char *end = NULL;
    long x = *v ? strtol(v, &end, 10) : lo - 1;
    if (!end || *end || x < lo || x > hi) {
        fprintf(stderr, "mtserve cluster-config: %s wants an integer %ld..%ld, got '%s'\n", flag, lo, hi, v);
        return -1;
    }
    *out = (int)x;
    return 0;
}

static const char missing_value[1]; /* opt_value's answer for a flag given without its value */

static const char *opt_value(int argc, char **argv, int *i, const char *name)
{
    size_t n = strlen(name);
    if (!strncmp(argv[*i], name, n) && argv[*i][n] == '=') return argv[*i] + n + 1;
    if (strcmp(argv[*i], name)) return NULL;
    if (*i + 1 >= argc || !strncmp(argv[*i + 1], "--", 2)) {
        fprintf(stderr, "mtserve cluster-config: option %s needs a value\n", name);
        return missing_value;
    }
    return argv[++*i];
}

int mts_cli_cluster_config(int argc, char **argv)
{
    static instance ins[MAX_INSTANCES];
    int n = 0, front_http = 8080, front_grpc = 50050, factor = 250, stats_port = 0, server_timeout = 300;
    int retry_body_kb = 0;
    const char *bind = "", *list = NULL;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if ((v = opt_value(argc, argv, &i, "--instances"))) {
            if (v == missing_value) return 2;
            list = v;
        } else if ((v = opt_value(argc, argv, &i, "--front-http"))) {
            if (v == missing_value) return 2;
            if (parse_port_opt("--front-http", v, &front_http)) return 2;
        } else if ((v = opt_value(argc, argv, &i, "--front-grpc"))) {
            if (v == missing_value) return 2;
            if (parse_port_opt("--front-grpc", v, &front_grpc)) return 2;
        } else if ((v = opt_value(argc, argv, &i, "--stats-port"))) {
            if (v == missing_value) return 2;
            if (parse_port_opt("--stats-port", v, &stats_port)) return 2;
        } else if ((v = opt_value(argc, argv, &i, "--bind"))) {
            if (v == missing_value) return 2;
            size_t len = strlen(v);
            bool ok = len <= MAX_HOST + 2;
            for (size_t k = 0; ok && k < len; k++)
                ok = isalnum((unsigned char)v[k]) || strchr(".-_:[]", v[k]);
            if (!ok) {
                fprintf(stderr, "mtserve cluster-config: --bind wants an address or a host name, got '%s'\n", v);
                return 2;
            }
            bind = v;
        } else if ((v = opt_value(argc, argv, &i, "--balance-factor"))) {
            if (v == missing_value) return 2;
            if (parse_int_opt("--balance-factor", v, 0, 1000, &factor)) return 2;
            if (factor > 0 && factor <= 100) {
                fprintf(stderr, "mtserve cluster-config: --balance-factor wants 0 (off) or a percentage 101..1000, "
                                "got '%s'\n", v);
                return 2;
            }
        } else if ((v = opt_value(argc, argv, &i, "--retry-body-kb"))) {
            if (v == missing_value) return 2;
            if (parse_int_opt("--retry-body-kb", v, 1, 262144, &retry_body_kb)) return 2;
        } else if ((v = opt_value(argc, argv, &i, "--server-timeout"))) {
            if (v == missing_value) return 2;
            if (parse_int_opt("--server-timeout", v, 1, 86400, &server_timeout)) return 2;
        } else {
            fprintf(stderr, "mtserve cluster-config: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (!list) {
        fprintf(stderr, "mtserve cluster-config: --instances is required (HOST:HTTP:GRPC,...)\n");
        return 2;
    }
    if (parse_instances(list, ins, &n)) return 2;
    int fronts[3] = {front_http, front_grpc, stats_port};
    if (fronts[0] == fronts[1] || fronts[0] == fronts[2] || fronts[1] == fronts[2]) {
        fprintf(stderr, "mtserve cluster-config: --front-http, --front-grpc and --stats-port must differ\n");
        return 2;
    }
    print_config(stdout, ins, n, front_http, front_grpc, bind, factor, stats_port, server_timeout, retry_body_kb);
    return fflush(stdout) ? 1 : 0;
}
