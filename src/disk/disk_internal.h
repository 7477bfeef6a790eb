/* SPDX-License-Identifier: Apache-2.0 */
/* The disk's side of the worker's transfer interface: every kvt_disk starts with a port
 * (port/xfer.h) that this fills. */
#ifndef KVT_DISK_INTERNAL_H
#define KVT_DISK_INTERNAL_H

#include "port/xfer.h"
#include "kvtier/disk.h"

void kvi_disk_port_init(kvi_xfer_port *port, const kvt_layout *layout, uint32_t num_slots);

#endif
