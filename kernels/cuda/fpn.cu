// The feature pyramid's own kernels on the GPU (its convolutions are cuDNN's), the same
// functions as workloads/models/src/detect/fpn.rs: the top-down path's nearest-neighbour upsampling
// added into the finer level's lateral output, P6 as P5 subsampled by 2, and their backward
// passes. NHWC f32, 64-bit sizes, grid-stride loops (any grid is correct). The backward of the
// upsampling is a gather (each coarse cell sums the contiguous run of fine cells that copied it,
// in order): atomics-free, the same bits on every run.

typedef unsigned long long u64;

#define GRID_STRIDE(i, n)                                                                      \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                          \
         i += (u64)gridDim.x * blockDim.x)

// y (n × h × w × c) += top upsampled: cell (oy, ox) takes top's (oy·th / h, ox·tw / w).
extern "C" __global__ void upsample_add(float* y, const float* top, int n, int h, int w, int th,
                                        int tw, int c) {
    const u64 total = (u64)n * h * w * c;
    GRID_STRIDE(i, total) {
        const int ch = (int)(i % c);
        const u64 pix = i / c;
        const int ox = (int)(pix % w);
        const int oy = (int)((pix / w) % h);
        const u64 b = pix / ((u64)w * h);
        const int iy = (int)((u64)oy * th / h), ix = (int)((u64)ox * tw / w);
        y[i] += top[((b * th + iy) * tw + ix) * c + ch];
    }
}

// The first fine index whose source is coarse index `i` (fine size f, coarse size t): the
// smallest o with o·t / f ≥ i, i.e. ⌈i·f / t⌉.
__device__ __forceinline__ int first_fine(int i, int f, int t) {
    return (int)(((u64)i * f + t - 1) / t);
}

// dtop (n × th × tw × c) += the upsampling's backward pass of dy (n × h × w × c): each coarse
// cell sums the fine cells that copied it, rows then columns in increasing order.
extern "C" __global__ void upsample_backward_add(float* dtop, const float* dy, int n, int h, int w,
                                                 int th, int tw, int c) {
    const u64 total = (u64)n * th * tw * c;
    GRID_STRIDE(i, total) {
        const int ch = (int)(i % c);
        const u64 pix = i / c;
        const int ix = (int)(pix % tw);
        const int iy = (int)((pix / tw) % th);
        const u64 b = pix / ((u64)tw * th);
        const int y0 = first_fine(iy, h, th), y1 = first_fine(iy + 1, h, th);
        const int x0 = first_fine(ix, w, tw), x1 = first_fine(ix + 1, w, tw);
        float acc = 0.0f;
        for (int oy = y0; oy < y1 && oy < h; ++oy)
            for (int ox = x0; ox < x1 && ox < w; ++ox)
                acc += dy[((b * h + oy) * w + ox) * c + ch];
        dtop[i] += acc;
    }
}

// y (n × ⌈h/2⌉ × ⌈w/2⌉ × c) = every other cell of x (n × h × w × c): P6 from P5.
extern "C" __global__ void subsample2(float* y, const float* x, int n, int h, int w, int c) {
    const int oh = (h + 1) / 2, ow = (w + 1) / 2;
    const u64 total = (u64)n * oh * ow * c;
    GRID_STRIDE(i, total) {
        const int ch = (int)(i % c);
        const u64 pix = i / c;
        const int ox = (int)(pix % ow);
        const int oy = (int)((pix / ow) % oh);
        const u64 b = pix / ((u64)ow * oh);
        y[i] = x[((b * h + 2 * oy) * w + 2 * ox) * c + ch];
    }
}

// dx (n × h × w × c) += dy (n × ⌈h/2⌉ × ⌈w/2⌉ × c) at every other cell: P6's gradient into P5's.
extern "C" __global__ void subsample2_backward_add(float* dx, const float* dy, int n, int h, int w,
                                                   int c) {
    const int oh = (h + 1) / 2, ow = (w + 1) / 2;
    const u64 total = (u64)n * oh * ow * c;
    GRID_STRIDE(i, total) {
        const int ch = (int)(i % c);
        const u64 pix = i / c;
        const int ox = (int)(pix % ow);
        const int oy = (int)((pix / ow) % oh);
        const u64 b = pix / ((u64)ow * oh);
        dx[((b * h + 2 * oy) * w + 2 * ox) * c + ch] += dy[i];
    }
}
