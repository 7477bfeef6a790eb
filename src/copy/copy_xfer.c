/* SPDX-License-Identifier: Apache-2.0 */
/* The copy engine behind the worker's transfer interface (port/xfer.h), through its public
 * calls. */
#include "port/xfer.h"

static int copy_submit(void *impl, int dir, int64_t event, const uint32_t *src, const uint32_t *dst,
                       uint32_t n, void *wait)
{
    return kvt_copy_submit(impl, dir, event, src, dst, n, wait);
}

static int copy_poll(void *impl, int dir, int64_t *hwm)
{
    return kvt_copy_poll(impl, dir, hwm);
}

static uint32_t copy_take_failed(void *impl, int dir, int64_t *out, uint32_t cap)
{
    return kvt_copy_take_failed(impl, dir, out, cap);
}

static int copy_flush(void *impl)
{
    return kvt_copy_flush(impl);
}

static uint32_t copy_outstanding(const void *impl, int dir)
{
    return kvt_copy_outstanding(impl, dir);
}

static const kvi_xfer_ops copy_ops = {
    .name = "copy",
    .eio_is_final = false,
    .store_fail_is_fatal = true, /* a DMA fault: the device is in an unknown state */
    .submit = copy_submit,
    .poll = copy_poll,
    .take_failed = copy_take_failed,
    .take_invalid = NULL,
    .flush = copy_flush,
    .outstanding = copy_outstanding,
};

kvi_xfer kvi_xfer_copy(kvt_copy *c)
{
    return (kvi_xfer){&copy_ops, c};
}
