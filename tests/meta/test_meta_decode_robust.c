/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Decoders against hostile bytes: every truncation of a valid message, every single-byte
 * mutation at every offset, messages of the wrong kind, and random garbage behind a valid
 * header. Each input must either fail with a decode error (leaving the target empty) or decode
 * to a valid object that re-encodes to the very same bytes (meta_check.h). Run under
 * AddressSanitizer in CI, this also shows that no input reads out of bounds.
 */
#include "kvt_test.h"
#include "meta/meta_check.h"
#include "meta/meta_samples.h"

static const uint32_t kinds[KVT_SAMPLE_KINDS] = {KVT_META_OFFLOAD,      KVT_META_OFFLOAD_WORKER,
                                                 KVT_META_EC,           KVT_META_EC_WORKER,
                                                 KVT_META_EC_LOAD_SPEC, KVT_META_EC_PUSH_SPEC};

static void valid_samples_decode(void **state)
{
    (void)state;
    for (int k = 0; k < KVT_SAMPLE_KINDS; k++)
        for (int v = 0; v < 3; v++) {
            size_t len;
            unsigned char *buf = kvt_sample_encode(kinds[k], v, &len);
            assert_non_null(buf);
            if (kvt_check_kind(kinds[k], buf, len) != 0)
                fail_msg("sample kind %u variant %d: %s", kinds[k], v, kvt_last_error());
            free(buf);
        }
}

static void every_truncation_is_rejected(void **state)
{
    (void)state;
    for (int k = 0; k < KVT_SAMPLE_KINDS; k++)
        for (int v = 0; v < 3; v++) {
            size_t len;
            unsigned char *buf = kvt_sample_encode(kinds[k], v, &len);
            for (size_t cut = 0; cut < len; cut++) {
                /* a fresh allocation of exactly `cut` bytes, so ASan sees any overread */
                unsigned char *t = malloc(cut ? cut : 1);
                memcpy(t, buf, cut);
                assert_int_not_equal(kvt_check_kind(kinds[k], t, cut), 0);
                free(t);
            }
            free(buf);
        }
}

static void every_single_byte_mutation_is_safe(void **state)
{
    (void)state;
    uint64_t accepted = 0, rejected = 0;
    for (int k = 0; k < KVT_SAMPLE_KINDS; k++)
        for (int v = 0; v < 3; v++) {
            size_t len;
            unsigned char *buf = kvt_sample_encode(kinds[k], v, &len);
            unsigned char *t = malloc(len);
            for (size_t off = 0; off < len; off++) {
                const unsigned char vals[] = {0,
                                              1,
                                              0x7f,
                                              0x80,
                                              0xff,
                                              (unsigned char)(buf[off] ^ 1),
                                              (unsigned char)(buf[off] + 1)};
                for (size_t i = 0; i < sizeof(vals); i++) {
                    memcpy(t, buf, len);
                    t[off] = vals[i];
                    if (kvt_check_kind(kinds[k], t, len) == 0)
                        accepted++;
                    else
                        rejected++;
                }
            }
            free(t);
            free(buf);
        }
    print_message("mutations: %llu decoded (and re-encoded identically), %llu rejected\n",
                  (unsigned long long)accepted, (unsigned long long)rejected);
    assert_true(rejected > 0 && accepted > 0);
}

static void wrong_kind_and_version_are_rejected(void **state)
{
    (void)state;
    for (int k = 0; k < KVT_SAMPLE_KINDS; k++) {
        size_t len;
        unsigned char *buf = kvt_sample_encode(kinds[k], 2, &len);
        for (int other = 0; other < KVT_SAMPLE_KINDS; other++)
            if (other != k)
                assert_int_equal(kvt_check_kind(kinds[other], buf, len), KVT_EPROTO);
        uint32_t kind, version;
        KVT_OK_(kvt_meta_peek(buf, len, &kind, &version));
        assert_int_equal(kind, kinds[k]);
        assert_int_equal(version, KVT_META_VERSION);
        buf[4] = KVT_META_VERSION + 1; /* a version from the future */
        assert_int_equal(kvt_check_kind(kinds[k], buf, len), KVT_EVERSION);
        char want[32];
        snprintf(want, sizeof(want), "version %u", KVT_META_VERSION + 1);
        assert_non_null(strstr(kvt_last_error(), want));
        buf[0] = 'X';
        assert_int_equal(kvt_check_kind(kinds[k], buf, len), KVT_EPROTO);
        free(buf);
    }
    uint32_t kind, version;
    KVT_ERR_(kvt_meta_peek("KVT", 3, &kind, &version), KVT_EPROTO);
}

static void random_bodies_behind_valid_headers_are_safe(void **state)
{
    (void)state;
    uint64_t seed = kvt_test_seed(), rng = seed;
    uint64_t n = (uint64_t)(20000 * kvt_test_scale());
    for (uint64_t i = 0; i < n; i++) {
        uint32_t kind = kinds[kvt_test_below(&rng, KVT_SAMPLE_KINDS)];
        size_t body = kvt_test_below(&rng, 96);
        unsigned char *b = malloc(KVT_META_HEADER_LEN + body);
        memcpy(b, "KVTM", 4);
        b[4] = 1;
        b[5] = 0;
        b[6] = (unsigned char)kind;
        b[7] = 0;
        b[8] = (unsigned char)body;
        b[9] = b[10] = b[11] = 0;
        /* small numbers are likelier to pass length checks and reach deeper code */
        for (size_t k = 0; k < body; k++)
            b[KVT_META_HEADER_LEN + k] =
                (unsigned char)(kvt_test_below(&rng, 4) ? kvt_test_below(&rng, 4)
                                                        : kvt_test_rand(&rng));
        kvt_check_kind(kind, b, KVT_META_HEADER_LEN + body);
        free(b);
    }
}

/* A count of 4 billion in a 20-byte message is refused before anything is allocated. */
static void huge_counts_are_refused_before_allocation(void **state)
{
    (void)state;
    unsigned char b[KVT_META_HEADER_LEN + 8] = {
        'K', 'V', 'T', 'M', KVT_META_VERSION, 0, KVT_META_OFFLOAD_WORKER, 0, 4, 0, 0, 0};
    b[12] = 0xff;
    b[13] = 0xff;
    b[14] = 0xff;
    b[15] = 0x00; /* 16 M entries */
    int rc = kvt_check_offload_worker(b, KVT_META_HEADER_LEN + 4);
    assert_true(rc == KVT_ELIMIT || rc == KVT_EPROTO);
    b[15] = 0x7f;
    rc = kvt_check_offload_worker(b, KVT_META_HEADER_LEN + 4);
    assert_int_equal(rc, KVT_ELIMIT);
    b[12] = 0x10;
    b[13] = b[14] = b[15] = 0; /* 16 entries in 0 bytes */
    rc = kvt_check_offload_worker(b, KVT_META_HEADER_LEN + 4);
    assert_int_equal(rc, KVT_EPROTO);
    assert_non_null(strstr(kvt_last_error(), "cannot fit"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(valid_samples_decode),
        cmocka_unit_test(every_truncation_is_rejected),
        cmocka_unit_test(every_single_byte_mutation_is_safe),
        cmocka_unit_test(wrong_kind_and_version_are_rejected),
        cmocka_unit_test(random_bodies_behind_valid_headers_are_safe),
        cmocka_unit_test(huge_counts_are_refused_before_allocation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
