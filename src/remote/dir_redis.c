/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The remote tier's directory in Redis (hiredis). Keys of space S (one hash tag, so a Redis
 * Cluster keeps a space on one shard):
 *
 *   kvt:{S}:live:<I>   "<epoch> <endpoint>", expiring: instance I is alive in that epoch
 *   kvt:{S}:epoch:<I>  counter: I's last epoch
 *   kvt:{S}:seeds      hash I -> "<hash seed> <signature> <hash_len>" (checked against live
 *                      instances when one enters)
 *   kvt:{S}:own:<I>    set of the entry keys I wrote (dropped when I enters again or leaves)
 *   kvt:{S}:b:<hex>    "<I> <epoch> <slot> <generation>": who holds the block
 *   kvt:{S}:b:<hex>:<r>  the same for rank r's part, in a space of engines of several ranks
 *                      (each rank registers as "<I>#<r>": a liveness key, an epoch and its
 *                      entries of its own; the seeds say how many ranks)
 *
 * Every operation is one EVAL (a script runs atomically on the server): entering checks the
 * seeds and starts an epoch, a lookup walks a request's chain and stops at the first block
 * that is missing or whose owner is not alive in the entry's epoch. Values are parsed and
 * validated here before use: a Redis that answers garbage gives misses, never a crash.
 */
#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/socket.h>
#include <inttypes.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "base/util.h"
#include "remote/remote_internal.h"

typedef struct rdir {
    redisContext *c;
    char host[256];
    char name[272];        /* "host:port" or the socket path, for messages */
    char *user, *password; /* AUTH; NULL: none */
    int port;              /* 0: host is a unix socket path */
    uint32_t timeout_ms;   /* bound of one whole call */
    uint32_t retry_ms;
    uint64_t retry_at_ns; /* no reconnect before this after a failure */
    bool hung_up;         /* the last exchange failed as the server had closed the connection */
} rdir;

static const char ENTER[] =
    "local all = redis.call('HGETALL', KEYS[1])\n"
    "for i = 1, #all, 2 do\n"
    "  if all[i] ~= ARGV[1] and all[i+1] ~= ARGV[2] and\n"
    "     redis.call('EXISTS', ARGV[3] .. all[i]) == 1 then\n"
    "    return {0, all[i], all[i+1]}\n"
    "  end\n"
    "end\n"
    "local cur = redis.call('GET', KEYS[3])\n"
    "if cur then return {2, cur} end\n"
    "for _, k in ipairs(redis.call('SMEMBERS', KEYS[4])) do\n"
    "  local v = redis.call('GET', k)\n"
    "  if v and string.sub(v, 1, #ARGV[1] + 1) == ARGV[1] .. ' ' then redis.call('DEL', k) end\n"
    "end\n"
    "redis.call('DEL', KEYS[4])\n"
    "redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])\n"
    "local ep = redis.call('INCR', KEYS[2])\n"
    "redis.call('SET', KEYS[3], ep .. ' ' .. ARGV[4], 'PX', ARGV[5])\n"
    "return {1, ep}\n";

static const char REFRESH[] = "if redis.call('GET', KEYS[1]) == ARGV[1] then\n"
                              "  return redis.call('PEXPIRE', KEYS[1], ARGV[2])\n"
                              "end\n"
                              "return 0\n";

static const char LEAVE[] =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end\n"
    "for _, k in ipairs(redis.call('SMEMBERS', KEYS[2])) do\n"
    "  local v = redis.call('GET', k)\n"
    "  if v and string.sub(v, 1, #ARGV[2] + 1) == ARGV[2] .. ' ' then redis.call('DEL', k) end\n"
    "end\n"
    "redis.call('DEL', KEYS[2])\n"
    "return 1\n";

/* KEYS: entries, then the owner's set; ARGV: their values */
static const char PUBLISH[] = "for i = 1, #KEYS - 1 do\n"
                              "  redis.call('SET', KEYS[i], ARGV[i])\n"
                              "  redis.call('SADD', KEYS[#KEYS], KEYS[i])\n"
                              "end\n"
                              "return #KEYS - 1\n";

static const char WITHDRAW[] =
    "local n = 0\n"
    "for i = 1, #KEYS - 1 do\n"
    "  if redis.call('GET', KEYS[i]) == ARGV[i] then redis.call('DEL', KEYS[i]); n = n + 1 end\n"
    "  redis.call('SREM', KEYS[#KEYS], KEYS[i])\n"
    "end\n"
    "return n\n";

/* KEYS: the chain's entries, each block's ranks in order; ARGV: the live-key prefix, self's
 * instance name, the ranks. Values are "<instance> <epoch> <slot> <generation>", live keys
 * "<epoch> <endpoint>"; an instance "<I>#<r>" is rank r of I. Whole blocks only. */
static const char LOOKUP[] =
    "local vs = redis.call('MGET', unpack(KEYS))\n"
    "local out, live = {}, {}\n"
    "for i = 1, #KEYS do\n"
    "  local v = vs[i]\n"
    "  if not v then break end\n"
    "  local a = string.find(v, ' ', 1, true)\n"
    "  local b = a and string.find(v, ' ', a + 1, true)\n"
    "  if not b then break end\n"
    "  local inst = string.sub(v, 1, a - 1)\n"
    "  local h = string.find(inst, '#', 1, true)\n"
    "  if (h and string.sub(inst, 1, h - 1) or inst) == ARGV[2] then break end\n"
    "  local l = live[inst]\n"
    "  if l == nil then l = redis.call('GET', ARGV[1] .. inst) or false; live[inst] = l end\n"
    "  if not l then break end\n"
    "  local c = string.find(l, ' ', 1, true)\n"
    "  if not c or string.sub(l, 1, c - 1) ~= string.sub(v, a + 1, b - 1) then break end\n"
    "  out[#out + 1] = v .. string.sub(l, c)\n"
    "end\n"
    "local r = tonumber(ARGV[3])\n"
    "while #out % r ~= 0 do out[#out] = nil end\n"
    "return out\n";

static void drop(rdir *d, const char *why)
{
    if (d->c) {
        KVT_LOG_D("remote directory: %s: %s", why, d->c->errstr);
        redisFree(d->c);
        d->c = NULL;
    }
    d->retry_at_ns = kvt_monotonic_ns() + (uint64_t)d->retry_ms * 1000000u;
}

/* Milliseconds left before deadline (0 when it passed). */
static int left_ms(uint64_t deadline)
{
    uint64_t now = kvt_monotonic_ns();
    return now >= deadline ? 0 : (int)((deadline - now + 999999u) / 1000000u);
}

/* One request and its reply on d->c's socket, the whole exchange bounded by deadline: the
 * socket is non-blocking and every wait is a poll with what is left, so a server that drips
 * bytes, or stops half-way, costs at most the deadline (a per-read timeout would let it hold
 * the caller as long as it keeps sending). A reply larger than MAX_REPLY is refused. */
static int exchange(rdir *d, const char *cmd, size_t len, uint64_t deadline, redisReply **out)
{
    enum { MAX_REPLY = 16u << 20 };
    int fd = d->c->fd;
    size_t off = 0, got = 0;
    while (off < len) {
        ssize_t n = send(fd, cmd + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            d->hung_up = errno == EPIPE || errno == ECONNRESET;
            return kvt_fail(KVT_EIO, "remote directory: %s: send: %s", d->name, strerror(errno));
        }
        struct pollfd pf = {fd, POLLOUT, 0};
        int ms = left_ms(deadline);
        if (ms == 0 || (poll(&pf, 1, ms) == 0 && left_ms(deadline) == 0))
            return kvt_fail(KVT_EIO, "remote directory: %s took longer than %u ms (sending)",
                            d->name, d->timeout_ms);
    }
    for (;;) {
        void *rep = NULL;
        if (redisReaderGetReply(d->c->reader, &rep) != REDIS_OK)
            return kvt_fail(KVT_EIO, "remote directory: %s: a reply that does not parse: %s",
                            d->name, d->c->reader->errstr);
        if (rep) {
            *out = rep;
            return 0;
        }
        char buf[16384];
        ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n > 0) {
            if ((got += (size_t)n) > MAX_REPLY)
                return kvt_fail(KVT_EIO, "remote directory: %s: a reply of more than %u bytes",
                                d->name, (unsigned)MAX_REPLY);
            if (redisReaderFeed(d->c->reader, buf, (size_t)n) != REDIS_OK)
                return kvt_fail(KVT_ENOMEM, "remote directory: out of memory");
            continue;
        }
        if (n == 0 || (n < 0 && errno == ECONNRESET)) {
            d->hung_up = got == 0;
            return kvt_fail(KVT_EIO, "remote directory: %s closed the connection", d->name);
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return kvt_fail(KVT_EIO, "remote directory: %s: recv: %s", d->name, strerror(errno));
        struct pollfd pf = {fd, POLLIN, 0};
        int ms = left_ms(deadline);
        if (ms == 0 || (poll(&pf, 1, ms) == 0 && left_ms(deadline) == 0))
            return kvt_fail(KVT_EIO,
                            "remote directory: %s took longer than %u ms (%zu bytes of "
                            "the reply in)",
                            d->name, d->timeout_ms, got);
    }
}

/* A formatted command's round trip; on a transport failure the connection is dropped (the
 * reader may hold half a reply). */
static int round_trip(rdir *d, int argc, const char **argv, const size_t *argl, uint64_t deadline,
                      redisReply **out)
{
    char *cmd = NULL;
    int len = redisFormatCommandArgv(&cmd, argc, argv, argl);
    if (len < 0)
        return kvt_fail(KVT_ENOMEM, "remote directory: out of memory");
    int rc = exchange(d, cmd, (size_t)len, deadline, out);
    redisFreeCommand(cmd);
    if (rc)
        drop(d, "round trip");
    return rc;
}

static int conn(rdir *d, uint64_t deadline)
{
    if (d->c)
        return 0;
    if (kvt_monotonic_ns() < d->retry_at_ns)
        return kvt_fail(KVT_EIO, "remote directory: %s unreachable (retrying later)", d->name);
    int ms = left_ms(deadline);
    if (ms == 0)
        return kvt_fail(KVT_EIO, "remote directory: %s: no time left to connect", d->name);
    struct timeval tv = {ms / 1000, (suseconds_t)(ms % 1000) * 1000};
    d->c = d->port ? redisConnectWithTimeout(d->host, d->port, tv)
                   : redisConnectUnixWithTimeout(d->host, tv);
    if (!d->c)
        return kvt_fail(KVT_ENOMEM, "remote directory: out of memory");
    int fl = d->c->err ? -1 : fcntl(d->c->fd, F_GETFL);
    if (fl < 0 || fcntl(d->c->fd, F_SETFL, fl | O_NONBLOCK) != 0) {
        int rc = kvt_fail(KVT_EIO, "remote directory: cannot reach %s: %s", d->name,
                          d->c->err ? d->c->errstr : strerror(errno));
        drop(d, "connect");
        return rc;
    }
    if (d->password) {
        const char *argv[3] = {"AUTH", d->user ? d->user : d->password, d->password};
        size_t argl[3] = {4, strlen(argv[1]), strlen(d->password)};
        redisReply *rep;
        int rc = round_trip(d, d->user ? 3 : 2, argv, argl, deadline, &rep);
        if (rc)
            return rc;
        if (rep->type == REDIS_REPLY_ERROR)
            rc = kvt_fail(KVT_EINVAL, "remote directory: %s refused the password: %.200s", d->name,
                          rep->str);
        freeReplyObject(rep);
        if (rc) {
            drop(d, "auth");
            return rc;
        }
    }
    return 0;
}

/* One EVAL: script, keys, args. *out is the reply (freeReplyObject), never an error reply.
 * The whole call (connecting, authenticating, sending, the reply) ends within timeout_ms. */
static int eval(rdir *d, const char *script, uint32_t nk, const char **keys, const size_t *klen,
                uint32_t na, const char **args, const size_t *alen, redisReply **out)
{
    uint64_t deadline = kvt_monotonic_ns() + (uint64_t)d->timeout_ms * 1000000u;
    bool reused = d->c != NULL;
    int rc = conn(d, deadline);
    if (rc)
        return rc;
    uint32_t argc = 3 + nk + na;
    const char **argv = malloc(argc * sizeof(*argv));
    size_t *argl = malloc(argc * sizeof(*argl));
    if (!argv || !argl) {
        free(argv);
        free(argl);
        return kvt_fail(KVT_ENOMEM, "remote directory: out of memory");
    }
    char nks[16];
    snprintf(nks, sizeof(nks), "%u", nk);
    argv[0] = "EVAL", argl[0] = 4;
    argv[1] = script, argl[1] = strlen(script);
    argv[2] = nks, argl[2] = strlen(nks);
    for (uint32_t i = 0; i < nk; i++)
        argv[3 + i] = keys[i], argl[3 + i] = klen ? klen[i] : strlen(keys[i]);
    for (uint32_t i = 0; i < na; i++)
        argv[3 + nk + i] = args[i], argl[3 + nk + i] = alen ? alen[i] : strlen(args[i]);
    redisReply *rep = NULL;
    d->hung_up = false;
    rc = round_trip(d, (int)argc, argv, argl, deadline, &rep);
    if (rc && d->hung_up && reused) {
        /* a connection that had worked, closed by the server before it answered: a restarted
         * Redis, or one that drops idle clients. Once more on a fresh one, within the same
         * deadline, rather than losing the call (a publication dropped, a lookup missed)
         * and waiting retry_ms. A script that ran before the close runs again: every one is
         * idempotent but enter's new epoch, of which the first is then never used. */
        d->retry_at_ns = 0;
        if (!(rc = conn(d, deadline)))
            rc = round_trip(d, (int)argc, argv, argl, deadline, &rep);
    }
    free(argv);
    free(argl);
    if (rc)
        return rc;
    if (rep->type == REDIS_REPLY_ERROR) {
        bool auth = strncmp(rep->str, "NOAUTH", 6) == 0 || strncmp(rep->str, "NOPERM", 6) == 0 ||
                    strncmp(rep->str, "WRONGPASS", 9) == 0 ||
                    strstr(rep->str, "unauthenticated") != NULL; /* Redis 7, large commands */
        rc = kvt_fail(auth ? KVT_EINVAL : KVT_EIO, "remote directory: Redis refused: %.200s%s",
                      rep->str, auth ? " (directory_password)" : "");
        freeReplyObject(rep);
        if (auth)
            drop(d, "auth"); /* Redis may have closed the connection */
        return rc;
    }
    *out = rep;
    return 0;
}

/* "kvt:{S}:kind:name", or "kvt:{S}:kind" without a name */
static int key(char *buf, size_t cap, const kvi_rdir_self *s, const char *kind, const char *name)
{
    int n = name ? snprintf(buf, cap, "kvt:{%s}:%s:%s", s->space, kind, name)
                 : snprintf(buf, cap, "kvt:{%s}:%s", s->space, kind);
    return n > 0 && (size_t)n < cap ? 0 : kvt_fail(KVT_EINVAL, "remote directory: name too long");
}

/* What must agree across the space: the hash seed, the signature, the hash length and the
 * ranks (an instance of another tensor parallelism splits a block otherwise). */
static void seeds_value(char *buf, size_t cap, const kvi_rdir_self *s)
{
    int n = snprintf(buf, cap, "%016" PRIx64 " ", s->hash_seed);
    for (uint32_t i = 0; i < 32 && n + 2 < (int)cap; i++)
        n += snprintf(buf + n, cap - (size_t)n, "%02x", s->signature[i]);
    snprintf(buf + n, cap - (size_t)n, " %u %u", s->hash_len, s->ranks);
}

static int d_enter(void *vd, const kvi_rdir_self *s, uint64_t *epoch)
{
    rdir *d = vd;
    char k[4][160], live_prefix[160], seeds[120], ttl[16];
    if (key(k[0], sizeof(k[0]), s, "seeds", NULL) ||
        key(k[1], sizeof(k[1]), s, "epoch", s->instance) ||
        key(k[2], sizeof(k[2]), s, "live", s->instance) ||
        key(k[3], sizeof(k[3]), s, "own", s->instance) ||
        key(live_prefix, sizeof(live_prefix), s, "live", ""))
        return KVT_EINVAL;
    seeds_value(seeds, sizeof(seeds), s);
    snprintf(ttl, sizeof(ttl), "%u", s->ttl_ms);
    const char *keys[4] = {k[0], k[1], k[2], k[3]};
    const char *args[5] = {s->instance, seeds, live_prefix, s->endpoint, ttl};
    redisReply *rep;
    int rc = eval(d, ENTER, 4, keys, NULL, 5, args, NULL, &rep);
    if (rc)
        return rc;
    rc = kvt_fail(KVT_EIO, "remote directory: unexpected answer to enter");
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements >= 2 &&
        rep->element[0]->type == REDIS_REPLY_INTEGER) {
        long long what = rep->element[0]->integer;
        redisReply *e1 = rep->element[1];
        if (what == 1 && e1->type == REDIS_REPLY_INTEGER && e1->integer > 0) {
            *epoch = (uint64_t)e1->integer;
            rc = 0;
        } else if (what == 0 && rep->elements == 3 && e1->type == REDIS_REPLY_STRING &&
                   rep->element[2]->type == REDIS_REPLY_STRING) {
            rc = kvt_fail(KVT_EINVAL,
                          "remote: instance '%.64s' of space '%s' is live with hash seed / "
                          "signature / hash length / ranks '%.120s', this one has '%s': their "
                          "blocks would never match (check PYTHONHASHSEED, the model, the block "
                          "size and the tensor parallelism)",
                          e1->str, s->space, rep->element[2]->str, seeds);
        } else if (what == 2 && e1->type == REDIS_REPLY_STRING) {
            rc = kvt_fail(KVT_EBUSY,
                          "remote: instance name '%s' is live in space '%s' (%.100s): another "
                          "process uses it, or it ended less than ttl ago",
                          s->instance, s->space, e1->str);
        }
    }
    freeReplyObject(rep);
    return rc;
}

static int live_value(char *buf, size_t cap, const kvi_rdir_self *s, uint64_t epoch)
{
    int n = snprintf(buf, cap, "%" PRIu64 " %s", epoch, s->endpoint);
    return n > 0 && (size_t)n < cap ? 0
                                    : kvt_fail(KVT_EINVAL, "remote directory: endpoint too long");
}

static int d_refresh(void *vd, const kvi_rdir_self *s, uint64_t epoch)
{
    rdir *d = vd;
    char k[160], v[128], ttl[16];
    if (key(k, sizeof(k), s, "live", s->instance) || live_value(v, sizeof(v), s, epoch))
        return KVT_EINVAL;
    snprintf(ttl, sizeof(ttl), "%u", s->ttl_ms);
    const char *keys[1] = {k};
    const char *args[2] = {v, ttl};
    redisReply *rep;
    int rc = eval(d, REFRESH, 1, keys, NULL, 2, args, NULL, &rep);
    if (rc)
        return rc;
    rc = rep->type == REDIS_REPLY_INTEGER && rep->integer == 1
             ? 0
             : kvt_fail(KVT_ENOENT, "remote: the liveness key of epoch %" PRIu64 " is gone", epoch);
    freeReplyObject(rep);
    return rc;
}

static int d_leave(void *vd, const kvi_rdir_self *s, uint64_t epoch)
{
    rdir *d = vd;
    char k[2][160], v[128];
    if (key(k[0], sizeof(k[0]), s, "live", s->instance) ||
        key(k[1], sizeof(k[1]), s, "own", s->instance) || live_value(v, sizeof(v), s, epoch))
        return KVT_EINVAL;
    const char *keys[2] = {k[0], k[1]};
    const char *args[2] = {v, s->instance};
    redisReply *rep;
    int rc = eval(d, LEAVE, 2, keys, NULL, 2, args, NULL, &rep);
    if (!rc)
        freeReplyObject(rep);
    return rc;
}

/* Entry keys of n blocks; for a change (slots given) also their values and the owner's set
 * key last. One allocation. */
typedef struct batch {
    const char **keys, **vals;
    char *mem;
} batch;

enum { ENTRY_KEY_MAX = 96 + 2 * KVT_REMOTE_MAX_HASH, ENTRY_VAL_MAX = KVT_REMOTE_NAME_MAX + 64 };

/* The entry key of a block's part: rank `rank`'s in a space of several ranks. */
static void entry_key(char *buf, const kvi_rdir_self *s, const uint8_t *h, uint32_t rank)
{
    static const char digits[] = "0123456789abcdef";
    char hex[2 * KVT_REMOTE_MAX_HASH + 1];
    for (uint32_t j = 0; j < s->hash_len; j++)
        hex[2 * j] = digits[h[j] >> 4], hex[2 * j + 1] = digits[h[j] & 15];
    hex[2 * s->hash_len] = '\0';
    if (s->ranks > 1)
        snprintf(buf, ENTRY_KEY_MAX, "kvt:{%s}:b:%s:%u", s->space, hex, rank);
    else
        snprintf(buf, ENTRY_KEY_MAX, "kvt:{%s}:b:%s", s->space, hex);
}

/* A change (slots given): n entries of self's rank, their values, the owner's set last. A
 * lookup: n blocks' entries, every rank's. */
static int batch_make(batch *b, const kvi_rdir_self *s, uint64_t epoch, const uint8_t *hashes,
                      const uint32_t *slots, const uint64_t *gens, uint32_t n)
{
    uint32_t per = slots ? 1 : s->ranks;
    size_t nk = (size_t)n * per + 1;
    b->keys = malloc(nk * sizeof(char *));
    b->vals = malloc(nk * sizeof(char *));
    b->mem = malloc(nk * (ENTRY_KEY_MAX + ENTRY_VAL_MAX));
    if (!b->keys || !b->vals || !b->mem) {
        free(b->keys), free(b->vals), free(b->mem);
        return kvt_fail(KVT_ENOMEM, "remote directory: out of memory for %u entries", n);
    }
    char *p = b->mem;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *h = hashes + (size_t)i * s->hash_len;
        if (!slots) {
            for (uint32_t k = 0; k < per; k++, p += ENTRY_KEY_MAX)
                entry_key(p, s, h, k), b->keys[(size_t)i * per + k] = p;
            continue;
        }
        entry_key(p, s, h, s->rank);
        b->keys[i] = p, p += ENTRY_KEY_MAX;
        snprintf(p, ENTRY_VAL_MAX, "%s %" PRIu64 " %u %" PRIu64, s->instance, epoch, slots[i],
                 gens[i]);
        b->vals[i] = p, p += ENTRY_VAL_MAX;
    }
    if (slots) {
        snprintf(p, ENTRY_KEY_MAX + ENTRY_VAL_MAX, "kvt:{%s}:own:%s", s->space, s->instance);
        b->keys[n] = p;
    }
    return 0;
}

static void batch_free(batch *b)
{
    free(b->keys), free(b->vals), free(b->mem);
}

static int d_change(rdir *d, const char *script, const kvi_rdir_self *s, uint64_t epoch,
                    const uint8_t *hashes, const uint32_t *slots, const uint64_t *gens, uint32_t n)
{
    batch b;
    int rc = batch_make(&b, s, epoch, hashes, slots, gens, n);
    if (rc)
        return rc;
    redisReply *rep;
    rc = eval(d, script, n + 1, b.keys, NULL, n, b.vals, NULL, &rep);
    if (!rc)
        freeReplyObject(rep);
    batch_free(&b);
    return rc;
}

static int d_publish(void *vd, const kvi_rdir_self *s, uint64_t epoch, const uint8_t *hashes,
                     const uint32_t *slots, const uint64_t *gens, uint32_t n)
{
    return d_change(vd, PUBLISH, s, epoch, hashes, slots, gens, n);
}

static int d_withdraw(void *vd, const kvi_rdir_self *s, uint64_t epoch, const uint8_t *hashes,
                      const uint32_t *slots, const uint64_t *gens, uint32_t n)
{
    return d_change(vd, WITHDRAW, s, epoch, hashes, slots, gens, n);
}

/* "<I> <epoch> <slot> <generation> <endpoint>" -> hit of rank `rank` (of `ranks`); false for
 * anything else, an owner of another rank included. */
static bool parse_hit(const char *v, size_t len, uint32_t rank, uint32_t ranks, kvi_rdir_hit *h)
{
    char buf[ENTRY_VAL_MAX + KVI_RDIR_EP_MAX + 8];
    if (len >= sizeof(buf) || memchr(v, '\0', len))
        return false;
    memcpy(buf, v, len);
    buf[len] = '\0';
    char *save = NULL, *tok[5];
    char *p = buf;
    for (int i = 0; i < 5; i++, p = NULL)
        if (!(tok[i] = strtok_r(p, " ", &save)))
            return false;
    if (strtok_r(NULL, " ", &save) || strlen(tok[0]) > KVT_REMOTE_NAME_MAX ||
        strlen(tok[4]) > KVI_RDIR_EP_MAX)
        return false;
    char *end;
    errno = 0;
    unsigned long long ep = strtoull(tok[1], &end, 10);
    if (errno || *end || ep == 0)
        return false;
    unsigned long long slot = strtoull(tok[2], &end, 10);
    if (errno || *end || slot > UINT32_MAX)
        return false;
    unsigned long long gen = strtoull(tok[3], &end, 10);
    if (errno || *end)
        return false;
    if (!kvi_rname_is_rank(tok[0], rank, ranks))
        return false; /* filed under another rank's key */
    strcpy(h->instance, tok[0]);
    strcpy(h->endpoint, tok[4]);
    h->epoch = ep, h->slot = (uint32_t)slot, h->generation = gen;
    return true;
}

static int d_lookup(void *vd, const kvi_rdir_self *s, const uint8_t *hashes, uint32_t n,
                    kvi_rdir_hit *out, uint32_t *n_hit)
{
    rdir *d = vd;
    *n_hit = 0;
    batch b;
    int rc = batch_make(&b, s, 0, hashes, NULL, NULL, n);
    if (rc)
        return rc;
    char live_prefix[160], ranks[16];
    rc = key(live_prefix, sizeof(live_prefix), s, "live", "");
    snprintf(ranks, sizeof(ranks), "%u", s->ranks);
    const char *args[3] = {live_prefix, s->base, ranks};
    redisReply *rep = NULL;
    uint32_t per = s->ranks, nk = n * per;
    if (!rc)
        rc = eval(d, LOOKUP, nk, b.keys, NULL, 3, args, NULL, &rep);
    batch_free(&b);
    if (rc)
        return rc;
    if (rep->type == REDIS_REPLY_ARRAY) {
        uint32_t m = rep->elements < nk ? (uint32_t)rep->elements : nk, i = 0;
        for (; i < m; i++) {
            redisReply *e = rep->element[i];
            if (e->type != REDIS_REPLY_STRING || !parse_hit(e->str, e->len, i % per, per, &out[i]))
                break;
        }
        *n_hit = i / per; /* whole blocks */
    }
    freeReplyObject(rep);
    return 0;
}

static void d_close(void *vd)
{
    rdir *d = vd;
    if (d->c)
        redisFree(d->c);
    free(d->user);
    free(d->password);
    free(d);
}

static const kvi_rdir_ops REDIS_OPS = {
    .enter = d_enter,
    .refresh = d_refresh,
    .leave = d_leave,
    .publish = d_publish,
    .withdraw = d_withdraw,
    .lookup = d_lookup,
    .close = d_close,
};

int kvi_rdir_redis_open(const char *addr, const char *password, uint32_t timeout_ms,
                        uint32_t retry_ms, kvi_rdir *out)
{
    if (!addr || !*addr || strlen(addr) >= 256)
        return kvt_fail(KVT_EINVAL, "remote: directory must be \"host:port\" or a unix socket "
                                    "path");
    rdir *d = calloc(1, sizeof(*d));
    if (!d)
        return kvt_fail(KVT_ENOMEM, "remote: out of memory");
    const char *colon = strrchr(addr, ':');
    if (addr[0] == '/' || !colon) {
        snprintf(d->host, sizeof(d->host), "%s", addr);
    } else {
        char *end;
        errno = 0;
        unsigned long port = strtoul(colon + 1, &end, 10);
        if (errno || *end || port == 0 || port > 65535 || colon == addr) {
            free(d);
            return kvt_fail(KVT_EINVAL, "remote: directory '%s': bad port", addr);
        }
        snprintf(d->host, sizeof(d->host), "%.*s", (int)(colon - addr), addr);
        d->port = (int)port;
    }
    snprintf(d->name, sizeof(d->name), "%s", addr);
    if (password) {
        const char *colon_pw = strchr(password, ':');
        d->user = colon_pw ? strndup(password, (size_t)(colon_pw - password)) : NULL;
        d->password = strdup(colon_pw ? colon_pw + 1 : password);
        if (!d->password || (colon_pw && !d->user)) {
            free(d->user);
            free(d->password);
            free(d);
            return kvt_fail(KVT_ENOMEM, "remote: out of memory");
        }
    }
    d->timeout_ms = timeout_ms;
    d->retry_ms = retry_ms;
    out->ops = &REDIS_OPS;
    out->d = d;
    return 0;
}
