/* webui.c - the chat page of `mlxcel serve` (docs/server.md, "The chat
 * page"): the files of webui/, embedded at build time by
 * scripts/embed_webui.cmake, served at GET / (index.html) and
 * GET /webui/<file>.  `--no-webui` turns them off (404 as for any unknown
 * path).
 *
 * They are served without the API key: the page holds no secret, and it
 * asks for the key itself when the API answers 401.  Its script and style
 * are files of their own, not inline, so the Content-Security-Policy can
 * allow only this server's own files and API: no inline code, no request to
 * any other host, no frames, no form posted anywhere. */
#include <microhttpd.h>
#include <string.h>

#include "server/srv_int.h"

static const char csp[] = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                          "connect-src 'self'; base-uri 'none'; form-action 'none'; "
                          "frame-ancestors 'none'";

const srv_webui_file *srv_webui_find(const char *url)
{
    for (int i = 0; i < srv_webui_n_files; i++)
        if (!strcmp(url, srv_webui_files[i].url))
            return &srv_webui_files[i];
    return NULL;
}

struct MHD_Response *srv_webui_response(const srv_webui_file *f)
{
    /* the bytes are static: MHD sends them without a copy */
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(f->len, (void *)f->data, MHD_RESPMEM_PERSISTENT);
    if (!resp)
        return NULL;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, f->type);
    MHD_add_response_header(resp, "Content-Security-Policy", csp);
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(resp, "Referrer-Policy", "no-referrer");
    /* a new build may bring a new page: the browser asks again each time */
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    return resp;
}
