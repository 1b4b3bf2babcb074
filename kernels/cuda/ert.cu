// Empirical Roofline Toolkit-style kernel: each pass reads every f32 element, applies FLOPS_PER
// dependent FMAs per element (x = x*a + b, 2*FLOPS_PER FLOPs) and writes it back: arithmetic
// intensity 2*FLOPS_PER / 8 FLOP/byte. Sweeping FLOPS_PER from 1 to 512 walks the whole roofline
// from the memory-bound side to the compute-bound side. Four independent chains per thread
// (one per lane of a 16-byte access). The host checks a sample of elements against the same
// recurrence computed with f32 fused multiply-adds.

template <int FLOPS_PER>
__device__ __forceinline__ void ert_body(float4* data, unsigned long long n, float a, float b, int reps) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (int r = 0; r < reps; ++r) {
        for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
            float4 v = data[i];
#pragma unroll
            for (int k = 0; k < FLOPS_PER; ++k) {
                v.x = fmaf(v.x, a, b);
                v.y = fmaf(v.y, a, b);
                v.z = fmaf(v.z, a, b);
                v.w = fmaf(v.w, a, b);
            }
            data[i] = v;
        }
    }
}

#define ERT(K) \
    extern "C" __global__ void ert_f32_##K(float4* data, unsigned long long n, float a, float b, int reps) { \
        ert_body<K>(data, n, a, b, reps); \
    }

ERT(1) ERT(2) ERT(4) ERT(8) ERT(16) ERT(32) ERT(64) ERT(128) ERT(256) ERT(512)
