/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target for the remote tier's read request and reply (src/remote/chan_wire.c).
 * The first input byte picks the decoder, the rest is the message. Property: a decode either
 * fails with a message, or succeeds and re-encoding the decoded fields gives back exactly the
 * input bytes (nothing read past the end, nothing ignored).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "remote/remote_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static kvi_rreq_block g_qb[KVT_REMOTE_MAX_READ];
static kvi_rrep_block g_pb[KVT_REMOTE_MAX_READ];

static void check(int ok)
{
    if (!ok)
        abort(); /* the fuzzer reports the input */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const uint8_t *b = data + 1;
    size_t n = size - 1;
    uint8_t *out = NULL;
    if (data[0] & 1) {
        kvi_rreq q = {.blocks = g_qb};
        if (kvi_rreq_decode(b, n, &q) == 0) {
            check(q.n >= 1 && q.n <= KVT_REMOTE_MAX_READ && q.hash_len >= 1 &&
                  q.hash_len <= KVT_REMOTE_MAX_HASH && q.cred_len >= 1 && q.addr_len >= 1);
            size_t len = kvi_rreq_size(&q);
            check(len == n);
            out = malloc(len);
            kvi_rreq_encode(&q, out);
            check(memcmp(out, b, n) == 0);
        } else {
            check(kvt_last_error()[0] != 0);
        }
    } else {
        kvi_rrep p = {.blocks = g_pb};
        if (kvi_rrep_decode(b, n, &p) == 0) {
            size_t len = kvi_rrep_size(&p);
            check(len == n);
            out = malloc(len);
            kvi_rrep_encode(&p, out);
            check(memcmp(out, b, n) == 0);
        } else {
            check(kvt_last_error()[0] != 0);
        }
    }
    free(out);
    return 0;
}
