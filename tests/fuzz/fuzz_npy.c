/* libFuzzer target: the .npy reader (check-plugin reads authors' reference files with it)
 * on the input as a whole file, through a memfd. Accepted arrays must fit the input.
 * (tests/fuzz/run_fuzzers.sh SECONDS builds and runs it with its corpus.) */
#include "npy.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int fd = memfd_create("npy", 0);
    if (fd < 0 || write(fd, data, size) != (ssize_t)size) abort();
    char path[64], err[512] = "";
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    float *d = NULL;
    int nd = 0;
    int64_t ne[4], rows, cols;
    if (npy_read_f32_nd(path, &d, &nd, ne, err, sizeof err) == 0) {
        uint64_t n = 1;
        for (int i = 0; i < nd; i++) {
            if (ne[i] <= 0) abort();
            n *= (uint64_t)ne[i];
        }
        if (nd < 2 || nd > 4 || n * 4 > size) abort(); /* the data came from the input */
        free(d);
    } else if (!err[0]) {
        abort(); /* every refusal says why */
    }
    d = NULL;
    if (npy_read_f32(path, &d, &rows, &cols, err, sizeof err) == 0) {
        if (rows <= 0 || cols <= 0 || (uint64_t)rows * (uint64_t)cols * 4 > size) abort();
        free(d);
    }
    close(fd);
    return 0;
}
