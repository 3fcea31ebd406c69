/*
 * The live dashboard's routes (dashboard_http.h): the page compiled in by
 * src/api/dashboard/embed.cmake, served with a content security policy that allows nothing
 * outside the page and its own origin, and the JSON state document from the server core.
 */
#include "api/dashboard_http.h"

#include <stdlib.h>

#include "api/protocol.h"

extern const unsigned char mts__dashboard_page[];
extern const size_t mts__dashboard_page_len;

static void route_page(mts_server *srv, mts_http_conn *c, mts_http_req *hr, const mts_route_args *a)
{
    /* no-referrer: the first visit may carry ?token= in its URL */
    mts_http_respond(c, 200, "text/html; charset=utf-8",
                     "Content-Security-Policy: default-src 'none'; script-src 'unsafe-inline'; "
                     "style-src 'unsafe-inline'; connect-src 'self'; img-src data:; base-uri 'none'; "
                     "form-action 'none'; frame-ancestors 'none'\r\n"
                     "Referrer-Policy: no-referrer\r\nX-Content-Type-Options: nosniff\r\nCache-Control: no-cache\r\n",
                     mts__dashboard_page, mts__dashboard_page_len);
}

static void route_state(mts_server *srv, mts_http_conn *c, mts_http_req *hr, const mts_route_args *a)
{
    size_t len = 0;
    char *json = mts_server_dashboard_json(srv, &len);
    if (!json) {
        mts_route_error(c, MTS_ENOMEM, "out of memory");
        return;
    }
    mts_http_respond(c, 200, "application/json", "Cache-Control: no-store\r\n", json, len);
    free(json);
}

const mts_route mts_dashboard_routes[] = {
    {"GET", "/dashboard", route_page, NULL, MTS_SCOPE_OPEN},
    {"GET", "/api/v1/dashboard/state", route_state, NULL, MTS_SCOPE_INFER},
    {NULL, NULL, NULL, NULL, 0},
};
