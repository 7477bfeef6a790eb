/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target for the encoder-cache control plane's messages (src/net/ec_ctl_wire.c): what
 * a control server decodes from any peer (requests) and what producers and schedulers decode
 * from shards (replies, events). The first input byte picks the decoder, the rest is the
 * message. Property: a decode either fails with a message and leaves the object empty, or
 * succeeds and re-encoding gives back exactly the input bytes (canonical: nothing read past
 * the end, nothing ignored, nothing invented).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "net/ec_ctl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok)
{
    if (!ok)
        abort(); /* the fuzzer reports the input */
}

static uint8_t g_out[1 << 20];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size - 1 > sizeof(g_out))
        return 0;
    const uint8_t *b = data + 1;
    size_t n = size - 1, len = 0;
    int rc;
    if (data[0] % 3 == 0) {
        kvi_ecc_request r;
        kvi_ecc_request_init(&r);
        if ((rc = kvi_ecc_request_decode(&r, b, n)) == 0) {
            check(kvi_ecc_request_encode(&r, g_out, sizeof(g_out), &len) == 0);
            check(len == n && memcmp(g_out, b, n) == 0);
        } else {
            check(rc < 0 && kvt_last_error()[0] != 0 && r.n == 0);
        }
        kvi_ecc_request_release(&r);
    } else if (data[0] % 3 == 1) {
        kvi_ecc_reply r;
        kvi_ecc_reply_init(&r);
        if ((rc = kvi_ecc_reply_decode(&r, b, n)) == 0) {
            check(kvi_ecc_reply_encode(&r, g_out, sizeof(g_out), &len) == 0);
            check(len == n && memcmp(g_out, b, n) == 0);
        } else {
            check(rc < 0 && kvt_last_error()[0] != 0 && r.n == 0 && r.n_ports == 0);
        }
        kvi_ecc_reply_release(&r);
    } else {
        kvi_ecc_event e;
        kvi_ecc_event_init(&e);
        if ((rc = kvi_ecc_event_decode(&e, b, n)) == 0) {
            check(kvi_ecc_event_encode(&e, g_out, sizeof(g_out), &len) == 0);
            check(len == n && memcmp(g_out, b, n) == 0);
        } else {
            check(rc < 0 && kvt_last_error()[0] != 0 && e.transfer_id.len == 0);
        }
        kvi_ecc_event_release(&e);
    }
    return 0;
}
