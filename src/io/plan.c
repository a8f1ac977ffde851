/* plan.c — turning a list of extents into aligned, coalesced device requests (see reader.h). */
#include "io/reader.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/util.h"

#define FLM_PLAN_MAX_END (UINT64_C(1) << 62)

/* An extent with its position in the caller's list, sorted by offset. */
typedef struct sext {
    uint64_t off, end;
    uint8_t *dst;
    size_t idx;
    uint64_t pmax; /* max end over the group members up to and including this one (filled per group) */
} sext;


static int cmp_sext(const void *pa, const void *pb) {
    const sext *a = pa, *b = pb;
    if (a->off != b->off) return a->off < b->off ? -1 : 1;
    if (a->end != b->end) return a->end < b->end ? -1 : 1;
    return a->idx < b->idx ? -1 : a->idx > b->idx;
}

static int cmp_op(const void *pa, const void *pb) {
    const flm_read_op *a = pa, *b = pb;
    if (a->offset != b->offset) return a->offset < b->offset ? -1 : 1;
    if (a->length != b->length) return a->length < b->length ? -1 : 1;
    return a->first_piece < b->first_piece ? -1 : a->first_piece > b->first_piece;
}

static bool is_aligned(const sext *e, uint64_t align) {
    return e->off % align == 0 && e->end % align == 0 && (uintptr_t)e->dst % align == 0;
}

/* Aligned extents of at least max_request are read zero-copy and never merged with anything. */
static bool stays_alone(const sext *e, uint64_t align, uint64_t max_request) {
    return e->end - e->off >= max_request && is_aligned(e, align);
}

static bool grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

/* Emit the requests for one group: members m[0..nm) sorted by offset, spanning aligned [g0, g1). */
static flm_status emit_group(flm_read_plan *plan, sext *m, size_t nm, uint64_t align, uint64_t max_request,
                             flm_error *err) {
    uint64_t g0 = flm_align_down(m[0].off, align), g1 = 0;
    for (size_t i = 0; i < nm; i++) {
        if (m[i].end > g1) g1 = m[i].end;
        m[i].pmax = g1;
    }
    g1 = flm_align_up(g1, align);
    uint64_t span = g1 - g0;
    uint64_t k = (span + max_request - 1) / max_request;    /* fewest requests of <= max_request */
    uint64_t piece = flm_align_up((span + k - 1) / k, align);   /* balanced, <= max_request */
    bool zero_copy = nm == 1 && is_aligned(&m[0], align);

    size_t lo = 0; /* members before lo end at or before the current request: skip them */
    for (uint64_t o0 = g0; o0 < g1; o0 += piece) {
        uint64_t o1 = o0 + piece < g1 ? o0 + piece : g1;
        if (!grow((void **)&plan->ops, &plan->ops_cap, plan->n_ops + 1, sizeof *plan->ops))
            return flm_fail(err, FLM_ERR_NOMEM, "read plan: out of memory for %zu requests", plan->n_ops + 1);
        flm_read_op *op = &plan->ops[plan->n_ops];
        *op = (flm_read_op){.offset = o0, .length = o1 - o0, .first_piece = plan->n_pieces};
        if (zero_copy) {
            op->dst = m[0].dst + (o0 - m[0].off);
            op->need = op->length;
            op->ext = m[0].idx;
        } else {
            while (lo < nm && m[lo].pmax <= o0) lo++;
            uint64_t need_end = o0;
            for (size_t i = lo; i < nm && m[i].off < o1; i++) {
                if (m[i].end <= o0) continue;
                uint64_t s = m[i].off > o0 ? m[i].off : o0, e = m[i].end < o1 ? m[i].end : o1;
                if (!grow((void **)&plan->pieces, &plan->pieces_cap, plan->n_pieces + 1, sizeof *plan->pieces))
                    return flm_fail(err, FLM_ERR_NOMEM, "read plan: out of memory for %zu copies", plan->n_pieces + 1);
                plan->pieces[plan->n_pieces++] = (flm_read_piece){s - o0, e - s, m[i].dst + (s - m[i].off), m[i].idx};
                if (e > need_end) need_end = e;
            }
            op->n_pieces = plan->n_pieces - op->first_piece;
            op->need = need_end - o0;
            if (op->n_pieces == 0) continue; /* the piece fell inside a merged gap: nothing to read */
        }
        plan->bytes += op->length;
        plan->n_ops++;
    }
    return FLM_OK;
}

flm_status flm_read_plan_build(const flm_extent *ext, size_t n, const flm_io_cost *cost, uint64_t align,
                               uint64_t max_request, flm_read_plan *plan, flm_error *err) {
    if (!plan || (n && !ext)) return flm_fail(err, FLM_ERR_ARG, "read plan: NULL plan or extent list");
    plan->n_ops = plan->n_pieces = 0;
    plan->bytes = plan->bytes_used = 0;
    if (align == 0 || (align & (align - 1)) != 0)
        return flm_fail(err, FLM_ERR_ARG, "read plan: alignment %llu is not a power of two",
                        (unsigned long long)align);
    max_request = flm_align_down(max_request, align);
    if (max_request == 0)
        return flm_fail(err, FLM_ERR_ARG, "read plan: max_request is smaller than the alignment %llu",
                        (unsigned long long)align);
    double lat = cost && cost->latency_us >= 0 ? cost->latency_us : 80.0;
    double bw = cost && cost->bandwidth_gbps > 0 ? cost->bandwidth_gbps : 2.0;
    double gap_limit = lat * bw * 1e3; /* bytes that take `latency` to stream */

    /* Collect the non-empty extents into the first half of tmp; the second half receives them partitioned. */
    if (!grow(&plan->tmp, &plan->tmp_cap, 2 * (n ? n : 1), sizeof(sext)))
        return flm_fail(err, FLM_ERR_NOMEM, "read plan: out of memory for %zu extents", n);
    sext *u = plan->tmp, *s = u + n;
    size_t ns = 0;
    for (size_t i = 0; i < n; i++) {
        if (ext[i].length == 0) continue;
        if (!ext[i].dst)
            return flm_fail(err, FLM_ERR_ARG, "read plan: extent %zu (offset %llu, length %llu) has no destination",
                            i, (unsigned long long)ext[i].offset, (unsigned long long)ext[i].length);
        if (ext[i].offset > FLM_PLAN_MAX_END || ext[i].length > FLM_PLAN_MAX_END - ext[i].offset)
            return flm_fail(err, FLM_ERR_ARG, "read plan: extent %zu (offset %llu, length %llu) ends beyond 2^62",
                            i, (unsigned long long)ext[i].offset, (unsigned long long)ext[i].length);
        u[ns++] = (sext){ext[i].offset, ext[i].offset + ext[i].length, ext[i].dst, i, 0};
        plan->bytes_used += ext[i].length;
    }
    if (ns == 0) return FLM_OK;
    qsort(u, ns, sizeof *u, cmp_sext);

    /* Stable partition: extents that stay alone (aligned and >= max_request: zero-copy) go to the back. */
    size_t n_merge = 0, n_alone = 0;
    for (size_t i = 0; i < ns; i++) n_merge += !stays_alone(&u[i], align, max_request);
    for (size_t i = 0, m = 0; i < ns; i++) {
        if (stays_alone(&u[i], align, max_request)) s[n_merge + n_alone++] = u[i];
        else s[m++] = u[i];
    }

    /* Sweep the mergeable extents into groups. */
    for (size_t i = 0; i < n_merge;) {
        size_t first = i;
        uint64_t g0 = flm_align_down(s[i].off, align), g1 = flm_align_up(s[i].end, align);
        for (i++; i < n_merge; i++) {
            uint64_t a0 = flm_align_down(s[i].off, align), a1 = flm_align_up(s[i].end, align);
            uint64_t merged_end = a1 > g1 ? a1 : g1;
            bool merge = a0 <= g1 || ((double)(a0 - g1) < gap_limit && merged_end - g0 <= max_request);
            if (!merge) break;
            g1 = merged_end;
        }
        flm_status st = emit_group(plan, &s[first], i - first, align, max_request, err);
        if (st != FLM_OK) return st;
    }
    /* The lone extents, then all requests in file order (groups and lone extents may interleave). */
    for (size_t a = n_merge; a < ns; a++) {
        flm_status st = emit_group(plan, &s[a], 1, align, max_request, err);
        if (st != FLM_OK) return st;
    }
    if (n_alone) qsort(plan->ops, plan->n_ops, sizeof *plan->ops, cmp_op);
    return FLM_OK;
}

size_t flm_read_plan_bytes(const flm_read_plan *plan) {
    if (!plan) return 0;
    return plan->ops_cap * sizeof(flm_read_op) + plan->pieces_cap * sizeof(flm_read_piece) +
           plan->tmp_cap * sizeof(sext);
}

void flm_read_plan_free(flm_read_plan *plan) {
    if (!plan) return;
    free(plan->ops);
    free(plan->pieces);
    free(plan->tmp);
    memset(plan, 0, sizeof *plan);
}
