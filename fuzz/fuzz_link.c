/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target for the scheduler <-> worker link's own frames (header, hello, status, the
 * finished-request ids).
 * The first input byte picks the decoder, the rest is the frame. Property: a decode either
 * fails with a message, or succeeds and re-encoding the decoded fields gives back exactly the
 * input bytes (nothing read past the end, nothing ignored).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "net/link_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

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
    if (data[0] % 4 == 3) {
        uint32_t count;
        if (kvi_link_ids_check(b, n, &count) == 0) { /* re-encode from the validated parts */
            kvt_str *ids = malloc(((size_t)count + 1) * sizeof(kvt_str));
            const uint8_t *p = b + 4;
            for (uint32_t i = 0; i < count; i++) {
                uint32_t l;
                memcpy(&l, p, 4); /* little-endian hosts only */
                ids[i] = (kvt_str){(const char *)p + 4, l};
                check(l >= 1 && l <= KVT_META_MAX_STR);
                p += 4 + (size_t)l;
            }
            size_t len = kvi_link_ids_size(ids, count);
            uint8_t *out = malloc(len);
            kvi_link_ids_encode(out, ids, count);
            check(len == n && memcmp(out, b, n) == 0);
            free(out);
            free(ids);
        } else {
            check(kvt_last_error()[0] != 0);
        }
    } else if (data[0] % 3 == 0) {
        uint32_t type;
        uint64_t step;
        if (kvi_link_hdr_decode(b, n, &type, &step) == 0) {
            uint8_t out[KVT_LINK_HDR_LEN];
            kvi_link_hdr_encode(out, type, step);
            check(n == sizeof(out) && memcmp(out, b, n) == 0);
        } else {
            check(kvt_last_error()[0] != 0);
        }
    } else if (data[0] % 3 == 1) {
        uint32_t rank, world, blocks;
        if (kvi_link_hello_decode(b, n, &rank, &world, &blocks) == 0) {
            uint8_t out[KVT_LINK_HELLO_LEN];
            kvi_link_hello_encode(out, rank, world, blocks);
            check(n == sizeof(out) && memcmp(out, b, n) == 0 && rank < world);
        } else {
            check(kvt_last_error()[0] != 0);
        }
    } else {
        kvi_link_status st;
        if (kvi_link_status_decode(b, n, &st) == 0) {
            uint32_t *inv = malloc(((size_t)st.n_invalid + 1) * sizeof(uint32_t));
            for (uint32_t i = 0; i < st.n_invalid; i++)
                memcpy(&inv[i], st.invalid + 4 * i, 4); /* little-endian hosts only */
            size_t len = kvi_link_status_size(st.n_invalid, st.msg_len);
            uint8_t *out = malloc(len ? len : 1);
            kvi_link_status_encode(out, st.rank, st.status, inv, st.n_invalid, st.msg, st.msg_len);
            check(len == n && memcmp(out, b, n) == 0 && st.status <= 0);
            free(out);
            free(inv);
        } else {
            check(kvt_last_error()[0] != 0);
        }
    }
    return 0;
}
