// Tensor-core peak through warp-level mma.sync. Every lane holds the same A and B element
// values (a and b, packed as the instruction's register format), so D = iters * CHAINS * K * a * b
// whatever the fragment layout: the host checks every lane's sum exactly (a = 1, b = a power of
// two). Per warp and iteration: CHAINS independent MMAs of 2*M*N*K operations each.
// Note: on sm_90, mma.sync reaches only part of the dense peak (wgmma.cu measures all of it);
// the probe's method text says so.
//
// Because that check holds whatever the fragment layout, each kernel has a layout check beside
// it (mma_layout_*): one mma of the same instruction on registers the host filled from
// matrices of distinct small values by PTX's fragment layouts (probe/gpu/mma_layout.rs), every
// lane's four D elements written out for the host to compare with A x B in f64. A wrong
// fragment, packing or transposition changes that product.

#define CHAINS 4

#define MMA_F32ACC(NAME, SHAPE_TYPES)                                                          \
    extern "C" __global__ void NAME(float* out, unsigned a, unsigned b, int iters) {           \
        float d[CHAINS][4];                                                                    \
        _Pragma("unroll") for (int c = 0; c < CHAINS; ++c) {                                   \
            d[c][0] = 0.f; d[c][1] = 0.f; d[c][2] = 0.f; d[c][3] = 0.f;                        \
        }                                                                                      \
        for (int it = 0; it < iters; ++it) {                                                   \
            _Pragma("unroll") for (int c = 0; c < CHAINS; ++c) {                               \
                asm volatile("mma.sync.aligned." SHAPE_TYPES                                   \
                             " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"          \
                             : "+f"(d[c][0]), "+f"(d[c][1]), "+f"(d[c][2]), "+f"(d[c][3])      \
                             : "r"(a), "r"(a), "r"(a), "r"(a), "r"(b), "r"(b));                \
            }                                                                                  \
        }                                                                                      \
        float s = 0.f;                                                                         \
        _Pragma("unroll") for (int c = 0; c < CHAINS; ++c) s += d[c][0] + d[c][1] + d[c][2] + d[c][3]; \
        out[blockIdx.x * blockDim.x + threadIdx.x] = s;                                        \
    }

MMA_F32ACC(mma_f16, "m16n8k16.row.col.f32.f16.f16.f32")
MMA_F32ACC(mma_bf16, "m16n8k16.row.col.f32.bf16.bf16.f32")
MMA_F32ACC(mma_tf32, "m16n8k8.row.col.f32.tf32.tf32.f32")

extern "C" __global__ void mma_int8(int* out, unsigned a, unsigned b, int iters) {
    int d[CHAINS][4];
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) { d[c][0] = 0; d[c][1] = 0; d[c][2] = 0; d[c][3] = 0; }
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int c = 0; c < CHAINS; ++c) {
            asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32"
                         " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                         : "+r"(d[c][0]), "+r"(d[c][1]), "+r"(d[c][2]), "+r"(d[c][3])
                         : "r"(a), "r"(a), "r"(a), "r"(a), "r"(b), "r"(b));
        }
    }
    int s = 0;
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) s += d[c][0] + d[c][1] + d[c][2] + d[c][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

// The layout checks: one warp; a holds each lane's four A registers, b its two B registers;
// out each lane's four D elements.
#define MMA_LAYOUT(NAME, SHAPE_TYPES, T, C, ZERO)                                              \
    extern "C" __global__ void NAME(T* out, const unsigned* a, const unsigned* b) {           \
        const int l = threadIdx.x;                                                             \
        T d0 = ZERO, d1 = ZERO, d2 = ZERO, d3 = ZERO;                                          \
        asm volatile("mma.sync.aligned." SHAPE_TYPES                                           \
                     " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"                  \
                     : "+" C(d0), "+" C(d1), "+" C(d2), "+" C(d3)                              \
                     : "r"(a[4 * l]), "r"(a[4 * l + 1]), "r"(a[4 * l + 2]), "r"(a[4 * l + 3]), \
                       "r"(b[2 * l]), "r"(b[2 * l + 1]));                                      \
        out[4 * l] = d0; out[4 * l + 1] = d1; out[4 * l + 2] = d2; out[4 * l + 3] = d3;        \
    }

MMA_LAYOUT(mma_layout_f16, "m16n8k16.row.col.f32.f16.f16.f32", float, "f", 0.f)
MMA_LAYOUT(mma_layout_bf16, "m16n8k16.row.col.f32.bf16.bf16.f32", float, "f", 0.f)
MMA_LAYOUT(mma_layout_tf32, "m16n8k8.row.col.f32.tf32.tf32.f32", float, "f", 0.f)
MMA_LAYOUT(mma_layout_int8, "m16n8k32.row.col.s32.s8.s8.s32", int, "r", 0)
