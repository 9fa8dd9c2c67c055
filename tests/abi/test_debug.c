/* abi/lmhost/debug.h: lmh_kv_next over settings lists (empty items, bare keys, values cut to
 * fit) and LMHOST_DEBUG lookups (whole keys only, the last of a repeated key, switches with
 * "=0"), and tests/test_debug.h's changes of single keys.
 * Exit 0 pass, 1 fail. */
#include "lmhost/debug.h"
#include "../test_debug.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fails;

static void check(int ok, const char *what) {
    if (!ok) {
        printf("FAIL %s\n", what);
        fails++;
    }
}

int main(void) {
    const char *p = ",max-memory=4G,,spin=0,profile,device=";
    char k[8], v[4];
    int n = 0;
    static const char *const keys[] = {"max-mem", "spin", "profile", "device"};
    static const char *const vals[] = {"4G", "0", "", ""};
    while (lmh_kv_next(&p, k, sizeof k, v, sizeof v)) {
        check(n < 4 && !strcmp(k, keys[n]) && !strcmp(v, vals[n]), "lmh_kv_next: items in order");
        n++;
    }
    check(n == 4, "lmh_kv_next: four items, empty ones skipped");
    check(!lmh_kv_next(&p, k, sizeof k, v, sizeof v), "lmh_kv_next: stays at the end");
    const char *none = NULL;
    check(!lmh_kv_next(&none, k, sizeof k, v, sizeof v), "lmh_kv_next: a NULL list is empty");
    p = "a=12345,b";
    check(lmh_kv_next(&p, k, sizeof k, v, sizeof v) && !strcmp(v, "123"),
          "lmh_kv_next: a value cut to fit");
    check(lmh_kv_next(&p, k, sizeof k, v, sizeof v) && !strcmp(k, "b") && !v[0],
          "lmh_kv_next: the next item after a cut value");

    char val[32];
    unsetenv("LMHOST_DEBUG");
    check(!lmh_debug_get("simd", val, sizeof val), "unset: no key");
    setenv("LMHOST_DEBUG", "vk-matvec-rows=16,simd=avx2,vk-no-fuse,vk-full-barriers=0,simd=neon",
           1);
    check(lmh_debug_get("simd", val, sizeof val) && !strcmp(val, "neon"), "the last simd counts");
    check(!lmh_debug_get("vk-matvec", val, sizeof val),
          "whole keys: vk-matvec is not vk-matvec-rows");
    check(lmh_debug_get("vk-matvec-rows", NULL, 0), "present, its value not asked for");
    check(lmh_debug_on("vk-no-fuse"), "a bare key is on");
    check(!lmh_debug_on("vk-full-barriers"), "=0 is off");
    check(!lmh_debug_on("cq-dequant"), "an absent key is off");

    test_debug_set("simd", "portable");
    check(!strcmp(getenv("LMHOST_DEBUG"),
                  "vk-matvec-rows=16,vk-no-fuse,vk-full-barriers=0,simd=portable"),
          "test_debug_set: the key replaced, the others kept");
    test_debug_set("vk-validate", "");
    test_debug_unset("vk-no-fuse");
    check(!strcmp(getenv("LMHOST_DEBUG"),
                  "vk-matvec-rows=16,vk-full-barriers=0,simd=portable,vk-validate"),
          "test_debug_set and unset: bare keys");
    char *saved = test_debug_save();
    test_debug_set("simd", "avx512");
    test_debug_restore(saved);
    check(lmh_debug_get("simd", val, sizeof val) && !strcmp(val, "portable"), "restored");
    printf(fails ? "%d checks failed\n" : "all checks passed\n", fails);
    return fails != 0;
}
