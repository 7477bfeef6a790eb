/* SPDX-License-Identifier: Apache-2.0 */
/* The copy engine and the disk tier behind the worker's transfer interface (xfer.h), through
 * their public calls. */
#include "worker/xfer.h"

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

static int disk_submit(void *impl, int dir, int64_t event, const uint32_t *src, const uint32_t *dst,
                       uint32_t n, void *wait)
{
    return kvt_disk_submit(impl, dir, event, src, dst, n, wait);
}

static int disk_poll(void *impl, int dir, int64_t *hwm)
{
    return kvt_disk_poll(impl, dir, hwm);
}

static uint32_t disk_take_failed(void *impl, int dir, int64_t *out, uint32_t cap)
{
    return dir == KVT_COPY_STORE ? kvt_disk_take_failed(impl, out, cap)
                                 : kvt_disk_take_failed_loads(impl, out, cap);
}

static uint32_t disk_take_invalid(void *impl, uint32_t *out, uint32_t cap)
{
    return kvt_disk_take_invalid_blocks(impl, out, cap);
}

static int disk_flush(void *impl)
{
    return kvt_disk_flush(impl);
}

static uint32_t disk_outstanding(const void *impl, int dir)
{
    return kvt_disk_outstanding(impl, dir);
}

static const kvi_xfer_ops disk_ops = {
    .name = "disk",
    .eio_is_final = true,         /* the ring failed: nothing more will be written or read */
    .store_fail_is_fatal = false, /* an I/O error fails the event; the engine's KV is intact */
    .submit = disk_submit,
    .poll = disk_poll,
    .take_failed = disk_take_failed,
    .take_invalid = disk_take_invalid,
    .flush = disk_flush,
    .outstanding = disk_outstanding,
};

kvi_xfer kvi_xfer_disk(kvt_disk *d)
{
    return (kvi_xfer){&disk_ops, d};
}
