/* Two logits files (.npy, f32 [rows, vocab]) against each other: same shape, max |a - b|
 * <= TOL x max |b|, and the same argmax in every row whose top two values in b are more
 * than 2 x TOL x max |b| apart.
 * usage: compare_logits A.npy B.npy TOL     exit 0 pass, 1 fail */
#include "npy.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: compare_logits A.npy B.npy TOL\n");
        return 2;
    }
    float *a, *b;
    int64_t ar, ac, br, bc;
    char err[512];
    if (npy_read_f32(argv[1], &a, &ar, &ac, err, sizeof err) ||
        npy_read_f32(argv[2], &b, &br, &bc, err, sizeof err)) {
        fprintf(stderr, "FAIL: %s\n", err);
        return 1;
    }
    if (ar != br || ac != bc || ac < 2) {
        fprintf(stderr, "FAIL: shapes [%lld, %lld] and [%lld, %lld]\n", (long long)ar,
                (long long)ac, (long long)br, (long long)bc);
        return 1;
    }
    double tol = atof(argv[3]), maxb = 0, maxd = 0;
    for (int64_t i = 0; i < ar * ac; i++) {
        if (fabs(b[i]) > maxb) maxb = fabs(b[i]);
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= maxd)) maxd = isnan(d) ? INFINITY : d;
    }
    int bad = 0;
    for (int64_t r = 0; r < ar; r++) {
        const float *x = a + r * ac, *y = b + r * ac;
        int64_t ba = 0, bb = 0, second = -1;
        for (int64_t c = 1; c < ac; c++) {
            if (x[c] > x[ba]) ba = c;
            if (y[c] > y[bb]) bb = c;
        }
        for (int64_t c = 0; c < ac; c++)
            if (c != bb && (second < 0 || y[c] > y[second])) second = c;
        if (ba != bb && y[bb] - y[second] > 2 * tol * maxb) {
            fprintf(stderr, "  row %lld: argmax %lld against %lld\n", (long long)r, (long long)ba,
                    (long long)bb);
            bad++;
        }
    }
    printf("max |a - b| = %.3g, max |b| = %.3g, ratio %.2e (tolerance %.0e); argmax differs in "
           "%d decided rows\n",
           maxd, maxb, maxd / maxb, tol, bad);
    free(a);
    free(b);
    return maxd <= tol * maxb && !bad ? 0 : 1;
}
