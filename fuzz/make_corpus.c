/*
 * Writes the seed corpus of every fuzz target: fuzz/corpus/<target>/seed-<n>, valid messages
 * built with the public API (tests/meta/meta_samples.h). Run by `make fuzz-corpus`; the output
 * is committed so CI fuzzing starts from meaningful inputs.
 */
#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>

#include "meta/meta_samples.h"

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
            FILE *f = fopen(path, "wb");
            if (!f || fwrite(buf, 1, len, f) != len || fclose(f) != 0) {
                perror(path);
                return 1;
            }
            free(buf);
        }
    }
    return 0;
}
