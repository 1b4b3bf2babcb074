// The embedded trainer's own kernels (the convolutions are cuDNN's and the classifier cuBLAS's):
// batch-norm statistics and application, ReLU masks, residual adds, pooling, bias, the softmax
// cross-entropy, SGD with momentum and weight decay, the finite check for loss scaling, and the
// f32 <-> f16/bf16 casts of mixed precision. Tensors are NHWC (channel = index % c), sizes are
// 64-bit, every loop is grid-stride, so any grid size is correct. No headers: the half
// conversions are inline PTX. Each kernel mirrors a CPU function of `workloads/nn/src/layers` or
// `train`, and the GPU self-test compares the two. Batch norm's statistics stay on the
// device: a training step on one GPU makes no host round trip for them.
//
// Activations are stored in f32, or in 16 bits (f16 or bf16) in mixed precision: the kernels
// that read or write them are templates over the storage type, read it into f32 registers,
// compute in f32 (with f32 parameters and statistics) and round to nearest even when they
// write. STORAGE_TYPES instantiates each as <kernel>_f32, <kernel>_f16 and <kernel>_bf16.

typedef unsigned long long u64;

#define GRID_STRIDE(i, n)                                                                      \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                          \
         i += (u64)gridDim.x * blockDim.x)

// The 16-bit storage types: IEEE half (h16) and bfloat16 (b16), as their bits.
struct h16 {
    unsigned short v;
};
struct b16 {
    unsigned short v;
};

__device__ __forceinline__ float ld(const float* p, u64 i) { return p[i]; }
__device__ __forceinline__ float ld(const h16* p, u64 i) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(p[i].v));
    return f;
}
__device__ __forceinline__ float ld(const b16* p, u64 i) {
    return __uint_as_float(((unsigned)p[i].v) << 16);
}
__device__ __forceinline__ void st(float* p, u64 i, float x) { p[i] = x; }
__device__ __forceinline__ void st(h16* p, u64 i, float x) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    p[i].v = h;
}
__device__ __forceinline__ void st(b16* p, u64 i, float x) {
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
    p[i].v = h;
}

// K(suffix, type) for each storage type: one entry point per type.
#define STORAGE_TYPES(K) K(f32, float) K(f16, h16) K(bf16, b16)

// The channel of this thread's first element of a grid-stride loop over c channels, `per`
// values a thread (1, or a pack's), and what the loop's stride adds to it (mod c): the channel
// follows the index with no 64-bit division per element.
__device__ __forceinline__ int first_channel(int c, int per) {
    return (int)((((u64)blockIdx.x * blockDim.x + threadIdx.x) * per) % (u64)c);
}
__device__ __forceinline__ int channel_step(int c, int per) {
    return (int)(((u64)gridDim.x * blockDim.x * per) % (u64)c);
}
__device__ __forceinline__ int next_channel(int ch, int step, int c) {
    ch += step;
    return ch >= c ? ch - c : ch;
}

// 16 bytes of a tensor at a time, in f32 registers: 4 f32 or 8 16-bit values (pack_of<T>::n),
// from element i, a multiple of that (so 16-byte aligned in a 256-byte aligned buffer). A
// streaming kernel needs the bytes in flight: one 16-byte load per thread carries 8 times what
// a 2-byte one does.
template <class T>
struct pack_of {
    static const int n = 8;
};
template <>
struct pack_of<float> {
    static const int n = 4;
};

__device__ __forceinline__ void halves(unsigned w, const b16*, float& a, float& b) {
    a = __uint_as_float(w << 16);
    b = __uint_as_float(w & 0xffff0000u);
}
__device__ __forceinline__ void halves(unsigned w, const h16*, float& a, float& b) {
    const unsigned short lo = (unsigned short)(w & 0xffffu), hi = (unsigned short)(w >> 16);
    asm("cvt.f32.f16 %0, %1;" : "=f"(a) : "h"(lo));
    asm("cvt.f32.f16 %0, %1;" : "=f"(b) : "h"(hi));
}
__device__ __forceinline__ unsigned bits_of(float x, const b16*) {
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}
__device__ __forceinline__ unsigned bits_of(float x, const h16*) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}

__device__ __forceinline__ void ldv(const float* p, u64 i, float* f) {
    const uint4 u = *reinterpret_cast<const uint4*>(p + i);
    f[0] = __uint_as_float(u.x);
    f[1] = __uint_as_float(u.y);
    f[2] = __uint_as_float(u.z);
    f[3] = __uint_as_float(u.w);
}
template <class T>
__device__ __forceinline__ void ldv(const T* p, u64 i, float* f) {
    const uint4 u = *reinterpret_cast<const uint4*>(p + i);
    halves(u.x, p, f[0], f[1]);
    halves(u.y, p, f[2], f[3]);
    halves(u.z, p, f[4], f[5]);
    halves(u.w, p, f[6], f[7]);
}
__device__ __forceinline__ void stv(float* p, u64 i, const float* f) {
    *reinterpret_cast<uint4*>(p + i) = make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]),
                                                  __float_as_uint(f[2]), __float_as_uint(f[3]));
}
template <class T>
__device__ __forceinline__ void stv(T* p, u64 i, const float* f) {
    const T* q = p;
    *reinterpret_cast<uint4*>(p + i) = make_uint4(bits_of(f[0], q) | (bits_of(f[1], q) << 16),
                                                  bits_of(f[2], q) | (bits_of(f[3], q) << 16),
                                                  bits_of(f[4], q) | (bits_of(f[5], q) << 16),
                                                  bits_of(f[6], q) | (bits_of(f[7], q) << 16));
}

// Per-channel sums over the rows of an NHWC tensor, accumulated in f64 and added into s1, s2
// (zeroed by the caller): s1 += g, s2 += g * b, with g = a masked by mask > 0 (when mask is not
// null) and b = a when b is null. Blocks of 256 threads: 32 channels by 8 rows. Block i covers
// channel tile i % tiles (tiles = ceil(c / 32)) and strides over the rows from slice i / tiles
// (gridDim.x must be a multiple of tiles).
template <class T>
__device__ __forceinline__ void bn_sums_k(const T* a, const T* b, const T* mask, u64 rows, int c,
                                          int tiles, double* s1, double* s2) {
    __shared__ double p1[8][33];
    __shared__ double p2[8][33];
    const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    const int ch = (blockIdx.x % tiles) * 32 + tx;
    const u64 slice = blockIdx.x / tiles, slices = gridDim.x / tiles;
    double q1 = 0.0, q2 = 0.0;
    if (ch < c) {
        for (u64 r = slice * 8 + ty; r < rows; r += slices * 8) {
            const u64 i = r * (u64)c + ch;
            const float v = ld(a, i);
            const float g = (mask != 0 && !(ld(mask, i) > 0.0f)) ? 0.0f : v;
            const float w = b != 0 ? ld(b, i) : v;
            q1 += (double)g;
            q2 += (double)g * (double)w;
        }
    }
    p1[ty][tx] = q1;
    p2[ty][tx] = q2;
    __syncthreads();
    if (ty == 0 && ch < c) {
        double t1 = 0.0, t2 = 0.0;
        for (int k = 0; k < 8; ++k) {
            t1 += p1[k][tx];
            t2 += p2[k][tx];
        }
        atomicAdd(&s1[ch], t1);
        atomicAdd(&s2[ch], t2);
    }
}
#define BN_SUMS(S, T)                                                                          \
    extern "C" __global__ void bn_sums_##S(const T* a, const T* b, const T* mask, u64 rows,     \
                                           int c, int tiles, double* s1, double* s2) {         \
        bn_sums_k(a, b, mask, rows, c, tiles, s1, s2);                                         \
    }
STORAGE_TYPES(BN_SUMS)

// bn_sums by 16-byte packs (c a multiple of 8): a block covers a tile of cp = min(c / V, 32)
// packs (V = pack_of<T>::n channels each) and R = blockDim.x / cp rows at a time, each thread
// one pack of one row; the rows' partial sums meet in shared memory and one thread per channel
// adds them to s1, s2. Block i covers tile i % tiles (tiles = ceil(c / (V·cp))) and strides
// over the rows from slice i / tiles (gridDim.x a multiple of tiles). The same sums as
// bn_sums, in another order.
template <class T>
__device__ __forceinline__ void bn_sums_vk(const T* a, const T* b, const T* mask, u64 rows,
                                           int c, int tiles, double* s1, double* s2) {
    const int V = pack_of<T>::n;
    __shared__ double p1[2048];
    __shared__ double p2[2048];
    const int packs = c / V;
    const int cp = packs < 32 ? packs : 32;
    const int R = blockDim.x / cp;
    const int tx = threadIdx.x % cp, ty = threadIdx.x / cp;
    const int tile = blockIdx.x % tiles;
    const int pack = tile * cp + tx;
    const u64 slice = blockIdx.x / tiles, slices = gridDim.x / tiles;
    double q1[8], q2[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) q1[k] = q2[k] = 0.0;
    if (ty < R && pack < packs) {
        for (u64 r = slice * R + ty; r < rows; r += slices * R) {
            const u64 i = r * (u64)c + (u64)pack * V;
            float v[8], w[8], m[8];
            ldv(a, i, v);
            if (b != 0) ldv(b, i, w);
            if (mask != 0) ldv(mask, i, m);
#pragma unroll
            for (int k = 0; k < V; ++k) {
                const float g = (mask != 0 && !(m[k] > 0.0f)) ? 0.0f : v[k];
                q1[k] += (double)g;
                q2[k] += (double)g * (double)(b != 0 ? w[k] : v[k]);
            }
        }
    }
    const int width = cp * V;
    if (ty < R) {
#pragma unroll
        for (int k = 0; k < V; ++k) {
            p1[ty * width + tx * V + k] = q1[k];
            p2[ty * width + tx * V + k] = q2[k];
        }
    }
    __syncthreads();
    const int j = threadIdx.x;
    const int ch = tile * width + j;
    if (j < width && ch < c) {
        double t1 = 0.0, t2 = 0.0;
        for (int r = 0; r < R; ++r) {
            t1 += p1[r * width + j];
            t2 += p2[r * width + j];
        }
        atomicAdd(&s1[ch], t1);
        atomicAdd(&s2[ch], t2);
    }
}
#define BN_SUMS_V(S, T)                                                                        \
    extern "C" __global__ void bn_sums_v_##S(const T* a, const T* b, const T* mask, u64 rows,   \
                                             int c, int tiles, double* s1, double* s2) {       \
        bn_sums_vk(a, b, mask, rows, c, tiles, s1, s2);                                        \
    }
STORAGE_TYPES(BN_SUMS_V)

// Batch norm's statistics on the device, from the per-channel f64 sums s = [Σx | Σx²] over
// the global batch's m rows, as the CPU's batch_statistics: stats = [mean | 1/σ], rounded once
// to f32; running = [mean | var] (f32) moves by momentum towards the mean and the unbiased
// variance. One thread per channel. The f64 arithmetic is spelled with _rn intrinsics so that
// nothing is contracted into a multiply-add: the results equal the CPU's bit for bit.
extern "C" __global__ void bn_stats(const double* s, double m, double eps, double momentum,
                                    float* stats, float* running, int c) {
    GRID_STRIDE(j, (u64)c) {
        const double mu = __ddiv_rn(s[j], m);
        double var = __dsub_rn(__ddiv_rn(s[c + j], m), __dmul_rn(mu, mu));
        var = var > 0.0 ? var : 0.0;
        const double unbiased = m > 1.0 ? __ddiv_rn(__dmul_rn(var, m), __dsub_rn(m, 1.0)) : var;
        const double keep = __dsub_rn(1.0, momentum);
        running[j] = (float)__dadd_rn(__dmul_rn(keep, (double)running[j]), __dmul_rn(momentum, mu));
        running[c + j] = (float)__dadd_rn(__dmul_rn(keep, (double)running[c + j]),
                                          __dmul_rn(momentum, unbiased));
        stats[j] = (float)mu;
        stats[c + j] = (float)__ddiv_rn(1.0, __dsqrt_rn(__dadd_rn(var, eps)));
    }
}

// Inference statistics from the running ones (running_statistics on the CPU): stats = [running
// mean | 1/σ of the running variance].
extern "C" __global__ void bn_running_stats(const float* running, double eps, float* stats,
                                            int c) {
    GRID_STRIDE(j, (u64)c) {
        stats[j] = running[j];
        stats[c + j] = (float)__ddiv_rn(1.0, __dsqrt_rn(__dadd_rn((double)running[c + j], eps)));
    }
}

// Batch norm's backward coefficients on the device, from the f64 sums s = [Σg | Σg·x] over the
// global batch's m rows and stats = [mean | 1/σ], as the CPU's backward_coefficients: the γ and
// β gradients (Σg·x̂ = (Σg·x − μΣg)/σ, and Σg), each times `share` (this rank's share: the
// gradient allreduce sums them back), written into the flat gradients; coef = [mean of g |
// mean of g·x̂] for bn_backward_dx.
extern "C" __global__ void bn_backward_coefficients(const double* s, const float* stats, double m,
                                                    double share, float* dgamma, float* dbeta,
                                                    float* coef, int c) {
    GRID_STRIDE(j, (u64)c) {
        const double dg =
            __dmul_rn(__dsub_rn(s[c + j], __dmul_rn((double)stats[j], s[j])), (double)stats[c + j]);
        dgamma[j] = (float)__dmul_rn(dg, share);
        dbeta[j] = (float)__dmul_rn(s[j], share);
        coef[j] = (float)__ddiv_rn(s[j], m);
        coef[c + j] = (float)__ddiv_rn(dg, m);
    }
}

// Batch norm folded to one scale and shift per channel, a = gamma * inv, d = beta - mean * a
// (in f32, as on the CPU): y = x * a + d, plus the residual s[i] when s is not null (a block's
// end: bn3, the shortcut's sum and the ReLU in one pass), then ReLU when relu != 0.
// bn_value is one value of it, which the scalar and the pack kernels share (the same bits).
__device__ __forceinline__ float bn_value(float x, bool residual, float r, const float* gamma,
                                          const float* beta, const float* mean,
                                          const float* inv, int ch, int relu) {
    const float a = gamma[ch] * inv[ch];
    const float d = beta[ch] - mean[ch] * a;
    float t = x * a + d;
    if (residual) t += r;
    return (relu != 0 && t < 0.0f) ? 0.0f : t;
}
template <class T>
__device__ __forceinline__ void bn_apply_k(const T* x, T* y, const float* gamma,
                                           const float* beta, const float* mean, const float* inv,
                                           const T* s, u64 n, int c, int relu) {
    const int step = channel_step(c, 1);
    int ch = first_channel(c, 1);
    GRID_STRIDE(i, n) {
        const float r = s != 0 ? ld(s, i) : 0.0f;
        st(y, i, bn_value(ld(x, i), s != 0, r, gamma, beta, mean, inv, ch, relu));
        ch = next_channel(ch, step, c);
    }
}
#define BN_APPLY(S, T)                                                                         \
    extern "C" __global__ void bn_apply_##S(const T* x, T* y, const float* gamma,               \
                                            const float* beta, const float* mean,              \
                                            const float* inv, const T* s, u64 n, int c,        \
                                            int relu) {                                        \
        bn_apply_k(x, y, gamma, beta, mean, inv, s, n, c, relu);                               \
    }
STORAGE_TYPES(BN_APPLY)

// Batch norm's input gradient: g = dy masked by mask > 0 (the fused ReLU; none when mask is
// null), h = (x - mean) * inv, dx = gamma * inv * (g - mdb - h * mdg), all per channel (mdb,
// mdg: the means of dy and of dy * h over the global batch). With a mask and masked_out not
// null, masked_out (dy's own buffer) is zeroed where the mask is off, which leaves dy masked
// in place: a block's end, whose shortcut takes the masked gradient, needs no pass of its own
// to apply the ReLU's mask. bn_dx_value is one value of it, shared by the scalar and the pack
// kernels.
__device__ __forceinline__ float bn_dx_value(float g, float x, const float* gamma,
                                             const float* mean, const float* inv,
                                             const float* mdb, const float* mdg, int ch) {
    const float h = (x - mean[ch]) * inv[ch];
    return gamma[ch] * inv[ch] * (g - mdb[ch] - h * mdg[ch]);
}
template <class T>
__device__ __forceinline__ void bn_backward_dx_k(const T* dy, const T* x, const T* mask, T* dx,
                                                 T* masked_out, const float* gamma,
                                                 const float* mean, const float* inv,
                                                 const float* mdb, const float* mdg, u64 n,
                                                 int c) {
    const int step = channel_step(c, 1);
    int ch = first_channel(c, 1);
    GRID_STRIDE(i, n) {
        float g = ld(dy, i);
        if (mask != 0 && !(ld(mask, i) > 0.0f)) {
            g = 0.0f;
            if (masked_out != 0) st(masked_out, i, 0.0f);
        }
        st(dx, i, bn_dx_value(g, ld(x, i), gamma, mean, inv, mdb, mdg, ch));
        ch = next_channel(ch, step, c);
    }
}
#define BN_BACKWARD_DX(S, T)                                                                   \
    extern "C" __global__ void bn_backward_dx_##S(                                             \
        const T* dy, const T* x, const T* mask, T* dx, T* masked_out, const float* gamma,      \
        const float* mean, const float* inv, const float* mdb, const float* mdg, u64 n,        \
        int c) {                                                                               \
        bn_backward_dx_k(dy, x, mask, dx, masked_out, gamma, mean, inv, mdb, mdg, n, c);       \
    }
STORAGE_TYPES(BN_BACKWARD_DX)

// bn_apply and bn_backward_dx a pack at a time (c a multiple of 8, so a pack's values are
// consecutive channels of one row): the same operations on each value as the scalar kernels,
// so the same bits. The grid strides over the n / pack_of<T>::n packs.
template <class T>
__device__ __forceinline__ void bn_apply_vk(const T* x, T* y, const float* gamma,
                                            const float* beta, const float* mean,
                                            const float* inv, const T* s, u64 n, int c,
                                            int relu) {
    const int V = pack_of<T>::n;
    const int step = channel_step(c, V);
    int ch = first_channel(c, V);
    GRID_STRIDE(p, n / V) {
        const u64 i = p * V;
        float v[8], r[8];
        ldv(x, i, v);
        if (s != 0) ldv(s, i, r);
#pragma unroll
        for (int k = 0; k < V; ++k) {
            const float rk = s != 0 ? r[k] : 0.0f;
            v[k] = bn_value(v[k], s != 0, rk, gamma, beta, mean, inv, ch + k, relu);
        }
        stv(y, i, v);
        ch = next_channel(ch, step, c);
    }
}
#define BN_APPLY_V(S, T)                                                                       \
    extern "C" __global__ void bn_apply_v_##S(const T* x, T* y, const float* gamma,             \
                                              const float* beta, const float* mean,            \
                                              const float* inv, const T* s, u64 n, int c,      \
                                              int relu) {                                      \
        bn_apply_vk(x, y, gamma, beta, mean, inv, s, n, c, relu);                              \
    }
STORAGE_TYPES(BN_APPLY_V)

template <class T>
__device__ __forceinline__ void bn_backward_dx_vk(const T* dy, const T* x, const T* mask, T* dx,
                                                  T* masked_out, const float* gamma,
                                                  const float* mean, const float* inv,
                                                  const float* mdb, const float* mdg, u64 n,
                                                  int c) {
    const int V = pack_of<T>::n;
    const int step = channel_step(c, V);
    int ch = first_channel(c, V);
    GRID_STRIDE(p, n / V) {
        const u64 i = p * V;
        float g[8], xv[8], m[8];
        ldv(dy, i, g);
        ldv(x, i, xv);
        bool masked = false;
        if (mask != 0) {
            ldv(mask, i, m);
#pragma unroll
            for (int k = 0; k < V; ++k) {
                if (!(m[k] > 0.0f)) {
                    g[k] = 0.0f;
                    masked = true;
                }
            }
        }
        if (masked && masked_out != 0) stv(masked_out, i, g);
#pragma unroll
        for (int k = 0; k < V; ++k) {
            xv[k] = bn_dx_value(g[k], xv[k], gamma, mean, inv, mdb, mdg, ch + k);
        }
        stv(dx, i, xv);
        ch = next_channel(ch, step, c);
    }
}
#define BN_BACKWARD_DX_V(S, T)                                                                 \
    extern "C" __global__ void bn_backward_dx_v_##S(                                           \
        const T* dy, const T* x, const T* mask, T* dx, T* masked_out, const float* gamma,      \
        const float* mean, const float* inv, const float* mdb, const float* mdg, u64 n,        \
        int c) {                                                                               \
        bn_backward_dx_vk(dy, x, mask, dx, masked_out, gamma, mean, inv, mdb, mdg, n, c);      \
    }
STORAGE_TYPES(BN_BACKWARD_DX_V)

// y = max(y, 0) in place (the detector heads' activations; NaN becomes 0, as on the CPU).
extern "C" __global__ void relu(float* y, u64 n) {
    GRID_STRIDE(i, n) {
        if (!(y[i] > 0.0f)) y[i] = 0.0f;
    }
}

// d = 0 where the forward output y was not positive (ReLU backward, in place).
template <class T>
__device__ __forceinline__ void relu_mask_k(const T* y, T* d, u64 n) {
    GRID_STRIDE(i, n) {
        if (!(ld(y, i) > 0.0f)) st(d, i, 0.0f);
    }
}
#define RELU_MASK(S, T)                                                                        \
    extern "C" __global__ void relu_mask_##S(const T* y, T* d, u64 n) { relu_mask_k(y, d, n); }
STORAGE_TYPES(RELU_MASK)

// y += s.
template <class T>
__device__ __forceinline__ void add_into_k(T* y, const T* s, u64 n) {
    GRID_STRIDE(i, n) { st(y, i, ld(y, i) + ld(s, i)); }
}
#define ADD_INTO(S, T)                                                                         \
    extern "C" __global__ void add_into_##S(T* y, const T* s, u64 n) { add_into_k(y, s, n); }
STORAGE_TYPES(ADD_INTO)

// Max pooling 3x3, stride 2, padding 1, NHWC; tap holds each output's winning tap, ky * 3 + kx
// (the first maximum in window order, as on the CPU): a byte, where an input index took four.
template <class T>
__device__ __forceinline__ void maxpool_forward_k(const T* x, T* y, unsigned char* tap, int n,
                                                  int h, int w, int c, int oh, int ow) {
    const u64 total = (u64)n * oh * ow * c;
    GRID_STRIDE(o, total) {
        const int ch = (int)(o % c);
        const u64 p = o / c;
        const int ox = (int)(p % ow);
        const int oy = (int)((p / ow) % oh);
        const int img = (int)(p / ((u64)ow * oh));
        const T* xi = x + (u64)img * h * w * c;
        float best = 0.0f;
        int at = 9, found = 0;
        for (int ky = 0; ky < 3; ++ky) {
            const int iy = oy * 2 + ky - 1;
            if (iy < 0 || iy >= h) continue;
            for (int kx = 0; kx < 3; ++kx) {
                const int ix = ox * 2 + kx - 1;
                if (ix < 0 || ix >= w) continue;
                const float v = ld(xi, (u64)(iy * w + ix) * c + ch);
                if (!found || v > best) {
                    best = v;
                    at = ky * 3 + kx;
                    found = 1;
                }
            }
        }
        st(y, o, best);
        tap[o] = (unsigned char)at;
    }
}
#define MAXPOOL_FORWARD(S, T)                                                                  \
    extern "C" __global__ void maxpool_forward_##S(const T* x, T* y, unsigned char* tap, int n, \
                                                   int h, int w, int c, int oh, int ow) {      \
        maxpool_forward_k(x, y, tap, n, h, w, c, oh, ow);                                      \
    }
STORAGE_TYPES(MAXPOOL_FORWARD)

// Max pooling's backward pass as a gather: each input element sums the gradients of the (at
// most four) windows whose winning tap it was, in the outputs' order, and is written once (no
// zeroed buffer, no atomics; the bits of the CPU's scatter in output order).
template <class T>
__device__ __forceinline__ void maxpool_backward_k(const T* dy, const unsigned char* tap, T* dx,
                                                   int n, int h, int w, int c, int oh, int ow) {
    const u64 total = (u64)n * h * w * c;
    GRID_STRIDE(i, total) {
        const int ch = (int)(i % c);
        const u64 p = i / c;
        const int ix = (int)(p % w);
        const int iy = (int)((p / w) % h);
        const u64 img = p / ((u64)w * h);
        // Output row oy's window covers rows 2oy - 1 .. 2oy + 1.
        const int oy0 = iy / 2, oy1 = min((iy + 1) / 2, oh - 1);
        const int ox0 = ix / 2, ox1 = min((ix + 1) / 2, ow - 1);
        float s = 0.0f;
        for (int oy = oy0; oy <= oy1; ++oy) {
            for (int ox = ox0; ox <= ox1; ++ox) {
                const u64 o = ((img * oh + oy) * ow + ox) * c + ch;
                const int t = (iy - 2 * oy + 1) * 3 + (ix - 2 * ox + 1);
                if (tap[o] == t) s += ld(dy, o);
            }
        }
        st(dx, i, s);
    }
}
#define MAXPOOL_BACKWARD(S, T)                                                                 \
    extern "C" __global__ void maxpool_backward_##S(const T* dy, const unsigned char* tap,      \
                                                    T* dx, int n, int h, int w, int c, int oh, \
                                                    int ow) {                                  \
        maxpool_backward_k(dy, tap, dx, n, h, w, c, oh, ow);                                   \
    }
STORAGE_TYPES(MAXPOOL_BACKWARD)

// Global average pooling: y[img, ch] = mean over the hw positions, written in f32 whatever
// the input's storage (the classifier runs in f32: the pool is where 16-bit activations end).
template <class T>
__device__ __forceinline__ void avgpool_forward_k(const T* x, float* y, int n, int hw, int c) {
    const u64 total = (u64)n * c;
    GRID_STRIDE(o, total) {
        const u64 img = o / c;
        const int ch = (int)(o % c);
        float s = 0.0f;
        for (int p = 0; p < hw; ++p) s += ld(x, (img * hw + p) * c + ch);
        y[o] = s * (1.0f / (float)hw);
    }
}
#define AVGPOOL_FORWARD(S, T)                                                                  \
    extern "C" __global__ void avgpool_forward_##S(const T* x, float* y, int n, int hw, int c) { \
        avgpool_forward_k(x, y, n, hw, c);                                                     \
    }
STORAGE_TYPES(AVGPOOL_FORWARD)

// The pool's input gradient in the activations' storage, from the classifier's f32 gradient.
template <class T>
__device__ __forceinline__ void avgpool_backward_k(const float* dy, T* dx, int n, int hw, int c) {
    const u64 total = (u64)n * hw * c;
    GRID_STRIDE(i, total) {
        const int ch = (int)(i % c);
        const u64 img = i / ((u64)hw * c);
        st(dx, i, dy[img * c + ch] * (1.0f / (float)hw));
    }
}
#define AVGPOOL_BACKWARD(S, T)                                                                 \
    extern "C" __global__ void avgpool_backward_##S(const float* dy, T* dx, int n, int hw,      \
                                                    int c) {                                   \
        avgpool_backward_k(dy, dx, n, hw, c);                                                  \
    }
STORAGE_TYPES(AVGPOOL_BACKWARD)

// y[row, j] += b[j] (the classifier's bias).
extern "C" __global__ void add_bias(float* y, const float* b, u64 n, int k) {
    GRID_STRIDE(i, n) { y[i] += b[i % k]; }
}

// db[j] = sum over rows of dy[row, j], one thread per column, rows in order.
extern "C" __global__ void column_sums(const float* dy, float* db, int rows, int k) {
    GRID_STRIDE(j, (u64)k) {
        float s = 0.0f;
        for (int r = 0; r < rows; ++r) s += dy[(u64)r * k + j];
        db[j] = s;
    }
}

// A bias gradient from per-channel f64 sums (bn_sums' s1): db[j] = s[j], or db[j] += s[j] when
// accumulate != 0 (a convolution whose weights several inputs share).
extern "C" __global__ void bias_from_sums(const double* s, float* db, int k, int accumulate) {
    GRID_STRIDE(j, (u64)k) { db[j] = (float)((accumulate ? (double)db[j] : 0.0) + s[j]); }
}

// Softmax cross-entropy with label smoothing, one thread per row: grad = (p - t) / rows * scale
// (scale: the loss scale of mixed precision, 1 otherwise), loss[row] = -sum t * log p, and
// correct[row] = 1 + the number of logits above the label's (1 = top-1, <= 5 = top-5).
// The loss scale is step[2] (see sgd_slots: a step's scalars are read from the device).
extern "C" __global__ void softmax_xent(const float* z, const int* labels, float* grad,
                                        double* loss, int* rank, int rows, int k,
                                        float smoothing, const float* step) {
    const float scale = step[2];
    GRID_STRIDE(r, (u64)rows) {
        const float* zr = z + r * (u64)k;
        float* gr = grad + r * (u64)k;
        const int label = labels[r];
        double m = -1e300;
        for (int j = 0; j < k; ++j) m = zr[j] > m ? (double)zr[j] : m;
        double s = 0.0;
        for (int j = 0; j < k; ++j) s += exp((double)zr[j] - m);
        const double lse = m + log(s);
        double l = 0.0;
        int higher = 0;
        const float zl = zr[label];
        for (int j = 0; j < k; ++j) {
            const double p = exp((double)zr[j] - lse);
            const double t = (j == label ? 1.0 - smoothing : 0.0) + (double)smoothing / k;
            l -= t * ((double)zr[j] - lse);
            gr[j] = (float)((p - t) / rows * scale);
            higher += zr[j] > zl ? 1 : 0;
        }
        loss[r] = l;
        rank[r] = higher + 1;
    }
}

// SGD with momentum and weight decay on the f32 master weights, gradients unscaled by
// inv_scale, over every slot of the flat store in one launch (a step's one optimizer kernel):
// v = mu * v + g * inv_scale + d * w; w -= lr * v (as the CPU's Sgd::step), d = wd where the
// slot decays (decay[s] != 0, or decay_all != 0), else 0; in the same pass the 16-bit copy
// that mixed precision's convolutions read (w16: f16 when w16_type is 1, bf16 when 2, none
// when 0). Slot blockIdx.y covers [off[s], off[s] + len[s]), the blocks of the x dimension
// striding over it. Nothing when skip is not null and *skip != 0 (nonfinite's flag: a
// loss-scale overflow skips the step on the device, and the host reads the flag once, at the
// step's end). The step's scalars are read from the device, step = [lr, inv_scale, loss
// scale]: the host writes them before each step, so that a step captured in a CUDA graph
// takes the learning rate and loss scale of the step it runs, not those of the step it was
// captured in.
extern "C" __global__ void sgd_slots(float* w, const float* g, float* v, void* w16, int w16_type,
                                     const u64* off, const u64* len, const unsigned* decay,
                                     int decay_all, const float* step, float mu, float wd,
                                     const int* skip) {
    if (skip != 0 && *skip != 0) return;
    const float lr = step[0], inv_scale = step[1];
    const unsigned s = blockIdx.y;
    const u64 o = off[s], n = len[s];
    const float d = (decay_all != 0 || decay[s] != 0) ? wd : 0.0f;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        const u64 j = o + i;
        const float vi = mu * v[j] + g[j] * inv_scale + d * w[j];
        v[j] = vi;
        const float wj = w[j] - lr * vi;
        w[j] = wj;
        if (w16_type == 1) st((h16*)w16, j, wj);
        if (w16_type == 2) st((b16*)w16, j, wj);
    }
}

// flag = 1 when any element is infinite or NaN (a loss-scale overflow).
extern "C" __global__ void nonfinite(const float* g, u64 n, int* flag) {
    GRID_STRIDE(i, n) {
        if ((__float_as_uint(g[i]) & 0x7f800000u) == 0x7f800000u) *flag = 1;
    }
}

// Round-to-nearest-even casts between f32 and the 16-bit formats (PTX cvt; bf16 needs sm_80).
extern "C" __global__ void f32_to_f16(const float* x, unsigned short* y, u64 n) {
    GRID_STRIDE(i, n) {
        unsigned short h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x[i]));
        y[i] = h;
    }
}

extern "C" __global__ void f16_to_f32(const unsigned short* x, float* y, u64 n) {
    GRID_STRIDE(i, n) {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x[i]));
        y[i] = f;
    }
}

extern "C" __global__ void f32_to_bf16(const float* x, unsigned short* y, u64 n) {
    GRID_STRIDE(i, n) {
        unsigned short h;
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x[i]));
        y[i] = h;
    }
}

extern "C" __global__ void bf16_to_f32(const unsigned short* x, float* y, u64 n) {
    GRID_STRIDE(i, n) { y[i] = __uint_as_float(((unsigned)x[i]) << 16); }
}
