// Peer for cpu/mem/DRAM/triad: the plain OpenMP STREAM triad a = b + s*c over three arrays of
// 512 MiB each, gcc -O3 -march=native -fopenmp. Bytes counted as STREAM does (24 per element).
// Prints the best of 10 repetitions in GB/s.
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

int main(void) {
    const long n = (512L << 20) / 8;
    double *a = aligned_alloc(4096, n * 8), *b = aligned_alloc(4096, n * 8), *c = aligned_alloc(4096, n * 8);
    if (!a || !b || !c) return 1;
#pragma omp parallel for
    for (long i = 0; i < n; i++) { a[i] = 0; b[i] = 1; c[i] = 2; }
    double best = 0;
    for (int r = 0; r < 10; r++) {
        double t = omp_get_wtime();
#pragma omp parallel for
        for (long i = 0; i < n; i++) a[i] = b[i] + 3.0 * c[i];
        t = omp_get_wtime() - t;
        double gbs = 24.0 * n / t / 1e9;
        if (gbs > best) best = gbs;
    }
    for (long i = 0; i < n; i += 4096) if (a[i] != 7.0) { fprintf(stderr, "wrong result\n"); return 1; }
    printf("c_omp_triad_gbs %.2f\n", best);
    return 0;
}
