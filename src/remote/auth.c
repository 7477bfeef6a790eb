/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The remote tier's keys, MACs and block tags over OpenSSL's libcrypto (auth.h says what each
 * is for). Every libcrypto failure is KVT_EIO with a message; nothing here allocates per
 * block (one cipher context per thread, re-keyed per block).
 */
#include <errno.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "base/error.h"
#include "remote/auth.h"

static const char SALT[] = "kvtier remote v2"; /* the space key's: unchanged by version 3 */

static int cfail(const char *what)
{
    return kvt_fail(KVT_EIO, "remote: libcrypto: %s failed", what);
}

/* HKDF-SHA256: extract (salt, ikm) then expand with the info pieces, n bytes out. With no
 * salt the input is taken as the pseudorandom key already (expand only). */
static int hkdf(const void *salt, size_t salt_len, const uint8_t *ikm, size_t ikm_len,
                const void *const *info, const size_t *info_len, int n_info, uint8_t *out, size_t n)
{
    uint8_t inf[512];
    size_t il = 0;
    for (int i = 0; i < n_info; i++) {
        if (il + info_len[i] > sizeof(inf))
            return kvt_fail(KVT_EINVAL, "remote: key derivation input too long");
        memcpy(inf + il, info[i], info_len[i]);
        il += info_len[i];
    }
    EVP_KDF *kdf = EVP_KDF_fetch(NULL, "HKDF", NULL);
    EVP_KDF_CTX *c = kdf ? EVP_KDF_CTX_new(kdf) : NULL;
    EVP_KDF_free(kdf);
    if (!c)
        return cfail("HKDF");
    int mode = salt ? EVP_KDF_HKDF_MODE_EXTRACT_AND_EXPAND : EVP_KDF_HKDF_MODE_EXPAND_ONLY;
    OSSL_PARAM p[6], *q = p;
    *q++ = OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, (char *)"SHA256", 0);
    *q++ = OSSL_PARAM_construct_int(OSSL_KDF_PARAM_MODE, &mode);
    *q++ = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, (void *)ikm, ikm_len);
    if (salt)
        *q++ = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, (void *)salt, salt_len);
    *q++ = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, inf, il);
    *q = OSSL_PARAM_construct_end();
    int ok = EVP_KDF_derive(c, out, n, p) > 0;
    EVP_KDF_CTX_free(c);
    OPENSSL_cleanse(inf, sizeof(inf));
    return ok ? 0 : cfail("HKDF derive");
}

int kvi_rauth_keys(const char *credential, size_t cred_len, const char *space, kvi_rkeys *out)
{
    const void *info[2] = {"space:", space};
    size_t il[2] = {6, strlen(space)};
    int rc = hkdf(SALT, sizeof(SALT) - 1, (const uint8_t *)credential, cred_len, info, il, 2,
                  out->space, KVI_RKEY);
    if (rc)
        return rc;
    const void *ai[1] = {"auth"};
    size_t al[1] = {4};
    return hkdf(NULL, 0, out->space, KVI_RKEY, ai, al, 1, out->auth, KVI_RKEY);
}

int kvi_rauth_block_key(const kvi_rkeys *k, const char *instance, const uint8_t boot[KVI_RBOOT],
                        uint8_t out[KVI_RKEY])
{
    const void *info[3] = {"block:", boot, instance};
    size_t il[3] = {6, KVI_RBOOT, strlen(instance)};
    return hkdf(NULL, 0, k->space, KVI_RKEY, info, il, 3, out, KVI_RKEY);
}

int kvi_rauth_ephemeral(uint8_t priv[KVI_RDH], uint8_t pub[KVI_RDH])
{
    EVP_PKEY_CTX *c = EVP_PKEY_CTX_new_id(EVP_PKEY_X25519, NULL);
    EVP_PKEY *k = NULL;
    size_t pl = KVI_RDH, ql = KVI_RDH;
    bool ok = c && EVP_PKEY_keygen_init(c) > 0 && EVP_PKEY_keygen(c, &k) > 0 &&
              EVP_PKEY_get_raw_private_key(k, priv, &pl) > 0 &&
              EVP_PKEY_get_raw_public_key(k, pub, &ql) > 0 && pl == KVI_RDH && ql == KVI_RDH;
    EVP_PKEY_free(k);
    EVP_PKEY_CTX_free(c);
    return ok ? 0 : cfail("X25519 key generation");
}

/* X25519(priv, peer) into out; KVT_EINVAL when the result is all zeros (a low-order point:
 * a peer key chosen to make the secret known). */
static int x25519(const uint8_t priv[KVI_RDH], const uint8_t peer[KVI_RDH], uint8_t out[KVI_RDH])
{
    EVP_PKEY *me = EVP_PKEY_new_raw_private_key(EVP_PKEY_X25519, NULL, priv, KVI_RDH);
    EVP_PKEY *them = EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, NULL, peer, KVI_RDH);
    EVP_PKEY_CTX *c = me ? EVP_PKEY_CTX_new(me, NULL) : NULL;
    size_t n = KVI_RDH;
    bool ok = c && them && EVP_PKEY_derive_init(c) > 0 && EVP_PKEY_derive_set_peer(c, them) > 0 &&
              EVP_PKEY_derive(c, out, &n) > 0 && n == KVI_RDH;
    EVP_PKEY_CTX_free(c);
    EVP_PKEY_free(them);
    EVP_PKEY_free(me);
    if (!ok) /* OpenSSL refuses an all-zero result itself */
        return kvt_fail(KVT_EINVAL, "remote: the peer's ephemeral key gives no shared secret");
    uint8_t zero[KVI_RDH] = {0};
    if (CRYPTO_memcmp(out, zero, KVI_RDH) == 0)
        return kvt_fail(KVT_EINVAL, "remote: the peer's ephemeral key gives no shared secret");
    return 0;
}

int kvi_rauth_session(const kvi_rkeys *k, const kvi_rhs *t, const uint8_t priv[KVI_RDH],
                      const uint8_t peer[KVI_RDH], uint8_t mac_key[KVI_RKEY],
                      uint8_t enc_key[KVI_RKEY])
{
    uint8_t dh[KVI_RDH];
    int rc = x25519(priv, peer, dh);
    if (rc)
        return rc;
    /* extract with the DH secret as the salt and the auth key as the input: a key only a
     * member holding this handshake's private half can compute */
    const void *info[5] = {"session3:", t->nr, t->no, t->er, t->eo};
    size_t il[5] = {9, KVI_RNONCE, KVI_RNONCE, KVI_RDH, KVI_RDH};
    rc = hkdf(dh, sizeof(dh), k->auth, KVI_RKEY, info, il, 5, mac_key, KVI_RKEY);
    OPENSSL_cleanse(dh, sizeof(dh));
    if (rc)
        return rc;
    const void *ei[1] = {"enc"};
    size_t el[1] = {3};
    return hkdf(NULL, 0, mac_key, KVI_RKEY, ei, el, 1, enc_key, KVI_RKEY);
}

/* HMAC-SHA256 over the pieces; out receives `n` bytes of it. */
static int hmac(const uint8_t *key, const void *const *part, const size_t *len, int n_parts,
                uint8_t *out, size_t n)
{
    EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    EVP_MAC_CTX *c = mac ? EVP_MAC_CTX_new(mac) : NULL;
    EVP_MAC_free(mac);
    if (!c)
        return cfail("HMAC");
    OSSL_PARAM p[2] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)"SHA256", 0),
                       OSSL_PARAM_construct_end()};
    uint8_t full[32];
    size_t got = 0;
    int ok = EVP_MAC_init(c, key, KVI_RKEY, p) > 0;
    for (int i = 0; ok && i < n_parts; i++)
        ok = EVP_MAC_update(c, part[i], len[i]) > 0;
    ok = ok && EVP_MAC_final(c, full, &got, sizeof(full)) > 0 && got == sizeof(full);
    EVP_MAC_CTX_free(c);
    if (!ok)
        return cfail("HMAC");
    memcpy(out, full, n);
    return 0;
}

int kvi_rauth_proof(const kvi_rkeys *k, const char *role, const kvi_rhs *t, const char *instance,
                    const uint8_t boot[KVI_RBOOT], uint8_t out[KVI_RKEY])
{
    /* the role and the instance are length-prefixed: no two inputs read the same */
    uint8_t rl = (uint8_t)strlen(role), nl = (uint8_t)strlen(instance);
    const void *part[9] = {&rl, role, t->nr, t->no, t->er, t->eo, &nl, instance, boot};
    size_t len[9] = {1, rl, KVI_RNONCE, KVI_RNONCE, KVI_RDH, KVI_RDH, 1, nl, KVI_RBOOT};
    return hmac(k->auth, part, len, 9, out, KVI_RKEY);
}

int kvi_rauth_tag(const uint8_t mac_key[KVI_RKEY], uint64_t seq, uint64_t *tag)
{
    uint8_t s[8], out[8];
    for (int i = 0; i < 8; i++)
        s[i] = (uint8_t)(seq >> (8 * i));
    const void *part[2] = {"tag", s};
    size_t len[2] = {3, 8};
    int rc = hmac(mac_key, part, len, 2, out, sizeof(out));
    if (rc)
        return rc;
    *tag = 0;
    for (int i = 0; i < 8; i++)
        *tag |= (uint64_t)out[i] << (8 * i);
    return 0;
}

int kvi_rauth_mac(const uint8_t key[KVI_RKEY], const char *label, const uint8_t *msg, size_t len,
                  uint8_t tag[KVI_RTAG])
{
    uint8_t ll = (uint8_t)strlen(label);
    const void *part[3] = {&ll, label, msg};
    size_t plen[3] = {1, ll, len};
    return hmac(key, part, plen, 3, tag, KVI_RTAG);
}

bool kvi_rauth_equal(const void *a, const void *b, size_t n)
{
    return CRYPTO_memcmp(a, b, n) == 0;
}

int kvi_rauth_random(void *buf, size_t n)
{
    uint8_t *p = buf;
    while (n) {
        ssize_t got = getrandom(p, n, 0);
        if (got <= 0)
            return kvi_fail_errno(errno, "remote: getrandom");
        p += got;
        n -= (size_t)got;
    }
    return 0;
}

void kvi_rauth_block_nonce(uint32_t slot, uint64_t generation, uint8_t nonce[12])
{
    for (int i = 0; i < 4; i++)
        nonce[i] = (uint8_t)(slot >> (8 * i));
    for (int i = 0; i < 8; i++)
        nonce[4 + i] = (uint8_t)(generation >> (8 * i));
}

/* ---- block tags ------------------------------------------------------------------------------ */

struct kvi_rgcm {
    EVP_CIPHER *aes;
    EVP_CIPHER_CTX *c;
    int mode;
    bool ok; /* no libcrypto call failed since begin */
};

int kvi_rgcm_new(kvi_rgcm **out)
{
    kvi_rgcm *g = calloc(1, sizeof(*g));
    if (!g)
        return kvt_fail(KVT_ENOMEM, "remote: out of memory");
    g->aes = EVP_CIPHER_fetch(NULL, "AES-256-GCM", NULL);
    g->c = EVP_CIPHER_CTX_new();
    if (!g->aes || !g->c) {
        kvi_rgcm_free(g);
        return cfail("AES-256-GCM");
    }
    *out = g;
    return 0;
}

void kvi_rgcm_free(kvi_rgcm *g)
{
    if (!g)
        return;
    EVP_CIPHER_CTX_free(g->c);
    EVP_CIPHER_free(g->aes);
    free(g);
}

int kvi_rgcm_begin(kvi_rgcm *g, const uint8_t key[KVI_RKEY], const uint8_t nonce[12], int mode)
{
    g->mode = mode;
    g->ok = (mode < 0 ? EVP_DecryptInit_ex(g->c, g->aes, NULL, key, nonce)
                      : EVP_EncryptInit_ex(g->c, g->aes, NULL, key, nonce)) > 0;
    return g->ok ? 0 : cfail("GCM init");
}

int kvi_rgcm_aad(kvi_rgcm *g, const void *p, size_t n)
{
    int l;
    while (g->ok && n) { /* EVP takes int lengths */
        int k = n > (1u << 30) ? 1 << 30 : (int)n;
        g->ok = (g->mode < 0 ? EVP_DecryptUpdate(g->c, NULL, &l, p, k)
                             : EVP_EncryptUpdate(g->c, NULL, &l, p, k)) > 0;
        p = (const uint8_t *)p + k;
        n -= (size_t)k;
    }
    return g->ok ? 0 : cfail("GCM data");
}

int kvi_rgcm_piece(kvi_rgcm *g, const void *in, void *out, size_t n)
{
    if (g->mode == 0)
        return kvi_rgcm_aad(g, in, n);
    int l;
    while (g->ok && n) {
        int k = n > (1u << 30) ? 1 << 30 : (int)n;
        g->ok = (g->mode < 0 ? EVP_DecryptUpdate(g->c, out, &l, in, k)
                             : EVP_EncryptUpdate(g->c, out, &l, in, k)) > 0 &&
                l == k;
        in = (const uint8_t *)in + k;
        out = (uint8_t *)out + k;
        n -= (size_t)k;
    }
    return g->ok ? 0 : cfail("GCM piece");
}

int kvi_rgcm_tag(kvi_rgcm *g, uint8_t tag[KVI_RTAG])
{
    uint8_t end[16];
    int l;
    g->ok = g->ok && g->mode >= 0 && EVP_EncryptFinal_ex(g->c, end, &l) > 0 &&
            EVP_CIPHER_CTX_ctrl(g->c, EVP_CTRL_GCM_GET_TAG, KVI_RTAG, tag) > 0;
    return g->ok ? 0 : cfail("GCM tag");
}

bool kvi_rgcm_check(kvi_rgcm *g, const uint8_t tag[KVI_RTAG])
{
    if (g->mode == 0) {
        uint8_t mine[KVI_RTAG];
        return kvi_rgcm_tag(g, mine) == 0 && kvi_rauth_equal(mine, tag, KVI_RTAG);
    }
    uint8_t end[16];
    int l;
    /* DecryptFinal compares the tag in constant time */
    return g->ok && EVP_CIPHER_CTX_ctrl(g->c, EVP_CTRL_GCM_SET_TAG, KVI_RTAG, (void *)tag) > 0 &&
           EVP_DecryptFinal_ex(g->c, end, &l) > 0;
}
