// fp8 tensor-core peak through warp-level mma.sync, apart from mma.cu: the e4m3 mma needs PTX
// ISA 8.4 on sm_89/sm_90 (NVRTC 12.4 or newer), and an older NVRTC failing on it must cost
// only this kernel (the probe notes it), not the f16/bf16/tf32/int8 ones. Same method as mma.cu:
// every lane holds the same A and B values, so D = iters * CHAINS * K * a * b exactly.

#define CHAINS 4

// fp8 (e4m3) MMA exists in PTX from sm_89 on; on older targets the kernel compiles to a stub
// that writes a sentinel the host refuses (and the host never launches it there). ptxas makes it
// the native QMMA only on sm_89 and sm_120/121: on sm_90 and sm_100 it emulates it with e4m3 ->
// f16 conversions and f16 HMMAs, so the probe runs it only where it is QMMA (`mma_support`,
// checked in the SASS by kernels/tests/sass_gate.rs).
extern "C" __global__ void mma_fp8(float* out, unsigned a, unsigned b, int iters) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    float d[CHAINS][4];
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) { d[c][0] = 0.f; d[c][1] = 0.f; d[c][2] = 0.f; d[c][3] = 0.f; }
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int c = 0; c < CHAINS; ++c) {
            asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32"
                         " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                         : "+f"(d[c][0]), "+f"(d[c][1]), "+f"(d[c][2]), "+f"(d[c][3])
                         : "r"(a), "r"(a), "r"(a), "r"(a), "r"(b), "r"(b));
        }
    }
    float s = 0.f;
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) s += d[c][0] + d[c][1] + d[c][2] + d[c][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
#else
    out[blockIdx.x * blockDim.x + threadIdx.x] = -1.0f;
#endif
}

// Its layout check (as mma.cu's mma_layout_*): one warp, one mma on the host's registers.
extern "C" __global__ void mma_layout_fp8(float* out, const unsigned* a, const unsigned* b) {
    const int l = threadIdx.x;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32"
                 " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
                 : "r"(a[4 * l]), "r"(a[4 * l + 1]), "r"(a[4 * l + 2]), "r"(a[4 * l + 3]),
                   "r"(b[2 * l]), "r"(b[2 * l + 1]));
    out[4 * l] = d0; out[4 * l + 1] = d1; out[4 * l + 2] = d2; out[4 * l + 3] = d3;
#else
    out[4 * l] = -1.0f; out[4 * l + 1] = -1.0f; out[4 * l + 2] = -1.0f; out[4 * l + 3] = -1.0f;
#endif
}
