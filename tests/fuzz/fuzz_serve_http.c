/* fuzz_serve_http.c — the header checks of `flashlm serve` (tools/serve_http.c) on arbitrary header blocks: the
 * message framing (RFC 9112 section 6: Content-Length, Transfer-Encoding), the Host, the Origin and Content-Type of
 * a POST, the API key headers.
 *
 * Input: byte 0 holds flags (bit 0: an HTTP/1.0 request; bit 1: --api-key given; bit 2: listening on 0.0.0.0 rather
 * than 127.0.0.1 and ::1; bit 3: --cors localhost and http://a.example); the rest is a header block, one
 * "Name: value" a line (LF or CRLF), parsed as libmicrohttpd hands headers over (name up to the colon, the value
 * without surrounding blanks). Besides memory errors, the target checks the answers against an independent reading
 * of the same headers: both framing headers are always refused, differing Content-Length values always refused, a
 * Transfer-Encoding whose last coding is not chunked always refused; the statuses are the documented ones. Seeds:
 * tests/fuzz/seeds/fuzz_serve_http (smuggling attempts and ordinary requests). */
#include <ctype.h>
#include <strings.h>

#include "fuzz_common.h"

#include "serve_http.h"

#define MAX_HDRS 64

/* The last non-empty comma-separated element of a Transfer-Encoding list, trimmed, without parameters: whether it is
 * "chunked" (independent of serve_http.c's list walker). Empty elements ("chunked, ,") are ignored, as RFC 9110
 * section 5.6.1 tells a recipient to. */
static int last_is_chunked(const char *v) {
    const char *end = v + strlen(v);
    for (;;) {
        const char *last = end;
        while (last > v && last[-1] != ',') last--;
        const char *b = last;
        while (b < end && (*b == ' ' || *b == '\t')) b++;
        if (b < end) {
            size_t n = strcspn(b, "; \t,");
            return n == 7 && !strncasecmp(b, "chunked", 7);
        }
        if (last == v) return 0; /* no element at all */
        end = last - 1;          /* an empty element: the one before it */
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    unsigned flags = data[0];
    char *buf = malloc(size);
    if (!buf) return 0;
    memcpy(buf, data + 1, size - 1);
    buf[size - 1] = 0;
    serve_hdr h[MAX_HDRS];
    size_t n = 0;
    int n_cl = 0, n_te = 0, te_bad = 0, cl_differ = 0, n_ce = 0;
    const char *cl0 = NULL;
    for (char *line = buf, *next; line && n < MAX_HDRS; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        size_t len = strlen(line);
        if (len && line[len - 1] == '\r') line[--len] = 0;
        char *colon = strchr(line, ':');
        if (!colon || colon == line) continue;
        *colon = 0;
        char *v = colon + 1;
        while (*v == ' ' || *v == '\t') v++;
        char *e = v + strlen(v);
        while (e > v && (e[-1] == ' ' || e[-1] == '\t')) *--e = 0;
        h[n++] = (serve_hdr){line, v};
        if (!strcasecmp(line, "Content-Length")) {
            if (cl0 && strcmp(cl0, v)) cl_differ = 1;
            if (!cl0) cl0 = v;
            n_cl++;
        }
        if (!strcasecmp(line, "Transfer-Encoding")) {
            n_te++;
            te_bad |= !last_is_chunked(v);
        }
        if (!strcasecmp(line, "Content-Encoding")) n_ce++;
    }
    char msg[256];
    int st = serve_check_framing(h, n, flags & 1, msg, sizeof msg);
    fz_check(st == 0 || st == 400 || st == 501 || (st == 415 && n_ce), "framing status %d", st);
    if (st) fz_check(msg[0] && strlen(msg) < sizeof msg, "framing: an error without a message");
    if (n_cl && n_te) fz_check(st == 400, "Content-Length with Transfer-Encoding accepted (%d)", st);
    if (n_te && (flags & 1)) fz_check(st == 400, "Transfer-Encoding in HTTP/1.0 accepted (%d)", st);
    if (n_te == 1 && te_bad) fz_check(st == 400, "a Transfer-Encoding not ending in chunked accepted (%d)", st);
    /* two values that differ as strings may still be the same number ("5" and "05"); as numbers they must not */
    if (cl_differ && st == 0) {
        unsigned long long first = 0;
        int have = 0;
        for (size_t i = 0; i < n; i++) {
            if (strcasecmp(h[i].name, "Content-Length")) continue;
            for (const char *p = h[i].value; *p;) {
                while (*p == ' ' || *p == '\t' || *p == ',') p++;
                if (!*p) break;
                fz_check(isdigit((unsigned char)*p), "a Content-Length that is not a number accepted");
                unsigned long long x = strtoull(p, (char **)&p, 10);
                if (have) fz_check(x == first, "differing Content-Length values accepted");
                first = x;
                have = 1;
            }
        }
    }

    serve_access a = {.n_hosts = 0};
    if (flags & 4) a.hosts[a.n_hosts++] = "0.0.0.0";
    else {
        a.hosts[a.n_hosts++] = "127.0.0.1";
        a.hosts[a.n_hosts++] = "::1";
    }
    if (flags & 8) {
        a.cors[a.n_cors++] = "localhost";
        a.cors[a.n_cors++] = "http://a.example";
    }
    a.api_key = flags & 2;
    const char *host = NULL, *origin = NULL, *ctype = NULL, *auth = NULL, *xkey = NULL;
    for (size_t i = 0; i < n; i++) {
        if (!strcasecmp(h[i].name, "Host")) host = h[i].value;
        if (!strcasecmp(h[i].name, "Origin")) origin = h[i].value;
        if (!strcasecmp(h[i].name, "Content-Type")) ctype = h[i].value;
        if (!strcasecmp(h[i].name, "Authorization")) auth = h[i].value;
        if (!strcasecmp(h[i].name, "X-Api-Key")) xkey = h[i].value;
    }
    st = serve_check_host(&a, host, msg, sizeof msg);
    fz_check(st == 0 || st == 400 || st == 403, "host status %d", st);
    if (a.api_key) fz_check(st == 0, "with an API key any Host is accepted");
    if (!a.api_key && host && st == 0) { /* a name other than localhost never passes: DNS rebinding */
        const char *b = host[0] == '[' ? host + 1 : host;
        fz_check(isxdigit((unsigned char)b[0]) || b[0] == ':' || !strncasecmp(b, "localhost", 9),
                 "Host '%s' accepted", host);
    }
    bool allowed = serve_origin_allowed(&a, origin, host);
    if (!origin) fz_check(!allowed, "no Origin, allowed");
    st = serve_check_post(&a, origin, host, ctype, msg, sizeof msg);
    fz_check(st == 0 || st == 403 || st == 415, "post status %d", st);
    if (origin && !allowed) fz_check(st == 403, "a disallowed origin's POST accepted");
    if (!a.api_key && !origin && st == 0)
        fz_check(ctype && !strncasecmp(ctype + strspn(ctype, " \t"), "application/json", 16),
                 "a POST of Content-Type '%s' accepted without a key", ctype ? ctype : "none");
    bool ok = serve_key_ok("k-123", auth, xkey);
    if (ok) fz_check((auth && strstr(auth, "k-123")) || (xkey && strstr(xkey, "k-123")), "a key accepted from nothing");
    fz_check(serve_key_ok(NULL, auth, xkey), "no key: every request passes");
    free(buf);
    return 0;
}
