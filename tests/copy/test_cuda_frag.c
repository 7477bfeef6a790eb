/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA gather/scatter kernel's parts that need no GPU: the PTX embedded at build time (its
 * entry point and launch bounds, as cuda_frag.c launches it), and the choice between the
 * kernel and DMA per job. The kernel itself runs in test_copy_cuda on a GPU.
 */
#include "kvt_test.h"

#include "copy/cuda_frag_internal.h"

static void test_ptx_embedded(void **state)
{
    (void)state;
#if KVT_TEST_PTX_EXPECTED
    assert_true(kvi_cuda_frag_ptx_len > 1000);
    const char *ptx = (const char *)kvi_cuda_frag_ptx;
    assert_int_equal(strlen(ptx), kvi_cuda_frag_ptx_len); /* NUL-terminated, no NUL inside */
    assert_non_null(strstr(ptx, ".entry kvi_copy_frags("));
    /* the block size cuda_frag.c launches with is the one the kernel was compiled for */
    char bounds[32];
    snprintf(bounds, sizeof(bounds), ".maxntid %d, 1, 1", KVT_FRAG_THREADS);
    assert_non_null(strstr(ptx, bounds));
    assert_non_null(strstr(ptx, ".address_size 64"));
#else
    /* a build without nvcc: nothing embedded, and the backend says so (DMA only) */
    assert_int_equal(kvi_cuda_frag_ptx_len, 0);
    assert_int_equal(kvi_cuda_frag_ptx[0], 0);
    print_message("built without nvcc: no kernel PTX, as expected\n");
#endif
}

static void test_kernel_or_dma(void **state)
{
    (void)state;
    assert_true(kvi_frag_use(64 * 16384, 64, 128 << 10));       /* per-layer fragments */
    assert_true(kvi_frag_use(128u << 10, 1, 128 << 10));        /* at the limit */
    assert_false(kvi_frag_use((128u << 10) + 1, 1, 128 << 10)); /* above it */
    assert_false(kvi_frag_use(32 * (2u << 20), 32, 128 << 10)); /* whole blocks: DMA */
    /* the mean decides: one 2 MiB run among 63 fragments of 16 KiB */
    assert_true(kvi_frag_use((2u << 20) + 63 * 16384, 64, 128 << 10));
    assert_false(kvi_frag_use(64 * 16384, 64, 0)); /* 0: never */
    assert_false(kvi_frag_use(0, 0, 128 << 10));   /* no descriptors */
    assert_true(kvi_frag_use(UINT64_MAX, 1, UINT64_MAX));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ptx_embedded),
        cmocka_unit_test(test_kernel_or_dma),
    };
    return kvt_test_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
