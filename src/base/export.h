/* SPDX-License-Identifier: Apache-2.0 */
/* KVI_EXPORT marks an internal function of libkvtier that its sibling libraries
 * (libkvtier_disk, libkvtier_net) call: it keeps default visibility, and scripts/gen-symbols
 * lists it under the version node KVTIER_PRIVATE of src/kvtier.map. It is no API: programs
 * never call it, and it may change in any release. */
#ifndef KVI_BASE_EXPORT_H
#define KVI_BASE_EXPORT_H

#define KVI_EXPORT __attribute__((visibility("default")))

#endif
