/* Opens every model directory under argv[1] (the reference fixtures) and checks each
 * tensor against the file read independently with pread: the span matches shape x dtype
 * size, spans do not overlap, look-up by name finds it, and its data pointer shows the
 * bytes that sit at 8 + header length + begin. */
#include "model_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int cmp_begin(const void *a, const void *b) {
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    return (x->begin > y->begin) - (x->begin < y->begin);
}

static int check_model(const char *dir) {
    char err[1024] = "", path[1100];
    model_dir *md = md_open(dir, err, sizeof err);
    if (!md) {
        printf("FAIL %s: %s\n", dir, err);
        return 1;
    }
    int bad = 0;
    json_object *mt = cfg_lookup(md_config(md), "model_type");
    if (!mt || !json_object_is_type(mt, json_type_string)) {
        printf("FAIL %s: config.json has no model_type string\n", dir);
        bad++;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int fd = open(path, O_RDONLY);
    uint8_t len8[8];
    uint64_t hlen = 0;
    if (fd < 0 || pread(fd, len8, 8, 0) != 8) {
        printf("FAIL %s: cannot read the header length\n", path);
        md_close(md);
        if (fd >= 0) close(fd);
        return 1;
    }
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | len8[i];
    struct stat st;
    fstat(fd, &st);

    int32_t n = md_count(md);
    const st_tensor **v = malloc(((size_t)n + 1) * sizeof *v);
    uint64_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        const st_tensor *t = md_at(md, i);
        v[i] = t;
        uint64_t need = lmh_dtype_size(t->dtype);
        for (int d = 0; d < t->ndim; d++) need *= (uint64_t)t->ne[d];
        uint64_t span = t->end - t->begin;
        total += span;
        if (need != span || t->begin > t->end || 8 + hlen + t->end > (uint64_t)st.st_size) {
            printf("FAIL %s: tensor %s: span [%" PRIu64 ", %" PRIu64 ") for %" PRIu64 " bytes\n",
                   dir, t->name, t->begin, t->end, need);
            bad++;
            continue;
        }
        if (md_find(md, t->name) != t) {
            printf("FAIL %s: md_find(%s) does not find it\n", dir, t->name);
            bad++;
        }
        uint8_t *buf = malloc(span + 1);
        if (pread(fd, buf, span, (off_t)(8 + hlen + t->begin)) != (ssize_t)span ||
            memcmp(buf, t->data, span) != 0) {
            printf("FAIL %s: tensor %s: mapped bytes differ from the file's\n", dir, t->name);
            bad++;
        }
        free(buf);
    }
    qsort(v, (size_t)n, sizeof *v, cmp_begin);
    for (int32_t i = 1; i < n; i++)
        if (v[i]->begin < v[i - 1]->end && v[i]->end > v[i]->begin) {
            printf("FAIL %s: %s and %s overlap\n", dir, v[i - 1]->name, v[i]->name);
            bad++;
        }
    if (total != md_weight_bytes(md)) {
        printf("FAIL %s: md_weight_bytes %" PRIu64 ", tensors sum to %" PRIu64 "\n", dir,
               md_weight_bytes(md), total);
        bad++;
    }
    if (!bad) printf("ok   %s: %d tensors, %" PRIu64 " bytes\n", dir, n, total);
    free(v);
    close(fd);
    md_close(md);
    return bad != 0;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s MODELS_DIR\n", argv[0]);
        return 2;
    }
    DIR *d = opendir(argv[1]);
    if (!d) {
        perror(argv[1]);
        return 1;
    }
    int models = 0, failed = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        char dir[1024], cfg[1100];
        if (de->d_name[0] == '.') continue;
        snprintf(dir, sizeof dir, "%s/%s", argv[1], de->d_name);
        snprintf(cfg, sizeof cfg, "%s/config.json", dir);
        if (access(cfg, F_OK) != 0) continue;
        models++;
        failed += check_model(dir);
    }
    closedir(d);
    printf("%d models, %d failed\n", models, failed);
    return models == 0 || failed ? 1 : 0;
}
