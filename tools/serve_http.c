/* serve_http.c — header checks of `flashlm serve` (tools/serve_http.h): framing (RFC 9112 §6), Host, Origin,
 * Content-Type, API key. Nothing here trusts a header: every value is scanned within its NUL, nothing is copied
 * into a fixed buffer without a bound. */
#include "serve_http.h"

#include <arpa/inet.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

static bool is_ows(char c) { return c == ' ' || c == '\t'; }

/* The next element of a comma-separated list (RFC 9110 §5.6.1) at *p: [*b, *e) trimmed of whitespace (possibly
 * empty: empty elements are allowed and skipped by the callers); false at the end. */
static bool next_elem(const char **p, const char **b, const char **e) {
    const char *s = *p;
    if (!s) return false;
    while (is_ows(*s)) s++;
    const char *end = strchr(s, ',');
    const char *stop = end ? end : s + strlen(s);
    const char *t = stop;
    while (t > s && is_ows(t[-1])) t--;
    *b = s;
    *e = t;
    *p = end ? end + 1 : NULL;
    return true;
}

static bool elem_is(const char *b, const char *e, const char *word) {
    size_t n = strlen(word);
    return (size_t)(e - b) == n && !strncasecmp(b, word, n);
}

/* A field name's character (RFC 9110 §5.6.2 tchar). */
static bool is_tchar(unsigned char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

int serve_check_framing(const serve_hdr *h, size_t n, bool http10, char *msg, size_t cap) {
    size_t n_host = 0;
    for (size_t i = 0; i < n; i++) {
        const char *name = h[i].name;
        if (!name) continue;
        bool token = *name != 0;
        for (const unsigned char *q = (const unsigned char *)name; token && *q; q++) token = is_tchar(*q);
        if (!token) {
            snprintf(msg, cap, "bad request: the header name '%.40s' is not a token (whitespace before its colon?: "
                     "RFC 9112 section 5.1)", name);
            return 400;
        }
        if (!strcasecmp(name, "Host") && ++n_host > 1) {
            snprintf(msg, cap, "bad request: more than one Host header (RFC 9112 section 3.2)");
            return 400;
        }
    }
    bool have_cl = false, have_te = false;
    unsigned long long cl = 0;
    /* the Transfer-Encoding codings over all its headers, in order: how many, whether the last is chunked, and
     * whether one before the last is chunked or unknown */
    size_t n_codings = 0;
    bool last_chunked = false, early_chunked = false, early_other = false;
    for (size_t i = 0; i < n; i++) {
        const char *name = h[i].name, *v = h[i].value ? h[i].value : "";
        if (!name) continue;
        if (!strcasecmp(name, "Content-Length")) {
            const char *p = v, *b, *e;
            bool any = false;
            while (next_elem(&p, &b, &e)) {
                if (b == e) continue;
                size_t len = (size_t)(e - b);
                bool digits = len <= 19;
                for (const char *q = b; digits && q < e; q++) digits = *q >= '0' && *q <= '9';
                if (!digits) {
                    snprintf(msg, cap, "bad request framing: Content-Length '%.40s' is not a decimal number", v);
                    return 400;
                }
                unsigned long long x = 0;
                for (const char *q = b; q < e; q++) x = x * 10 + (unsigned)(*q - '0');
                if (have_cl && x != cl) {
                    snprintf(msg, cap, "bad request framing: Content-Length values differ (%llu and %llu)", cl, x);
                    return 400;
                }
                have_cl = true;
                any = true;
                cl = x;
            }
            if (!any) {
                snprintf(msg, cap, "bad request framing: an empty Content-Length");
                return 400;
            }
        } else if (!strcasecmp(name, "Transfer-Encoding")) {
            have_te = true;
            const char *p = v, *b, *e;
            while (next_elem(&p, &b, &e)) {
                if (b == e) continue;
                const char *semi = memchr(b, ';', (size_t)(e - b)); /* a coding's parameters */
                const char *ce = semi ? semi : e;
                while (ce > b && is_ows(ce[-1])) ce--;
                if (n_codings && last_chunked) early_chunked = true;
                else if (n_codings) early_other = true;
                last_chunked = elem_is(b, ce, "chunked");
                n_codings++;
            }
        }
    }
    if (have_te && have_cl) {
        snprintf(msg, cap, "bad request framing: both Content-Length and Transfer-Encoding (RFC 9112 section 6.1)");
        return 400;
    }
    if (have_te && http10) {
        snprintf(msg, cap, "bad request framing: Transfer-Encoding in an HTTP/1.0 request (RFC 9112 section 6.1)");
        return 400;
    }
    if (have_te && (!n_codings || !last_chunked || early_chunked)) {
        snprintf(msg, cap, "bad request framing: Transfer-Encoding must end in chunked, once (RFC 9112 section 6.3)");
        return 400;
    }
    if (have_te && early_other) {
        snprintf(msg, cap, "Transfer-Encoding: only chunked is implemented");
        return 501;
    }
    /* a coded body (gzip, br, ...) would be read as its compressed bytes: refused by name (RFC 9110 section 8.4.1:
     * 415 for a coding the server does not take); identity is no coding */
    for (size_t i = 0; i < n; i++) {
        if (!h[i].name || strcasecmp(h[i].name, "Content-Encoding")) continue;
        const char *p = h[i].value ? h[i].value : "", *b, *e;
        while (next_elem(&p, &b, &e))
            if (b != e && !elem_is(b, e, "identity")) {
                snprintf(msg, cap, "Content-Encoding '%.40s' is not supported: send the body uncompressed (RFC 9110 "
                         "section 8.4.1)", h[i].value);
                return 415;
            }
    }
    return 0;
}

/* The host part of a Host header or an origin's authority: [*b, *e) without port and brackets. */
static void split_host(const char *s, const char **b, const char **e) {
    if (*s == '[') {
        const char *r = strchr(s, ']');
        *b = s + 1;
        *e = r ? r : s + strlen(s);
        return;
    }
    const char *c1 = strchr(s, ':');
    *b = s;
    *e = c1 && !strchr(c1 + 1, ':') ? c1 : s + strlen(s); /* one colon: host:port; more: a bare IPv6 address */
}

/* A numeric address (IPv4 or IPv6) in [b, e): its family and bytes; 0 when it is not one. */
static int parse_ip(const char *b, const char *e, unsigned char out[16]) {
    char buf[64];
    size_t n = (size_t)(e - b);
    if (n == 0 || n >= sizeof buf) return 0;
    memcpy(buf, b, n);
    buf[n] = 0;
    if (inet_pton(AF_INET, buf, out) == 1) return AF_INET;
    if (inet_pton(AF_INET6, buf, out) == 1) return AF_INET6;
    return 0;
}

static bool is_any_addr(const char *h) {
    unsigned char a[16];
    int f = parse_ip(h, h + strlen(h), a);
    static const unsigned char zero[16];
    return f && !memcmp(a, zero, f == AF_INET ? 4 : 16);
}

/* Whether [b, e) names a loopback host: localhost (a trailing dot allowed), 127.0.0.0/8 or ::1. */
static bool is_loopback(const char *b, const char *e) {
    if (elem_is(b, e, "localhost") || elem_is(b, e, "localhost.")) return true;
    unsigned char a[16];
    int f = parse_ip(b, e, a);
    static const unsigned char one6[16] = {[15] = 1};
    return (f == AF_INET && a[0] == 127) || (f == AF_INET6 && !memcmp(a, one6, 16));
}

int serve_check_host(const serve_access *a, const char *host, char *msg, size_t cap) {
    if (a->api_key) return 0;
    if (!host || !*host) {
        snprintf(msg, cap, "a Host header is required");
        return 400;
    }
    const char *b, *e;
    split_host(host, &b, &e);
    if (elem_is(b, e, "localhost") || elem_is(b, e, "localhost.")) return 0;
    unsigned char ip[16];
    int f = parse_ip(b, e, ip);
    for (int i = 0; f && i < a->n_hosts; i++) {
        const char *hs = a->hosts[i];
        unsigned char bound[16];
        int bf = parse_ip(hs, hs + strlen(hs), bound);
        if (is_any_addr(hs)) return 0; /* listening on every address: any numeric one is ours or a proxy's */
        if (bf == f && !memcmp(bound, ip, f == AF_INET ? 4 : 16)) return 0;
        if (is_loopback(hs, hs + strlen(hs)) && is_loopback(b, e)) return 0;
    }
    snprintf(msg, cap, "Host '%.100s' is not this server's address (without --api-key only localhost and the "
             "addresses listened on are served: a DNS rebinding defence)", host);
    return 403;
}

/* An origin "scheme://host[:port]": whether its host is a loopback one and its scheme http or https. */
static bool origin_is_loopback(const char *o) {
    const char *h = NULL;
    if (!strncasecmp(o, "http://", 7)) h = o + 7;
    else if (!strncasecmp(o, "https://", 8)) h = o + 8;
    if (!h || strchr(h, '/')) return false;
    const char *b, *e;
    split_host(h, &b, &e);
    return is_loopback(b, e);
}

bool serve_origin_allowed(const serve_access *a, const char *origin, const char *host) {
    if (!origin) return false;
    for (int i = 0; i < a->n_cors; i++) {
        const char *c = a->cors[i];
        if (!strcmp(c, "*") || !strcasecmp(c, origin)) return true;
        if (!strcasecmp(c, "localhost") && origin_is_loopback(origin)) return true;
    }
    if (host && *host) { /* same origin: scheme://Host */
        const char *h = NULL;
        if (!strncasecmp(origin, "http://", 7)) h = origin + 7;
        else if (!strncasecmp(origin, "https://", 8)) h = origin + 8;
        if (h && !strcasecmp(h, host)) return true;
    }
    /* without --cors: a page served from this machine (a loopback origin, any port) may call, as llama-server's
     * default; a remote site may not (its Origin names its own host, also when DNS rebinding points it here) */
    if (a->n_cors == 0 && origin_is_loopback(origin)) return true;
    return a->api_key && a->n_cors == 0;
}

int serve_check_post(const serve_access *a, const char *origin, const char *host, const char *ctype, char *msg,
                     size_t cap) {
    bool allowed = serve_origin_allowed(a, origin, host);
    if (origin && !allowed) {
        snprintf(msg, cap, "cross-origin request from '%.100s' refused (allow it with --cors ORIGIN)", origin);
        return 403;
    }
    if (a->api_key || (origin && allowed && a->n_cors)) return 0;
    const char *b = ctype ? ctype : "", *e;
    while (is_ows(*b)) b++;
    e = b + strcspn(b, "; \t");
    if (!elem_is(b, e, "application/json")) {
        snprintf(msg, cap, "Content-Type must be application/json (got '%.60s'; without --api-key other types are "
                 "refused: a web page may send them from any site)", ctype ? ctype : "none");
        return 415;
    }
    return 0;
}

bool serve_key_ok(const char *key, const char *authorization, const char *x_api_key) {
    if (!key) return true;
    const char *got[2] = {NULL, x_api_key};
    if (authorization) {
        const char *s = authorization;
        while (is_ows(*s)) s++;
        if (!strncasecmp(s, "Bearer", 6) && is_ows(s[6])) {
            s += 6;
            while (is_ows(*s)) s++;
            got[0] = s;
        }
    }
    bool ok = false;
    size_t n = strlen(key);
    for (int k = 0; k < 2; k++) {
        const char *h = got[k];
        if (!h) continue;
        size_t m = strlen(h);
        while (m && is_ows(h[m - 1])) m--;
        unsigned diff = n != m;
        for (size_t i = 0; i < n; i++) diff |= (unsigned)(key[i] ^ (i < m ? h[i] : 0)); /* no early exit */
        ok |= diff == 0;
    }
    return ok;
}
