/*
 * Bearer-token authentication for both front ends. A token file lists one token per line with
 * the scopes it grants:
 *
 *     # comment
 *     <token> infer            inference, metadata, statistics, metrics, lip-sync, segmentation
 *     <token> admin            everything: also repository load/unload
 *     <token> infer,admin      the same as admin
 *
 * Tokens are 16-512 printable ASCII characters without spaces. Every route and RPC carries the
 * scope it needs (open: health only; infer; admin); with a token file loaded, a request names
 * its token in `Authorization: Bearer <token>` (the HTTP header, or the gRPC metadata key
 * `authorization`). A missing or unknown token is answered 401 / UNAUTHENTICATED, a token
 * without the route's scope 403 / PERMISSION_DENIED. Tokens are compared in constant time and
 * never logged or echoed. Without a token file every route is open (a warning at start says so
 * when the server listens beyond loopback).
 */
#ifndef MTS_API_AUTH_H
#define MTS_API_AUTH_H

#include <stdbool.h>
#include <stddef.h>

#include "util/status.h"

/* What a route or RPC needs. MTS_SCOPE_INFER is 0 so that a table entry that names none is
 * protected, not open. */
enum mts_scope { MTS_SCOPE_INFER = 0, MTS_SCOPE_OPEN = 1, MTS_SCOPE_ADMIN = 2 };

typedef struct mts_auth mts_auth;

/* Reads a token file. Errors name the file and line (never the token). */
int mts_auth_load(const char *path, mts_auth **out, mts_err *err);
void mts_auth_free(mts_auth *a);
int mts_auth_count(const mts_auth *a);

/* Checks the value of an Authorization header / metadata entry (NULL when absent; value_len
 * bytes, not NUL-terminated) against the scope a route needs. a == NULL or MTS_SCOPE_OPEN:
 * MTS_OK. Otherwise MTS_OK, MTS_EUNAUTHENTICATED (no, malformed or unknown token) or
 * MTS_EPERMISSION (the token lacks the scope), with a message for the client in err. */
int mts_auth_check(const mts_auth *a, const char *value, size_t value_len, int scope, mts_err *err);

/* True when host is a loopback address ("127.x.x.x", "::1", "localhost"). */
bool mts_auth_host_is_loopback(const char *host);

#endif
