/* The Vulkan backend's reading of what a SPIR-V kernel needs (backends/vulkan/vk_spirv.c):
 * shared memory and workgroup size of shaders compiled by glslangValidator at build time
 * (tests/vulkan/spirv/), and malformed modules made from them, which must be refused
 * without reading past their end (run under ASan in CI).
 * usage: test_vk_spirv PLAIN.spv SPEC.spv NONE.spv */
#include "vk_spirv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_checks, g_fail;

static void check(int ok, const char *what) {
    g_checks++;
    if (!ok) {
        g_fail++;
        fprintf(stderr, "FAIL: %s\n", what);
    }
}

static uint32_t *slurp(const char *path, size_t *bytes) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "FAIL: cannot open %s\n", path);
        exit(1);
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    uint32_t *w = malloc(n > 0 ? (size_t)n : 1);
    if (!w || n <= 0 || fread(w, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "FAIL: cannot read %s\n", path);
        exit(1);
    }
    fclose(f);
    *bytes = (size_t)n;
    return w;
}

/* The module read whole: its needs against the shader source's declarations */
static void expect(const char *path, uint64_t shared, uint32_t x, uint32_t y, uint32_t z) {
    size_t n;
    uint32_t *w = slurp(path, &n);
    vk_spirv_needs need;
    char err[160] = "", what[512];
    int rc = vk_spirv_read(w, n, &need, err, sizeof err);
    printf("%s: %llu bytes shared%s, workgroup %ux%ux%u %s\n", path,
           (unsigned long long)need.shared_bytes, need.shared_known ? "" : " (at least)",
           need.local[0], need.local[1], need.local[2], err);
    snprintf(what, sizeof what, "%s: read (%s)", path, err);
    check(rc == 0, what);
    snprintf(what, sizeof what, "%s: %llu shared bytes, want %llu", path,
             (unsigned long long)need.shared_bytes, (unsigned long long)shared);
    check(need.shared_bytes == shared && need.shared_known, what);
    snprintf(what, sizeof what, "%s: workgroup %ux%ux%u, want %ux%ux%u", path, need.local[0],
             need.local[1], need.local[2], x, y, z);
    check(need.local[0] == x && need.local[1] == y && need.local[2] == z, what);

    /* every truncation: a shorter module is read to its end, never past it, and one cut
     * inside an instruction is refused */
    int refused = 0;
    for (size_t cut = 0; cut < n; cut += 4) {
        uint32_t *t = malloc(cut ? cut : 1); /* exact size, so ASan sees any overread */
        memcpy(t, w, cut);
        refused += vk_spirv_read(t, cut, &need, err, sizeof err) != 0;
        free(t);
    }
    snprintf(what, sizeof what, "%s: truncations refused: %d of %zu", path, refused, n / 4);
    check(refused > 0, what);
    /* a header too short, the wrong magic, a zero-length instruction, one past the end */
    uint32_t *t = malloc(n);
    memcpy(t, w, n);
    check(vk_spirv_read(t, 16, &need, err, sizeof err) != 0, "a 16-byte module is refused");
    check(vk_spirv_read(t, n - 2, &need, err, sizeof err) != 0, "a partial word is refused");
    t[0] = 0x03022307u;
    check(vk_spirv_read(t, n, &need, err, sizeof err) != 0 && strstr(err, "byte order"),
          "swapped bytes are refused");
    memcpy(t, w, n);
    t[5] &= 0xffffu;
    check(vk_spirv_read(t, n, &need, err, sizeof err) != 0, "a zero-length instruction");
    memcpy(t, w, n);
    t[5] = (t[5] & 0xffffu) | 0xffff0000u;
    check(vk_spirv_read(t, n, &need, err, sizeof err) != 0 && strstr(err, "past"),
          "an instruction past the end");
    memcpy(t, w, n);
    t[3] = 0xffffffffu;
    check(vk_spirv_read(t, n, &need, err, sizeof err) != 0, "an id bound past the limit");
    /* every single-word corruption: refused or read, never a crash */
    for (size_t i = 5; i < n / 4; i++) {
        memcpy(t, w, n);
        t[i] ^= 0x00010007u ^ (uint32_t)i * 2654435761u;
        (void)vk_spirv_read(t, n, &need, err, sizeof err);
    }
    free(t);
    free(w);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: test_vk_spirv PLAIN.spv SPEC.spv NONE.spv\n");
        return 2;
    }
    /* plain.comp: float[100] 400 + vec4[10] 160 + {float, vec3} 16 + uvec2[3][2] 48 */
    expect(argv[1], 624, 64, 2, 1);
    /* spec.comp: float[48 * 2 + 1] 388 + int[48 >> 2] 48; W = 96 */
    expect(argv[2], 436, 96, 1, 1);
    expect(argv[3], 0, 256, 1, 1);
    printf("%d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
