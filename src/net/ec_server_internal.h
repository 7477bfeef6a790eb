/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The control server without its sockets and thread: the request-to-reply path alone, for the
 * fuzzer (fuzz/fuzz_ec_server.c). No data plane: completions are trusted, as with
 * data_plane = false.
 */
#ifndef KVT_EC_SERVER_INTERNAL_H
#define KVT_EC_SERVER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier/ec_net.h"

int kvi_ec_server_open_local(kvt_ec_shard *shard, kvt_ec_server **out);
/* The encoded reply to one request's bytes (valid until the next call); 0, or a code when even
 * an error reply could not be built. */
int kvi_ec_server_answer(kvt_ec_server *s, const void *req, size_t len, const uint8_t **reply,
                         size_t *reply_len);
/* The owner key the server checks (its random one). */
const char *kvi_ec_server_owner(const kvt_ec_server *s);
void kvi_ec_server_close_local(kvt_ec_server *s);

#endif
