// RoIAlign of the detector on the GPU (torchvision's MultiScaleRoIAlign, aligned=True), the
// same function as workloads/models/src/detect/roi_align.rs. The regions come as a plan the host
// builds (workloads/gpu/src/roi_align.rs): 6 floats per region: its pyramid level (0 = P2 …
// 3 = P5), its image, and in that level's map cells y1 and x1 (shifted by half a cell), the
// bin height and the bin width. Maps, outputs and gradients are NHWC f32; loops grid-stride.
//
// The backward pass is a gather, atomics-free and deterministic: each feature element of one
// level sums, in a fixed order (the regions of its level and image in plan order, then sample
// rows, then sample columns), the weights of every sample that touches it. The regions come
// binned by tiles of the map (`tile` × `tile` cells of one image): a tile's segment lists, in
// plan order, every region whose samples may touch one of its cells (the host widens each
// footprint by a cell, so a segment holds at least the regions the exact test passes). An
// element so visits the few regions near it, not all of its image's. The bilinear weight is
// separable, and only the samples within about a cell of the element are weighed, one
// dimension at a time; the sums are those of visiting every region and every sample.

typedef unsigned long long u64;

#define GRID_STRIDE(i, n)                                                                      \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                          \
         i += (u64)gridDim.x * blockDim.x)

// The two cells a sample at `v` (in cells) interpolates on an axis of `n` cells, and the
// weight of the second, as the CPU's taps: clamped at 0, and beyond n - 1 both are the last
// cell. False when the sample lies more than one cell outside (it contributes nothing).
__device__ __forceinline__ bool taps1d(float v, int n, int* i0, int* i1, float* l) {
    if (v < -1.0f || v > (float)n) return false;
    v = fmaxf(v, 0.0f);
    const int a = (int)floorf(v);
    if (a >= n - 1) {
        *i0 = *i1 = n - 1;
        *l = 0.0f;
    } else {
        *i0 = a;
        *i1 = a + 1;
        *l = v - (float)a;
    }
    return true;
}

// The 1-D bilinear weight of cell `i` for a sample at `v` (taps1d's two cells and weights).
__device__ __forceinline__ float lin_weight(float v, int i, int n) {
    int i0, i1;
    float l;
    if (!taps1d(v, n, &i0, &i1, &l)) return 0.0f;
    return (i == i0 ? 1.0f - l : 0.0f) + (i == i1 ? l : 0.0f);
}

// The position of sample t (bin t / samples, sample t % samples) along one axis.
__device__ __forceinline__ float sample_at(float start, float bin, int t, int samples) {
    return start + (float)(t / samples) * bin + ((float)(t % samples) + 0.5f) * bin / (float)samples;
}

// y[r, py, px, ch] for `rois` regions: the mean of samples × samples bilinear samples of the
// region's level map (p2 … p5, of sizes hw[2l] × hw[2l + 1]) in each of out × out bins.
extern "C" __global__ void roi_align_forward(const float* p2, const float* p3, const float* p4,
                                             const float* p5, const int* hw, const float* plan,
                                             int rois, int out, int samples, int c, float* y) {
    const u64 total = (u64)rois * out * out * c;
    const float norm = 1.0f / (float)(samples * samples);
    GRID_STRIDE(i, total) {
        const int ch = (int)(i % c);
        const u64 cell = i / c;
        const int px = (int)(cell % out);
        const int py = (int)((cell / out) % out);
        const u64 r = cell / ((u64)out * out);
        const float* pl = plan + 6 * r;
        const int l = (int)pl[0];
        const int img = (int)pl[1];
        const float* m = l == 0 ? p2 : l == 1 ? p3 : l == 2 ? p4 : p5;
        const int h = hw[2 * l], w = hw[2 * l + 1];
        const float* base = m + (u64)img * h * w * c;
        float acc = 0.0f;
        for (int iy = 0; iy < samples; ++iy) {
            int y0, y1;
            float ly;
            if (!taps1d(sample_at(pl[2], pl[4], py * samples + iy, samples), h, &y0, &y1, &ly))
                continue;
            for (int ix = 0; ix < samples; ++ix) {
                int x0, x1;
                float lx;
                if (!taps1d(sample_at(pl[3], pl[5], px * samples + ix, samples), w, &x0, &x1, &lx))
                    continue;
                const float hy = 1.0f - ly, hx = 1.0f - lx;
                acc += hy * hx * base[((u64)y0 * w + x0) * c + ch] +
                       hy * lx * base[((u64)y0 * w + x1) * c + ch] +
                       ly * hx * base[((u64)y1 * w + x0) * c + ch] +
                       ly * lx * base[((u64)y1 * w + x1) * c + ch];
            }
        }
        y[i] = acc * norm;
    }
}

// The samples t of an axis (ts = out · samples of them, at start + (t + 0.5) · bin / samples)
// that may touch cell q: those within a cell of it, widened by two samples for the rounding,
// clamped to [0, ts - 1]. Every sample outside the range has weight 0 at q. Where the rounding
// could reach two samples (a step under 1/64 cell, coordinates beyond 2^16 cells, or not
// finite), the range is every sample.
__device__ __forceinline__ void sample_range(float start, float bin, int samples, int q, int ts,
                                             int* lo, int* hi) {
    const float step = bin / (float)samples;
    const float a = ((float)q - 1.0f - start) / step - 0.5f;
    const float b = ((float)q + 1.0f - start) / step - 0.5f;
    const float far = 65536.0f;
    if (!(fabsf(step) >= 1.0f / 64.0f && fabsf(start) <= far && fabsf(bin) * ts <= far &&
          isfinite(a) && isfinite(b))) {
        *lo = 0;
        *hi = ts - 1;
        return;
    }
    const float last = (float)(ts - 1);
    *lo = (int)fminf(fmaxf(floorf(fminf(a, b)) - 2.0f, 0.0f), last);
    *hi = (int)fminf(fmaxf(ceilf(fmaxf(a, b)) + 2.0f, 0.0f), last);
}

// dx (one level's n × h × w × c gradient, overwritten) from dy (rois × out × out × c). The
// regions that may touch tile k (tiles of `tile` cells, ceil(h / tile) × ceil(w / tile) of
// them an image, image-major then row-major) are list[start[k] .. start[k + 1]), in plan order.
extern "C" __global__ void roi_align_backward(float* dx, int n, int h, int w, int c, int tile,
                                              const int* start, const int* list,
                                              const float* plan, const float* dy, int out,
                                              int samples) {
    const u64 total = (u64)n * h * w * c;
    const int ts = out * samples;
    const int th = (h + tile - 1) / tile, tw = (w + tile - 1) / tile;
    const float norm = 1.0f / (float)(samples * samples);
    GRID_STRIDE(i, total) {
        const int ch = (int)(i % c);
        const u64 pix = i / c;
        const int xq = (int)(pix % w);
        const int yq = (int)((pix / w) % h);
        const int b = (int)(pix / ((u64)w * h));
        const int k0 = ((b * th) + yq / tile) * tw + xq / tile;
        float acc = 0.0f;
        for (int k = start[k0]; k < start[k0 + 1]; ++k) {
            const int r = list[k];
            const float* pl = plan + 6 * r;
            // The cells any sample of this region touches: from the first sample's (clamped)
            // cell to one past the last's.
            const float y_lo = fmaxf(sample_at(pl[2], pl[4], 0, samples), 0.0f);
            const float y_hi = fmaxf(sample_at(pl[2], pl[4], ts - 1, samples), 0.0f);
            if (yq < (int)floorf(y_lo) || yq > (int)floorf(y_hi) + 1) continue;
            const float x_lo = fmaxf(sample_at(pl[3], pl[5], 0, samples), 0.0f);
            const float x_hi = fmaxf(sample_at(pl[3], pl[5], ts - 1, samples), 0.0f);
            if (xq < (int)floorf(x_lo) || xq > (int)floorf(x_hi) + 1) continue;
            int t0, t1, u0, u1;
            sample_range(pl[2], pl[4], samples, yq, ts, &t0, &t1);
            sample_range(pl[3], pl[5], samples, xq, ts, &u0, &u1);
            const float* g = dy + (u64)r * out * out * c + ch;
            for (int t = t0; t <= t1; ++t) {
                const float wy = lin_weight(sample_at(pl[2], pl[4], t, samples), yq, h);
                if (wy == 0.0f) continue;
                for (int u = u0; u <= u1; ++u) {
                    const float wx = lin_weight(sample_at(pl[3], pl[5], u, samples), xq, w);
                    if (wx == 0.0f) continue;
                    acc += wy * wx * g[((u64)(t / samples) * out + u / samples) * c];
                }
            }
        }
        dx[i] = acc * norm;
    }
}
