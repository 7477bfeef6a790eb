/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Wire side of the scheduler <-> worker link: pure encoders and bounds-checked decoders of
 * the link's own frames (the offload metadata travels in its own kvt_offload_meta encoding).
 * Fuzzed by fuzz/fuzz_link.c.
 *
 *   header  16 bytes: "KVTL", u16 version, u16 type, u64 step
 *   hello   u32 rank, u32 world_size, u32 host_blocks
 *   status  u32 rank, i32 status, u32 n_invalid, n_invalid x u32 block id, str message
 *   ids     u32 n, n x (u32 len 1..KVT_META_MAX_STR, bytes): the finished requests
 *
 * Messages (ZeroMQ multipart, a fixed number of parts so that their total is bounded: libzmq
 * buffers a whole multipart message before the first part is read, and its ZMQ_MAXMSGSIZE
 * bounds each part, so the frame count must be bounded by the format itself):
 *   worker -> scheduler   HELLO: header, hello
 *                         REPLY: header, status, worker meta, ids
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

enum kvi_link_type { KVT_LINK_HELLO = 1, KVT_LINK_STEP = 2, KVT_LINK_REPLY = 3, KVT_LINK_STOP = 4 };

typedef struct kvi_link_status {
    uint32_t rank;
    int32_t status;
    uint32_t n_invalid;
    const uint8_t *invalid; /* n_invalid little-endian u32, inside the decoded buffer */
    const char *msg;
    uint32_t msg_len;
} kvi_link_status;

void kvi_link_hdr_encode(uint8_t out[KVT_LINK_HDR_LEN], uint32_t type, uint64_t step);
int kvi_link_hdr_decode(const void *buf, size_t len, uint32_t *type, uint64_t *step);
void kvi_link_hello_encode(uint8_t out[KVT_LINK_HELLO_LEN], uint32_t rank, uint32_t world,
                           uint32_t host_blocks);
int kvi_link_hello_decode(const void *buf, size_t len, uint32_t *rank, uint32_t *world,
                          uint32_t *host_blocks);
/* Bytes of one part the scheduler accepts (a reply's status, worker meta or ids; more and
 * libzmq drops the peer's connection), and of one part a worker accepts (a step's metadata or
 * payload). */
#define KVT_LINK_MAX_REPLY_PART ((16u << 20) + 65536u)
#define KVT_LINK_MAX_STEP_PART  (1u << 30)

size_t kvi_link_ids_size(const kvt_str *ids, uint32_t n);
void kvi_link_ids_encode(uint8_t *out, const kvt_str *ids, uint32_t n);
/* Validates an ids part (count, each length 1..KVT_META_MAX_STR, nothing trailing); *n. */
int kvi_link_ids_check(const void *buf, size_t len, uint32_t *n);
size_t kvi_link_status_size(uint32_t n_invalid, uint32_t msg_len);
void kvi_link_status_encode(uint8_t *out, uint32_t rank, int32_t status, const uint32_t *invalid,
                            uint32_t n_invalid, const char *msg, uint32_t msg_len);
/* Decodes and validates (status 0 or a KVT_E* code, counts bounded by the bytes present,
 * nothing trailing). */
int kvi_link_status_decode(const void *buf, size_t len, kvi_link_status *st);

#endif
