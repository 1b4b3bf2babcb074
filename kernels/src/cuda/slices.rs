//! Host-side work on large buffers in slices on up to 8 threads: a training batch staged for
//! upload (copied, or rounded to 16 bits) while the GPU waits for it or trains on the last one.

/// Copies `src` into `dst` (equal lengths), in slices on up to 8 threads when it is large: a
/// training batch staged for upload (77 MB for ResNet-50 at batch 128) takes about a tenth of a
/// ResNet step on one thread, and the GPU waits for it.
pub fn parallel_copy(dst: &mut [u8], src: &[u8]) {
    in_slices(dst, src, 8 << 20, |d, s| d.copy_from_slice(s));
}

/// `f` over `dst` and `src` (equal lengths) in matching slices on up to 8 threads, one thread
/// per `per_thread` elements at least (one slice, on this thread, when they are short).
pub fn in_slices<D: Send, S: Sync>(
    dst: &mut [D],
    src: &[S],
    per_thread: usize,
    f: impl Fn(&mut [D], &[S]) + Sync,
) {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(8)
        .min(src.len() / per_thread.max(1))
        .max(1);
    if threads == 1 {
        return f(dst, src);
    }
    let chunk = src.len().div_ceil(threads);
    let f = &f;
    std::thread::scope(|s| {
        for (d, c) in dst.chunks_mut(chunk).zip(src.chunks(chunk)) {
            s.spawn(move || f(d, c));
        }
    });
}
