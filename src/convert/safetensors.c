/* safetensors.c — the safetensors reader (see safetensors.h). */
#include "convert/safetensors.h"

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/files.h"

typedef unsigned long long ull;

typedef struct st_impl {
    flm_st_file f;
    int mapped; /* 1: munmap, 2: free, 0: borrowed */
} st_impl;

void flm_st_close(flm_st_file *f) {
    if (!f) return;
    st_impl *fi = (st_impl *)f;
    for (uint64_t i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    if (fi->mapped == 1 && f->size) munmap((void *)f->map, f->size);
    else if (fi->mapped == 2) free((void *)f->map);
    free(f->path);
    free(fi);
}

const flm_st_tensor *flm_st_find(const flm_st_file *f, const char *name) {
    for (uint64_t i = 0; f && i < f->n_tensors; i++)
        if (!strcmp(f->tensors[i].name, name)) return &f->tensors[i];
    return NULL;
}

/* the dtype's flm_type and element size; 0 size for a dtype flashlm does not read */
static uint32_t dtype_of(const char *s, uint32_t *type) {
    if (!strcmp(s, "F32")) { *type = FLM_TYPE_F32; return 4; }
    if (!strcmp(s, "F16")) { *type = FLM_TYPE_F16; return 2; }
    if (!strcmp(s, "BF16")) { *type = FLM_TYPE_BF16; return 2; }
    return 0;
}

/* a JSON number that is a whole number in [0, 2^53): *v */
static bool json_u64(const cJSON *j, uint64_t *v) {
    if (!cJSON_IsNumber(j)) return false;
    double d = j->valuedouble;
    if (!(d >= 0.0 && d < 9007199254740992.0) || d != (double)(uint64_t)d) return false;
    *v = (uint64_t)d;
    return true;
}

/* true when some object of the tree j holds one key twice (*key: that key) */
static bool dup_key(const cJSON *j, const char **key) {
    for (const cJSON *a = j ? j->child : NULL; a; a = a->next) {
        if (cJSON_IsObject(j))
            for (const cJSON *b = a->next; b; b = b->next)
                if (a->string && b->string && !strcmp(a->string, b->string)) { *key = a->string; return true; }
        if ((cJSON_IsObject(a) || cJSON_IsArray(a)) && dup_key(a, key)) return true;
    }
    return false;
}

flm_status flm_json_parse(const char *path, const char *what, const char *text, size_t len, bool no_dup_keys,
                          cJSON **out, flm_error *err) {
    *out = NULL;
    const char *nul = memchr(text, 0, len);
    if (nul)
        return flm_fail(err, FLM_ERR_FORMAT, "%s: %s holds a NUL byte (offset %zu): not JSON text", path, what,
                        (size_t)(nul - text));
    /* a \u0000 escape: a backslash that is not itself escaped, then u0000 */
    for (size_t i = 0; i < len; i++)
        if (text[i] == '\\') {
            if (i + 5 < len && text[i + 1] == 'u' && !memcmp(text + i + 2, "0000", 4))
                return flm_fail(err, FLM_ERR_FORMAT, "%s: %s holds a \\u0000 escape (offset %zu): a NUL character "
                                "inside a string (a name or piece would be cut short there)", path, what, i);
            i++; /* the escaped character */
        }
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, len, &end, false);
    if (!j) return flm_fail(err, FLM_ERR_FORMAT, "%s: %s is not valid JSON", path, what);
    size_t at = end ? (size_t)(end - text) : len;
    while (at < len && (text[at] == ' ' || text[at] == '\t' || text[at] == '\n' || text[at] == '\r')) at++;
    if (at < len) {
        cJSON_Delete(j);
        return flm_fail(err, FLM_ERR_FORMAT, "%s: %s has data after the JSON value (offset %zu): not one JSON value",
                        path, what, at);
    }
    const char *key = NULL;
    if (no_dup_keys && dup_key(j, &key)) {
        flm_status st = flm_fail(err, FLM_ERR_FORMAT, "%s: key '%.64s' appears twice in one object", path, key);
        cJSON_Delete(j);
        return st;
    }
    *out = j;
    return FLM_OK;
}

typedef struct range { uint64_t begin, end; uint64_t idx; } range;

static int cmp_range(const void *a, const void *b) {
    const range *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

/* one header entry (key name, object e) into t; data_size: bytes after the header */
static flm_status parse_entry(const char *path, const char *name, const cJSON *e, const uint8_t *data,
                              uint64_t data_size, flm_st_tensor *t, uint64_t *begin, flm_error *err) {
    if (!cJSON_IsObject(e))
        return flm_fail(err, FLM_ERR_FORMAT, "%s: tensor '%s': the header entry is not a JSON object", path, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt) || !dt->valuestring)
        return flm_fail(err, FLM_ERR_FORMAT, "%s: tensor '%s': 'dtype' is missing or not a string", path, name);
    uint32_t es = dtype_of(dt->valuestring, &t->type);
    if (!es)
        return flm_fail(err, FLM_ERR_UNSUPPORTED, "%s: tensor '%s': dtype '%.16s' is not supported (F32, F16, BF16)",
                        path, name, dt->valuestring);
    if (!cJSON_IsArray(sh))
        return flm_fail(err, FLM_ERR_FORMAT, "%s: tensor '%s': 'shape' is missing or not an array", path, name);
    int nd = cJSON_GetArraySize(sh);
    if (nd < 0 || nd > FLM_ST_MAX_DIMS)
        return flm_fail(err, FLM_ERR_FORMAT, "%s: tensor '%s': %d dimensions (at most %d)", path, name, nd,
                        FLM_ST_MAX_DIMS);
    t->n_dims = (uint32_t)nd;
    uint64_t n = 1;
    int i = 0;
    for (const cJSON *d = sh->child; d; d = d->next, i++) {
        uint64_t v;
        if (!json_u64(d, &v))
            return flm_fail(err, FLM_ERR_FORMAT, "%s: tensor '%s': shape[%d] is not a non-negative integer", path,
                            name, i);
        t->shape[i] = v;
        if (v && n > UINT64_MAX / v)
            return flm_fail(err, FLM_ERR_FORMAT, "%s: tensor '%s': the element count overflows", path, name);
        n *= v;
    }
    t->n_elements = n;
    if (n > UINT64_MAX / es)
        return flm_fail(err, FLM_ERR_FORMAT, "%s: tensor '%s': the byte size overflows", path, name);
    t->nbytes = n * es;
    uint64_t b, en;
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 || !json_u64(off->child, &b) ||
        !json_u64(off->child->next, &en))
        return flm_fail(err, FLM_ERR_FORMAT, "%s: tensor '%s': 'data_offsets' is not two non-negative integers",
                        path, name);
    if (b > en)
        return flm_fail(err, FLM_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu) begin after they end", path,
                        name, (ull)b, (ull)en);
    if (en > data_size)
        return flm_fail(err, FLM_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu) run past the end of the "
                        "data (%llu bytes)", path, name, (ull)b, (ull)en, (ull)data_size);
    if (en - b != t->nbytes)
        return flm_fail(err, FLM_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu) hold %llu bytes, but shape "
                        "x %s is %llu bytes", path, name, (ull)b, (ull)en, (ull)(en - b), dt->valuestring,
                        (ull)t->nbytes);
    t->data = data + b;
    *begin = b;
    return FLM_OK;
}

static flm_status parse(st_impl *fi, flm_error *err) {
    flm_st_file *f = &fi->f;
    const char *path = f->path;
    if (f->size < 8)
        return flm_fail(err, FLM_ERR_FORMAT, "%s: truncated: %zu bytes, shorter than the 8-byte header length", path,
                        f->size);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | f->map[i];
    if (hl > FLM_ST_MAX_HEADER)
        return flm_fail(err, FLM_ERR_FORMAT, "%s: header length %llu is above the %u bytes allowed", path, (ull)hl,
                        FLM_ST_MAX_HEADER);
    if (hl < 2 || hl > f->size - 8)
        return flm_fail(err, FLM_ERR_FORMAT, "%s: truncated: header length %llu, but the file has %zu bytes after "
                        "the length", path, (ull)hl, f->size - 8);
    const char *hdr = (const char *)f->map + 8;
    if (hdr[0] != '{')
        return flm_fail(err, FLM_ERR_FORMAT, "%s: the header does not start with '{'", path);
    cJSON *root = NULL;
    flm_status jst = flm_json_parse(path, "the header", hdr, (size_t)hl, false, &root, err);
    if (jst) return jst;
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return flm_fail(err, FLM_ERR_FORMAT, "%s: the header (%llu bytes) is not a JSON object", path, (ull)hl);
    }
    const uint8_t *data = f->map + 8 + hl;
    const uint64_t data_size = f->size - 8 - hl;
    flm_status st = FLM_OK;
    uint64_t n = 0;
    for (const cJSON *e = root->child; e; e = e->next) n++;
    f->tensors = calloc(n ? n : 1, sizeof *f->tensors);
    range *rg = calloc(n ? n : 1, sizeof *rg);
    if (!f->tensors || !rg) st = flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", path);
    for (const cJSON *e = root->child; e && !st; e = e->next) {
        const char *name = e->string ? e->string : "";
        if (!strcmp(name, "__metadata__")) {
            if (!cJSON_IsObject(e))
                st = flm_fail(err, FLM_ERR_FORMAT, "%s: '__metadata__' is not a JSON object", path);
            continue;
        }
        if (!name[0]) { st = flm_fail(err, FLM_ERR_FORMAT, "%s: a tensor with an empty name", path); break; }
        flm_st_tensor *t = &f->tensors[f->n_tensors];
        uint64_t b = 0;
        if ((st = parse_entry(path, name, e, data, data_size, t, &b, err))) break;
        if (!(t->name = strdup(name))) { st = flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", path); break; }
        for (uint64_t j = 0; j < f->n_tensors; j++)
            if (!strcmp(f->tensors[j].name, name)) {
                st = flm_fail(err, FLM_ERR_FORMAT, "%s: tensor '%s' appears twice in the header", path, name);
                break;
            }
        rg[f->n_tensors] = (range){b, b + t->nbytes, f->n_tensors};
        f->n_tensors++;
    }
    if (!st && f->n_tensors > 1) { /* no two tensors share a byte */
        qsort(rg, f->n_tensors, sizeof *rg, cmp_range);
        for (uint64_t i = 1; i < f->n_tensors && !st; i++)
            if (rg[i].begin < rg[i - 1].end && rg[i].end > rg[i].begin && rg[i - 1].end > rg[i - 1].begin)
                st = flm_fail(err, FLM_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu) overlap tensor '%s' "
                              "[%llu, %llu)", path, f->tensors[rg[i].idx].name, (ull)rg[i].begin, (ull)rg[i].end,
                              f->tensors[rg[i - 1].idx].name, (ull)rg[i - 1].begin, (ull)rg[i - 1].end);
    }
    free(rg);
    cJSON_Delete(root);
    return st;
}

static flm_status load(st_impl *fi, const char *path, flm_error *err) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return flm_fail(err, FLM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    flm_status st = FLM_OK;
    if (fstat(fd, &sb) != 0) {
        st = flm_fail(err, FLM_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    } else if (!S_ISREG(sb.st_mode)) {
        st = flm_fail(err, FLM_ERR_IO, "%s: is %s, not a regular file", path, flm_file_kind(sb.st_mode));
    } else if ((uint64_t)sb.st_size > SIZE_MAX) {
        st = flm_fail(err, FLM_ERR_IO, "%s: file of %llu bytes is too large to map", path, (ull)sb.st_size);
    } else if ((fi->f.size = (size_t)sb.st_size) > 0) {
        void *m = mmap(NULL, fi->f.size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) st = flm_fail(err, FLM_ERR_IO, "%s: cannot map: %s", path, strerror(errno));
        else { fi->f.map = m; fi->mapped = 1; }
    }
    close(fd);
    return st;
}

static flm_status open_common(const char *path, const void *data, size_t size, flm_st_file **out, flm_error *err) {
    *out = NULL;
    st_impl *fi = calloc(1, sizeof *fi);
    if (!fi || !(fi->f.path = strdup(path))) {
        free(fi);
        return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", path);
    }
    flm_status st = FLM_OK;
    if (data) { fi->f.map = data; fi->f.size = size; }
    else st = load(fi, path, err);
    if (!st) st = parse(fi, err);
    if (st) { flm_st_close(&fi->f); return st; }
    *out = &fi->f;
    return FLM_OK;
}

flm_status flm_st_open(const char *path, flm_st_file **out, flm_error *err) {
    return open_common(path, NULL, 0, out, err);
}

flm_status flm_st_open_buffer(const char *name, const void *data, size_t size, flm_st_file **out, flm_error *err) {
    static const uint8_t empty[1];
    return open_common(name, data ? data : empty, data ? size : 0, out, err);
}

/* ---- folders ---------------------------------------------------------------------------------------------------- */

void flm_st_set_close(flm_st_set *s) {
    if (!s) return;
    for (uint32_t i = 0; i < s->n_files; i++) flm_st_close(s->files[i]);
    free(s->files);
    free(s);
}

const flm_st_tensor *flm_st_set_find(const flm_st_set *s, const char *name) {
    for (uint32_t i = 0; s && i < s->n_files; i++) {
        const flm_st_tensor *t = flm_st_find(s->files[i], name);
        if (t) return t;
    }
    return NULL;
}

/* the whole of a small text file (at most max bytes) into a malloc'd NUL-terminated buffer */
static flm_status read_text(const char *path, size_t max, char **out, size_t *len, flm_error *err) {
    *out = NULL;
    FILE *fp = NULL;
    flm_status os = flm_fopen_regular(path, &fp, NULL, err);
    if (os) return os;
    char *buf = malloc(max + 1);
    size_t n = buf ? fread(buf, 1, max + 1, fp) : 0;
    bool bad = buf && ferror(fp);
    fclose(fp);
    if (!buf) return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", path);
    if (bad) { free(buf); return flm_fail(err, FLM_ERR_IO, "%s: read failed", path); }
    if (n > max) { free(buf); return flm_fail(err, FLM_ERR_FORMAT, "%s: larger than %zu bytes", path, max); }
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return FLM_OK;
}

static flm_status set_add(flm_st_set *s, const char *path, flm_error *err) {
    flm_st_file **nf = realloc(s->files, (s->n_files + 1) * sizeof *nf);
    if (!nf) return flm_fail(err, FLM_ERR_NOMEM, "%s: out of memory", path);
    s->files = nf;
    flm_status st = flm_st_open(path, &s->files[s->n_files], err);
    if (!st) s->n_files++;
    return st;
}

static flm_status open_index(const char *dir, const char *ipath, flm_st_set *s, flm_error *err) {
    char *text = NULL;
    size_t len = 0;
    flm_status st = read_text(ipath, 64u << 20, &text, &len, err);
    if (st) return st;
    cJSON *root = NULL;
    st = flm_json_parse(ipath, "the index", text, len, false, &root, err);
    free(text);
    if (st) return st;
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm)) {
        cJSON_Delete(root);
        return flm_fail(err, FLM_ERR_FORMAT, "%s: no 'weight_map' object", ipath);
    }
    /* open each shard once, in the order first named */
    for (const cJSON *e = wm->child; e && !st; e = e->next) {
        if (!cJSON_IsString(e) || !e->valuestring || !e->valuestring[0] || strchr(e->valuestring, '/') ||
            !strcmp(e->valuestring, "..") || !strcmp(e->valuestring, ".")) {
            st = flm_fail(err, FLM_ERR_FORMAT, "%s: weight_map['%s'] is not a file name in the folder", ipath,
                          e->string ? e->string : "");
            break;
        }
        char path[PATH_MAX];
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, e->valuestring) >= sizeof path) {
            st = flm_fail(err, FLM_ERR_ARG, "%s: shard path too long", ipath);
            break;
        }
        bool seen = false;
        for (uint32_t i = 0; i < s->n_files && !seen; i++) seen = !strcmp(s->files[i]->path, path);
        if (!seen) st = set_add(s, path, err);
    }
    /* every tensor in its shard, and in one shard only */
    for (const cJSON *e = wm->child; e && !st; e = e->next) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, e->valuestring);
        int found = 0;
        bool in_named = false;
        for (uint32_t i = 0; i < s->n_files; i++)
            if (flm_st_find(s->files[i], e->string)) {
                found++;
                in_named |= !strcmp(s->files[i]->path, path);
            }
        if (!in_named)
            st = flm_fail(err, FLM_ERR_FORMAT, "%s: tensor '%s' is not in %s, where weight_map puts it", ipath,
                          e->string, e->valuestring);
        else if (found > 1)
            st = flm_fail(err, FLM_ERR_FORMAT, "%s: tensor '%s' is in %d shards", ipath, e->string, found);
    }
    cJSON_Delete(root);
    return st;
}

flm_status flm_st_open_dir(const char *dir, flm_st_set **out, flm_error *err) {
    *out = NULL;
    flm_st_set *s = calloc(1, sizeof *s);
    if (!s) return flm_fail(err, FLM_ERR_NOMEM, "out of memory");
    char path[PATH_MAX];
    flm_status st;
    if ((size_t)snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir) >= sizeof path) {
        st = flm_fail(err, FLM_ERR_ARG, "%s: path too long", dir);
    } else if (access(path, F_OK) == 0) {
        st = open_index(dir, path, s, err);
    } else {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        if (access(path, F_OK) != 0)
            st = flm_fail(err, FLM_ERR_IO, "%s: neither model.safetensors nor model.safetensors.index.json", dir);
        else st = set_add(s, path, err);
    }
    if (st) { flm_st_set_close(s); return st; }
    *out = s;
    return FLM_OK;
}
