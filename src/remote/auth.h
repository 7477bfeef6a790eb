/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The remote tier's cryptography (auth.c, OpenSSL's libcrypto): who may read a space's
 * blocks, and which bytes a reader may accept.
 *
 * Keys, all derived from the space's credential, which never leaves the process:
 *   space key   HKDF-SHA256(salt "kvtier remote v2", the credential), expanded with the space's
 *               name: a credential reused in two spaces gives two unrelated keys;
 *   auth key    expanded from the space key ("auth"): proofs of membership in handshakes;
 *   session key HKDF-SHA256(salt X25519(one side's ephemeral key, the other's), the auth key),
 *               expanded with the handshake's transcript (both 32-byte nonces, both ephemeral
 *               public keys): the MACs of one connection's requests and replies, the UCX tags
 *               of its reads (kvi_rauth_tag: a relay that sees a request cannot tell them),
 *               and, when asked, the encryption of its bytes (its own expansion, "enc"). Each
 *               side makes a fresh X25519 key pair per handshake and wipes the private half
 *               once the session keys exist: a member that recorded a handshake, or anyone
 *               who learns the credential later, cannot derive the session (forward secrecy);
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
#define KVI_RDH    32u /* bytes of an X25519 key */

/* A handshake's transcript: the reader's and the owner's nonces and ephemeral public keys. */
typedef struct kvi_rhs {
    const uint8_t *nr, *no; /* KVI_RNONCE bytes each */
    const uint8_t *er, *eo; /* KVI_RDH bytes each */
} kvi_rhs;

typedef struct kvi_rkeys {
    uint8_t space[KVI_RKEY];
    uint8_t auth[KVI_RKEY];
} kvi_rkeys;

/* The space and auth keys of (credential, space). KVT_EIO when libcrypto fails. */
int kvi_rauth_keys(const char *credential, size_t cred_len, const char *space, kvi_rkeys *out);
/* An owner's block key: its instance name and boot id. */
int kvi_rauth_block_key(const kvi_rkeys *k, const char *instance, const uint8_t boot[KVI_RBOOT],
                        uint8_t out[KVI_RKEY]);
/* A fresh X25519 key pair for one handshake. */
int kvi_rauth_ephemeral(uint8_t priv[KVI_RDH], uint8_t pub[KVI_RDH]);
/* A handshake proof: HMAC-SHA256(auth key, role || nr || no || er || eo || instance || boot):
 * the owner's proves it holds the credential and binds both ephemeral keys (a relay that
 * swaps either key fails it). */
int kvi_rauth_proof(const kvi_rkeys *k, const char *role, const kvi_rhs *t, const char *instance,
                    const uint8_t boot[KVI_RBOOT], uint8_t out[KVI_RKEY]);
/* A connection's session key (MACs, tags) and encryption key: this side's ephemeral private
 * key with the peer's public one, and the transcript. KVT_EINVAL for a peer key that gives no
 * secret (a low-order point). */
int kvi_rauth_session(const kvi_rkeys *k, const kvi_rhs *t, const uint8_t priv[KVI_RDH],
                      const uint8_t peer[KVI_RDH], uint8_t mac_key[KVI_RKEY],
                      uint8_t enc_key[KVI_RKEY]);
/* The base UCX tag of request seq of a session (HMAC(mac_key, "tag" || seq), its first 8
 * bytes): both sides compute it; it never travels before the owner's sends do. */
int kvi_rauth_tag(const uint8_t mac_key[KVI_RKEY], uint64_t seq, uint64_t *tag);
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
