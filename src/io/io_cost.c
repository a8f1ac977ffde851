/* io_cost.c — reading the I/O cost model that `flashlm probe-disk` (src/probe/) fitted and saved as
 * "<model>.probe.json": the runtime's side of the probe file (io/io_cost.h). */
#include "io/io_cost.h"

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

#define MAX_JSON_BYTES ((size_t)16 << 20)

char *flm_probe_json_path(const char *model_path) {
    if (!model_path) return NULL;
    size_t n = strlen(model_path) + sizeof FLM_PROBE_SUFFIX;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s%s", model_path, FLM_PROBE_SUFFIX);
    return p;
}

/* A number member of obj within [lo, hi]; FLM_ERR_FORMAT otherwise. */
static flm_status get_number(const cJSON *obj, const char *where, const char *key, double lo, double hi,
                             const char *path, double *out, flm_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) return flm_fail(err, FLM_ERR_FORMAT, "%s: probe file: %s.%s is missing", path, where, key);
    if (!cJSON_IsNumber(v)) return flm_fail(err, FLM_ERR_FORMAT, "%s: probe file: %s.%s is not a number", path, where,
                                            key);
    double x = v->valuedouble;
    if (!isfinite(x) || x < lo || x > hi)
        return flm_fail(err, FLM_ERR_FORMAT, "%s: probe file: %s.%s = %g is outside [%g, %g]", path, where, key, x, lo,
                        hi);
    *out = x;
    return FLM_OK;
}

flm_status flm_probe_load_cost_file(const char *json_path, flm_io_cost *out, flm_error *err) {
    if (!json_path || !out) return flm_fail(err, FLM_ERR_ARG, "flm_probe_load_cost: NULL path or output");
    FILE *fp = fopen(json_path, "rb");
    if (!fp) return flm_fail(err, FLM_ERR_IO, "%s: cannot open: %s", json_path, strerror(errno));
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    flm_status st = buf ? FLM_OK : flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", json_path);
    while (st == FLM_OK) {
        if (len + 1 >= cap) { /* room for a terminating NUL: cJSON never reads past it, whatever the length says */
            if (cap >= MAX_JSON_BYTES) {
                st = flm_fail(err, FLM_ERR_FORMAT, "%s: probe file larger than %llu bytes", json_path,
                              (unsigned long long)MAX_JSON_BYTES);
                break;
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                st = flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", json_path);
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t k = fread(buf + len, 1, cap - len, fp);
        len += k;
        if (k == 0) {
            if (ferror(fp)) st = flm_fail(err, FLM_ERR_IO, "%s: read error", json_path);
            break;
        }
    }
    fclose(fp);
    if (st == FLM_OK) st = flm_probe_parse_cost(json_path, buf, len, out, err);
    free(buf);
    return st;
}

flm_status flm_probe_parse_cost(const char *json_path, const char *text, size_t len, flm_io_cost *out,
                                flm_error *err) {
    if (!json_path || (!text && len) || !out) return flm_fail(err, FLM_ERR_ARG, "flm_probe_parse_cost: NULL argument");
    if (len >= MAX_JSON_BYTES)
        return flm_fail(err, FLM_ERR_FORMAT, "%s: probe file larger than %llu bytes", json_path,
                        (unsigned long long)MAX_JSON_BYTES);
    char *buf = malloc(len + 1); /* a terminating NUL: cJSON never reads past it, whatever the length says */
    if (!buf) return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", json_path);
    if (len) memcpy(buf, text, len);
    flm_status st = FLM_OK;
    buf[len] = '\0';
    if (st == FLM_OK && memchr(buf, '\0', len)) /* cJSON would skip it as white space; JSON text has none */
        st = flm_fail(err, FLM_ERR_FORMAT, "%s: probe file contains a NUL byte (at %ld)", json_path,
                      (long)((const char *)memchr(buf, '\0', len) - buf));
    cJSON *root = NULL;
    if (st == FLM_OK) {
        const char *end = NULL;
        root = cJSON_ParseWithLengthOpts(buf, len, &end, 0);
        if (root) { /* only white space may follow the document */
            for (const char *q = end; q && q < buf + len; q++)
                if (*q != ' ' && *q != '\t' && *q != '\n' && *q != '\r') {
                    cJSON_Delete(root);
                    root = NULL;
                    st = flm_fail(err, FLM_ERR_FORMAT, "%s: probe file has trailing data after the JSON document "
                                  "(byte %ld of %zu)", json_path, (long)(q - buf), len);
                    break;
                }
        } else {
            uintptr_t at = (uintptr_t)cJSON_GetErrorPtr(), b0 = (uintptr_t)buf;
            long pos = at >= b0 && at <= b0 + len ? (long)(at - b0) : -1;
            st = flm_fail(err, FLM_ERR_FORMAT, "%s: probe file is not valid JSON (error near byte %ld of %zu)",
                          json_path, pos, len);
        }
    }
    if (st == FLM_OK && !cJSON_IsObject(root))
        st = flm_fail(err, FLM_ERR_FORMAT, "%s: probe file is not a JSON object", json_path);
    if (st == FLM_OK) {
        const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
        if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, FLM_PROBE_FORMAT) != 0)
            st = flm_fail(err, FLM_ERR_FORMAT, "%s: not a flashlm probe file (\"format\" is not \"%s\")", json_path,
                          FLM_PROBE_FORMAT);
    }
    double version = 0;
    if (st == FLM_OK) st = get_number(root, "root", "version", 0, 1e9, json_path, &version, err);
    if (st == FLM_OK && version != FLM_PROBE_VERSION)
        st = flm_fail(err, FLM_ERR_FORMAT, "%s: probe file version %g; this flashlm reads version %d (run flashlm "
                      "probe-disk again)", json_path, version, FLM_PROBE_VERSION);
    const cJSON *cost = NULL;
    if (st == FLM_OK) {
        cost = cJSON_GetObjectItemCaseSensitive(root, "cost");
        if (!cJSON_IsObject(cost))
            st = flm_fail(err, FLM_ERR_FORMAT, "%s: probe file has no fitted \"cost\" object (the probe measured too "
                          "little? run flashlm probe-disk again)", json_path);
    }
    flm_io_cost c = {0};
    if (st == FLM_OK) st = get_number(cost, "cost", "latency_us", 0, 1e6, json_path, &c.latency_us, err);
    if (st == FLM_OK) st = get_number(cost, "cost", "bandwidth_gbps", 0, 1e4, json_path, &c.bandwidth_gbps, err);
    if (st == FLM_OK && !(c.bandwidth_gbps > 0))
        st = flm_fail(err, FLM_ERR_FORMAT, "%s: probe file: cost.bandwidth_gbps must be > 0", json_path);
    if (st == FLM_OK) *out = c;
    cJSON_Delete(root);
    free(buf);
    return st;
}

flm_status flm_probe_load_cost(const char *model_path, flm_io_cost *out, flm_error *err) {
    if (!model_path || !out) return flm_fail(err, FLM_ERR_ARG, "flm_probe_load_cost: NULL path or output");
    char *p = flm_probe_json_path(model_path);
    if (!p) return flm_fail(err, FLM_ERR_NOMEM, "out of memory");
    flm_status st = flm_probe_load_cost_file(p, out, err);
    free(p);
    return st;
}
