/*
 * Writes the seed corpus of every fuzz target: fuzz/corpus/<target>/seed-<n>, valid messages
 * built with the public API (tests/meta/meta_samples.h). Run by `make fuzz-corpus`; the output
 * is committed so CI fuzzing starts from meaningful inputs.
 */
#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>

#include "meta/meta_samples.h"
#include "worker/link_internal.h"

static const struct {
    uint32_t kind;
    const char *name;
} targets[] = {
    {KVT_META_OFFLOAD, "offload_meta"},
    {KVT_META_OFFLOAD_WORKER, "offload_worker_meta"},
    {KVT_META_EC, "ec_meta"},
    {KVT_META_EC_WORKER, "ec_worker_meta"},
    {KVT_META_EC_LOAD_SPEC, "ec_load_spec"},
    {KVT_META_EC_PUSH_SPEC, "ec_push_spec"},
};

static int write_file(const char *path, const void *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, len, f) != len || fclose(f) != 0) {
        perror(path);
        return 1;
    }
    return 0;
}

/* Seeds of fuzz_link: selector byte, then a header, a hello and a status frame. */
static int link_seeds(const char *dir)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/link", dir);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        perror(path);
        return 1;
    }
    uint8_t buf[256];
    buf[0] = 0;
    kvt_link_hdr_encode(buf + 1, 3, 42);
    snprintf(path, sizeof(path), "%s/link/seed-0", dir);
    if (write_file(path, buf, 1 + KVT_LINK_HDR_LEN))
        return 1;
    buf[0] = 1;
    kvt_link_hello_encode(buf + 1, 1, 2, 4096);
    snprintf(path, sizeof(path), "%s/link/seed-1", dir);
    if (write_file(path, buf, 1 + KVT_LINK_HELLO_LEN))
        return 1;
    buf[0] = 2;
    uint32_t inv[3] = {7, 9, 1000};
    kvt_link_status_encode(buf + 1, 1, -12, inv, 3, "store failed", 12);
    snprintf(path, sizeof(path), "%s/link/seed-2", dir);
    return write_file(path, buf, 1 + kvt_link_status_size(3, 12));
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : "fuzz/corpus";
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        perror(dir);
        return 1;
    }
    for (size_t t = 0; t < sizeof(targets) / sizeof(targets[0]); t++) {
        char path[512];
        snprintf(path, sizeof(path), "%s/%s", dir, targets[t].name);
        if (mkdir(path, 0755) != 0 && errno != EEXIST) {
            perror(path);
            return 1;
        }
        for (int v = 0; v < 3; v++) {
            size_t len;
            unsigned char *buf = kvt_sample_encode(targets[t].kind, v, &len);
            if (!buf) {
                fprintf(stderr, "make_corpus: cannot encode %s/%d: %s\n", targets[t].name, v,
                        kvt_last_error());
                return 1;
            }
            snprintf(path, sizeof(path), "%s/%s/seed-%d", dir, targets[t].name, v);
            int rc = write_file(path, buf, len);
            free(buf);
            if (rc)
                return 1;
        }
    }
    return link_seeds(dir);
}
