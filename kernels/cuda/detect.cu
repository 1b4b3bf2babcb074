// The region proposal network's proposals on the GPU, the same function as
// workloads/models/src/detect/rpn.rs `proposals` (its host twin), driven by workloads/gpu/src/proposals.rs.
// A segment is one image of one pyramid level; segment s = level · images + image, and each
// segment has K slots (K = pre_nms, at most MAX_K) in every per-segment buffer.
//
// 1. rpn_topk: per segment, the indices of its best min(K, n) logits, best first, ties by the
//    lower index (boxes::top_k's order), by a radix select on a 64-bit key that is unique within
//    the segment (the logit's order in the high half, the index reversed in the low half), then
//    a bitonic sort of the selected keys in shared memory.
// 2. rpn_decode: each selected anchor (made here from its cell, as boxes::anchors makes it) moved
//    by its deltas (Coder with weights 1), clipped, and marked valid when both sides reach
//    min_size.
// 3. nms_mask: per segment, 64 × 64 tiles of suppression bits (box j after box i overlapping it
//    by more than the threshold), as boxes::nms decides.
// 4. nms_sweep: per segment, one warp walks the boxes best first, keeping each box no kept box
//    suppressed: greedy NMS within a level (torchvision's batched_nms with the level as the
//    category).
// 5. rpn_merge: per image, every level's kept boxes ranked together (logit, then the lower level,
//    then the rank within the level) by counting, for each box, the boxes of the other levels
//    that come before it (a binary search in each level's kept list); the best `post` written.
//
// The boxes' arithmetic is f64 with every multiply and add rounded on its own (__dmul_rn,
// __dadd_rn: no contraction into fma), so that anchors, clipping, the size test and every IoU
// are the host's bits; exp() is CUDA's (within 1 ulp of the host's), the one difference.
// Deterministic: the only atomics are shared-memory counts whose totals, not order, are used
// (the histogram) or whose slots are sorted afterwards by a key unique in the segment.

typedef unsigned long long u64;
typedef unsigned int u32;

#define TOPK_THREADS 1024
// The most anchors a level keeps before NMS (workloads/gpu/src/proposals.rs MAX_PRE_NMS).
#define MAX_K 4096
#define MAX_WORDS (MAX_K / 64)

#define GRID_STRIDE(i, n)                                                                      \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                          \
         i += (u64)gridDim.x * blockDim.x)

// f32 logits as unsigned keys in the order of f64::total_cmp on their widened values: a larger
// logit has a larger key (negative values reversed, the sign bit set on the others).
__device__ __forceinline__ u32 order_key(float v) {
    const u32 b = __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// The logit's order, then the lower index first: unique within a segment (n < 2^32 − 1), and
// never 0 (0 pads the sort).
__device__ __forceinline__ u64 rank_key(float v, u32 i) {
    return ((u64)order_key(v) << 32) | (u64)(0xFFFFFFFFu - i);
}

// sel[s·K + j], j < min(K, n): the indices of segment s's best min(K, n) logits, best first,
// ties by the lower index. logits[l] points to level l's images × per[l] logits (the RPN head's
// n·h·w·A output: image b's anchors are b·per[l] … (b + 1)·per[l] − 1). Grid (images, levels),
// TOPK_THREADS (1024) threads; K ≤ MAX_K.
extern "C" __global__ void __launch_bounds__(1024) rpn_topk(const u64* logits, const int* per,
                                                           int images, int K, u32* sel) {
    const int b = blockIdx.x, l = blockIdx.y;
    const u32 n = (u32)per[l];
    const float* z = (const float*)logits[l] + (u64)b * n;
    const u32 k = min((u32)K, n);
    u32* out = sel + ((u64)l * images + b) * K;
    __shared__ u32 hist[256];
    __shared__ u64 cand[MAX_K];
    __shared__ u64 s_prefix, s_mask;
    __shared__ u32 s_need, s_count;
    __shared__ int s_done;
    if (threadIdx.x == 0) {
        s_prefix = 0;
        s_mask = 0;
        s_need = k;
        s_count = 0;
        s_done = (k == n);
    }
    __syncthreads();
    // The radix select, 8 bits a pass from the top: `prefix` holds the digits of the k-th
    // largest key found so far (under `mask`), `need` how many of the keys sharing them are
    // still to be taken. It ends when every key sharing the prefix is taken: the selected keys
    // are then exactly those ≥ prefix (the undecided low digits zero).
    for (int shift = 56; shift >= 0; shift -= 8) {
        if (s_done) break;  // uniform: read after a barrier, written before the next
        for (int d = threadIdx.x; d < 256; d += blockDim.x) hist[d] = 0;
        __syncthreads();
        const u64 prefix = s_prefix, mask = s_mask;
        // Every thread runs every round (the warp collectives below need the whole warp).
        for (u32 base = 0; base < n; base += blockDim.x) {
            const u32 i = base + threadIdx.x;
            int digit = -1;
            if (i < n) {
                const u64 key = rank_key(z[i], i);
                if ((key & mask) == prefix) digit = (int)((key >> shift) & 255);
            }
            // One shared atomic per distinct digit of the warp (logits share their top bits).
            const u32 peers = __match_any_sync(0xFFFFFFFFu, digit);
            if (digit >= 0 && (int)(threadIdx.x & 31) == __ffs(peers) - 1)
                atomicAdd(&hist[digit], (u32)__popc(peers));
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            u32 above = 0;
            const u32 need = s_need;
            for (int d = 255; d >= 0; --d) {
                const u32 h = hist[d];
                if (above + h >= need) {
                    s_prefix = prefix | ((u64)d << shift);
                    s_mask = mask | ((u64)255 << shift);
                    s_need = need - above;
                    s_done = (h == need - above);
                    break;
                }
                above += h;
            }
        }
        __syncthreads();
    }
    const u64 threshold = s_prefix;
    for (u32 base = 0; base < n; base += blockDim.x) {
        const u32 i = base + threadIdx.x;
        if (i < n) {
            const u64 key = rank_key(z[i], i);
            if (key >= threshold) {
                const u32 slot = atomicAdd(&s_count, 1u);
                if (slot < MAX_K) cand[slot] = key;
            }
        }
    }
    u32 p = 1;
    while (p < k) p <<= 1;
    __syncthreads();
    for (u32 j = k + threadIdx.x; j < p; j += blockDim.x) cand[j] = 0;
    // Bitonic sort, descending, of the p (a power of two) keys.
    for (u32 size = 2; size <= p; size <<= 1) {
        for (u32 stride = size >> 1; stride > 0; stride >>= 1) {
            __syncthreads();
            for (u32 t = threadIdx.x; t < p / 2; t += blockDim.x) {
                const u32 lo = 2 * t - (t & (stride - 1)), hi = lo + stride;
                const bool descending = (lo & size) == 0;
                const u64 a = cand[lo], c = cand[hi];
                if ((a < c) == descending) {
                    cand[lo] = c;
                    cand[hi] = a;
                }
            }
        }
    }
    __syncthreads();
    for (u32 j = threadIdx.x; j < k; j += blockDim.x)
        out[j] = 0xFFFFFFFFu - (u32)(cand[j] & 0xFFFFFFFFu);
}

// Anchor i of level l, as boxes::AnchorGrid::anchors makes it: cell (y, x) = (i / A) of a grid
// cols[l] wide at stride[l], anchor a = i % A of the cell wh[(l·A + a)·2 …] wide and high,
// centred on ((x + ½)·stride, (y + ½)·stride).
__device__ __forceinline__ void anchor_box(const int* cols, const double* stride,
                                           const double* wh, int A, int l, u32 i, double* r) {
    const u32 cell = i / A, a = i % A;
    const u32 y = cell / cols[l], x = cell % cols[l];
    const double st = stride[l];
    const double ax = __dmul_rn(__dadd_rn((double)x, 0.5), st);
    const double ay = __dmul_rn(__dadd_rn((double)y, 0.5), st);
    const double aw = wh[2 * (l * A + a)], ah = wh[2 * (l * A + a) + 1];
    r[0] = __dsub_rn(ax, __dmul_rn(0.5, aw));
    r[1] = __dsub_rn(ay, __dmul_rn(0.5, ah));
    r[2] = __dadd_rn(ax, __dmul_rn(0.5, aw));
    r[3] = __dadd_rn(ay, __dmul_rn(0.5, ah));
}

// Segment s's selected anchors decoded: boxes[(s·K + j)·4 …] = (x1, y1, x2, y2) of the box that
// anchor sel[s·K + j]'s deltas make, clipped to width × height; scores[s·K + j] its logit;
// valid[s·K + j] whether both its sides reach min_size (0 for the slots past min(K, n)); the
// anchors are anchor_box's. Grid-stride over levels · images · K slots.
extern "C" __global__ void rpn_decode(const u64* logits, const u64* deltas, const int* per,
                                      const int* cols, const double* stride, const double* wh,
                                      int A, const u32* sel, int images, int levels, int K,
                                      double clamp, double width, double height,
                                      double min_size, double* boxes, float* scores,
                                      int* valid) {
    const u64 total = (u64)levels * images * K;
    GRID_STRIDE(t, total) {
        const u32 j = (u32)(t % K);
        const u64 s = t / K;
        const int b = (int)(s % images), l = (int)(s / images);
        const u32 n = (u32)per[l];
        double* box = boxes + 4 * t;
        if (j >= min((u32)K, n)) {
            box[0] = box[1] = box[2] = box[3] = 0.0;
            scores[t] = 0.0f;
            valid[t] = 0;
            continue;
        }
        const u32 i = sel[t];
        double r[4];
        anchor_box(cols, stride, wh, A, l, i, r);
        // Coder::decode with weights (1, 1, 1, 1).
        const double rw = __dsub_rn(r[2], r[0]), rh = __dsub_rn(r[3], r[1]);
        const double rx = __dadd_rn(r[0], __dmul_rn(0.5, rw)), ry = __dadd_rn(r[1], __dmul_rn(0.5, rh));
        const float* d = (const float*)deltas[l] + ((u64)b * n + i) * 4;
        const double dx = (double)d[0], dy = (double)d[1];
        const double dw = fmin((double)d[2], clamp), dh = fmin((double)d[3], clamp);
        const double cx = __dadd_rn(rx, __dmul_rn(dx, rw)), cy = __dadd_rn(ry, __dmul_rn(dy, rh));
        const double pw = __dmul_rn(rw, exp(dw)), ph = __dmul_rn(rh, exp(dh));
        const double hw = __dmul_rn(0.5, pw), hh = __dmul_rn(0.5, ph);
        // clip: f64::clamp(0, side), which keeps a NaN.
        const double c[4] = {__dsub_rn(cx, hw), __dsub_rn(cy, hh), __dadd_rn(cx, hw),
                             __dadd_rn(cy, hh)};
        const double side[4] = {width, height, width, height};
        for (int q = 0; q < 4; ++q) {
            const double v = c[q];
            box[q] = v < 0.0 ? 0.0 : (v > side[q] ? side[q] : v);
        }
        scores[t] = ((const float*)logits[l])[(u64)b * n + i];
        valid[t] = __dsub_rn(box[2], box[0]) >= min_size && __dsub_rn(box[3], box[1]) >= min_size;
    }
}

// boxes::iou, operation for operation.
__device__ __forceinline__ double iou(const double* a, const double* b) {
    const double w = fmax(__dsub_rn(fmin(a[2], b[2]), fmax(a[0], b[0])), 0.0);
    const double h = fmax(__dsub_rn(fmin(a[3], b[3]), fmax(a[1], b[1])), 0.0);
    const double inter = __dmul_rn(w, h);
    const double area_a =
        __dmul_rn(fmax(__dsub_rn(a[2], a[0]), 0.0), fmax(__dsub_rn(a[3], a[1]), 0.0));
    const double area_b =
        __dmul_rn(fmax(__dsub_rn(b[2], b[0]), 0.0), fmax(__dsub_rn(b[3], b[1]), 0.0));
    const double uni = __dsub_rn(__dadd_rn(area_a, area_b), inter);
    return uni > 0.0 ? __ddiv_rn(inter, uni) : 0.0;
}

// mask[(s·K + i)·W + cb], W = ⌈K/64⌉: bit q set when box j = 64·cb + q of segment s comes after
// box i and their IoU is not ≤ threshold (boxes::nms's test: a NaN IoU suppresses too). Grid
// (W, W · images · levels), 64 threads: block (cb, rb + W·s) makes rows 64·rb … of column word cb.
extern "C" __global__ void nms_mask(const double* boxes, int K, double threshold, u64* mask) {
    const int W = (K + 63) / 64;
    const int cb = blockIdx.x, rb = blockIdx.y % W;
    const u64 s = blockIdx.y / W;
    __shared__ double col[64 * 4];
    const int j0 = cb * 64, tid = threadIdx.x;
    if (j0 + tid < K)
        for (int q = 0; q < 4; ++q) col[4 * tid + q] = boxes[(s * K + j0 + tid) * 4 + q];
    __syncthreads();
    const int i = rb * 64 + tid;
    if (i >= K) return;
    u64 bits = 0;
    if (cb >= rb) {
        double a[4];
        for (int q = 0; q < 4; ++q) a[q] = boxes[(s * K + i) * 4 + q];
        const int jn = min(64, K - j0);
        for (int q = 0; q < jn; ++q)
            if (j0 + q > i && !(iou(a, col + 4 * q) <= threshold)) bits |= 1ull << q;
    }
    mask[(s * K + i) * W + cb] = bits;
}

// Greedy NMS of segment s from its mask: keep[s·K + r] the r-th kept slot (best first), kept[s]
// how many; the slots not valid are never kept. Grid (images · levels), 32 threads (one warp,
// the removed boxes' bits in shared memory, W ≤ MAX_WORDS).
extern "C" __global__ void nms_sweep(const u64* mask, const int* valid, int K, int* keep,
                                     int* kept) {
    const int W = (K + 63) / 64;
    const u64 s = blockIdx.x;
    const int lane = threadIdx.x;
    __shared__ u64 removed[MAX_WORDS];
    for (int w = lane; w < W; w += 32) {
        u64 bits = 0;
        for (int q = 0; q < 64; ++q) {
            const int j = 64 * w + q;
            if (j >= K || !valid[s * K + j]) bits |= 1ull << q;
        }
        removed[w] = bits;
    }
    __syncwarp();
    int count = 0;
    for (int i = 0; i < K; ++i) {
        // Every lane reads the same word: the branch is uniform.
        if ((removed[i >> 6] >> (i & 63)) & 1ull) continue;
        if (lane == 0) keep[s * K + count] = i;
        ++count;
        const u64* row = mask + (s * K + i) * W;
        for (int w = (i >> 6) + lane; w < W; w += 32) removed[w] |= row[w];
        __syncwarp();
    }
    if (lane == 0) kept[s] = count;
}

// Image b's proposals: out[b·(1 + 5·post)] their number (min(post, Σ kept)), then the best
// `post` kept boxes of every level as (x1, y1, x2, y2, logit), ranked by logit, then the lower
// level, then the rank within the level. Grid-stride over levels · images · K slots.
extern "C" __global__ void rpn_merge(const double* boxes, const float* scores, const int* keep,
                                     const int* kept, int images, int levels, int K, int post,
                                     double* out) {
    const u64 stride_out = 1 + 5 * (u64)post;
    GRID_STRIDE(b, (u64)images) {
        int total = 0;
        for (int l = 0; l < levels; ++l) total += kept[l * images + b];
        out[b * stride_out] = (double)min(total, post);
    }
    const u64 slots = (u64)levels * images * K;
    GRID_STRIDE(t, slots) {
        const int r = (int)(t % K);
        const u64 s = t / K;
        const int b = (int)(s % images), l = (int)(s / images);
        if (r >= kept[s]) continue;
        const int p = keep[s * K + r];
        const float score = scores[s * K + p];
        const u32 key = order_key(score);
        u64 pos = (u64)r;
        for (int l2 = 0; l2 < levels; ++l2) {
            if (l2 == l) continue;
            const u64 s2 = (u64)l2 * images + b;
            // Level l2's kept boxes that come before this one: a prefix of its list (its logits
            // do not increase along it).
            int lo = 0, hi = kept[s2];
            while (lo < hi) {
                const int mid = (lo + hi) / 2;
                const u32 k2 = order_key(scores[s2 * K + keep[s2 * K + mid]]);
                if (l2 < l ? k2 >= key : k2 > key)
                    lo = mid + 1;
                else
                    hi = mid;
            }
            pos += (u64)lo;
        }
        if (pos < (u64)post) {
            double* o = out + b * stride_out + 1 + 5 * pos;
            for (int q = 0; q < 4; ++q) o[q] = boxes[(s * K + p) * 4 + q];
            o[4] = (double)score;
        }
    }
}

// ---- The RPN's losses (rpn::rpn_loss), driven by workloads/gpu/src/rpn_loss.rs ----
// Image b's anchors are its levels' in turn: anchor a = first[l] + i is anchor i of level l
// (first[levels] = N anchors an image). Its ground truth is truth[4·(tstart[b] + j) …], j < G_b.
// Labels: j ≥ 0 foreground (matched to box j), −1 background, −2 ignored.
//
// 1. anchor_match: Matcher::assign_chunks' first pass (each anchor's best box, the first where
//    several, against the thresholds) and each box's best IoU over the image's anchors.
// 2. anchor_best: its second pass (an anchor at a box's best IoU goes to that box, the last such
//    box), then each block's foreground and background counts.
// 3. anchor_scan: per image, each block's first foreground and background ordinal, and the
//    totals. The host draws from the totals (matcher::draw, the CPU's Rng) which ordinals to keep.
// 4. rpn_loss_terms: each kept anchor's losses and its gradients.
// Deterministic: the best IoUs are maxima (atomicMax over the bits of non-negative doubles), the
// counts are sums, and the loss terms, written at slots in any order, are summed by the host in
// the anchors' order.

#define MATCH_THREADS 1024
// The most ground-truth boxes an image (workloads/gpu/src/rpn_loss.rs MAX_TRUTH).
#define MAX_TRUTH 256

// The level of image anchor a (first[l] ≤ a < first[l + 1]).
__device__ __forceinline__ int level_of(const int* first, int levels, u32 a) {
    int l = 0;
    while (l + 1 < levels && a >= (u32)first[l + 1]) ++l;
    return l;
}

// The block's exclusive prefix sum of v and (in *total) its sum; every thread of the block
// calls it (MATCH_THREADS threads, a multiple of 32).
__device__ u64 block_exclusive_scan(u64 v, u64* total) {
    __shared__ u64 warp_sums[32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, warps = blockDim.x >> 5;
    u64 x = v;
    for (int o = 1; o < 32; o <<= 1) {
        const u64 y = __shfl_up_sync(0xFFFFFFFFu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) warp_sums[w] = x;
    __syncthreads();
    if (w == 0) {
        u64 s = lane < warps ? warp_sums[lane] : 0;
        for (int o = 1; o < 32; o <<= 1) {
            const u64 y = __shfl_up_sync(0xFFFFFFFFu, s, o);
            if (lane >= o) s += y;
        }
        if (lane < warps) warp_sums[lane] = s;
    }
    __syncthreads();
    const u64 before = (w > 0 ? warp_sums[w - 1] : 0) + x - v;
    *total = warp_sums[warps - 1];
    __syncthreads();
    return before;
}

// The maximum of v over the warp.
__device__ __forceinline__ u64 warp_max(u64 v) {
    for (int o = 16; o > 0; o >>= 1) {
        const u64 y = __shfl_xor_sync(0xFFFFFFFFu, v, o);
        v = y > v ? y : v;
    }
    return v;
}

// label[b·N + a] by the first pass: the anchor's best box j (the first, where several) when its
// IoU ≥ high, −1 below low, −2 between (−1 for an image without boxes); best[tstart[b] + j]
// raised to box j's best IoU over the block's anchors (the bits of a non-negative double; zeroed
// before). Grid (⌈N / 1024⌉, images), MATCH_THREADS (1024) threads, G_b ≤ MAX_TRUTH.
extern "C" __global__ void __launch_bounds__(1024) anchor_match(
    const int* first, int levels, const int* cols, const double* stride, const double* wh, int A,
    const double* truth, const int* tstart, double high, double low, int* label, u64* best) {
    const u32 N = (u32)first[levels];
    const int b = blockIdx.y;
    const u32 a = blockIdx.x * blockDim.x + threadIdx.x;
    const int t0 = tstart[b], g = tstart[b + 1] - t0;
    __shared__ double box_s[4 * MAX_TRUTH];
    __shared__ u64 top_s[MAX_TRUTH];
    for (int j = threadIdx.x; j < g; j += blockDim.x) {
        top_s[j] = 0;
        for (int q = 0; q < 4; ++q) box_s[4 * j + q] = truth[4 * (t0 + j) + q];
    }
    __syncthreads();
    const bool live = a < N;
    double r[4] = {0.0, 0.0, 0.0, 0.0};
    if (live) {
        const int l = level_of(first, levels, a);
        anchor_box(cols, stride, wh, A, l, a - (u32)first[l], r);
    }
    int jb = 0;
    double top = -__longlong_as_double(0x7FF0000000000000ll);  // −∞
    // Every thread runs every box (the warp maximum needs the whole warp); g is the block's.
    for (int j = 0; j < g; ++j) {
        const double v = live ? iou(r, box_s + 4 * j) : 0.0;
        if (v > top) {
            top = v;
            jb = j;
        }
        // f64::max ignores a NaN; IoUs are ≥ 0, so their bits order as the values.
        const u64 m = warp_max(v > 0.0 ? (u64)__double_as_longlong(v) : 0ull);
        if ((threadIdx.x & 31) == 0 && m != 0) atomicMax(&top_s[j], m);
    }
    if (live) label[(u64)b * N + a] = g == 0 ? -1 : (top >= high ? jb : (top < low ? -1 : -2));
    __syncthreads();
    for (int j = threadIdx.x; j < g; j += blockDim.x)
        if (top_s[j] != 0) atomicMax(&best[t0 + j], top_s[j]);
}

// The second pass (when allow_best): an anchor whose IoU with box j equals box j's best, where
// that is > 0, goes to j (the last such j); then counts[b·nb + blockIdx.x] = the block's
// foreground count + its background count · 2³², nb = gridDim.x. Grid and block as anchor_match.
extern "C" __global__ void __launch_bounds__(1024) anchor_best(
    const int* first, int levels, const int* cols, const double* stride, const double* wh, int A,
    const double* truth, const int* tstart, int allow_best, const u64* best, int* label,
    u64* counts) {
    const u32 N = (u32)first[levels];
    const int b = blockIdx.y;
    const u32 a = blockIdx.x * blockDim.x + threadIdx.x;
    const int t0 = tstart[b], g = tstart[b + 1] - t0;
    int lab = -2;
    if (a < N) {
        lab = label[(u64)b * N + a];
        if (allow_best && g > 0) {
            const int l = level_of(first, levels, a);
            double r[4];
            anchor_box(cols, stride, wh, A, l, a - (u32)first[l], r);
            for (int j = g - 1; j >= 0; --j) {
                const double bj = __longlong_as_double((long long)best[t0 + j]);
                if (bj > 0.0 && iou(r, truth + 4 * (t0 + j)) == bj) {
                    lab = j;
                    break;
                }
            }
            label[(u64)b * N + a] = lab;
        }
    }
    const u32 fg = (u32)__syncthreads_count(lab >= 0);
    const u32 bg = (u32)__syncthreads_count(lab == -1);
    if (threadIdx.x == 0) counts[(u64)b * gridDim.x + blockIdx.x] = (u64)fg | ((u64)bg << 32);
}

// Per image b: offsets[b·nb + k] the foreground (low half) and background (high half) anchors of
// its blocks before block k; totals[b] their sums over the image (the same halves). Grid images,
// MATCH_THREADS threads.
extern "C" __global__ void __launch_bounds__(1024) anchor_scan(const u64* counts, int nb,
                                                               u64* offsets, u64* totals) {
    const u64 b = blockIdx.x;
    u64 carry = 0;
    for (int base = 0; base < nb; base += blockDim.x) {
        const int k = base + threadIdx.x;
        const u64 v = k < nb ? counts[b * nb + k] : 0;
        u64 sum;
        const u64 before = block_exclusive_scan(v, &sum);
        if (k < nb) offsets[b * nb + k] = carry + before;
        carry += sum;
    }
    if (threadIdx.x == 0) totals[b] = carry;
}

// Whether ordinal o is kept by a draw: (first, count) into `chosen` (sorted offsets), count < 0
// for all of them.
__device__ __forceinline__ bool drawn(const u32* chosen, int first, int count, u32 o) {
    if (count < 0) return true;
    int lo = 0, hi = count;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (chosen[first + mid] < o)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < count && chosen[first + lo] == o;
}

// loss::smooth_l1 of one coordinate x (its error): ½·x²/β added to *loss where |x| < β,
// |x| − ½β elsewhere; returns the gradient, x/β or sign(x) (NaN stays NaN).
__device__ __forceinline__ double smooth_l1(double x, double beta, double* loss) {
    if (fabs(x) < beta) {
        *loss = __dadd_rn(*loss, __ddiv_rn(__dmul_rn(__dmul_rn(0.5, x), x), beta));
        return __ddiv_rn(x, beta);
    }
    *loss = __dadd_rn(*loss, __dsub_rn(fabs(x), __dmul_rn(0.5, beta)));
    return x != x ? x : copysign(1.0, x);
}

// The kept anchors' losses (rpn::rpn_loss): anchor a of image b is kept when its ordinal among
// the image's foreground (background) anchors, offsets' half plus the block's prefix, is drawn:
// pick[4·b …] = (first, count) of the foreground's sorted offsets in `chosen`, then the
// background's (count −1: all). For each kept anchor, with z its logit and t its target (1
// foreground, 0 background): dlogits[l][at] = f32((σ(z) − t) / count) · scale (at = b·per_l + i;
// the others are zeroed before); a foreground one's deltas d against its box's encoding e
// (Coder, weights 1): ddeltas[l][4·at + q] = f32(g_q / count) · scale with g the smooth-L1 (beta)
// gradient; terms[3·s …] = (b·N + a, its cross-entropy, its smooth-L1 sum) at slot s =
// atomicAdd(slots). Grid and block as anchor_match.
extern "C" __global__ void __launch_bounds__(1024) rpn_loss_terms(
    const int* first, int levels, const int* cols, const double* stride, const double* wh, int A,
    const double* truth, const int* tstart, const int* label, const u64* offsets,
    const int* pick, const u32* chosen, const u64* logits, const u64* deltas, double count,
    float scale, double beta, const u64* dlogits, const u64* ddeltas, u32* slots,
    double* terms) {
    const u32 N = (u32)first[levels];
    const int b = blockIdx.y;
    const u32 a = blockIdx.x * blockDim.x + threadIdx.x;
    const int lab = a < N ? label[(u64)b * N + a] : -2;
    const u64 mine = lab >= 0 ? 1ull : (lab == -1 ? (1ull << 32) : 0ull);
    u64 sum;
    const u64 ord = offsets[(u64)b * gridDim.x + blockIdx.x] + block_exclusive_scan(mine, &sum);
    if (mine == 0) return;
    const bool fg = lab >= 0;
    const u32 o = fg ? (u32)(ord & 0xFFFFFFFFu) : (u32)(ord >> 32);
    const int* p = pick + 4 * b + (fg ? 0 : 2);
    if (!drawn(chosen, p[0], p[1], o)) return;
    const int l = level_of(first, levels, a);
    const u32 i = a - (u32)first[l];
    const u64 at = (u64)b * (u64)(first[l + 1] - first[l]) + i;
    const double z = (double)((const float*)logits[l])[at];
    const double t = fg ? 1.0 : 0.0;
    // loss::bce_with_logits: max(z, 0) − t·z + log1p(e^−|z|), gradient σ(z) − t.
    const double lo = __dadd_rn(__dsub_rn(fmax(z, 0.0), __dmul_rn(t, z)), log1p(exp(-fabs(z))));
    const double go = __dsub_rn(__ddiv_rn(1.0, __dadd_rn(1.0, exp(-z))), t);
    ((float*)dlogits[l])[at] = __fmul_rn((float)__ddiv_rn(go, count), scale);
    double lr = 0.0;
    if (fg) {
        double r[4];
        anchor_box(cols, stride, wh, A, l, i, r);
        const double* gt = truth + 4 * (tstart[b] + lab);
        // Coder::encode with weights (1, 1, 1, 1).
        const double rw = __dsub_rn(r[2], r[0]), rh = __dsub_rn(r[3], r[1]);
        const double rx = __dadd_rn(r[0], __dmul_rn(0.5, rw)), ry = __dadd_rn(r[1], __dmul_rn(0.5, rh));
        const double tw = __dsub_rn(gt[2], gt[0]), th = __dsub_rn(gt[3], gt[1]);
        const double tx = __dadd_rn(gt[0], __dmul_rn(0.5, tw)), ty = __dadd_rn(gt[1], __dmul_rn(0.5, th));
        const double e[4] = {__ddiv_rn(__dsub_rn(tx, rx), rw), __ddiv_rn(__dsub_rn(ty, ry), rh),
                             log(__ddiv_rn(tw, rw)), log(__ddiv_rn(th, rh))};
        const float* d = (const float*)deltas[l] + 4 * at;
        float* dd = (float*)ddeltas[l] + 4 * at;
        for (int q = 0; q < 4; ++q) {
            const double gq = smooth_l1(__dsub_rn((double)d[q], e[q]), beta, &lr);
            dd[q] = __fmul_rn((float)__ddiv_rn(gq, count), scale);
        }
    }
    const u32 s = atomicAdd(slots, 1u);
    terms[3 * (u64)s] = (double)((u64)b * N + a);
    terms[3 * (u64)s + 1] = lo;
    terms[3 * (u64)s + 2] = lr;
}

// Fast R-CNN's losses (detect::head::head_loss) for `rows` regions, one thread each: z holds
// rows × k class logits, d rows × dc deltas (4 a class), label[r] the region's class (0:
// background), target[4r …] a foreground region's encoded box. Softmax cross-entropy in f64 as
// layers::softmax_cross_entropy: dz[r·k + j] = f32((p_j − t_j) / rows) · scale; smooth L1
// (beta) of a foreground region's 4 deltas of its class against its target: dd there =
// f32(g / rows) · scale, 0 elsewhere; terms[2r] = the region's cross-entropy, terms[2r + 1] its
// smooth-L1 sum (the host sums them in region order, each divided by rows). Grid-stride.
extern "C" __global__ void head_loss_terms(const float* z, const float* d, const int* label,
                                           const double* target, int rows, int k, int dc,
                                           float scale, double beta, float* dz, float* dd,
                                           double* terms) {
    const double n = (double)rows;
    GRID_STRIDE(r, (u64)rows) {
        const float* zr = z + r * k;
        float* gr = dz + r * k;
        const int lab = label[r];
        double m = -__longlong_as_double(0x7FF0000000000000ll);
        for (int j = 0; j < k; ++j) m = fmax(m, (double)zr[j]);
        double s = 0.0;
        for (int j = 0; j < k; ++j) s = __dadd_rn(s, exp(__dsub_rn((double)zr[j], m)));
        const double lse = __dadd_rn(m, log(s));
        double lc = 0.0;
        for (int j = 0; j < k; ++j) {
            const double zl = __dsub_rn((double)zr[j], lse);
            const double t = j == lab ? 1.0 : 0.0;
            lc = __dsub_rn(lc, __dmul_rn(t, zl));
            gr[j] = __fmul_rn((float)__ddiv_rn(__dsub_rn(exp(zl), t), n), scale);
        }
        const float* dr = d + r * dc;
        float* hr = dd + r * dc;
        for (int j = 0; j < dc; ++j) hr[j] = 0.0f;
        double lr = 0.0;
        if (lab > 0) {
            const double* t = target + 4 * r;
            for (int q = 0; q < 4; ++q) {
                const double g = smooth_l1(__dsub_rn((double)dr[4 * lab + q], t[q]), beta, &lr);
                hr[4 * lab + q] = __fmul_rn((float)__ddiv_rn(g, n), scale);
            }
        }
        terms[2 * r] = lc;
        terms[2 * r + 1] = lr;
    }
}

// ---- The second stage's matching (head::sample_regions' Matcher::HEAD), on the proposals ----
// Image b's candidates are its proposals (rpn_merge's row b of `row` doubles: a count, then 5
// doubles a box, at most `post`), then its boxes truth[4·(tstart[b] + j) …], j < G_b =
// tstart[b + 1] − tstart[b]. label[b·stride + i] for candidate i (a double, so that it comes
// down in the proposals' copy): its best box j (the first, where several; IoUs in the host's f64
// rounding) when that IoU ≥ high, −1 below low, −2 between; −1 for every candidate of an image
// without boxes (Matcher::assign without its best-match pass). Grid (images), any block.
extern "C" __global__ void region_match(const double* rows, int row, int post,
                                        const double* truth, const int* tstart, double high,
                                        double low, int stride, double* label) {
    const int b = blockIdx.x;
    const double* r = rows + (u64)b * row;
    const int count = (int)fmin(fmax(r[0], 0.0), (double)post);
    const int t0 = tstart[b], g = tstart[b + 1] - t0;
    for (int i = threadIdx.x; i < count + g; i += blockDim.x) {
        const double* c = i < count ? r + 1 + 5 * i : truth + 4 * (t0 + i - count);
        int jb = 0;
        double top = -__longlong_as_double(0x7FF0000000000000ll);  // −∞
        for (int j = 0; j < g; ++j) {
            const double v = iou(c, truth + 4 * (t0 + j));
            if (v > top) {
                top = v;
                jb = j;
            }
        }
        label[(u64)b * stride + i] = g == 0 ? -1.0 : top >= high ? (double)jb : top < low ? -1.0 : -2.0;
    }
}
