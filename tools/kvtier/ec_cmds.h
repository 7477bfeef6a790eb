/* SPDX-License-Identifier: Apache-2.0 */
/* `kvtier ec-consumer` and `kvtier ec-producer` (ec_cmds.c). */
#ifndef KVT_TOOLS_EC_CMDS_H
#define KVT_TOOLS_EC_CMDS_H

/* Each returns a process exit code: 0 when every item arrived (consumer: intact; producer:
 * pushed on every shard), 1 on a failure, 2 on bad options. */
int kvt_cmd_ec_consumer(int argc, char **argv);
int kvt_cmd_ec_producer(int argc, char **argv);

#include <stddef.h>
#include <stdint.h>

#include "kvtier/ec.h"

/* Pushes one item and waits for it (push, bind src as its source, dispatch): 0 once it is
 * DONE on every shard, -1 otherwise with the producer's failure report (or the last error) in
 * why. What `ec-producer`, `ec-encoder` and `bench ec` do per item. */
int kvt_ec_push_now(kvt_ec_producer *p, const kvt_ec_push_spec *s, const void *src, char *why,
                    size_t cap);

/* The soak's network round (kvtier demo --soak): a consumer with 2 shards in this process, a
 * producer process (kvtier ec-producer) pushing 30 items that, half the time, dies (SIGKILL)
 * mid-push: after a random number of items, with the next one reserved on every shard and not
 * written; waits until no writer is left (a killed producer's are reaped after the 1 s TTL). Every
 * item that arrived is checked. Returns 0 when nothing was corrupt, left behind or leaked, 1 if
 * something was, a code if the round could not run. */
typedef struct kvt_ec_net_soak {
    uint64_t items_checked, corrupt, bytes, killed, reaped, writers_left, leaked_bytes;
} kvt_ec_net_soak;
int kvt_ec_net_soak_round(uint64_t seed, kvt_ec_net_soak *res);

#endif
