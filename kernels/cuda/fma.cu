// FMA peak per precision: every thread runs ACC independent chains x = x*a + b, UNROLL times
// per iteration, for `iters` iterations. FLOPs per thread: 2 * ACC * UNROLL * iters (f16x2 and
// bf16x2: twice that, two lanes per instruction). No headers: half types are handled as raw
// 32-bit registers through inline PTX, so NVRTC needs no include path.
// The host checks out[] against a CPU model of the same chains.

#define ACC 8
#define UNROLL 16

extern "C" __global__ void fma_f64(double* out, double a, double b, int iters) {
    const int tid = blockIdx.x * blockDim.x + threadIdx.x;
    double x[ACC];
#pragma unroll
    for (int i = 0; i < ACC; ++i) x[i] = (double)((tid + i) & 255) * (1.0 / 256.0);
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
            for (int i = 0; i < ACC; ++i) x[i] = fma(x[i], a, b);
        }
    }
    double s = 0.0;
#pragma unroll
    for (int i = 0; i < ACC; ++i) s += x[i];
    out[tid] = s;
}

extern "C" __global__ void fma_f32(float* out, float a, float b, int iters) {
    const int tid = blockIdx.x * blockDim.x + threadIdx.x;
    float x[ACC];
#pragma unroll
    for (int i = 0; i < ACC; ++i) x[i] = (float)((tid + i) & 255) * (1.0f / 256.0f);
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
            for (int i = 0; i < ACC; ++i) x[i] = fmaf(x[i], a, b);
        }
    }
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < ACC; ++i) s += x[i];
    out[tid] = s;
}

// Packed half precision: a, b and the start values are packed pairs (low lane, high lane) of
// IEEE binary16 (f16x2) or bfloat16 (bf16x2) bits. The chains' final values are written
// unreduced (out has ACC words per thread) so that the host compares every lane exactly.
#define PACKED_FMA(NAME, INSTR)                                                              \
    extern "C" __global__ void NAME(unsigned* out, const unsigned* start, unsigned a,        \
                                    unsigned b, int iters) {                                 \
        const int tid = blockIdx.x * blockDim.x + threadIdx.x;                               \
        unsigned x[ACC];                                                                     \
        _Pragma("unroll") for (int i = 0; i < ACC; ++i) x[i] = start[(tid + i) & 255];       \
        for (int it = 0; it < iters; ++it) {                                                 \
            _Pragma("unroll") for (int u = 0; u < UNROLL; ++u) {                             \
                _Pragma("unroll") for (int i = 0; i < ACC; ++i) {                            \
                    asm volatile(INSTR " %0, %0, %1, %2;" : "+r"(x[i]) : "r"(a), "r"(b));    \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
        _Pragma("unroll") for (int i = 0; i < ACC; ++i) out[tid * ACC + i] = x[i];           \
    }

PACKED_FMA(fma_f16x2, "fma.rn.f16x2")
PACKED_FMA(fma_bf16x2, "fma.rn.bf16x2")
