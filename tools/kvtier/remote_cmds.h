/* SPDX-License-Identifier: Apache-2.0 */
/* `kvtier remote-peer` (remote_cmds.c) and the generator it shares with `bench remote`. */
#ifndef KVT_TOOLS_REMOTE_CMDS_H
#define KVT_TOOLS_REMOTE_CMDS_H

#include <stdint.h>

/* Exit code: 0 served until stopped, or every block read intact (--expect-hits held); 1 a
 * failure; 2 bad options. */
int kvt_cmd_remote_peer(int argc, char **argv);

/* The n chained block hashes (hash_len bytes each) of generated sequence seq. */
void kvt_remote_seq_hashes(uint64_t seq, uint32_t n, uint32_t hash_len, uint8_t *out);
/* The bytes of block i of sequence seq. */
void kvt_remote_seq_fill(uint64_t seq, uint32_t i, uint8_t *p, uint64_t len);

#endif
