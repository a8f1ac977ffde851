/* async_read.c — a read in flight beside the computation (io/async_read.h). */
#include "io/async_read.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct flm_async_read {
    flm_reader *reader;
    pthread_t th;
    pthread_mutex_t mu; /* guards everything below */
    pthread_cond_t cv;
    bool stop;
    bool pending; /* submitted and not yet taken by wait */
    bool done;    /* the read finished (st, err, io hold its result) */
    const flm_extent *ext;
    bool unchecked; /* the pending request: flm_reader_read_unchecked */
    size_t n;
    uint64_t tag;
    flm_status st;
    flm_error err;
    flm_io_stats io;
};

void flm_io_stats_add(flm_io_stats *to, const flm_io_stats *d) {
    to->bytes_requested += d->bytes_requested;
    to->bytes_read += d->bytes_read;
    to->n_requests += d->n_requests;
    to->n_extents += d->n_extents;
    for (int b = 0; b < FLM_IO_HIST_BUCKETS; b++) to->hist[b] += d->hist[b];
    to->ms += d->ms;
    to->bytes_checked += d->bytes_checked;
    to->n_check_retries += d->n_check_retries;
    to->check_ms += d->check_ms;
}

static void *async_main(void *arg) {
    flm_async_read *a = arg;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        while (!a->stop && !(a->pending && !a->done)) pthread_cond_wait(&a->cv, &a->mu);
        if (a->stop) break;
        const flm_extent *ext = a->ext;
        size_t n = a->n;
        const bool unchecked = a->unchecked;
        pthread_mutex_unlock(&a->mu);
        flm_io_stats io = {0};
        flm_error err = {0};
        flm_status st = unchecked ? flm_reader_read_unchecked(a->reader, ext, n, &io, &err)
                                  : flm_reader_read(a->reader, ext, n, &io, &err);
        pthread_mutex_lock(&a->mu);
        a->st = st;
        a->err = err;
        a->io = io;
        a->done = true;
        pthread_cond_broadcast(&a->cv);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

flm_async_read *flm_async_read_start(flm_reader *r) {
    if (!r) return NULL;
    flm_async_read *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->reader = r;
    if (pthread_mutex_init(&a->mu, NULL)) {
        free(a);
        return NULL;
    }
    if (pthread_cond_init(&a->cv, NULL)) {
        pthread_mutex_destroy(&a->mu);
        free(a);
        return NULL;
    }
    pthread_attr_t at;
    bool attr = !pthread_attr_init(&at);
    if (attr) pthread_attr_setstacksize(&at, 256 << 10);
    int rc = pthread_create(&a->th, attr ? &at : NULL, async_main, a);
    if (attr) pthread_attr_destroy(&at);
    if (rc) {
        pthread_cond_destroy(&a->cv);
        pthread_mutex_destroy(&a->mu);
        free(a);
        return NULL;
    }
    return a;
}

void flm_async_read_stop(flm_async_read *a) {
    if (!a) return;
    pthread_mutex_lock(&a->mu);
    while (a->pending && !a->done) pthread_cond_wait(&a->cv, &a->mu); /* its destinations may be freed next */
    a->stop = true;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    pthread_join(a->th, NULL);
    pthread_cond_destroy(&a->cv);
    pthread_mutex_destroy(&a->mu);
    free(a);
}

static void submit(flm_async_read *a, const flm_extent *ext, size_t n, uint64_t tag, bool unchecked) {
    pthread_mutex_lock(&a->mu);
    while (a->pending && !a->done) pthread_cond_wait(&a->cv, &a->mu);
    a->ext = ext;
    a->unchecked = unchecked;
    a->n = n;
    a->tag = tag;
    a->pending = true;
    a->done = false;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

void flm_async_read_submit(flm_async_read *a, const flm_extent *ext, size_t n, uint64_t tag) {
    submit(a, ext, n, tag, false);
}

void flm_async_read_submit_unchecked(flm_async_read *a, const flm_extent *ext, size_t n, uint64_t tag) {
    submit(a, ext, n, tag, true);
}

bool flm_async_read_wait(flm_async_read *a, uint64_t *tag, flm_status *st, flm_error *err, flm_io_stats *io) {
    pthread_mutex_lock(&a->mu);
    if (!a->pending) {
        pthread_mutex_unlock(&a->mu);
        return false;
    }
    while (!a->done) pthread_cond_wait(&a->cv, &a->mu);
    *tag = a->tag;
    *st = a->st;
    if (a->st && err) *err = a->err;
    if (io) flm_io_stats_add(io, &a->io);
    a->pending = a->done = false;
    pthread_mutex_unlock(&a->mu);
    return true;
}

bool flm_async_read_busy(flm_async_read *a) {
    pthread_mutex_lock(&a->mu);
    const bool busy = a->pending && !a->done;
    pthread_mutex_unlock(&a->mu);
    return busy;
}
