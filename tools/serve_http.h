/* serve_http.h — `flashlm serve`'s checks of a request's HTTP headers (tools/serve_http.c): the message framing
 * (RFC 9112 §6.1 and §6.3: request smuggling), the Host (DNS rebinding), the Origin and Content-Type of browser
 * requests (CORS: a page the user visits must not drive the server) and the API key. Pure functions of the headers,
 * apart from the HTTP server so that they can be fuzzed alone (tests/fuzz/fuzz_serve_http.c). */
#ifndef FLM_TOOLS_SERVE_HTTP_H
#define FLM_TOOLS_SERVE_HTTP_H
#include <stdbool.h>
#include <stddef.h>

#define SERVE_HOSTS_MAX 8 /* --host A,B,...: addresses listened on */
#define SERVE_CORS_MAX 32 /* --cors ORIGIN...: origins allowed */

/* One request header, as received (name and value NUL-terminated, value without surrounding whitespace). */
typedef struct serve_hdr {
    const char *name;
    const char *value;
} serve_hdr;

/* The request's message framing (RFC 9112 §6): 0 when the body's length is unambiguous, else the status to answer,
 * after which the connection must be closed, with a one-line reason in msg (cap bytes):
 *   400  Content-Length and Transfer-Encoding both present (§6.1: a smuggling attempt or a broken proxy);
 *        Content-Length values that differ, or one that is not a decimal number (§6.3 item 5, RFC 9110 §8.6);
 *        Transfer-Encoding whose last coding is not "chunked" (§6.3 item 4), or any in an HTTP/1.0 request (§6.1);
 *   400  a field name that is not a token (RFC 9110 §5.1), whitespace before the colon above all (RFC 9112 §5.1:
 *        "Transfer-Encoding : chunked" would frame the body for a proxy that trims it and not here);
 *        more than one Host field line (RFC 9112 §3.2);
 *   501  Transfer-Encoding with a coding other than chunked before the final chunked (§6.1: not understood);
 *   415  Content-Encoding with a coding other than identity (RFC 9110 §8.4.1: the body would be read compressed).
 * Header names are compared case-insensitively; Transfer-Encoding headers are joined as one list (RFC 9110 §5.3). */
int serve_check_framing(const serve_hdr *h, size_t n, bool http10, char *msg, size_t cap);

/* Who may call: the addresses listened on and the --cors origins. */
typedef struct serve_access {
    const char *hosts[SERVE_HOSTS_MAX]; /* numeric addresses as given to --host ("127.0.0.1", "::1", "0.0.0.0") */
    int n_hosts;
    const char *cors[SERVE_CORS_MAX];   /* "*": any; "localhost": http(s) origins on a loopback host, any port;
                                           else an origin compared whole, case-insensitively ("http://a.b:3000") */
    int n_cors;
    bool api_key;                       /* --api-key given: the key is the gate, any Host and Origin may call */
} serve_access;

/* The Host header (RFC 9110 §7.2) without --api-key: 0 when its host is "localhost", one of the addresses
 * listened on, or (listening on 0.0.0.0 or ::) any numeric address; 400 without a Host; else 403. A name a DNS
 * rebinding attack points at 127.0.0.1 is refused. With an API key any Host is accepted. */
int serve_check_host(const serve_access *a, const char *host, char *msg, size_t cap);

/* Whether a request with this Origin header (RFC 6454) may read the response: the same origin as the Host, a
 * --cors origin; without --cors, a loopback origin (http(s) on localhost, 127.0.0.0/8 or [::1], any port: a page
 * served from this machine), or any origin when an API key guards the server. false for NULL. */
bool serve_origin_allowed(const serve_access *a, const char *origin, const char *host);

/* A POST's browser checks: 0, or 403 (an Origin that may not call) or 415 (without --api-key, a body that is not
 * Content-Type application/json and no Origin --cors allows: a form or text/plain POST, which a browser sends
 * from any page without asking the server first). */
int serve_check_post(const serve_access *a, const char *origin, const char *host, const char *ctype, char *msg,
                     size_t cap);

/* The API key from "Authorization: Bearer KEY" (the scheme case-insensitive, RFC 9110 §11.1) or "x-api-key: KEY":
 * true when one of them equals key (compared in constant time). */
bool serve_key_ok(const char *key, const char *authorization, const char *x_api_key);

#endif
