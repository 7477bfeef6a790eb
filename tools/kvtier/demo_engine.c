/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `kvtier demo`: the reference engine (tools/refengine) serving a multi-turn chat workload
 * with images, three times:
 *   1. without offload (the GPU tier alone: history evicted from it is recomputed);
 *   2. with the host tier (kvt_offload + one kvt_worker per rank; eager stores, or --lazy);
 *   3. with the host tier and encoder disaggregation: an encoder process (`kvtier
 *      ec-encoder`) computes the image embeddings and pushes them over UCX (loopback) into
 *      the engine's consumer shards, one per rank;
 * then, for a hybrid model whose odd layers attend to a sliding window (two KV-cache groups,
 * the window group's blocks behind the window freed and nulled as vLLM does), twice more:
 *   4. without offload; 5. with the host tier.
 * It checks that runs 1-3 generated the same tokens, runs 4 and 5 too, and that every
 * transferred embedding equals the locally computed one, prints tables, writes report.json
 * and a plot of the TTFT distributions, and exits non-zero if a check failed.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "rand.h"
#include "bench_util.h"
#include "cli.h"
#include "demo.h"
#include "ec_cmds.h"
#include "engine.h"
#include "kvtier/kvtier.h"

struct opts {
    uint32_t convs, turns, tp, concurrency, n_sys, sys_len, doc_min, doc_max, user_min, user_max;
    uint32_t answer, n_images, gpu_blocks, max_batched;
    uint32_t window, n_runs; /* hybrid runs 4 and 5: their sliding window (0: none), runs */
    uint64_t cpu_bytes, seed;
    bool lazy, json, plot, progress;
    uint32_t inject; /* ref_inject */
    const char *out_dir;
};

struct turn_rec {
    uint32_t *gen; /* generated tokens */
    uint32_t n_gen, n_prompt, gpu_hit, host_hit, computed;
    double ttft;
};

struct run {
    const char *name;
    struct turn_rec *t; /* convs x turns */
    ref_engine_stats st;
    double wall;
    uint32_t leaked_gpu, leaked_host;
    bool ok;
    uint64_t producer_items;
    int producer_rc;
};

struct conv {
    uint32_t *tok, len, cap;
    ref_image_ref img[64];
    uint32_t n_img;
};

static uint64_t mix(uint64_t a, uint64_t b, uint64_t c)
{
    uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 1) * 0xBF58476D1CE4E5B9ull ^
                 (c + 7) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    return x | 1;
}

static int push_tok(struct conv *c, uint32_t t)
{
    if (c->len == c->cap) {
        uint32_t nc = c->cap ? 2 * c->cap : 1024;
        uint32_t *n = realloc(c->tok, nc * sizeof(*n));
        if (!n)
            return -1;
        c->tok = n;
        c->cap = nc;
    }
    c->tok[c->len++] = t;
    return 0;
}

/* Appends turn t's user message to conversation ci (the same for every run of a seed). */
static int user_message(const struct opts *o, const ref_config *mc, uint32_t ci, uint32_t t,
                        struct conv *c)
{
    uint64_t r = mix(o->seed, ci, t);
    uint32_t body = t == 0 ? o->doc_min + kvt_rand_below(&r, o->doc_max - o->doc_min + 1)
                           : o->user_min + kvt_rand_below(&r, o->user_max - o->user_min + 1);
    if (t == 0) { /* the shared system prompt first */
        uint64_t s = mix(o->seed, 1000000 + ci % o->n_sys, 0);
        for (uint32_t i = 0; i < o->sys_len; i++)
            if (push_tok(c, 1 + kvt_rand_below(&s, mc->vocab - 2)))
                return -1;
    }
    bool image = o->n_images && c->n_img < 64 && (t == 0 || kvt_rand_below(&r, 3) == 0);
    uint32_t at = image ? kvt_rand_below(&r, body) : UINT32_MAX;
    for (uint32_t i = 0; i < body; i++) {
        if (i == at) {
            c->img[c->n_img].pos = c->len;
            c->img[c->n_img].image = kvt_rand_below(&r, o->n_images);
            c->n_img++;
            for (uint32_t k = 0; k < REF_IMG_TOKENS; k++)
                if (push_tok(c, ref_img_token(mc)))
                    return -1;
        }
        if (push_tok(c, 1 + kvt_rand_below(&r, mc->vocab - 2)))
            return -1;
    }
    return 0;
}

/* A bar on a terminal; otherwise (a log, a pipe, CI) a line every 5 s and one at the end. */
static void progress(const struct opts *o, int run, uint32_t done, uint32_t total)
{
    static double last;
    if (!o->progress)
        return;
    if (!isatty(2)) {
        double now = kvt_now_s();
        if (done == 0)
            last = now;
        if (done == total || now - last >= 5.0) {
            fprintf(stderr, "demo: run %d/%u: %u/%u turns\n", run, o->n_runs, done, total);
            last = now;
        }
        return;
    }
    char bar[41];
    uint32_t fill = total ? done * 40 / total : 40;
    for (uint32_t i = 0; i < 40; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[40] = 0;
    fprintf(stderr, "\r  run %d/%u [%s] %u/%u turns", run, o->n_runs, bar, done, total);
    if (done == total)
        fprintf(stderr, "\r%70s\r", "");
    fflush(stderr);
}

/* The encoder process of run 3. */
static pid_t spawn_encoder(const struct opts *o, const ref_engine_config *ec, uint32_t port)
{
    char self[4096], addr[64], n[16], seed[32], mseed[32];
    ssize_t l = readlink("/proc/self/exe", self, sizeof(self) - 1);
    self[l > 0 ? l : 0] = 0;
    snprintf(addr, sizeof(addr), "tcp://127.0.0.1:%u", port);
    snprintf(n, sizeof(n), "%u", o->n_images);
    snprintf(seed, sizeof(seed), "%llu", (unsigned long long)ec->image_seed);
    snprintf(mseed, sizeof(mseed), "%llu", (unsigned long long)ec->model.seed);
    char *argv[] = {self,           "ec-encoder", "--consumer",   addr,  "--images", n,
                    "--image-seed", seed,         "--model-seed", mseed, "--quiet",  NULL};
    extern char **environ;
    pid_t pid;
    return posix_spawn(&pid, self, NULL, NULL, argv, environ) == 0 ? pid : -1;
}

/* Finished turn f (conversation *ci) into res's record, its answer into the conversation's
 * history (f's tokens freed): 0, or -1 for an id that is not the demo's or no memory. */
static int record_turn(const struct opts *o, struct run *res, struct conv *cv, ref_result *f,
                       unsigned *ci)
{
    unsigned t;
    if (sscanf(f->id, "conv%u-turn%u", ci, &t) != 2 || *ci >= o->convs || t >= o->turns) {
        free(f->tokens);
        return -1;
    }
    struct turn_rec *tr = &res->t[*ci * o->turns + t];
    tr->n_prompt = f->n_prompt;
    tr->n_gen = f->n_tokens - f->n_prompt;
    tr->gen = malloc(tr->n_gen * sizeof(uint32_t));
    if (tr->gen)
        memcpy(tr->gen, f->tokens + f->n_prompt, tr->n_gen * sizeof(uint32_t));
    tr->ttft = f->ttft_s;
    tr->gpu_hit = f->gpu_hit;
    tr->host_hit = f->host_hit;
    tr->computed = f->computed;
    int rc = 0; /* the answer becomes part of the history */
    for (uint32_t k = f->n_prompt; k < f->n_tokens && !rc; k++)
        rc = push_tok(&cv[*ci], f->tokens[k]);
    free(f->tokens);
    return rc;
}

/* The encoder process's exit status, waited for up to 10 s (then it is killed: 128). */
static int reap_encoder(pid_t enc)
{
    int status = 0;
    double deadline = kvt_now_s() + 10;
    while (waitpid(enc, &status, WNOHANG) == 0 && kvt_now_s() < deadline)
        usleep(10000);
    if (kvt_now_s() >= deadline) {
        kill(enc, SIGKILL);
        waitpid(enc, &status, 0);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

static int run_once(const struct opts *o, int which, struct run *res)
{
    ref_engine_config ec;
    ref_engine_config_init(&ec);
    ec.model.tp = o->tp;
    ec.model.seed = o->seed;
    ec.gpu_blocks = o->gpu_blocks;
    ec.max_batched_tokens = o->max_batched;
    ec.max_running = o->concurrency * 2;
    ec.cpu_bytes = which == 1 || which == 4 ? 0 : o->cpu_bytes;
    ec.model.window = which >= 4 ? o->window : 0; /* the hybrid model */
    ec.lazy = o->lazy;
    ec.inject = o->inject;
    ec.remote_images = which == 3;
    ec.image_seed = o->seed + 11;
    ec.ec_port = 27000 + (uint32_t)(getpid() % 5000) * 4;
    char err[512];
    ref_engine *e;
    res->ok = false;
    res->producer_rc = 0;
    if (ref_engine_create(&ec, &e, err, sizeof(err))) {
        fprintf(stderr, "demo: run %d: %s\n", which, err);
        ref_engine_destroy(e);
        return -1;
    }
    pid_t enc = -1;
    if (which == 3 && o->n_images) { /* no images: nothing for an encoder to do */
        for (uint32_t i = 0; i < o->n_images; i++)
            if (ref_engine_register_image(e, i)) {
                fprintf(stderr, "demo: out of memory\n");
                ref_engine_destroy(e);
                return -1;
            }
        enc = spawn_encoder(o, &ec, ref_engine_ec_port(e));
        if (enc < 0) {
            fprintf(stderr, "demo: cannot start the encoder process: %s\n", strerror(errno));
            ref_engine_destroy(e);
            return -1;
        }
    }
    struct conv *cv = calloc(o->convs, sizeof(*cv));
    uint32_t *next_turn = calloc(o->convs, sizeof(uint32_t));
    bool *busy = calloc(o->convs, sizeof(bool));
    ref_result *fin = calloc(256, sizeof(*fin));
    int rc = cv && next_turn && busy && fin ? 0 : -1;
    uint32_t total = o->convs * o->turns, done = 0, in_flight = 0, cursor = 0;
    double t0 = kvt_now_s(), last_done = t0;
    progress(o, which, 0, total);
    while (!rc && done < total) {
        /* a run that stops making progress fails with a reason instead of hanging */
        int st;
        if (enc > 0 && waitpid(enc, &st, WNOHANG) == enc) {
            res->producer_rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
            enc = -1;
            if (res->producer_rc != 0) {
                fprintf(stderr, "demo: run 3: the encoder process failed (exit %d)\n",
                        res->producer_rc);
                rc = -1;
                break;
            }
        }
        if (kvt_now_s() - last_done > 120) {
            static char desc[16384];
            ref_engine_describe(e, desc, sizeof(desc));
            fprintf(stderr, "demo: run %d: no turn finished for 120 s (%u of %u done)\n%s", which,
                    done, total, desc);
            rc = -1;
            break;
        }
        /* closed loop: keep `concurrency` turns in flight, turn-major order */
        while (in_flight < o->concurrency && cursor < total) {
            uint32_t ci = cursor % o->convs, t = cursor / o->convs;
            if (busy[ci] || next_turn[ci] != t)
                break;
            if (user_message(o, &ec.model, ci, t, &cv[ci])) {
                rc = -1;
                break;
            }
            char id[64];
            snprintf(id, sizeof(id), "conv%u-turn%u", ci, t);
            ref_request_spec s = {id, cv[ci].tok, cv[ci].len, cv[ci].img, cv[ci].n_img, o->answer};
            if (ref_engine_add(e, &s, err, sizeof(err))) {
                fprintf(stderr, "demo: run %d: %s\n", which, err);
                rc = -1;
                break;
            }
            busy[ci] = true;
            in_flight++;
            cursor++;
        }
        if (rc || ref_engine_step(e, err, sizeof(err)) < 0) {
            if (!rc)
                fprintf(stderr, "demo: run %d: %s\n", which, err);
            rc = -1;
            break;
        }
        uint32_t n = ref_engine_take_finished(e, fin, 256);
        for (uint32_t i = 0; i < n; i++) {
            unsigned ci;
            if (record_turn(o, res, cv, &fin[i], &ci)) {
                rc = -1;
                continue;
            }
            busy[ci] = false;
            next_turn[ci]++;
            in_flight--;
            done++;
        }
        if (n) {
            progress(o, which, done, total);
            last_done = kvt_now_s();
        }
    }
    res->wall = kvt_now_s() - t0;
    ref_engine_leaks(e, &res->leaked_gpu, &res->leaked_host);
    ref_engine_get_stats(e, &res->st);
    if (enc > 0)
        res->producer_rc = reap_encoder(enc);
    ref_engine_destroy(e);
    for (uint32_t i = 0; cv && i < o->convs; i++)
        free(cv[i].tok);
    free(cv);
    free(next_turn);
    free(busy);
    free(fin);
    res->ok = !rc && done == total;
    return res->ok ? 0 : -1;
}

/* ---- figures ------------------------------------------------------------------------------- */

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, uint32_t n, double p)
{
    if (!n)
        return 0;
    qsort(v, n, sizeof(double), cmp_d);
    double idx = p * (n - 1);
    uint32_t lo = (uint32_t)idx;
    return lo + 1 < n ? v[lo] + (v[lo + 1] - v[lo]) * (idx - lo) : v[lo];
}

/* TTFT percentile p (ms) over the turns of run r; only the turns whose prefix had left the
 * GPU tier (host-tier hit in run 2) when evicted_only. */
static double ttft_ms(const struct opts *o, const struct run *runs, int r, bool evicted_only,
                      double p, uint32_t *count)
{
    uint32_t n = o->convs * o->turns, k = 0;
    double *v = malloc(n * sizeof(double));
    for (uint32_t i = 0; v && i < n; i++)
        if (!evicted_only || runs[1].t[i].host_hit > 0)
            v[k++] = runs[r].t[i].ttft * 1e3;
    double x = v ? pct(v, k, p) : 0;
    free(v);
    if (count)
        *count = k;
    return x;
}

/* One table row on tbl: the label, then expr (of R, the run) for runs first .. first + n - 1. */
#define TABLE_ROW(first, n, label, fmt, expr)                                                      \
    do {                                                                                           \
        fprintf(tbl, "%-44s", label);                                                              \
        for (int r_ = (first); r_ < (first) + (n); r_++) {                                         \
            const struct run *R = &runs[r_];                                                       \
            fprintf(tbl, " " fmt, (double)(expr));                                                 \
        }                                                                                          \
        fprintf(tbl, "  \n");                                                                      \
    } while (0)

static bool same_tokens(const struct opts *o, const struct run *a, const struct run *b,
                        uint32_t *first_bad)
{
    for (uint32_t i = 0; i < o->convs * o->turns; i++)
        if (a->t[i].n_gen != b->t[i].n_gen || !a->t[i].gen || !b->t[i].gen ||
            memcmp(a->t[i].gen, b->t[i].gen, a->t[i].n_gen * sizeof(uint32_t)) != 0) {
            *first_bad = i;
            return false;
        }
    return true;
}

static void write_plot(const struct opts *o, const struct run *runs, const char *dir)
{
    char path[4096], dat[4096], gp[4096];
    snprintf(dat, sizeof(dat), "%s/ttft.dat", dir);
    snprintf(path, sizeof(path), "%s/ttft.svg", dir);
    snprintf(gp, sizeof(gp), "%s/ttft.gp", dir);
    FILE *f = fopen(dat, "w");
    if (!f)
        return;
    uint32_t n = o->convs * o->turns;
    for (int r = 0; r < 3; r++) { /* one block per run: sorted TTFTs and their CDF */
        double *v = malloc(n * sizeof(double));
        for (uint32_t i = 0; v && i < n; i++)
            v[i] = runs[r].t[i].ttft * 1e3;
        if (v)
            qsort(v, n, sizeof(double), cmp_d);
        for (uint32_t i = 0; v && i < n; i++)
            fprintf(f, "%.3f %.4f\n", v[i], (double)(i + 1) / n);
        fprintf(f, "\n\n");
        free(v);
    }
    fclose(f);
    f = fopen(gp, "w");
    if (!f)
        return;
    fprintf(f,
            "set terminal svg size 800,480 dynamic font 'sans,12'\n"
            "set output 'ttft.svg'\n"
            "set title 'Time to first token, %u turns (reference engine, tp %u)'\n"
            "set xlabel 'TTFT (ms, log scale)'\nset ylabel 'fraction of turns'\n"
            "set logscale x\nset key bottom right\nset grid\n"
            "plot 'ttft.dat' index 0 with steps lw 2 title 'without offload', "
            "'' index 1 with steps lw 2 title 'with the host tier', "
            "'' index 2 with steps lw 2 dt 2 title 'host tier + encoder disaggregation'\n",
            n, o->tp);
    fclose(f);
    /* gnuplot runs in dir on relative names, without a shell: any --out works. */
    int status = -1;
    pid_t pid = fork();
    if (pid == 0) {
        int dn = open("/dev/null", O_WRONLY);
        if (dn >= 0)
            dup2(dn, 2);
        if (chdir(dir) == 0)
            execlp("gnuplot", "gnuplot", "ttft.gp", (char *)NULL);
        _exit(127);
    }
    if (pid > 0)
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
            ;
    if (pid < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fprintf(stderr,
                "demo: gnuplot failed or is missing: no %s (scripts/install-deps "
                "installs gnuplot-nox)\n",
                path);
}

/* What the runs showed: each check's result and the figures the tables and the report share. */
struct verdict {
    bool bad; /* a run failed (or the report could not be built) */
    bool identical, ec_identical, leaks, offload_worked, kv_equal;
    bool hyb, hyb_identical, hyb_worked, hyb_kv; /* hyb: the hybrid runs ran */
    uint32_t differs, hyb_differs; /* the first turn whose tokens differ (runs 1-3, 4-5) */
    uint32_t n_ev;                 /* turns whose prefix had left the GPU tier */
    uint64_t kv_verified, kv_bad;
    double p50_wo, p50_w, p90_wo, p90_w, speedup;
};

/* The options into *o: 0, or the exit code (-1: help printed, exit 0). */
static int parse_opts(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){.convs = 16,
                       .turns = 4,
                       .tp = 2,
                       .concurrency = 4,
                       .n_sys = 4,
                       .sys_len = 256,
                       .doc_min = 1100,
                       .doc_max = 1500,
                       .user_min = 48,
                       .user_max = 112,
                       .answer = 16,
                       .n_images = 8,
                       .gpu_blocks = 512,
                       .max_batched = 512,
                       .window = 256,
                       .cpu_bytes = 512ull << 20,
                       .seed = 1,
                       .plot = true,
                       .out_dir = "."};
    uint64_t convs = o->convs, turns = o->turns, tp = o->tp, conc = o->concurrency;
    uint64_t answer = o->answer, images = o->n_images, gpu_blocks = o->gpu_blocks;
    uint64_t max_batched = o->max_batched, doc_max = o->doc_max, window = o->window;
    bool no_plot = false, no_progress = false;
    const char *inject = NULL;
    const kvt_opt opts[] = {
        {"requests", KVT_OPT_U64, &convs, "N", "conversations (default 16)", .lo = 1, .hi = 4096},
        {"turns", KVT_OPT_U64, &turns, "T", "turns per conversation (default 4)", .lo = 1,
         .hi = 64},
        {"tp", KVT_OPT_U64, &tp, "N", "tensor-parallel ranks: 1, 2 or 4 (default 2)", .lo = 1,
         .hi = 4},
        {"concurrency", KVT_OPT_U64, &conc, "N", "turns in flight at once (default 4)", .lo = 1,
         .hi = 256},
        {"cpu-bytes", KVT_OPT_BYTES, &o->cpu_bytes, "B",
         "host tier across ranks, K/M/G suffix allowed (default 512M)", .lo = 1u << 20,
         .hi = 1ull << 40},
        {"lazy", KVT_OPT_FLAG, &o->lazy, NULL, "lazy stores (default eager)"},
        {"gpu-blocks", KVT_OPT_U64, &gpu_blocks, "N",
         "GPU-tier KV blocks of 16 tokens per rank (default 512)", .lo = 64, .hi = 1u << 20},
        {"max-batched-tokens", KVT_OPT_U64, &max_batched, "N", "tokens per step (default 512)",
         .lo = 32, .hi = 8192},
        {"doc-tokens", KVT_OPT_U64, &doc_max, "N", "longest first-turn document (default 1500)",
         .lo = 16, .hi = 8000},
        {"answer-tokens", KVT_OPT_U64, &answer, "N", "tokens generated per turn (default 16)",
         .lo = 1, .hi = 512},
        {"images", KVT_OPT_U64, &images, "N", "distinct images (default 8; 0: none)", .lo = 0,
         .hi = 4096},
        {"hybrid-window", KVT_OPT_U64, &window, "N",
         "runs 4-5: a hybrid model whose odd layers attend to the last N tokens\n"
         "(default 256; 0: no hybrid runs)",
         .lo = 0, .hi = 8000},
        {"seed", KVT_OPT_U64, &o->seed, "N", "workload and weights seed (default 1)", .lo = 0,
         .hi = UINT64_MAX},
        {"out", KVT_OPT_STR, &o->out_dir, "DIR", "where report.json and ttft.svg go (default .)"},
        {"json", KVT_OPT_FLAG, &o->json, NULL, "the report on stdout (the table goes to stderr)"},
        {"inject", KVT_OPT_CHOICE, &inject, "F",
         "corrupt|swap|drop: a fault on rank 0 to watch the KV check fail: a\n"
         "loaded block's byte flipped, two loaded blocks swapped, or every store\n"
         "reported done without its bytes",
         .choices = "corrupt|swap|drop"},
        {"no-plot", KVT_OPT_FLAG, &no_plot, NULL, "no ttft.svg"},
        {"no-progress", KVT_OPT_FLAG, &no_progress, NULL,
         "no progress on stderr (a bar on a terminal, else a line every 5 s)"},
    };
    kvt_cli c = {
        .prog = "kvtier demo",
        .usage = "kvtier demo [options]",
        .about =
            "  The main demonstration: a reference engine (a small transformer with a paged KV\n"
            "  cache, a vLLM-like scheduler, tensor-parallel ranks as threads, a vision encoder)\n"
            "  serves a multi-turn chat workload with images three times: without offload, with\n"
            "  the host tier, and with the host tier plus an encoder process pushing embeddings\n"
            "  over UCX; then a hybrid model (full and sliding-window layers) twice, without\n"
            "  and with the host tier. Checks that the generated tokens are identical (runs 1-3,\n"
            "  and runs 4-5), every transferred embedding equals the local one, the host tier\n"
            "  was hit and saved prefill, every block loaded from it holds the KV computed for\n"
            "  its hash (checksums per rank and KV-cache group) and nothing leaked; prints the\n"
            "  tables, writes report.json and ttft.svg (gnuplot).\n",
        .opts = opts,
        .n_opts = sizeof(opts) / sizeof(opts[0]),
        .footer = "  Exit code 0: all passed; 1: a check failed (named); 2: a usage error.\n"
                  "kvtier demo --components [...]   the library's parts one by one "
                  "(--components --help)\n"
                  "kvtier demo --soak SECONDS       random faults for SECONDS "
                  "(docs/reliability.md)\n"};
    int prc = kvt_cli_parse(&c, argc, argv);
    if (prc)
        return prc;
    o->convs = (uint32_t)convs, o->turns = (uint32_t)turns, o->tp = (uint32_t)tp;
    o->concurrency = (uint32_t)conc, o->answer = (uint32_t)answer, o->n_images = (uint32_t)images;
    o->gpu_blocks = (uint32_t)gpu_blocks, o->max_batched = (uint32_t)max_batched;
    o->doc_max = (uint32_t)doc_max;
    o->window = (uint32_t)window;
    o->n_runs = o->window ? 5 : 3;
    o->plot = !no_plot;
    o->progress = !no_progress;
    static const char *const inject_names[] = {"corrupt", "swap", "drop"};
    for (uint32_t k = 0; inject && k < 3; k++)
        if (strcmp(inject, inject_names[k]) == 0)
            o->inject = REF_INJECT_CORRUPT + k;
    if (o->doc_max < o->doc_min)
        o->doc_min = o->doc_max * 3 / 4;
    return 0;
}

/* The model's configuration for --tp, the output directory and the address space checked, and
 * the header printed on tbl: 0, or the exit code. */
static int check_setup(const struct opts *o, FILE *tbl)
{
    char cerr[256];
    ref_config mc;
    ref_config_default(&mc);
    mc.tp = o->tp;
    if (ref_config_check(&mc, cerr, sizeof(cerr))) {
        fprintf(stderr, "kvtier demo: --tp %u: %s\n", o->tp, cerr);
        return 2;
    }
    struct stat sb;
    if (stat(o->out_dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "kvtier demo: --out %s is not a directory\n", o->out_dir);
        return 2;
    }
    uint64_t kv_tok = ref_kv_bytes_per_token(&mc) * o->tp;
    /* Under an address-space limit (ulimit -v) too small for the runs, say so now: OpenBLAS,
     * which the engine's matrix products use, retries a failing allocation for ever. */
    struct rlimit as;
    uint64_t need = o->cpu_bytes + (uint64_t)o->gpu_blocks * REF_BT * kv_tok + (1ull << 30);
    if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY && as.rlim_cur < need) {
        fprintf(stderr,
                "kvtier demo: needs about %llu MiB of address space (host tier %llu MiB, GPU "
                "tier %llu MiB, 1 GiB for the engine and its libraries); ulimit -v allows %llu "
                "MiB (lower --cpu-bytes or --gpu-blocks, or raise the limit)\n",
                (unsigned long long)(need >> 20), (unsigned long long)(o->cpu_bytes >> 20),
                (unsigned long long)(((uint64_t)o->gpu_blocks * REF_BT * kv_tok) >> 20),
                (unsigned long long)(as.rlim_cur >> 20));
        return 1;
    }
    fprintf(tbl,
            "kvtier %s demo: a reference engine (%u layers, d_model %u, %u query / %u KV heads, "
            "tp %u ranks)\nserving %u conversations x %u turns (shared %u-token system prompts, "
            "%u..%u-token documents, %u images),\nGPU tier %u blocks of %u tokens (%.1f MiB of "
            "KV, %.0f KiB per token), host tier %.0f MiB%s\n\n",
            kvt_version(), mc.n_layers, mc.d_model, mc.n_heads, mc.n_kv_heads, o->tp, o->convs,
            o->turns, o->sys_len, o->doc_min, o->doc_max, o->n_images, o->gpu_blocks - 1, REF_BT,
            (double)(o->gpu_blocks - 1) * REF_BT * kv_tok / (1 << 20), kv_tok / 1024.0,
            (double)o->cpu_bytes / (1 << 20), o->lazy ? " (lazy stores)" : " (eager stores)");
    fflush(tbl);
    return 0;
}

/* What the runs showed (bad: one of them failed). */
static void judge(const struct opts *o, const struct run *runs, bool bad, struct verdict *v)
{
    memset(v, 0, sizeof(*v));
    v->bad = bad;
    v->identical = !bad && same_tokens(o, &runs[0], &runs[1], &v->differs) &&
                   same_tokens(o, &runs[0], &runs[2], &v->differs);
    v->ec_identical = !bad && runs[2].st.image_mismatches == 0 &&
                      runs[2].st.images_received == (uint64_t)o->n_images * o->tp &&
                      runs[2].producer_rc == 0;
    if (!bad) {
        v->p50_wo = ttft_ms(o, runs, 0, true, 0.5, &v->n_ev);
        v->p50_w = ttft_ms(o, runs, 1, true, 0.5, NULL);
        v->p90_wo = ttft_ms(o, runs, 0, true, 0.9, NULL);
        v->p90_w = ttft_ms(o, runs, 1, true, 0.9, NULL);
    }
    v->speedup = v->p50_w > 0 ? v->p50_wo / v->p50_w : 0;
    for (int r = 0; r < (int)o->n_runs && !bad; r++)
        v->leaks |= runs[r].leaked_gpu || runs[r].leaked_host;
    /* the hybrid pair: the same tokens, host-tier hits, every loaded block (both groups) right */
    const struct run *h0 = &runs[3], *h1 = &runs[4];
    v->hyb = o->window && !bad;
    v->hyb_identical = !v->hyb || same_tokens(o, h0, h1, &v->hyb_differs);
    v->hyb_worked = !v->hyb || (h1->st.host_hit_tokens > 0 && h1->st.loaded_bytes > 0 &&
                                h1->st.prefill_tokens < h0->st.prefill_tokens);
    v->hyb_kv = !v->hyb || (h1->st.kv_blocks_mismatched == 0 && h1->st.kv_loads_verified > 0);
    /* offload must have done its work: a run that loaded nothing proves nothing */
    v->offload_worked = !bad && runs[1].st.host_hit_tokens > 0 && runs[1].st.loaded_bytes > 0 &&
                        runs[1].st.prefill_tokens < runs[0].st.prefill_tokens;
    /* every block loaded from the host tier (runs 2 and 3) holds the KV computed for its hash */
    for (int r = 1; r < 3 && !bad; r++) {
        v->kv_verified += runs[r].st.kv_loads_verified;
        v->kv_bad += runs[r].st.kv_blocks_mismatched;
    }
    v->kv_equal = !bad && v->kv_bad == 0 && v->kv_verified > 0;
}

/* Runs 1-3 side by side on tbl, then each check's result. */
static void print_tables(const struct opts *o, const struct run *runs, const struct verdict *v,
                         FILE *tbl)
{
    fprintf(tbl, "%-44s %15s %15s %17s\n", "", "without offload", "with host tier",
            "+ encoder process");
#define ROW(label, fmt, expr) TABLE_ROW(0, 3, label, fmt, expr)
    ROW("prompt tokens", "%15.0f", (double)R->st.prompt_tokens);
    ROW("  hit in the GPU prefix cache (%)", "%15.1f",
        100.0 * R->st.gpu_hit_tokens / (double)R->st.prompt_tokens);
    ROW("  loaded from the host tier (%)", "%15.1f",
        100.0 * R->st.host_hit_tokens / (double)R->st.prompt_tokens);
    ROW("prefill tokens computed", "%15.0f", (double)R->st.prefill_tokens);
    ROW("TTFT p50, all turns (ms)", "%15.1f", ttft_ms(o, runs, (int)(R - runs), false, .5, NULL));
    ROW("TTFT p90, all turns (ms)", "%15.1f", ttft_ms(o, runs, (int)(R - runs), false, .9, NULL));
    ROW("TTFT p50, turns whose prefix left the GPU", "%15.1f",
        ttft_ms(o, runs, (int)(R - runs), true, .5, NULL));
    ROW("TTFT p90, turns whose prefix left the GPU", "%15.1f",
        ttft_ms(o, runs, (int)(R - runs), true, .9, NULL));
    ROW("throughput (tokens in + out per s)", "%15.0f",
        (R->st.prompt_tokens + R->st.decode_tokens + o->convs * o->turns) / R->wall);
    ROW("wall time (s)", "%15.2f", R->wall);
    ROW("KV loaded from the host tier (MiB)", "%15.1f", R->st.loaded_bytes / 1048576.0);
    ROW("KV stored to the host tier (MiB)", "%15.1f", R->st.stored_bytes / 1048576.0);
    ROW("  load GB/s (bytes / issue-to-done time)", "%15.2f",
        R->st.load_seconds > 0 ? R->st.loaded_bytes / R->st.load_seconds / 1e9 : 0.0);
    ROW("  load wait per loading turn, mean (ms)", "%15.1f",
        R->st.loads ? R->st.load_seconds / R->st.loads * 1e3 : 0.0);
    ROW("preemptions", "%15.0f", (double)R->st.preemptions);
    ROW("images encoded locally", "%15.0f", (double)R->st.images_encoded);
    ROW("embeddings received over UCX (all ranks)", "%15.0f", (double)R->st.images_received);
    ROW("  KiB received", "%15.1f", R->st.image_bytes_received / 1024.0);
#undef ROW
    double all_wo = ttft_ms(o, runs, 0, false, .5, NULL),
           all_w = ttft_ms(o, runs, 1, false, .5, NULL);
    fprintf(tbl,
            "\nTTFT p50 of the %u turns whose prefix had left the GPU tier: %.1f ms without "
            "offload, %.1f ms with the host tier: %.1fx (over all %u turns: %.1fx)\n",
            v->n_ev, v->p50_wo, v->p50_w, v->speedup, o->convs * o->turns,
            all_w > 0 ? all_wo / all_w : 0);
    fprintf(tbl, "generated tokens identical in all three runs: %s%s\n",
            v->identical ? "yes" : "NO", v->identical ? "" : " (see stderr)");
    fprintf(tbl,
            "every transferred embedding equal to the local encoder's: %s (%llu "
            "received, %llu different, encoder process exit %d)\n",
            v->ec_identical ? "yes" : "NO", (unsigned long long)runs[2].st.images_received,
            (unsigned long long)runs[2].st.image_mismatches, runs[2].producer_rc);
    fprintf(tbl, "GPU and host blocks left referenced at the end: %s\n",
            v->leaks ? "SOME (leak)" : "none");
    fprintf(tbl,
            "the host tier did its work (hits, loads, less prefill than without it): %s "
            "(%llu tokens hit, %llu vs %llu prefill tokens)\n",
            v->offload_worked ? "yes" : "NO", (unsigned long long)runs[1].st.host_hit_tokens,
            (unsigned long long)runs[1].st.prefill_tokens,
            (unsigned long long)runs[0].st.prefill_tokens);
    fprintf(tbl,
            "every loaded KV block equal to the KV computed for its hash: %s (%llu loaded "
            "blocks verified, %llu different)\n",
            v->kv_equal ? "yes" : "NO", (unsigned long long)v->kv_verified,
            (unsigned long long)v->kv_bad);
    for (int r = 1; r < 3; r++)
        if (runs[r].st.kv_blocks_mismatched)
            fprintf(stderr, "demo: KV check failed in run %d (%s): %s\n", r + 1, runs[r].name,
                    runs[r].st.kv_first_mismatch);
    if (!v->identical)
        fprintf(stderr, "demo: conversation %u turn %u generated different tokens\n",
                v->differs / o->turns, v->differs % o->turns);
}

/* Runs 4-5 (the hybrid model) side by side on tbl, then their checks. */
static void print_hybrid(const struct opts *o, const struct run *runs, const struct verdict *v,
                         FILE *tbl)
{
    const struct run *h0 = &runs[3], *h1 = &runs[4];
    fprintf(tbl,
            "\nhybrid model: layers 1 and 3 attend to the last %u tokens (two KV-cache "
            "groups: full and sliding window)\n%-44s %15s %15s\n",
            o->window, "", "without offload", "with host tier");
#define HROW(label, fmt, expr) TABLE_ROW(3, 2, label, fmt, expr)
    HROW("prompt tokens", "%15.0f", (double)R->st.prompt_tokens);
    HROW("  hit in the GPU prefix cache (%)", "%15.1f",
         100.0 * R->st.gpu_hit_tokens / (double)R->st.prompt_tokens);
    HROW("  loaded from the host tier (%)", "%15.1f",
         100.0 * R->st.host_hit_tokens / (double)R->st.prompt_tokens);
    HROW("prefill tokens computed", "%15.0f", (double)R->st.prefill_tokens);
    HROW("TTFT p50, all turns (ms)", "%15.1f", ttft_ms(o, runs, (int)(R - runs), false, .5, NULL));
    HROW("wall time (s)", "%15.2f", R->wall);
    HROW("KV loaded from the host tier (MiB)", "%15.1f", R->st.loaded_bytes / 1048576.0);
    HROW("preemptions", "%15.0f", (double)R->st.preemptions);
#undef HROW
    fprintf(tbl, "hybrid: generated tokens identical with and without offload: %s\n",
            v->hyb_identical ? "yes" : "NO");
    fprintf(tbl,
            "hybrid: the host tier did its work: %s (%.1f%% of prompt tokens loaded from "
            "it, %llu vs %llu prefill tokens)\n",
            v->hyb_worked ? "yes" : "NO",
            100.0 * h1->st.host_hit_tokens /
                (double)(h1->st.prompt_tokens ? h1->st.prompt_tokens : 1),
            (unsigned long long)h1->st.prefill_tokens, (unsigned long long)h0->st.prefill_tokens);
    fprintf(tbl,
            "hybrid: every loaded KV block (both groups) equal to the KV computed for its "
            "hash: %s (%llu verified, %llu different)\n",
            v->hyb_kv ? "yes" : "NO", (unsigned long long)h1->st.kv_loads_verified,
            (unsigned long long)h1->st.kv_blocks_mismatched);
    if (h1->st.kv_blocks_mismatched)
        fprintf(stderr, "demo: KV check failed in run 5 (%s): %s\n", h1->name,
                h1->st.kv_first_mismatch);
    if (!v->hyb_identical)
        fprintf(stderr, "demo: hybrid: conversation %u turn %u generated different tokens\n",
                v->hyb_differs / o->turns, v->hyb_differs % o->turns);
}

/* report.json's object (NULL when it could not be built). */
static json_t *build_report(const struct opts *o, const struct run *runs, const struct verdict *v)
{
    const struct run *h0 = &runs[3], *h1 = &runs[4];
    json_t *rep;
    if (!v->bad) {
        const ref_engine_stats *s1 = &runs[1].st;
        double all_wo = ttft_ms(o, runs, 0, false, .5, NULL);
        double all_w = ttft_ms(o, runs, 1, false, .5, NULL);
        rep = json_pack(
            "{s:b, s:b, s:b, s:b, s:b, s:I, s:I, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:i, "
            "s:o, s:o, s:o, s:o, s:o, s:o}",
            "identical", v->identical, "ec_identical", v->ec_identical, "no_leaks", !v->leaks,
            "offload_worked", v->offload_worked, "kv_equal", v->kv_equal, "kv_blocks_verified",
            (json_int_t)v->kv_verified, "kv_blocks_different", (json_int_t)v->kv_bad,
            "host_tier_hit_rate", kvt_json_real(s1->host_hit_tokens / (double)s1->prompt_tokens),
            "gpu_hit_rate_without",
            kvt_json_real(runs[0].st.gpu_hit_tokens / (double)runs[0].st.prompt_tokens),
            "gpu_hit_rate_with", kvt_json_real(s1->gpu_hit_tokens / (double)s1->prompt_tokens),
            "ttft_p50_ms_without", kvt_json_real(v->p50_wo), "ttft_p50_ms_with",
            kvt_json_real(v->p50_w), "ttft_p90_ms_without", kvt_json_real(v->p90_wo),
            "ttft_p90_ms_with", kvt_json_real(v->p90_w), "ttft_speedup_p50",
            kvt_json_real(v->speedup), "turns_prefix_evicted", (int)v->n_ev,
            "ttft_p50_ms_all_without", kvt_json_real(all_wo), "ttft_p50_ms_all_with",
            kvt_json_real(all_w), "ttft_p50_ms_all_ec",
            kvt_json_real(ttft_ms(o, runs, 2, false, .5, NULL)), "ttft_p90_ms_all_without",
            kvt_json_real(ttft_ms(o, runs, 0, false, .9, NULL)), "ttft_p90_ms_all_with",
            kvt_json_real(ttft_ms(o, runs, 1, false, .9, NULL)), "ttft_speedup_p50_all",
            kvt_json_real(all_w > 0 ? all_wo / all_w : 0.0));
        json_t *more = json_pack(
            "{s:[o,o,o], s:[I,I,I], s:I, s:I, s:o, s:o, s:I, s:I, s:[I,I,I], "
            "s:{s:i, s:i, s:i, s:I, s:i, s:b, s:I, s:i}}",
            "wall_s", kvt_json_real(runs[0].wall), kvt_json_real(runs[1].wall),
            kvt_json_real(runs[2].wall), "prefill_tokens", (json_int_t)runs[0].st.prefill_tokens,
            (json_int_t)s1->prefill_tokens, (json_int_t)runs[2].st.prefill_tokens, "bytes_loaded",
            (json_int_t)s1->loaded_bytes, "bytes_stored", (json_int_t)s1->stored_bytes, "load_gbps",
            kvt_json_real(s1->load_seconds > 0 ? s1->loaded_bytes / s1->load_seconds / 1e9 : 0.0),
            "load_wait_ms_mean",
            kvt_json_real(s1->loads ? s1->load_seconds / s1->loads * 1e3 : 0.0),
            "embeddings_received", (json_int_t)runs[2].st.images_received,
            "embedding_bytes_received", (json_int_t)runs[2].st.image_bytes_received, "preemptions",
            (json_int_t)runs[0].st.preemptions, (json_int_t)s1->preemptions,
            (json_int_t)runs[2].st.preemptions, "config", "requests", (int)o->convs, "turns",
            (int)o->turns, "tp", (int)o->tp, "cpu_bytes", (json_int_t)o->cpu_bytes, "gpu_blocks",
            (int)o->gpu_blocks, "lazy", o->lazy, "seed", (json_int_t)o->seed, "images",
            (int)o->n_images);
        if (json_object_update(rep, more) != 0) {
            json_decref(rep);
            rep = NULL;
        }
        json_decref(more);
        if (rep && v->hyb) {
            const ref_engine_stats *t1 = &h1->st;
            json_t *hj = json_pack(
                "{s:i, s:b, s:b, s:b, s:o, s:[I,I], s:I, s:I, s:[o,o], s:[o,o]}", "window",
                (int)o->window, "identical", v->hyb_identical, "offload_worked", v->hyb_worked,
                "kv_equal", v->hyb_kv, "host_tier_hit_rate",
                kvt_json_real(t1->host_hit_tokens / (double)t1->prompt_tokens), "prefill_tokens",
                (json_int_t)h0->st.prefill_tokens, (json_int_t)t1->prefill_tokens,
                "kv_blocks_verified", (json_int_t)t1->kv_loads_verified, "bytes_loaded",
                (json_int_t)t1->loaded_bytes, "ttft_p50_ms_all",
                kvt_json_real(ttft_ms(o, runs, 3, false, .5, NULL)),
                kvt_json_real(ttft_ms(o, runs, 4, false, .5, NULL)), "wall_s",
                kvt_json_real(h0->wall), kvt_json_real(h1->wall));
            if (!hj || json_object_set_new(rep, "hybrid", hj) != 0) {
                json_decref(rep);
                rep = NULL;
            }
        }
    } else {
        rep = json_pack("{s:b, s:b, s:s}", "identical", 0, "ec_identical", 0, "error",
                        "a run failed (see stderr)");
    }
    return rep;
}

/* report.json written to --out (and stdout with --json), the plot drawn; v->bad when the
 * report could not be built. */
static void write_report(const struct opts *o, const struct run *runs, struct verdict *v, FILE *tbl)
{
    /* report.json */
    char path[4096];
    snprintf(path, sizeof(path), "%s/report.json", o->out_dir);
    json_t *rep = build_report(o, runs, v);
    char *js = rep ? json_dumps(rep, JSON_REAL_PRECISION(9) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(rep);
    if (!js) {
        fprintf(stderr, "demo: the JSON report could not be built\n");
        v->bad = true;
    }
    FILE *jf = fopen(path, "w");
    if (jf && js)
        fprintf(jf, "%s\n", js);
    if (jf)
        fclose(jf);
    if (o->json && js)
        printf("%s\n", js);
    free(js);
    if (!v->bad && o->plot)
        write_plot(o, runs, o->out_dir);
    if (!v->bad && o->plot)
        fprintf(tbl, "wrote %s and %s/ttft.svg\n", path, o->out_dir);
    else if (!v->bad)
        fprintf(tbl, "wrote %s\n", path);
}

/* The verdict on tbl (and what failed on stderr too): the exit code. */
static int report_verdict(const struct verdict *v, FILE *tbl)
{
    bool pass = !v->bad && v->identical && v->ec_identical && !v->leaks && v->offload_worked &&
                v->kv_equal && v->hyb_identical && v->hyb_worked && v->hyb_kv;
    if (pass) {
        fprintf(tbl, "demo: all checks passed\n");
    } else {
        /* name the checks that caught it (stderr too: the caller may read only that) */
        const char *failed[9];
        uint32_t nf = 0;
        if (v->bad)
            failed[nf++] = "a run failed";
        if (!v->bad && !v->kv_equal)
            failed[nf++] = "KV check (every loaded KV block equal to the KV computed for its hash)";
        if (!v->bad && !v->identical)
            failed[nf++] = "identical tokens";
        if (!v->bad && !v->ec_identical)
            failed[nf++] = "transferred embeddings";
        if (!v->bad && v->leaks)
            failed[nf++] = "no blocks left referenced";
        if (!v->bad && !v->offload_worked)
            failed[nf++] = "the host tier did its work";
        if (!v->hyb_identical)
            failed[nf++] = "hybrid: identical tokens";
        if (!v->hyb_worked)
            failed[nf++] = "hybrid: the host tier did its work";
        if (!v->hyb_kv)
            failed[nf++] = "hybrid: KV check";
        for (FILE *f = tbl; f; f = f == stderr ? NULL : stderr) {
            fprintf(f, "demo: FAILED:");
            for (uint32_t k = 0; k < nf; k++)
                fprintf(f, "%s %s", k ? ";" : "", failed[k]);
            fprintf(f, "\n");
        }
    }
    return pass ? 0 : 1;
}

int kvt_demo_engine(int argc, char **argv)
{
    struct opts o;
    int prc = parse_opts(argc, argv, &o);
    if (prc)
        return prc < 0 ? 0 : prc;
    FILE *tbl = o.json ? stderr : stdout;
    prc = check_setup(&o, tbl);
    if (prc)
        return prc;
    struct run runs[5] = {{.name = "without offload"},
                          {.name = "with host tier"},
                          {.name = "host tier + encoder process"},
                          {.name = "hybrid, without offload"},
                          {.name = "hybrid, with host tier"}};
    int bad = 0;
    for (int r = 0; r < (int)o.n_runs; r++) {
        runs[r].t = calloc(o.convs * o.turns, sizeof(struct turn_rec));
        if (!runs[r].t || run_once(&o, r + 1, &runs[r]))
            bad = 1;
        if (bad)
            break;
    }
    struct verdict v;
    judge(&o, runs, bad, &v);
    if (!bad)
        print_tables(&o, runs, &v, tbl);
    if (v.hyb)
        print_hybrid(&o, runs, &v, tbl);
    write_report(&o, runs, &v, tbl);
    for (int r = 0; r < 5; r++) {
        for (uint32_t i = 0; runs[r].t && i < o.convs * o.turns; i++)
            free(runs[r].t[i].gen);
        free(runs[r].t);
    }
    return report_verdict(&v, tbl);
}

/* ---- `kvtier ec-encoder`: the encoder instance of run 3 ------------------------------------ */

int kvt_cmd_ec_encoder(int argc, char **argv)
{
    const char *consumer = NULL;
    uint64_t images = 8, image_seed = 12, model_seed = 1;
    bool quiet = false;
    const kvt_opt opts[] = {
        {"consumer", KVT_OPT_STR, &consumer, "ADDR",
         "the consumer's shard-0 control address, tcp://ADDR:P (required)"},
        {"images", KVT_OPT_U64, &images, "N", "images to encode and push (default 8)", .lo = 1,
         .hi = 4096},
        {"image-seed", KVT_OPT_U64, &image_seed, "S", "pixels' seed (default 12)", .lo = 0,
         .hi = UINT64_MAX},
        {"model-seed", KVT_OPT_U64, &model_seed, "S", "encoder weights' seed (default 1)", .lo = 0,
         .hi = UINT64_MAX},
        {"quiet", KVT_OPT_FLAG, &quiet, NULL, "no summary line"},
    };
    kvt_cli c = {
        .prog = "kvtier ec-encoder",
        .usage = "kvtier ec-encoder --consumer tcp://ADDR:P [options]",
        .about = "  The encoder instance of `kvtier demo`: runs the reference engine's vision\n"
                 "  encoder on images 0..N-1 and pushes each embedding (mm_hash: the hash of its\n"
                 "  pixels) into every shard of the consumer (ZeroMQ control, UCX data).\n",
        .opts = opts,
        .n_opts = sizeof(opts) / sizeof(opts[0]),
        .footer = "  Exit code 0: every embedding pushed; 1: a push failed; 2: a usage error.\n"};
    int prc = kvt_cli_parse(&c, argc, argv);
    if (prc)
        return prc < 0 ? 0 : prc;
    if (!consumer) {
        fprintf(stderr, "kvtier ec-encoder: --consumer is required (see --help)\n");
        return 2;
    }
    ref_config mc;
    ref_config_default(&mc);
    mc.seed = model_seed;
    ref_encoder *enc = ref_encoder_create(&mc);
    uint64_t nbytes = ref_embedding_bytes(&mc);
    float *emb = malloc(nbytes * images);
    kvt_ec_net_config nc;
    kvt_ec_net_config_init(&nc);
    kvt_ec_net_consumer *net = NULL;
    kvt_ec_producer *prod = NULL;
    kvt_ec_producer_config pc;
    kvt_ec_producer_config_init(&pc);
    int rc = enc && emb ? kvt_ec_net_consumer_create(&nc, &net) : KVT_ENOMEM;
    if (!rc) {
        pc.ops = kvt_ec_net_consumer_ops(net);
        rc = kvt_ec_producer_create(&pc, &prod);
    }
    uint64_t pushed = 0;
    double t0 = kvt_now_s();
    for (unsigned long long i = 0; !rc && i < images; i++) {
        uint8_t px[REF_IMG_BYTES];
        char hash[33], tid[48];
        ref_image_pixels(image_seed, (uint32_t)i, px);
        ref_image_hash(px, hash);
        float *out = emb + i * (nbytes / sizeof(float));
        ref_encoder_run(enc, px, out);
        snprintf(tid, sizeof(tid), "enc-%llu", i);
        kvt_ec_push_spec s;
        memset(&s, 0, sizeof(s));
        s.mm_hash = (kvt_str){hash, 32};
        s.ndim = 2;
        s.shape[0] = REF_IMG_TOKENS;
        s.shape[1] = mc.d_model;
        s.dtype = (kvt_str){"float32", 7};
        s.nbytes = nbytes;
        s.consumer_zmq = (kvt_str){consumer, (uint32_t)strlen(consumer)};
        s.transfer_id = (kvt_str){tid, (uint32_t)strlen(tid)};
        char why[256];
        bool ok = kvt_ec_push_now(prod, &s, out, why, sizeof(why)) == 0;
        if (!ok) {
            fprintf(stderr, "kvtier ec-encoder: image %llu: %s\n", i, why);
            rc = KVT_EIO;
        }
        pushed += ok;
    }
    if (!quiet)
        printf("ec-encoder: %llu of %llu embeddings pushed in %.3f s\n", (unsigned long long)pushed,
               (unsigned long long)images, kvt_now_s() - t0);
    kvt_ec_producer_destroy(prod);
    kvt_ec_net_consumer_destroy(net);
    ref_encoder_destroy(enc);
    free(emb);
    if (rc && !pushed)
        fprintf(stderr, "kvtier ec-encoder: %s\n", kvt_last_error());
    return rc ? 1 : 0;
}
