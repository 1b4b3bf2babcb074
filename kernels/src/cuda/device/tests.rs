//! The device wrapper's host-side tests: staging offsets, the parallel copy.

use super::*;

/// A staged batch is copied whole, byte for byte, whatever its length against the slices
/// (small: one thread; large: several, the last slice short).
#[test]
fn a_parallel_copy_is_the_copy() {
    for n in [0, 1, 4096, (8 << 20) - 1, 8 << 20, (24 << 20) + 3, 77 << 20] {
        let src: Vec<u8> = (0..n).map(|i| (i * 31 + i / 977) as u8).collect();
        let mut dst = vec![0u8; n];
        parallel_copy(&mut dst, &src);
        assert!(dst == src, "{n} bytes");
    }
}

/// Uploads between two synchronisations never share staging bytes: each goes after the
/// last (aligned), and one that does not fit gets a new, larger buffer (the old one kept).
#[test]
fn staged_uploads_never_overlap_before_a_synchronisation() {
    let (mut cap, mut used) = (0usize, 0usize);
    let mut taken: Vec<(usize, usize, usize)> = Vec::new(); // (buffer, offset, len)
    let mut buffer = 0;
    for n in [100, 3 << 20, 1, 255, 257, 5 << 20, 64, 9 << 20] {
        let off = match stage_at(cap, used, n) {
            Ok(off) => off,
            Err(new_cap) => {
                assert!(new_cap >= n && new_cap >= 2 * cap && new_cap >= STAGE_MIN);
                cap = new_cap;
                buffer += 1;
                0
            }
        };
        assert_eq!(off % STAGE_ALIGN, 0);
        assert!(off + n <= cap);
        for &(b, o, l) in &taken {
            assert!(
                b != buffer || off >= o + l || off + n <= o,
                "{n} at {off} overlaps"
            );
        }
        taken.push((buffer, off, n));
        used = off + n;
    }
    // After a synchronisation the buffer is reused from its start.
    assert_eq!(stage_at(cap, 0, 100), Ok(0));
}
