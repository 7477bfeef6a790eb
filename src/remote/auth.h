/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The remote tier's cryptography (auth.c, OpenSSL's libcrypto): who may read a space's
 * blocks, and which bytes a reader may accept.
 *
 * Keys, all derived from the space's credential, which never leaves the process:
 *   space key   HKDF-SHA256(salt "kvtier remote v2", the credential), expanded with the space's
 *               name: a credential reused in two spaces gives two unrelated keys;
 *   auth key    expanded from the space key ("auth"): proofs of membership in handshakes;
 *   session key expanded from the auth key and both sides' 32-byte handshake nonces: the MACs
 *               of one connection's requests and replies, and, when asked, the encryption of
 *               its bytes (its own expansion, "enc");
 *   block key   expanded from the space key, an owner's instance name and its boot id (128
 *               random bits per process start): the AES-256-GCM key under which that owner
 *               authenticates what it publishes.
 *
 * A published block's tag is GMAC (AES-256-GCM over no plaintext) with the owner's block key,
 * nonce = slot (4 bytes) || generation (8 bytes), over the block hash and the block's bytes,
 * piece by piece. A (slot, generation) pair is never published twice under one boot id (the
 * generation only grows), so a nonce never repeats under a key. GMAC rather than a hash: a
 * checksum's collisions can be constructed; a MAC's cannot without the key. GMAC rather than
 * HMAC or keyed BLAKE2: measured on 1 MiB blocks (docs/security.md), with AES-NI and carry-less
 * multiplication it runs at 8.5 GB/s on one core, HMAC-SHA256 at 0.84, BLAKE2b at 0.4-0.5.
 */
#ifndef KVT_REMOTE_AUTH_H
#define KVT_REMOTE_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVI_RKEY   32u /* bytes of every key */
#define KVI_RNONCE 32u /* bytes of a handshake nonce */
#define KVI_RBOOT  16u /* bytes of an owner's boot id */
#define KVI_RTAG   16u /* bytes of a MAC or GCM tag */

typedef struct kvi_rkeys {
    uint8_t space[KVI_RKEY];
    uint8_t auth[KVI_RKEY];
} kvi_rkeys;

/* The space and auth keys of (credential, space). KVT_EIO when libcrypto fails. */
int kvi_rauth_keys(const char *credential, size_t cred_len, const char *space, kvi_rkeys *out);
/* An owner's block key: its instance name and boot id. */
int kvi_rauth_block_key(const kvi_rkeys *k, const char *instance, const uint8_t boot[KVI_RBOOT],
                        uint8_t out[KVI_RKEY]);
/* A handshake proof: HMAC-SHA256(auth key, role || nr || no || instance || boot). */
int kvi_rauth_proof(const kvi_rkeys *k, const char *role, const uint8_t nr[KVI_RNONCE],
                    const uint8_t no[KVI_RNONCE], const char *instance,
                    const uint8_t boot[KVI_RBOOT], uint8_t out[KVI_RKEY]);
/* A connection's session key (MACs) and encryption key, from the handshake's nonces. */
int kvi_rauth_session(const kvi_rkeys *k, const uint8_t nr[KVI_RNONCE],
                      const uint8_t no[KVI_RNONCE], uint8_t mac_key[KVI_RKEY],
                      uint8_t enc_key[KVI_RKEY]);
/* HMAC-SHA256(key, label || msg), its first 16 bytes. */
int kvi_rauth_mac(const uint8_t key[KVI_RKEY], const char *label, const uint8_t *msg, size_t len,
                  uint8_t tag[KVI_RTAG]);
/* Constant-time equality of n bytes. */
bool kvi_rauth_equal(const void *a, const void *b, size_t n);
/* n random bytes from the kernel (getrandom); KVT_ESYS if it refuses. */
int kvi_rauth_random(void *buf, size_t n);

/* AES-256-GCM over a block, piece by piece: GMAC (no plaintext) or encryption in place or
 * into another buffer. One context per thread. */
typedef struct kvi_rgcm kvi_rgcm;
int kvi_rgcm_new(kvi_rgcm **out);
void kvi_rgcm_free(kvi_rgcm *g);
/* Starts a block: key, 12-byte nonce, and whether pieces are encrypted (1), decrypted (-1) or
 * only authenticated (0). */
int kvi_rgcm_begin(kvi_rgcm *g, const uint8_t key[KVI_RKEY], const uint8_t nonce[12], int mode);
/* Authenticated data that is not encrypted (the block hash). */
int kvi_rgcm_aad(kvi_rgcm *g, const void *p, size_t n);
/* One piece: authenticated (mode 0), or transformed from in to out (out may be in). */
int kvi_rgcm_piece(kvi_rgcm *g, const void *in, void *out, size_t n);
/* The block's tag (mode 0 and 1). */
int kvi_rgcm_tag(kvi_rgcm *g, uint8_t tag[KVI_RTAG]);
/* Whether the block's tag is `tag` (mode -1 and 0), in constant time. */
bool kvi_rgcm_check(kvi_rgcm *g, const uint8_t tag[KVI_RTAG]);

/* The nonce of a published block: slot || generation. */
void kvi_rauth_block_nonce(uint32_t slot, uint64_t generation, uint8_t nonce[12]);

#endif
