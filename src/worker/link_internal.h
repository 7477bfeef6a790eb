/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Wire side of the scheduler <-> worker link: pure encoders and bounds-checked decoders of
 * the link's own frames (the offload metadata travels in its own kvt_offload_meta encoding).
 * Fuzzed by fuzz/fuzz_link.c.
 *
 *   header  16 bytes: "KVTL", u16 version, u16 type, u64 step
 *   hello   u32 rank, u32 world_size, u32 host_blocks
 *   status  u32 rank, i32 status, u32 n_invalid, n_invalid x u32 block id, str message
 *
 * Messages (ZeroMQ multipart):
 *   worker -> scheduler   HELLO: header, hello
 *                         REPLY: header, status, worker meta, one frame per finished request
 *   scheduler -> worker   STEP:  header, offload meta, payload (possibly empty)
 *                         STOP:  header
 */
#ifndef KVT_WORKER_LINK_INTERNAL_H
#define KVT_WORKER_LINK_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier/link.h"

#define KVT_LINK_HDR_LEN   16u
#define KVT_LINK_HELLO_LEN 12u

enum kvt_link_type { KVT_LINK_HELLO = 1, KVT_LINK_STEP = 2, KVT_LINK_REPLY = 3, KVT_LINK_STOP = 4 };

typedef struct kvt_link_status {
    uint32_t rank;
    int32_t status;
    uint32_t n_invalid;
    const uint8_t *invalid; /* n_invalid little-endian u32, inside the decoded buffer */
    const char *msg;
    uint32_t msg_len;
} kvt_link_status;

void kvt_link_hdr_encode(uint8_t out[KVT_LINK_HDR_LEN], uint32_t type, uint64_t step);
int kvt_link_hdr_decode(const void *buf, size_t len, uint32_t *type, uint64_t *step);
void kvt_link_hello_encode(uint8_t out[KVT_LINK_HELLO_LEN], uint32_t rank, uint32_t world,
                           uint32_t host_blocks);
int kvt_link_hello_decode(const void *buf, size_t len, uint32_t *rank, uint32_t *world,
                          uint32_t *host_blocks);
size_t kvt_link_status_size(uint32_t n_invalid, uint32_t msg_len);
void kvt_link_status_encode(uint8_t *out, uint32_t rank, int32_t status, const uint32_t *invalid,
                            uint32_t n_invalid, const char *msg, uint32_t msg_len);
/* Decodes and validates (status 0 or a KVT_E* code, counts bounded by the bytes present,
 * nothing trailing). */
int kvt_link_status_decode(const void *buf, size_t len, kvt_link_status *st);

#endif
