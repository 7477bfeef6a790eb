/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvtier: KV-cache offload and encoder-cache transfer for LLM inference engines.
 * Including this header includes every public module.
 */
#ifndef KVTIER_H
#define KVTIER_H

#include "kvtier/base.h"
#include "kvtier/copy.h"
#include "kvtier/layout.h"
#include "kvtier/disk.h"
#include "kvtier/ec.h"
#include "kvtier/ec_net.h"
#include "kvtier/link.h"
#include "kvtier/meta.h"
#include "kvtier/node.h"
#include "kvtier/offload.h"
#include "kvtier/pool.h"
#include "kvtier/remote.h"
#include "kvtier/worker.h"
#include "kvtier/version.h"

#ifdef __cplusplus
extern "C" {
#endif

/* sizeof a public struct by its name ("kvt_offload_meta"), 0 if unknown: lets bindings that
 * declare the structs themselves check them against this build. */
KVT_API size_t kvt_sizeof(const char *type_name);

#ifdef __cplusplus
}
#endif

#endif
