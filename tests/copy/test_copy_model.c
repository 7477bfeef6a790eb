/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Model-based test of the CPU copy engine: long random sequences of stores, loads, "compute"
 * (the engine rewriting a device block), polls and flushes, checked against a reference model
 * that gives every block a tag (its bytes are a function of the tag). The workload respects
 * the contract the offload manager keeps: no block is touched by in-flight events of both
 * directions, no destination appears twice in one event, and compute only rewrites blocks no
 * event touches. Within a direction events may chain through the same blocks (event 2
 * overwrites what event 1 wrote); the model applies events at submit, which is correct only
 * because a direction's events run in order. Whenever a block is idle its bytes must match
 * its tag; after a flush every block is checked.
 */
#include "kvt_test.h"

#define DEV  48
#define HOST 64
#define NREG 3
#define MAXQ 64

static const uint64_t BPB[NREG] = {4096, 12288, 200};

typedef struct model {
    uint64_t dev_tag[DEV], host_tag[HOST];
    uint32_t dev_busy[2][DEV], host_busy[2][HOST]; /* in-flight events per direction */
    struct ev {
        int64_t id;
        uint32_t n, src[16], dst[16];
    } q[2][MAXQ];
    uint32_t qh[2], qt[2];
    int64_t next_ev[2];
    uint64_t checked;
} model;

static unsigned char tagbyte(uint64_t tag, int r, uint64_t o)
{
    uint64_t x = (tag + 0x51) * 0x9E3779B97F4A7C15ull ^ (uint64_t)r << 50 ^ o;
    x ^= x >> 29;
    return (unsigned char)(x * 0xBF58476D1CE4E5B9ull >> 56);
}

static unsigned char *blk(const kvt_region *regs, int r, uint32_t b)
{
    return (unsigned char *)(uintptr_t)regs[r].base + b * BPB[r];
}

static void write_tag(const kvt_region *regs, uint32_t b, uint64_t tag)
{
    for (int r = 0; r < NREG; r++) {
        unsigned char *p = blk(regs, r, b);
        for (uint64_t o = 0; o < BPB[r]; o++)
            p[o] = tagbyte(tag, r, o);
    }
}

static void check_tag(const kvt_region *regs, uint32_t b, uint64_t tag, const char *what,
                      uint64_t seed, model *m)
{
    for (int r = 0; r < NREG; r++) {
        const unsigned char *p = blk(regs, r, b);
        for (uint64_t o = 0; o < BPB[r]; o += 61)
            if (p[o] != tagbyte(tag, r, o))
                fail_msg("seed %llu: %s block %u region %d byte %llu wrong",
                         (unsigned long long)seed, what, b, r, (unsigned long long)o);
    }
    m->checked++;
}

static bool idle(model *m, bool dev, uint32_t b)
{
    return dev ? m->dev_busy[0][b] + m->dev_busy[1][b] == 0
               : m->host_busy[0][b] + m->host_busy[1][b] == 0;
}

/* Picks up to want pairs obeying the contract for direction d; returns how many. */
static uint32_t pick(model *m, int d, uint64_t *s, uint32_t *src, uint32_t *dst, uint32_t want)
{
    int o = 1 - d;
    uint32_t n = 0;
    for (uint32_t tries = 0; tries < 200 && n < want; tries++) {
        uint32_t a = kvt_test_below(s, d == KVT_COPY_STORE ? DEV : HOST);
        uint32_t b = kvt_test_below(s, d == KVT_COPY_STORE ? HOST : DEV);
        if (kvt_test_below(s, 3) == 0 && n > 0) { /* extend a run now and then */
            a = src[n - 1] + 1;
            b = dst[n - 1] + 1;
            if (a >= (d == KVT_COPY_STORE ? DEV : HOST) || b >= (d == KVT_COPY_STORE ? HOST : DEV))
                continue;
        }
        bool ok = d == KVT_COPY_STORE ? !m->dev_busy[o][a] && !m->host_busy[o][b]
                                      : !m->host_busy[o][a] && !m->dev_busy[o][b];
        for (uint32_t i = 0; i < n && ok; i++)
            ok = dst[i] != b;
        if (ok) {
            src[n] = a;
            dst[n] = b;
            n++;
        }
    }
    return n;
}

static void retire(model *m, int d, int64_t hwm, const kvt_region *dev, const kvt_region *host,
                   uint64_t seed)
{
    while (m->qh[d] != m->qt[d] && m->q[d][m->qh[d] % MAXQ].id <= hwm) {
        struct ev *e = &m->q[d][m->qh[d]++ % MAXQ];
        for (uint32_t i = 0; i < e->n; i++) {
            if (d == KVT_COPY_STORE) {
                m->dev_busy[d][e->src[i]]--;
                m->host_busy[d][e->dst[i]]--;
                if (idle(m, false, e->dst[i]))
                    check_tag(host, e->dst[i], m->host_tag[e->dst[i]], "host", seed, m);
            } else {
                m->host_busy[d][e->src[i]]--;
                m->dev_busy[d][e->dst[i]]--;
                if (idle(m, true, e->dst[i]))
                    check_tag(dev, e->dst[i], m->dev_tag[e->dst[i]], "device", seed, m);
            }
        }
    }
}

static void run(uint64_t seed, uint32_t threads, uint64_t chunk, uint32_t steps)
{
    uint64_t s = seed;
    static model m;
    memset(&m, 0, sizeof(m));
    kvt_layout *l;
    KVT_OK_(kvt_layout_create(KVT_HOST_DEVICE, DEV, &l));
    unsigned char *mem[NREG];
    for (int r = 0; r < NREG; r++) {
        mem[r] = malloc(DEV * BPB[r]);
        KVT_OK_(kvt_layout_add_region(l, (uint64_t)(uintptr_t)mem[r], BPB[r]));
    }
    kvt_mirror_config mc;
    kvt_mirror_config_init(&mc);
    mc.host_blocks = HOST;
    kvt_mirror *mi;
    KVT_OK_(kvt_mirror_create(&mc, l, &mi));
    kvt_copy_config cc;
    kvt_copy_config_init(&cc);
    cc.threads = threads;
    cc.chunk_bytes = chunk;
    cc.max_events = 8;
    kvt_copy *c;
    KVT_OK_(kvt_copy_create(&cc, l, mi, &c));
    const kvt_region *dev = kvt_layout_regions(l), *host = kvt_mirror_regions(mi);
    uint64_t tag = 1;
    for (uint32_t b = 0; b < DEV; b++)
        write_tag(dev, b, m.dev_tag[b] = tag++);
    for (uint32_t b = 0; b < HOST; b++)
        write_tag(host, b, m.host_tag[b] = 0); /* the mirror starts zeroed; tag 0 rewrites */
    for (uint32_t step = 0; step < steps; step++) {
        uint32_t op = kvt_test_below(&s, 10);
        if (op < 6) {
            int d = op < 3 ? KVT_COPY_STORE : KVT_COPY_LOAD;
            if (m.qt[d] - m.qh[d] >= cc.max_events)
                continue;
            struct ev *e = &m.q[d][m.qt[d] % MAXQ];
            e->n = pick(&m, d, &s, e->src, e->dst, 1 + kvt_test_below(&s, 16));
            if (e->n == 0)
                continue;
            e->id = m.next_ev[d] += 1 + kvt_test_below(&s, 3);
            KVT_OK_(kvt_copy_submit(c, d, e->id, e->src, e->dst, e->n, NULL));
            for (uint32_t i = 0; i < e->n; i++) {
                if (d == KVT_COPY_STORE) {
                    m.host_tag[e->dst[i]] = m.dev_tag[e->src[i]];
                    m.dev_busy[d][e->src[i]]++;
                    m.host_busy[d][e->dst[i]]++;
                } else {
                    m.dev_tag[e->dst[i]] = m.host_tag[e->src[i]];
                    m.host_busy[d][e->src[i]]++;
                    m.dev_busy[d][e->dst[i]]++;
                }
            }
            m.qt[d]++;
        } else if (op == 6) { /* compute: rewrite an idle device block */
            uint32_t b = kvt_test_below(&s, DEV);
            if (idle(&m, true, b))
                write_tag(dev, b, m.dev_tag[b] = tag++);
        } else if (op < 9) {
            for (int d = 0; d < 2; d++) {
                int64_t hwm;
                KVT_OK_(kvt_copy_poll(c, d, &hwm));
                retire(&m, d, hwm, dev, host, seed);
            }
        } else {
            KVT_OK_(kvt_copy_flush(c));
            for (int d = 0; d < 2; d++) {
                int64_t hwm;
                KVT_OK_(kvt_copy_poll(c, d, &hwm));
                if (m.qh[d] != m.qt[d])
                    assert_int_equal(hwm, m.q[d][(m.qt[d] - 1) % MAXQ].id);
                retire(&m, d, hwm, dev, host, seed);
                assert_int_equal(kvt_copy_outstanding(c, d), 0);
            }
            for (uint32_t b = 0; b < DEV; b++)
                check_tag(dev, b, m.dev_tag[b], "device", seed, &m);
            for (uint32_t b = 0; b < HOST; b++)
                check_tag(host, b, m.host_tag[b], "host", seed, &m);
        }
    }
    kvt_copy_destroy(c);
    kvt_mirror_destroy(mi);
    kvt_layout_destroy(l);
    for (int r = 0; r < NREG; r++)
        free(mem[r]);
    assert_true(m.checked > steps / 10);
}

static void test_copy_engine_against_model(void **state)
{
    (void)state;
    uint64_t seed = kvt_test_seed();
    uint32_t steps = (uint32_t)(20000 * kvt_test_scale());
    printf("# seed %llu, %u steps per configuration\n", (unsigned long long)seed, steps);
    run(seed, 1, 1 << 20, steps);
    run(seed + 1, 2, 4096, steps);
    run(seed + 2, 3, 8192, steps);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_copy_engine_against_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
