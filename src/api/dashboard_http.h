/*
 * The live dashboard's REST routes:
 *
 *   GET /dashboard                  the page (HTML with inlined CSS and JavaScript, compiled into
 *                                   the binary from src/api/dashboard/); it holds no data, so it
 *                                   is open (MTS_SCOPE_OPEN)
 *   GET /api/v1/dashboard/state     the JSON state the page polls (mts_server_dashboard_json);
 *                                   scope infer, like /metrics
 *
 * With a token file, the page is opened once as /dashboard?token=<token>: its script keeps the
 * token in sessionStorage, removes it from the address bar and sends it as
 * `Authorization: Bearer` with every poll. docs/server.md ("Dashboard") describes the page.
 */
#ifndef MTS_API_DASHBOARD_HTTP_H
#define MTS_API_DASHBOARD_HTTP_H

#include "api/router.h"

extern const mts_route mts_dashboard_routes[];

#endif
