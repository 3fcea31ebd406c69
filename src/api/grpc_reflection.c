/*
 * grpc.health.v1.Health/Check and gRPC server reflection (grpc.reflection.v1 and v1alpha, which
 * share one wire format). Reflection answers from the FileDescriptorSet that protoc writes from
 * proto/ at build time (embedded as mts__grpc_descriptor_set): at first use it is walked once
 * with a minimal protobuf reader to index every file by name and every package-qualified
 * symbol (messages, nested messages, enums, services, methods) by the file declaring it.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/grpc_internal.h"
#include "grpc/health/v1/health.pb-c.h"
#include "grpc/reflection/v1alpha/reflection.pb-c.h"

const char *const mts__grpc_service_names[] = {
    "inference.GRPCInferenceService", "inference.InferenceService", "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection", NULL,
};

/* ---- health ---- */

/* Unpacks a HealthCheckRequest (failing the call with INVALID_ARGUMENT when it is not one) and
 * tells whether it names the server ("") or a served service. Free with ..._free_unpacked. */
static Grpc__Health__V1__HealthCheckRequest *health_request(mts__grpc_call *c, const uint8_t *data, size_t len,
                                                            bool *known)
{
    Grpc__Health__V1__HealthCheckRequest *m = grpc__health__v1__health_check_request__unpack(NULL, len, data);
    if (!m) {
        mts__grpc_fail(c, MTS_GRPC_INVALID_ARGUMENT, "the request is not a valid grpc.health.v1.HealthCheckRequest");
        return NULL;
    }
    *known = !m->service[0];
    for (int i = 0; !*known && mts__grpc_service_names[i]; i++) *known = !strcmp(m->service, mts__grpc_service_names[i]);
    return m;
}

static void health_check(mts__grpc_call *c, const uint8_t *data, size_t len)
{
    bool known;
    Grpc__Health__V1__HealthCheckRequest *m = health_request(c, data, len, &known);
    if (!m) return;
    if (!known) {
        mts__grpc_fail(c, MTS_GRPC_NOT_FOUND, "unknown service '%s'", m->service);
    } else {
        Grpc__Health__V1__HealthCheckResponse r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
        r.status = mts__grpc_shutting_down(c) ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING
                                              : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
        mts__grpc_reply(c, &r.base);
    }
    grpc__health__v1__health_check_request__free_unpacked(m, NULL);
}

/* Watch (server streaming): the current status at once, then a message whenever it changes. The
 * only change a running mtserve has is SERVING -> NOT_SERVING at shutdown, after which the stream
 * closes with OK. An unknown service gets SERVICE_UNKNOWN and the stream stays open (as the
 * protocol asks), as do streams whose client keeps them. */
static void watch_send(mts__grpc_call *c, int status)
{
    Grpc__Health__V1__HealthCheckResponse r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    r.status = status;
    mts__grpc_send(c, &r.base);
}

static void watch_shutdown(mts__grpc_call *c)
{
    watch_send(c, GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING);
    mts__grpc_fail(c, MTS_GRPC_OK, "%s", "");
}

static void health_watch(mts__grpc_call *c, const uint8_t *data, size_t len)
{
    if (c->state) return; /* one request per stream; later messages are ignored */
    c->state = (void *)1;
    bool known;
    Grpc__Health__V1__HealthCheckRequest *m = health_request(c, data, len, &known);
    if (!m) return;
    grpc__health__v1__health_check_request__free_unpacked(m, NULL);
    if (!known) {
        watch_send(c, GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN);
        return;
    }
    if (mts__grpc_shutting_down(c) || !mts__grpc_watch_add(c, watch_shutdown)) {
        watch_shutdown(c);
        return;
    }
    watch_send(c, GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
}

static void watch_half_close(mts__grpc_call *c)
{
    (void)c; /* the client sent its request; the stream stays open for updates */
}

static void watch_cancel(mts__grpc_call *c)
{
    mts__grpc_watch_remove(c);
}

const mts__grpc_method mts__grpc_health_methods[] = {
    {"/grpc.health.v1.Health/Check", false, health_check, NULL, NULL, NULL, MTS_SCOPE_OPEN, false, 0},
    {"/grpc.health.v1.Health/Watch", true, health_watch, watch_half_close, watch_cancel, NULL,
     MTS_SCOPE_OPEN, false, 0},
    {NULL, false, NULL, NULL, NULL, NULL, 0, false, 0},
};

/* ---- descriptor index ---- */

typedef struct desc_file {
    char name[256];
    const uint8_t *data;
    size_t len;
    int deps[16];
    int n_deps;
    char dep_names[16][256];
} desc_file;

typedef struct desc_symbol {
    char name[256];
    int file;
} desc_symbol;

static struct {
    pthread_once_t once;
    desc_file files[32];
    int n_files;
    desc_symbol *symbols;
    int n_symbols, cap_symbols;
} idx = {PTHREAD_ONCE_INIT};

static void add_symbol(const char *prefix, const uint8_t *name, size_t nlen, int file, char *out, size_t out_len)
{
    snprintf(out, out_len, "%s%s%.*s", prefix, prefix[0] ? "." : "", (int)nlen, (const char *)name);
    if (idx.n_symbols == idx.cap_symbols) {
        int cap = idx.cap_symbols ? idx.cap_symbols * 2 : 256;
        desc_symbol *s = realloc(idx.symbols, sizeof *s * (size_t)cap);
        if (!s) return;
        idx.symbols = s;
        idx.cap_symbols = cap;
    }
    snprintf(idx.symbols[idx.n_symbols].name, sizeof idx.symbols[0].name, "%s", out);
    idx.symbols[idx.n_symbols++].file = file;
}

/* Indexes a DescriptorProto (or EnumDescriptorProto when is_enum) and its nested types. */
static void index_type(const char *prefix, const uint8_t *p, size_t len, int file, bool is_enum)
{
    const uint8_t *end = p + len, *q = p;
    mts__pb_field f;
    char full[256] = "";
    while (mts__pb_next(&q, end, &f))
        if (f.number == 1 && f.wire == 2) add_symbol(prefix, f.data, f.len, file, full, sizeof full);
    if (is_enum || !full[0]) return;
    q = p;
    while (mts__pb_next(&q, end, &f))
        if ((f.number == 3 || f.number == 4) && f.wire == 2) index_type(full, f.data, f.len, file, f.number == 4);
}

static void index_service(const char *prefix, const uint8_t *p, size_t len, int file)
{
    const uint8_t *end = p + len, *q = p;
    mts__pb_field f;
    char full[256] = "", method[256];
    while (mts__pb_next(&q, end, &f))
        if (f.number == 1 && f.wire == 2) add_symbol(prefix, f.data, f.len, file, full, sizeof full);
    q = p;
    while (full[0] && mts__pb_next(&q, end, &f)) {
        if (f.number != 2 || f.wire != 2) continue;
        const uint8_t *mq = f.data, *mend = f.data + f.len;
        mts__pb_field mf;
        while (mts__pb_next(&mq, mend, &mf))
            if (mf.number == 1 && mf.wire == 2) add_symbol(full, mf.data, mf.len, file, method, sizeof method);
    }
}

static void build_index(void)
{
    const uint8_t *p = mts__grpc_descriptor_set, *end = p + mts__grpc_descriptor_set_len;
    mts__pb_field f;
    while (mts__pb_next(&p, end, &f)) {
        if (f.number != 1 || f.wire != 2 || idx.n_files == (int)(sizeof idx.files / sizeof idx.files[0])) continue;
        int fi = idx.n_files++;
        desc_file *df = &idx.files[fi];
        df->data = f.data;
        df->len = f.len;
        char package[256] = "";
        const uint8_t *q = f.data, *fend = f.data + f.len;
        mts__pb_field g;
        while (mts__pb_next(&q, fend, &g)) {
            if (g.wire != 2) continue;
            if (g.number == 1) snprintf(df->name, sizeof df->name, "%.*s", (int)g.len, (const char *)g.data);
            else if (g.number == 2) snprintf(package, sizeof package, "%.*s", (int)g.len, (const char *)g.data);
            else if (g.number == 3 && df->n_deps < 16)
                snprintf(df->dep_names[df->n_deps++], sizeof df->dep_names[0], "%.*s", (int)g.len, (const char *)g.data);
        }
        q = f.data;
        while (mts__pb_next(&q, fend, &g)) {
            if (g.wire != 2) continue;
            if (g.number == 4 || g.number == 5) index_type(package, g.data, g.len, fi, g.number == 5);
            else if (g.number == 6) index_service(package, g.data, g.len, fi);
        }
    }
    for (int i = 0; i < idx.n_files; i++)
        for (int d = 0; d < idx.files[i].n_deps; d++) {
            idx.files[i].deps[d] = -1;
            for (int j = 0; j < idx.n_files; j++)
                if (!strcmp(idx.files[j].name, idx.files[i].dep_names[d])) idx.files[i].deps[d] = j;
        }
}

static int find_file(const char *name)
{
    for (int i = 0; i < idx.n_files; i++)
        if (!strcmp(idx.files[i].name, name)) return i;
    return -1;
}

static int find_symbol(const char *name)
{
    if (name[0] == '.') name++;
    for (int i = 0; i < idx.n_symbols; i++)
        if (!strcmp(idx.symbols[i].name, name)) return idx.symbols[i].file;
    return -1;
}

/* The file and its transitive dependencies, the file first. */
static void collect_files(int fi, bool *seen, int *order, int *n)
{
    if (fi < 0 || seen[fi]) return;
    seen[fi] = true;
    order[(*n)++] = fi;
    for (int d = 0; d < idx.files[fi].n_deps; d++) collect_files(idx.files[fi].deps[d], seen, order, n);
}

/* ---- reflection stream ---- */

static void reflection_message(mts__grpc_call *c, const uint8_t *data, size_t len)
{
    pthread_once(&idx.once, build_index);
    Grpc__Reflection__V1alpha__ServerReflectionRequest *m =
        grpc__reflection__v1alpha__server_reflection_request__unpack(NULL, len, data);
    if (!m) {
        mts__grpc_fail(c, MTS_GRPC_INVALID_ARGUMENT, "the message is not a valid ServerReflectionRequest");
        return;
    }
    mts__grpc_arena a = {0};
    Grpc__Reflection__V1alpha__ServerReflectionResponse r = GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_RESPONSE__INIT;
    r.valid_host = m->host;
    r.original_request = m;
    int file = -1;
    char err[400] = "";
    switch (m->message_request_case) {
    case GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_LIST_SERVICES: {
        Grpc__Reflection__V1alpha__ListServiceResponse *ls = MTS__GRPC_NEW(
            &a, Grpc__Reflection__V1alpha__ListServiceResponse, GRPC__REFLECTION__V1ALPHA__LIST_SERVICE_RESPONSE__INIT);
        int n = 0;
        while (mts__grpc_service_names[n]) n++;
        ls->service = mts__grpc_alloc(&a, sizeof *ls->service * (size_t)n);
        for (int i = 0; i < n; i++) {
            Grpc__Reflection__V1alpha__ServiceResponse *s = MTS__GRPC_NEW(
                &a, Grpc__Reflection__V1alpha__ServiceResponse, GRPC__REFLECTION__V1ALPHA__SERVICE_RESPONSE__INIT);
            s->name = (char *)mts__grpc_service_names[i];
            ls->service[ls->n_service++] = s;
        }
        r.message_response_case = GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_LIST_SERVICES_RESPONSE;
        r.list_services_response = ls;
        break;
    }
    case GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_BY_FILENAME:
        file = find_file(m->file_by_filename);
        if (file < 0) snprintf(err, sizeof err, "file '%s' not found", m->file_by_filename);
        break;
    case GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_SYMBOL:
        file = find_symbol(m->file_containing_symbol);
        if (file < 0) snprintf(err, sizeof err, "symbol '%s' not found", m->file_containing_symbol);
        break;
    case GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_ALL_EXTENSION_NUMBERS_OF_TYPE:
        if (find_symbol(m->all_extension_numbers_of_type) < 0) {
            snprintf(err, sizeof err, "type '%s' not found", m->all_extension_numbers_of_type);
        } else {
            Grpc__Reflection__V1alpha__ExtensionNumberResponse *en =
                MTS__GRPC_NEW(&a, Grpc__Reflection__V1alpha__ExtensionNumberResponse,
                              GRPC__REFLECTION__V1ALPHA__EXTENSION_NUMBER_RESPONSE__INIT);
            en->base_type_name = m->all_extension_numbers_of_type;
            r.message_response_case =
                GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ALL_EXTENSION_NUMBERS_RESPONSE;
            r.all_extension_numbers_response = en;
        }
        break;
    case GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_EXTENSION:
        snprintf(err, sizeof err, "no extensions are declared");
        break;
    default: snprintf(err, sizeof err, "empty or unknown reflection request"); break;
    }
    if (file >= 0) {
        bool seen[32] = {0};
        int order[32], n = 0;
        collect_files(file, seen, order, &n);
        Grpc__Reflection__V1alpha__FileDescriptorResponse *fd =
            MTS__GRPC_NEW(&a, Grpc__Reflection__V1alpha__FileDescriptorResponse,
                          GRPC__REFLECTION__V1ALPHA__FILE_DESCRIPTOR_RESPONSE__INIT);
        fd->file_descriptor_proto = mts__grpc_alloc(&a, sizeof *fd->file_descriptor_proto * (size_t)n);
        for (int i = 0; i < n; i++) {
            fd->file_descriptor_proto[i].data = (uint8_t *)idx.files[order[i]].data;
            fd->file_descriptor_proto[i].len = idx.files[order[i]].len;
        }
        fd->n_file_descriptor_proto = (size_t)n;
        r.message_response_case = GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_FILE_DESCRIPTOR_RESPONSE;
        r.file_descriptor_response = fd;
    } else if (err[0]) {
        Grpc__Reflection__V1alpha__ErrorResponse *e = MTS__GRPC_NEW(&a, Grpc__Reflection__V1alpha__ErrorResponse,
                                                                    GRPC__REFLECTION__V1ALPHA__ERROR_RESPONSE__INIT);
        e->error_code = MTS_GRPC_NOT_FOUND;
        e->error_message = err;
        r.message_response_case = GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ERROR_RESPONSE;
        r.error_response = e;
    }
    pthread_mutex_lock(&c->lock);
    mts__grpc_send_locked(c, &r.base);
    mts__grpc_read_locked(c);
    pthread_mutex_unlock(&c->lock);
    mts__grpc_arena_free(&a);
    grpc__reflection__v1alpha__server_reflection_request__free_unpacked(m, NULL);
}

static void reflection_half_close(mts__grpc_call *c)
{
    pthread_mutex_lock(&c->lock);
    mts__grpc_close_locked(c, MTS_GRPC_OK, NULL);
    pthread_mutex_unlock(&c->lock);
}

const mts__grpc_method mts__grpc_reflection_methods[] = {
    {"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", true, reflection_message,
     reflection_half_close, NULL, NULL, MTS_SCOPE_INFER, false, 0},
    {"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", true, reflection_message, reflection_half_close,
     NULL, NULL, MTS_SCOPE_INFER, false, 0},
    {NULL, false, NULL, NULL, NULL, NULL, 0, false, 0},
};
