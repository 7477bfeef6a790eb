/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The decoder property shared by the robustness test and the libFuzzer targets: decoding any
 * bytes either fails with a kvtier error code, or yields an object that validates, encodes to
 * exactly the bytes it came from (the encoding is canonical), and decodes back equal.
 * A violation calls abort(), which both cmocka and libFuzzer report with the input.
 */
#ifndef KVT_META_CHECK_H
#define KVT_META_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier/meta.h"

#define KVT_PROPERTY(cond)                                                                         \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "decoder property violated: %s (%s:%d) last error: %s\n", #cond,       \
                    __FILE__, __LINE__, kvt_last_error());                                         \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

static inline int kvt_rc_is_decode_error(int rc)
{
    return rc == KVT_EPROTO || rc == KVT_EVERSION || rc == KVT_ELIMIT || rc == KVT_ENOMEM;
}

/* Re-encodes into a fresh buffer and checks it equals the input bytes. */
#define KVT_REENCODE_SAME(enc, size, obj, buf, len)                                                \
    do {                                                                                           \
        size_t need_ = size(obj), got_ = 0;                                                        \
        KVT_PROPERTY(need_ == (len));                                                              \
        unsigned char *out_ = malloc(need_);                                                       \
        KVT_PROPERTY(out_ != NULL);                                                                \
        KVT_PROPERTY(enc(obj, out_, need_, &got_) == 0);                                           \
        KVT_PROPERTY(got_ == (len) && memcmp(out_, (buf), (len)) == 0);                            \
        free(out_);                                                                                \
    } while (0)

static inline int kvt_check_offload(const uint8_t *buf, size_t len)
{
    kvt_offload_meta m, back;
    kvt_offload_meta_init(&m);
    kvt_offload_meta_init(&back);
    int rc = kvt_offload_meta_decode(&m, buf, len);
    if (rc == 0) {
        KVT_PROPERTY(kvt_offload_meta_validate(&m) == 0);
        KVT_REENCODE_SAME(kvt_offload_meta_encode, kvt_offload_meta_encoded_size, &m, buf, len);
        KVT_PROPERTY(kvt_offload_meta_decode(&back, buf, len) == 0);
        KVT_PROPERTY(kvt_offload_meta_equal(&m, &back));
    } else {
        KVT_PROPERTY(kvt_rc_is_decode_error(rc));
        KVT_PROPERTY(m.n_loads == 0 && m.n_stores == 0 && m.n_load_events == 0);
    }
    kvt_offload_meta_release(&m);
    kvt_offload_meta_release(&back);
    return rc;
}

static inline int kvt_check_offload_worker(const uint8_t *buf, size_t len)
{
    kvt_offload_worker_meta m;
    kvt_offload_worker_meta_init(&m);
    int rc = kvt_offload_worker_meta_decode(&m, buf, len);
    if (rc == 0) {
        KVT_PROPERTY(kvt_offload_worker_meta_validate(&m) == 0);
        KVT_REENCODE_SAME(kvt_offload_worker_meta_encode, kvt_offload_worker_meta_encoded_size, &m,
                          buf, len);
    } else {
        KVT_PROPERTY(kvt_rc_is_decode_error(rc));
        KVT_PROPERTY(m.stores.n_completed == 0);
    }
    kvt_offload_worker_meta_release(&m);
    return rc;
}

static inline int kvt_check_ec(const uint8_t *buf, size_t len)
{
    kvt_ec_meta m, back;
    kvt_ec_meta_init(&m);
    kvt_ec_meta_init(&back);
    int rc = kvt_ec_meta_decode(&m, buf, len);
    if (rc == 0) {
        KVT_PROPERTY(kvt_ec_meta_validate(&m) == 0);
        KVT_REENCODE_SAME(kvt_ec_meta_encode, kvt_ec_meta_encoded_size, &m, buf, len);
        KVT_PROPERTY(kvt_ec_meta_decode(&back, buf, len) == 0);
        KVT_PROPERTY(kvt_ec_meta_equal(&m, &back));
    } else {
        KVT_PROPERTY(kvt_rc_is_decode_error(rc));
        KVT_PROPERTY(m.n_loads == 0 && m.n_pushes == 0 && m.n_freed == 0);
    }
    kvt_ec_meta_release(&m);
    kvt_ec_meta_release(&back);
    return rc;
}

static inline int kvt_check_ec_worker(const uint8_t *buf, size_t len)
{
    kvt_ec_worker_meta m;
    kvt_ec_worker_meta_init(&m);
    int rc = kvt_ec_worker_meta_decode(&m, buf, len);
    if (rc == 0) {
        KVT_PROPERTY(kvt_ec_worker_meta_validate(&m) == 0);
        KVT_REENCODE_SAME(kvt_ec_worker_meta_encode, kvt_ec_worker_meta_encoded_size, &m, buf, len);
    } else {
        KVT_PROPERTY(kvt_rc_is_decode_error(rc));
        KVT_PROPERTY(m.loaded.n == 0 && m.failed_loads.n == 0 && m.reclaimed.n == 0 &&
                     m.failed_saves.n == 0);
    }
    kvt_ec_worker_meta_release(&m);
    return rc;
}

static inline int kvt_check_load_spec(const uint8_t *buf, size_t len)
{
    kvt_ec_load_spec s;
    kvt_bump b = {0};
    int rc = kvt_ec_load_spec_decode(&s, &b, buf, len);
    if (rc == 0) {
        KVT_PROPERTY(kvt_ec_load_spec_validate(&s) == 0);
        KVT_REENCODE_SAME(kvt_ec_load_spec_encode, kvt_ec_load_spec_encoded_size, &s, buf, len);
    } else {
        KVT_PROPERTY(kvt_rc_is_decode_error(rc));
    }
    kvt_bump_release(&b);
    return rc;
}

static inline int kvt_check_push_spec(const uint8_t *buf, size_t len)
{
    kvt_ec_push_spec s;
    kvt_bump b = {0};
    int rc = kvt_ec_push_spec_decode(&s, &b, buf, len);
    if (rc == 0) {
        KVT_PROPERTY(kvt_ec_push_spec_validate(&s) == 0);
        KVT_REENCODE_SAME(kvt_ec_push_spec_encode, kvt_ec_push_spec_encoded_size, &s, buf, len);
    } else {
        KVT_PROPERTY(kvt_rc_is_decode_error(rc));
    }
    kvt_bump_release(&b);
    return rc;
}

/* Dispatch by message kind. */
static inline int kvt_check_kind(uint32_t kind, const uint8_t *buf, size_t len)
{
    switch (kind) {
    case KVT_META_OFFLOAD:
        return kvt_check_offload(buf, len);
    case KVT_META_OFFLOAD_WORKER:
        return kvt_check_offload_worker(buf, len);
    case KVT_META_EC:
        return kvt_check_ec(buf, len);
    case KVT_META_EC_WORKER:
        return kvt_check_ec_worker(buf, len);
    case KVT_META_EC_LOAD_SPEC:
        return kvt_check_load_spec(buf, len);
    default:
        return kvt_check_push_spec(buf, len);
    }
}

#endif
