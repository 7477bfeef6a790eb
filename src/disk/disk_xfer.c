/* SPDX-License-Identifier: Apache-2.0 */
/* The disk tier behind the worker's transfer interface (port/xfer.h), through its public
 * calls; a kvt_disk starts with the port that carries these operations. */
#include "disk/disk_internal.h"

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

void kvi_disk_port_init(kvi_xfer_port *port, const kvt_layout *layout, uint32_t num_slots)
{
    *port = (kvi_xfer_port){&disk_ops, layout, num_slots};
}
