/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target for one metadata decoder, chosen at compile time with KVT_FUZZ_KIND (one
 * binary per decoder, see fuzz/CMakeLists.txt). The property checked is the one of
 * tests/meta/meta_check.h: any input either fails with a decode error and leaves the target
 * empty, or decodes to a valid object whose encoding is byte-identical to the input.
 */
#include <stddef.h>
#include <stdint.h>

#include "meta/meta_check.h"

#ifndef KVT_FUZZ_KIND
#error "define KVT_FUZZ_KIND"
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvt_check_kind(KVT_FUZZ_KIND, data, size);
    return 0;
}
