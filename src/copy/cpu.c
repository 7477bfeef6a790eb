/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CPU copy backend: device memory is host memory (CPU-only deployments, tests, benchmarks).
 *
 * A pool of copy threads serves the submission queue in order. Each job is cut into
 * chunk_bytes pieces at submit; every thread takes the next piece of the job at the head of
 * the queue, so all threads work on one event at a time and an event with one large block
 * still uses every core. A thread that takes a job's last piece pops the job; the next job
 * starts at once if it belongs to the other direction, and once the last pieces are copied
 * if it belongs to the same one: a direction's events run strictly one after the other, as
 * on a CUDA stream, so a later event never races an earlier one on the same bytes. The
 * thread that completes the last piece marks the job DONE.
 *
 * Runs of at least nt_min_bytes are copied by the kernels calibrated for this machine
 * (kernels.c: one for runs under 256 KiB, one for longer ones; usually non-temporal stores,
 * since a regular store first reads the destination line, so a block copy moves three bytes
 * for every two a streaming copy moves and evicts the engine's working set), shorter ones by
 * memcpy.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "copy/copy_internal.h"
#include "copy/kernels.h"

static void copy_chunk(kvt_copy *c, const copy_job *j, uint32_t k)
{
    uint64_t left = c->cfg.chunk_bytes, off = j->chunk_off[k];
    for (uint32_t d = j->chunk_desc[k]; d < j->n_descs && left > 0; d++, off = 0) {
        const kvi_desc *x = &j->descs[d];
        uint64_t n = x->size - off < left ? x->size - off : left;
        char *dst = (char *)(uintptr_t)(x->dst + off);
        const char *src = (const char *)(uintptr_t)(x->src + off);
        /* while copying this run, pull the start of the next one into the cache: runs are
         * randomly placed, so the hardware prefetcher cannot see it coming */
        const char *next = NULL;
        size_t next_n = 0;
        if (d + 1 < j->n_descs && left - n > 0) {
            next = (const char *)(uintptr_t)x[1].src;
            next_n = x[1].size < left - n ? x[1].size : left - n;
            if (next_n > n)
                next_n = n;
        }
        if (x->size >= c->cfg.nt_min_bytes)
            c->kern[x->size >= KVT_KERNEL_LARGE_MIN]->fn(dst, src, n, next, next_n);
        else
            memcpy(dst, src, n);
        left -= n;
    }
    kvi_copy_fence(); /* the streamed bytes are in memory before the chunk counts as done */
}

static void *copy_thread(void *arg)
{
    kvt_copy *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        copy_job *j = kvi_copy_wait_front(c);
        if (!j)
            break;
        /* a direction's events run one after the other, like a stream: wait for the tail
         * of the previous one (at most one chunk per thread) before starting the next */
        if (j->next_chunk == 0 && c->active[j->dir]) {
            pthread_cond_wait(&c->cv_work, &c->mu);
            continue;
        }
        if (j->next_chunk == 0)
            c->active[j->dir]++;
        uint32_t k = j->next_chunk++;
        if (j->next_chunk == j->n_chunks)
            kvi_copy_queue_pop(c);
        pthread_mutex_unlock(&c->mu);
        copy_chunk(c, j, k);
        pthread_mutex_lock(&c->mu);
        if (++j->chunks_done == j->n_chunks) {
            c->active[j->dir]--;
            kvi_copy_job_finish(c, j, true);
            pthread_cond_broadcast(&c->cv_work);
        }
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

static int cpu_start(kvt_copy *c)
{
    const copy_kernel *const *kern = kvi_copy_kernels(); /* calibrated once per process */
    c->kern[0] = kern[0];
    c->kern[1] = kern[1];
    uint32_t n = c->cfg.threads;
    if (n == 0) {
        long on = sysconf(_SC_NPROCESSORS_ONLN);
        n = on > 0 ? (uint32_t)on : 1;
    }
    if (n > 256)
        return kvt_fail(KVT_EINVAL, "copy: %u copy threads (max 256)", n);
    c->threads = calloc(n, sizeof(*c->threads));
    if (!c->threads)
        return kvt_fail(KVT_ENOMEM, "copy: out of memory");
    for (uint32_t i = 0; i < n; i++) {
        int e = pthread_create(&c->threads[i], NULL, copy_thread, c);
        if (e) {
            pthread_mutex_lock(&c->mu);
            c->stop = true;
            pthread_cond_broadcast(&c->cv_work);
            pthread_mutex_unlock(&c->mu);
            for (uint32_t k = 0; k < i; k++)
                pthread_join(c->threads[k], NULL);
            free(c->threads);
            c->threads = NULL;
            return kvi_fail_errno(e, "copy: cannot start copy thread %u", i);
        }
        c->n_threads++;
    }
    return 0;
}

static void cpu_stop(kvt_copy *c)
{
    for (uint32_t i = 0; i < c->n_threads; i++)
        pthread_join(c->threads[i], NULL);
    free(c->threads);
    c->threads = NULL;
    c->n_threads = 0;
}

/* CPU jobs never reach ISSUED. */
static bool cpu_query(kvt_copy *c, copy_job *j)
{
    (void)c;
    (void)j;
    return false;
}

static bool cpu_sync(kvt_copy *c, copy_job *j)
{
    (void)c;
    (void)j;
    return true;
}

const copy_backend_ops kvi_copy_cpu_ops = {
    .name = "cpu",
    .start = cpu_start,
    .stop = cpu_stop,
    .query = cpu_query,
    .sync = cpu_sync,
};
