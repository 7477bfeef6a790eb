/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Encoder-cache control messages (src/net/ec_ctl.h): every op's request and reply and both kinds
 * of event round-trip and re-encode to the same bytes (canonical); every truncation fails and
 * leaves the object empty; every field a peer could forge is refused with a message.
 */
#include "kvt_test.h"
#include "net/ec_ctl.h"

#define RID  "0123456789abcdef0123456789abcdef"
#define RID2 "fedcba9876543210fedcba9876543210"
#define KEY  "00112233445566778899aabbccddeeff"

static kvt_str S(const char *s)
{
    return (kvt_str){s, (uint32_t)strlen(s)};
}

static kvi_ecc_item reserve_item(const char *tid, const char *hash, uint64_t rows)
{
    kvi_ecc_item it = {0};
    it.transfer_id = S(tid);
    it.mm_hash = S(hash);
    it.ndim = 2;
    it.shape[0] = rows;
    it.shape[1] = 64;
    it.dtype = S("bfloat16");
    it.nbytes = rows * 64 * 2;
    it.client_key = S(KEY);
    return it;
}

static uint8_t g_buf[1 << 16], g_buf2[1 << 16];

/* Encodes r, decodes it into back, re-encodes back: the same bytes. Returns the length. */
static size_t request_round_trip(const kvi_ecc_request *r, kvi_ecc_request *back)
{
    size_t len, len2;
    KVT_OK_(kvi_ecc_request_encode(r, g_buf, sizeof(g_buf), &len));
    assert_int_equal(len, kvi_ecc_request_encoded_size(r));
    KVT_OK_(kvi_ecc_request_decode(back, g_buf, len));
    KVT_OK_(kvi_ecc_request_encode(back, g_buf2, sizeof(g_buf2), &len2));
    assert_int_equal(len, len2);
    assert_memory_equal(g_buf, g_buf2, len);
    return len;
}

static size_t reply_round_trip(const kvi_ecc_reply *r, kvi_ecc_reply *back)
{
    size_t len, len2;
    KVT_OK_(kvi_ecc_reply_encode(r, g_buf, sizeof(g_buf), &len));
    assert_int_equal(len, kvi_ecc_reply_encoded_size(r));
    KVT_OK_(kvi_ecc_reply_decode(back, g_buf, len));
    KVT_OK_(kvi_ecc_reply_encode(back, g_buf2, sizeof(g_buf2), &len2));
    assert_int_equal(len, len2);
    assert_memory_equal(g_buf, g_buf2, len);
    return len;
}

static void every_request_op_round_trips(void **state)
{
    (void)state;
    kvi_ecc_request r, back;
    kvi_ecc_request_init(&r);
    kvi_ecc_request_init(&back);
    for (uint32_t op = KVT_ECC_PEERS; op <= KVT_ECC_CANCEL_BATCH; op++) {
        kvi_ecc_request_begin(&r, op);
        bool cancel = op == KVT_ECC_CANCEL || op == KVT_ECC_CANCEL_BATCH;
        uint32_t n = op == KVT_ECC_PEERS || op == KVT_ECC_EVENT_PORT || op == KVT_ECC_DATA_ADDRESS
                         ? 0
                     : op == KVT_ECC_RESERVE_BATCH || op == KVT_ECC_COMPLETE_BATCH ||
                             op == KVT_ECC_CANCEL_BATCH
                         ? 3
                         : 1;
        for (uint32_t i = 0; i < n; i++) {
            kvi_ecc_item it = reserve_item(i ? "xfer-b" : "xfer-a", "img-1", 16 + i);
            it.transfer_id = S(i == 2 ? "xfer-c" : it.transfer_id.ptr);
            it.reservation_id = S(RID);
            it.abandon = cancel;
            it.refresh = cancel;
            if (cancel) /* a producer's abandon: its id, no key */
                it.client_key = S("");
            KVT_OK_(kvi_ecc_request_add(&r, &it));
        }
        request_round_trip(&r, &back);
        assert_int_equal(back.op, op);
        assert_int_equal(back.n, n);
        for (uint32_t i = 0; i < n; i++) {
            const kvi_ecc_item *a = &r.items[i], *b = &back.items[i];
            assert_string_equal(b->transfer_id.ptr, a->transfer_id.ptr);
            if (op == KVT_ECC_RESERVE || op == KVT_ECC_RESERVE_BATCH) {
                assert_string_equal(b->mm_hash.ptr, "img-1");
                assert_int_equal(b->nbytes, a->nbytes);
                assert_int_equal(b->ndim, 2);
                assert_int_equal(b->shape[0], a->shape[0]);
                assert_string_equal(b->dtype.ptr, "bfloat16");
                assert_string_equal(b->client_key.ptr, KEY);
            }
            if (op == KVT_ECC_COMPLETE || op == KVT_ECC_COMPLETE_BATCH)
                assert_string_equal(b->reservation_id.ptr, RID);
            if (op == KVT_ECC_CANCEL) {
                assert_string_equal(b->reservation_id.ptr, RID);
                assert_true(b->abandon && b->refresh);
                assert_int_equal(b->client_key.len, 0);
            }
        }
    }
    /* the consumer's own cancel: no reservation id, its owner key */
    kvi_ecc_request_begin(&r, KVT_ECC_CANCEL);
    kvi_ecc_item c = {.transfer_id = S("xfer-a"), .reservation_id = S(""), .client_key = S(KEY)};
    KVT_OK_(kvi_ecc_request_add(&r, &c));
    request_round_trip(&r, &back);
    assert_int_equal(back.items[0].reservation_id.len, 0);
    assert_string_equal(back.items[0].client_key.ptr, KEY);
    kvi_ecc_request_release(&r);
    kvi_ecc_request_release(&back);
}

static void every_reply_round_trips_with_per_item_errors(void **state)
{
    (void)state;
    kvi_ecc_reply r, back;
    kvi_ecc_reply_init(&r);
    kvi_ecc_reply_init(&back);
    /* peers */
    kvi_ecc_reply_begin(&r, KVT_ECC_PEERS);
    r.n_ports = 2;
    r.ports[0] = 19000;
    r.ports[1] = 19001;
    reply_round_trip(&r, &back);
    assert_int_equal(back.n_ports, 2);
    assert_int_equal(back.ports[1], 19001);
    /* event_port */
    kvi_ecc_reply_begin(&r, KVT_ECC_EVENT_PORT);
    r.port = 40123;
    reply_round_trip(&r, &back);
    assert_int_equal(back.port, 40123);
    /* reserve_batch: a writer, a cached hit, a failure with its message */
    kvi_ecc_reply_begin(&r, KVT_ECC_RESERVE_BATCH);
    kvi_ecc_result x = {0};
    x.reservation_id = S(RID);
    x.offset = 4096;
    x.nbytes = 2048;
    x.tag = 0x1234567890abcdefull;
    x.write = true;
    KVT_OK_(kvi_ecc_reply_add(&r, &x));
    x.write = false, x.ready = x.cached = true, x.reservation_id = S(RID2);
    KVT_OK_(kvi_ecc_reply_add(&r, &x));
    kvi_ecc_result bad = {.code = KVT_ENOSPC, .error = S("EC consumer buffer pool is full")};
    KVT_OK_(kvi_ecc_reply_add(&r, &bad));
    reply_round_trip(&r, &back);
    assert_int_equal(back.n, 3);
    assert_true(back.results[0].write && !back.results[0].ready);
    assert_int_equal(back.results[0].tag, 0x1234567890abcdefull);
    assert_int_equal(back.results[0].offset, 4096);
    assert_string_equal(back.results[1].reservation_id.ptr, RID2);
    assert_true(back.results[1].cached);
    assert_int_equal(back.results[2].code, KVT_ENOSPC);
    assert_string_equal(back.results[2].error.ptr, "EC consumer buffer pool is full");
    /* status: found and not */
    kvi_ecc_reply_begin(&r, KVT_ECC_STATUS);
    kvi_ecc_result st = {.found = true, .ready = true, .nbytes = 256, .ndim = 1};
    st.shape[0] = 128;
    st.mm_hash = S("img-2"), st.dtype = S("float16");
    KVT_OK_(kvi_ecc_reply_add(&r, &st));
    reply_round_trip(&r, &back);
    assert_int_equal(back.results[0].reservation_id.len, 0);
    assert_true(back.results[0].found && back.results[0].ready);
    assert_string_equal(back.results[0].dtype.ptr, "float16");
    kvi_ecc_reply_begin(&r, KVT_ECC_STATUS);
    kvi_ecc_result none = {0};
    KVT_OK_(kvi_ecc_reply_add(&r, &none));
    assert_int_equal(reply_round_trip(&r, &back), KVT_META_HEADER_LEN + 8 + 4 + 4 + 8 + 1);
    assert_false(back.results[0].found);
    /* complete_batch and cancel */
    kvi_ecc_reply_begin(&r, KVT_ECC_COMPLETE_BATCH);
    kvi_ecc_result c = {.completed = true, .became_ready = true};
    KVT_OK_(kvi_ecc_reply_add(&r, &c));
    c.became_ready = false;
    KVT_OK_(kvi_ecc_reply_add(&r, &c));
    c.pending = true; /* accepted, bytes still arriving */
    KVT_OK_(kvi_ecc_reply_add(&r, &c));
    reply_round_trip(&r, &back);
    assert_true(back.results[0].became_ready && !back.results[1].became_ready);
    assert_true(!back.results[1].pending && back.results[2].pending && back.results[2].completed);
    kvi_ecc_reply_begin(&r, KVT_ECC_CANCEL);
    kvi_ecc_result k = {.cancelled = true};
    KVT_OK_(kvi_ecc_reply_add(&r, &k));
    reply_round_trip(&r, &back);
    assert_true(back.results[0].cancelled);
    /* a whole-request failure carries no results */
    kvi_ecc_reply_begin(&r, KVT_ECC_RESERVE);
    KVT_OK_(kvi_ecc_reply_fail(&r, KVT_ESTATE, "shard is shutting down"));
    reply_round_trip(&r, &back);
    assert_int_equal(back.code, KVT_ESTATE);
    assert_string_equal(back.error.ptr, "shard is shutting down");
    assert_int_equal(back.n, 0);
    kvi_ecc_reply_release(&r);
    kvi_ecc_reply_release(&back);
}

static void events_round_trip_ready_and_abandoned(void **state)
{
    (void)state;
    kvi_ecc_event e = {0}, back;
    kvi_ecc_event_init(&back);
    e.transfer_id = S("xfer-a"), e.mm_hash = S("img-1"), e.reservation_id = S(RID);
    e.dtype = S("bfloat16"), e.ndim = 2, e.shape[0] = 4, e.shape[1] = 8, e.nbytes = 64;
    e.shard = 3;
    size_t len, len2;
    KVT_OK_(kvi_ecc_event_encode(&e, g_buf, sizeof(g_buf), &len));
    KVT_OK_(kvi_ecc_event_decode(&back, g_buf, len));
    assert_string_equal(back.reservation_id.ptr, RID);
    assert_int_equal(back.shard, 3);
    assert_false(back.abandoned);
    KVT_OK_(kvi_ecc_event_encode(&back, g_buf2, sizeof(g_buf2), &len2));
    assert_memory_equal(g_buf, g_buf2, len);
    /* an abandoned notice may come without a reservation id; a ready one may not */
    e.abandoned = true, e.reservation_id = S("");
    KVT_OK_(kvi_ecc_event_encode(&e, g_buf, sizeof(g_buf), &len));
    KVT_OK_(kvi_ecc_event_decode(&back, g_buf, len));
    assert_true(back.abandoned);
    e.abandoned = false;
    KVT_ERR_(kvi_ecc_event_encode(&e, g_buf, sizeof(g_buf), &len), KVT_EINVAL);
    e.reservation_id = S(RID), e.shard = KVT_EC_MAX_SHARDS;
    KVT_ERR_(kvi_ecc_event_encode(&e, g_buf, sizeof(g_buf), &len), KVT_EINVAL);
    kvi_ecc_event_release(&back);
}

/* The public decoder (kvtier/ec_net.h) gives the event as the shard queued it, and leaves
 * its output untouched on a broken message. */
static void public_event_decode(void **state)
{
    (void)state;
    kvi_ecc_event e = {0};
    e.transfer_id = S("xfer-a"), e.mm_hash = S("img-1"), e.reservation_id = S(RID);
    e.dtype = S("bfloat16"), e.ndim = 2, e.shape[0] = 4, e.shape[1] = 8, e.nbytes = 64;
    e.shard = 5;
    size_t len;
    KVT_OK_(kvi_ecc_event_encode(&e, g_buf, sizeof(g_buf), &len));
    kvt_ec_ready_event out;
    uint32_t shard = 0;
    KVT_OK_(kvt_ec_event_decode(g_buf, len, &out, &shard));
    assert_string_equal(out.transfer_id, "xfer-a");
    assert_string_equal(out.mm_hash, "img-1");
    assert_string_equal(out.reservation_id, RID);
    assert_string_equal(out.dtype, "bfloat16");
    assert_int_equal(out.nbytes, 64);
    assert_int_equal(out.ndim, 2);
    assert_int_equal(out.shape[1], 8);
    assert_false(out.abandoned);
    assert_int_equal(shard, 5);
    KVT_OK_(kvt_ec_event_decode(g_buf, len, &out, NULL));
    memset(&out, 0x7e, sizeof(out));
    kvt_ec_ready_event before = out;
    KVT_ERR_(kvt_ec_event_decode(g_buf, len - 1, &out, &shard), KVT_EPROTO);
    g_buf[len - 1] ^= 0xff; /* the shard: beyond KVT_EC_MAX_SHARDS */
    assert_int_not_equal(kvt_ec_event_decode(g_buf, len, &out, &shard), 0);
    assert_memory_equal(&out, &before, sizeof(out));
    KVT_ERR_(kvt_ec_event_decode(NULL, len, &out, &shard), KVT_EINVAL);
    KVT_ERR_(kvt_ec_event_decode(g_buf, len, NULL, &shard), KVT_EINVAL);
}

/* Every proper prefix of a valid message is refused, and the object is left empty. */
static void every_truncation_is_refused(void **state)
{
    (void)state;
    kvi_ecc_request r, back;
    kvi_ecc_request_init(&r);
    kvi_ecc_request_init(&back);
    kvi_ecc_request_begin(&r, KVT_ECC_RESERVE_BATCH);
    kvi_ecc_item a = reserve_item("xfer-a", "img-1", 3), b = reserve_item("xfer-b", "img-2", 5);
    KVT_OK_(kvi_ecc_request_add(&r, &a));
    KVT_OK_(kvi_ecc_request_add(&r, &b));
    size_t len;
    KVT_OK_(kvi_ecc_request_encode(&r, g_buf, sizeof(g_buf), &len));
    for (size_t cut = 0; cut < len; cut++) {
        int rc = kvi_ecc_request_decode(&back, g_buf, cut);
        assert_true(rc == KVT_EPROTO || rc == KVT_EVERSION);
        assert_int_equal(back.n, 0);
        assert_true(kvt_last_error()[0] != 0);
    }
    kvi_ecc_reply rep, rback;
    kvi_ecc_reply_init(&rep);
    kvi_ecc_reply_init(&rback);
    kvi_ecc_reply_begin(&rep, KVT_ECC_RESERVE_BATCH);
    kvi_ecc_result x = {.reservation_id = S(RID), .nbytes = 384, .write = true};
    KVT_OK_(kvi_ecc_reply_add(&rep, &x));
    KVT_OK_(kvi_ecc_reply_add(&rep, &x));
    KVT_OK_(kvi_ecc_reply_encode(&rep, g_buf, sizeof(g_buf), &len));
    for (size_t cut = 0; cut < len; cut++) {
        int rc = kvi_ecc_reply_decode(&rback, g_buf, cut);
        assert_true(rc == KVT_EPROTO || rc == KVT_EVERSION);
        assert_int_equal(rback.n, 0);
    }
    /* trailing bytes too */
    KVT_ERR_(kvi_ecc_reply_decode(&rback, g_buf, len + 1), KVT_EPROTO);
    kvi_ecc_request_release(&r);
    kvi_ecc_request_release(&back);
    kvi_ecc_reply_release(&rep);
    kvi_ecc_reply_release(&rback);
}

/* Encodes r after `mutate` changed one field; the encoder (and so the decoder, which runs the
 * same validation) refuses it. */
static void forged_requests_are_refused(void **state)
{
    (void)state;
    kvi_ecc_request r;
    kvi_ecc_request_init(&r);
    size_t len;
    kvi_ecc_item it = reserve_item("xfer-a", "img-1", 3);
    /* nbytes that does not match the shape */
    it.nbytes++;
    kvi_ecc_request_begin(&r, KVT_ECC_RESERVE);
    KVT_OK_(kvi_ecc_request_add(&r, &it));
    KVT_ERR_(kvi_ecc_request_encode(&r, g_buf, sizeof(g_buf), &len), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "nbytes"));
    /* a single op with two items, a batch with none, an unknown op */
    it.nbytes--;
    KVT_OK_(kvi_ecc_request_add(&r, &it));
    KVT_ERR_(kvi_ecc_request_encode(&r, g_buf, sizeof(g_buf), &len), KVT_EINVAL);
    kvi_ecc_request_begin(&r, KVT_ECC_COMPLETE_BATCH);
    KVT_ERR_(kvi_ecc_request_encode(&r, g_buf, sizeof(g_buf), &len), KVT_EINVAL);
    kvi_ecc_request_begin(&r, 99);
    KVT_ERR_(kvi_ecc_request_encode(&r, g_buf, sizeof(g_buf), &len), KVT_EINVAL);
    /* reservation ids: 31 digits, upper case, missing on a completion */
    const char *bad_rids[] = {"0123456789abcdef0123456789abcde", "0123456789ABCDEF0123456789abcdef",
                              ""};
    for (int i = 0; i < 3; i++) {
        kvi_ecc_request_begin(&r, KVT_ECC_COMPLETE);
        kvi_ecc_item c = {.transfer_id = S("xfer-a"), .reservation_id = S(bad_rids[i])};
        KVT_OK_(kvi_ecc_request_add(&r, &c));
        KVT_ERR_(kvi_ecc_request_encode(&r, g_buf, sizeof(g_buf), &len), KVT_EINVAL);
        assert_non_null(strstr(kvt_last_error(), "reservation_id"));
    }
    /* a transfer id longer than a shard's keys */
    char longid[KVT_EC_KEY_MAX + 2];
    memset(longid, 'x', sizeof(longid) - 1);
    longid[sizeof(longid) - 1] = 0;
    kvi_ecc_request_begin(&r, KVT_ECC_STATUS);
    kvi_ecc_item s = {.transfer_id = S(longid)};
    KVT_OK_(kvi_ecc_request_add(&r, &s));
    KVT_ERR_(kvi_ecc_request_encode(&r, g_buf, sizeof(g_buf), &len), KVT_EINVAL);
    kvi_ecc_request_release(&r);
}

/* What the capabilities rule out at the wire: a reserve without its client's key, an abandon or
 * refresh without a reservation id, a consumer-side cancel without the owner key, a status
 * reply that reveals an id, a pending completion that was not accepted. */
static void capabilities_are_required_on_the_wire(void **state)
{
    (void)state;
    kvi_ecc_request r;
    kvi_ecc_request_init(&r);
    size_t len;
    kvi_ecc_item it = reserve_item("t", "h", 1);
    it.client_key = S("");
    kvi_ecc_request_begin(&r, KVT_ECC_RESERVE);
    KVT_OK_(kvi_ecc_request_add(&r, &it));
    KVT_ERR_(kvi_ecc_request_encode(&r, g_buf, sizeof(g_buf), &len), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "client_key"));
    const struct {
        const char *rid, *key;
        bool abandon, refresh;
        const char *why;
    } bad[] = {{"", KEY, true, false, "needs the reservation id"},
               {"", KEY, false, true, "needs the reservation id"},
               {"", "", false, false, "owner key"},
               {RID, "0011", false, false, "client_key"}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        kvi_ecc_request_begin(&r, KVT_ECC_CANCEL);
        kvi_ecc_item c = {.transfer_id = S("t"),
                          .reservation_id = S(bad[i].rid),
                          .client_key = S(bad[i].key),
                          .abandon = bad[i].abandon,
                          .refresh = bad[i].refresh};
        KVT_OK_(kvi_ecc_request_add(&r, &c));
        KVT_ERR_(kvi_ecc_request_encode(&r, g_buf, sizeof(g_buf), &len), KVT_EINVAL);
        assert_non_null(strstr(kvt_last_error(), bad[i].why));
    }
    kvi_ecc_request_release(&r);
    kvi_ecc_reply p;
    kvi_ecc_reply_init(&p);
    kvi_ecc_reply_begin(&p, KVT_ECC_STATUS);
    kvi_ecc_result st = {.found = true, .nbytes = 2, .ndim = 1};
    st.shape[0] = 1;
    st.mm_hash = S("h"), st.dtype = S("float16"), st.reservation_id = S(RID);
    KVT_OK_(kvi_ecc_reply_add(&p, &st));
    KVT_ERR_(kvi_ecc_reply_encode(&p, g_buf, sizeof(g_buf), &len), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "never revealed"));
    kvi_ecc_reply_begin(&p, KVT_ECC_COMPLETE);
    kvi_ecc_result c = {.pending = true};
    KVT_OK_(kvi_ecc_reply_add(&p, &c));
    KVT_ERR_(kvi_ecc_reply_encode(&p, g_buf, sizeof(g_buf), &len), KVT_EINVAL);
    kvi_ecc_reply_release(&p);
}

/* Bytes a peer forges after a valid encoding: caught by the decoder itself. */
static void forged_bytes_are_refused(void **state)
{
    (void)state;
    kvi_ecc_request r, back;
    kvi_ecc_request_init(&r);
    kvi_ecc_request_init(&back);
    kvi_ecc_request_begin(&r, KVT_ECC_CANCEL);
    kvi_ecc_item c = {.transfer_id = S("t"), .reservation_id = S(RID), .abandon = true};
    KVT_OK_(kvi_ecc_request_add(&r, &c));
    size_t len;
    KVT_OK_(kvi_ecc_request_encode(&r, g_buf, sizeof(g_buf), &len));
    /* the abandon flag (before refresh and the empty client key's length) set to 2 */
    g_buf[len - 6] = 2;
    KVT_ERR_(kvi_ecc_request_decode(&back, g_buf, len), KVT_EPROTO);
    assert_non_null(strstr(kvt_last_error(), "abandon"));
    g_buf[len - 6] = 1;
    /* an item count of 2^32 - 1: refused before anything is allocated */
    memset(g_buf + KVT_META_HEADER_LEN + 4, 0xff, 4);
    int rc = kvi_ecc_request_decode(&back, g_buf, len);
    assert_true(rc == KVT_ELIMIT || rc == KVT_EPROTO);
    /* a message over the size limit */
    KVT_ERR_(kvi_ecc_request_decode(&back, g_buf, KVT_ECC_MAX_MSG + 1), KVT_ELIMIT);
    /* another kind of message */
    kvi_ecc_reply rep;
    kvi_ecc_reply_init(&rep);
    kvi_ecc_reply_begin(&rep, KVT_ECC_EVENT_PORT);
    rep.port = 1;
    KVT_OK_(kvi_ecc_reply_encode(&rep, g_buf, sizeof(g_buf), &len));
    KVT_ERR_(kvi_ecc_request_decode(&back, g_buf, len), KVT_EPROTO);
    assert_non_null(strstr(kvt_last_error(), "expected"));
    /* a reply: a port past 65535 (0 is a unix socket: allowed), a success with a message, a
     * positive code */
    rep.port = 65536;
    KVT_ERR_(kvi_ecc_reply_encode(&rep, g_buf, sizeof(g_buf), &len), KVT_EINVAL);
    rep.port = 7;
    rep.error = S("oops");
    KVT_ERR_(kvi_ecc_reply_encode(&rep, g_buf, sizeof(g_buf), &len), KVT_EINVAL);
    rep.error = S("");
    rep.code = 5;
    KVT_ERR_(kvi_ecc_reply_encode(&rep, g_buf, sizeof(g_buf), &len), KVT_EINVAL);
    kvi_ecc_request_release(&r);
    kvi_ecc_request_release(&back);
    kvi_ecc_reply_release(&rep);
}

/* A reply must answer its request: same op, one result per item. */
static void a_reply_must_match_its_request(void **state)
{
    (void)state;
    kvi_ecc_request q;
    kvi_ecc_request_init(&q);
    kvi_ecc_request_begin(&q, KVT_ECC_COMPLETE_BATCH);
    kvi_ecc_item c = {.transfer_id = S("t"), .reservation_id = S(RID)};
    KVT_OK_(kvi_ecc_request_add(&q, &c));
    KVT_OK_(kvi_ecc_request_add(&q, &c));
    kvi_ecc_reply p;
    kvi_ecc_reply_init(&p);
    kvi_ecc_reply_begin(&p, KVT_ECC_COMPLETE_BATCH);
    kvi_ecc_result x = {.completed = true};
    KVT_OK_(kvi_ecc_reply_add(&p, &x));
    KVT_ERR_(kvi_ecc_reply_check(&p, &q), KVT_EPROTO);
    assert_non_null(strstr(kvt_last_error(), "1 results for 2 items"));
    KVT_OK_(kvi_ecc_reply_add(&p, &x));
    KVT_OK_(kvi_ecc_reply_check(&p, &q));
    p.op = KVT_ECC_RESERVE_BATCH;
    KVT_ERR_(kvi_ecc_reply_check(&p, &q), KVT_EPROTO);
    /* a whole-request failure answers any request of its op */
    kvi_ecc_reply_begin(&p, KVT_ECC_COMPLETE_BATCH);
    KVT_OK_(kvi_ecc_reply_fail(&p, KVT_EPROTO, "malformed control request"));
    KVT_OK_(kvi_ecc_reply_check(&p, &q));
    kvi_ecc_request_release(&q);
    kvi_ecc_reply_release(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_request_op_round_trips),
        cmocka_unit_test(every_reply_round_trips_with_per_item_errors),
        cmocka_unit_test(events_round_trip_ready_and_abandoned),
        cmocka_unit_test(public_event_decode),
        cmocka_unit_test(capabilities_are_required_on_the_wire),
        cmocka_unit_test(every_truncation_is_refused),
        cmocka_unit_test(forged_requests_are_refused),
        cmocka_unit_test(forged_bytes_are_refused),
        cmocka_unit_test(a_reply_must_match_its_request),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
