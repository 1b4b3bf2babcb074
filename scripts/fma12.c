// Peer for cpu/fma/{f32,f64}/t1: 12 independent _mm512_fmadd chains, gcc -O3 -march=native.
// Usage: fma12 [seconds]   Prints GFLOP/s for f32 and f64 (best of 5 runs).
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

#define CHAINS(T, FMA, SET1, ADD, RED)                                          \
    T x0 = SET1(a0), x1 = SET1(a0 + 1), x2 = SET1(a0 + 2), x3 = SET1(a0 + 3),   \
      x4 = SET1(a0 + 4), x5 = SET1(a0 + 5), x6 = SET1(a0 + 6), x7 = SET1(a0 + 7), \
      x8 = SET1(a0 + 8), x9 = SET1(a0 + 9), x10 = SET1(a0 + 10), x11 = SET1(a0 + 11); \
    T va = SET1(a), vb = SET1(b);                                                \
    for (long i = 0; i < n; i++) {                                              \
        x0 = FMA(x0, va, vb); x1 = FMA(x1, va, vb); x2 = FMA(x2, va, vb);       \
        x3 = FMA(x3, va, vb); x4 = FMA(x4, va, vb); x5 = FMA(x5, va, vb);       \
        x6 = FMA(x6, va, vb); x7 = FMA(x7, va, vb); x8 = FMA(x8, va, vb);       \
        x9 = FMA(x9, va, vb); x10 = FMA(x10, va, vb); x11 = FMA(x11, va, vb);   \
    }                                                                           \
    T s = ADD(ADD(ADD(x0, x1), ADD(x2, x3)), ADD(ADD(x4, x5), ADD(x6, x7)));   \
    s = ADD(s, ADD(ADD(x8, x9), ADD(x10, x11)));                                \
    return RED(s);

__attribute__((noinline)) float run_ps(long n, float a, float b, float a0) {
    CHAINS(__m512, _mm512_fmadd_ps, _mm512_set1_ps, _mm512_add_ps, _mm512_reduce_add_ps)
}
__attribute__((noinline)) double run_pd(long n, double a, double b, double a0) {
    CHAINS(__m512d, _mm512_fmadd_pd, _mm512_set1_pd, _mm512_add_pd, _mm512_reduce_add_pd)
}

int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 0.5;
    // Inputs from the command line's length so the compiler cannot fold the chains.
    float a = 0.999f + 1e-6f * argc, b = 0.001f;
    long n = 1000000;
    double best_s = 0, best_d = 0, sink = 0;
    for (int r = 0; r < 5; r++) {
        double t = now();
        long it = 0;
        while (now() - t < secs) { sink += run_ps(n, a, b, 1.0f); it += n; }
        double g = 12.0 * 16 * 2 * it / (now() - t) / 1e9;
        if (g > best_s) best_s = g;
        t = now(); it = 0;
        while (now() - t < secs) { sink += run_pd(n, a, b, 1.0); it += n; }
        g = 12.0 * 8 * 2 * it / (now() - t) / 1e9;
        if (g > best_d) best_d = g;
    }
    printf("c_fma12_f32_gflops %.2f\nc_fma12_f64_gflops %.2f\n", best_s, best_d);
    return sink == 12345.0;
}
