// Memory bandwidth: read / write / copy / triad with 16-byte accesses (v4 loads and stores),
// grid-stride loops over n 16-byte words, repeated `reps` times inside the kernel so that small
// (L2-resident) working sets are timed over many passes, not over one launch's overhead.
// Loads are `ld.global.cg` (cached in L2, not L1) and volatile, so every pass really reads and
// the small sizes measure L2, not the SM's L1. Data are 32-bit words; word i of an initialised
// buffer holds `pattern(i, seed)`. Results are checked on the device by `stream_check_*`,
// which count mismatches (0 expected), and for `read` by the host from the per-thread sums.

__device__ __forceinline__ unsigned pattern(unsigned i, unsigned seed) {
    // Small integers as float bits are exact under the triad's a = b + s*c with s = 2.
    return __float_as_uint((float)((i * 7u + seed) & 1023u));
}

__device__ __forceinline__ uint4 load_cg(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}

extern "C" __global__ void stream_init(uint4* a, unsigned long long n, unsigned seed) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const unsigned w = (unsigned)(i * 4);
        a[i] = make_uint4(pattern(w, seed), pattern(w + 1, seed), pattern(w + 2, seed), pattern(w + 3, seed));
    }
}

// Wrapping 32-bit sum of every word read, per thread: the host adds them up and compares with
// reps * (sum of the pattern), exact in modular arithmetic.
extern "C" __global__ void stream_read(unsigned* sums, const uint4* a, unsigned long long n, int reps) {
    const unsigned long long tid = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned acc = 0;
    for (int r = 0; r < reps; ++r) {
        for (unsigned long long i = tid; i < n; i += stride) {
            const uint4 v = load_cg(a + i);
            acc += v.x + v.y + v.z + v.w;
        }
    }
    sums[tid] = acc;
}

extern "C" __global__ void stream_write(uint4* a, unsigned long long n, unsigned value, int reps) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (int r = 0; r < reps; ++r) {
        for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
            // volatile store: repeated passes storing the same value are not merged into one
            asm volatile("st.global.v4.u32 [%0], {%1,%1,%1,%1};" : : "l"(a + i), "r"(value) : "memory");
        }
    }
}

// Also the SM copy kernel for peer-to-peer copies (dst on another GPU with peer access on).
extern "C" __global__ void stream_copy(uint4* dst, const uint4* src, unsigned long long n, int reps) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (int r = 0; r < reps; ++r) {
        for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
            dst[i] = load_cg(src + i);
        }
    }
}

// a = b + s * c on f32 lanes.
extern "C" __global__ void stream_triad(uint4* a, const uint4* b, const uint4* c, float s,
                                        unsigned long long n, int reps) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (int r = 0; r < reps; ++r) {
        for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
            const uint4 x = load_cg(b + i);
            const uint4 y = load_cg(c + i);
            a[i] = make_uint4(__float_as_uint(__uint_as_float(x.x) + s * __uint_as_float(y.x)),
                              __float_as_uint(__uint_as_float(x.y) + s * __uint_as_float(y.y)),
                              __float_as_uint(__uint_as_float(x.z) + s * __uint_as_float(y.z)),
                              __float_as_uint(__uint_as_float(x.w) + s * __uint_as_float(y.w)));
        }
    }
}

// Mismatch counters. `kind` 0: every word == value (write); 1: dst == pattern(seed_b) (copy);
// 2: dst == pattern(seed_b) + s * pattern(seed_c) (triad).
extern "C" __global__ void stream_check(unsigned long long* bad, const unsigned* dst, unsigned long long words,
                                        int kind, unsigned value, unsigned seed_b, unsigned seed_c, float s) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long local = 0;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride) {
        unsigned expect;
        if (kind == 0) {
            expect = value;
        } else if (kind == 1) {
            expect = pattern((unsigned)i, seed_b);
        } else {
            expect = __float_as_uint(__uint_as_float(pattern((unsigned)i, seed_b)) +
                                     s * __uint_as_float(pattern((unsigned)i, seed_c)));
        }
        local += (dst[i] != expect);
    }
    if (local) atomicAdd(bad, local);
}
