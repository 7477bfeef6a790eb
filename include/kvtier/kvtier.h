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

#endif
