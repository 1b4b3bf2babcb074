//! AMX-BF16 (Sapphire Rapids and newer): a 32 × 32 tile of C (f32) += A (32 rows of bf16
//! pairs) · B (one packed panel of 32 columns) with `tdpbf16ps`, four accumulator tiles of
//! 16 × 16, two A tiles and two B tiles (all eight tile registers, each 16 rows of 64 bytes).
//!
//! The layouts are the vector path's: A in rows (row i's pair p at word `i·lda + p`), B in
//! panels (pair p's 32 columns at words `p·32 .. p·32 + 32`): a B panel is two AMX B tiles
//! side by side (rows 128 bytes apart), a run of 16 pairs of an A row one A tile row. The
//! instruction adds the products of each pair into f32 (Intel: the even element's product,
//! then the odd one's, round to nearest even, denormal inputs and results flushed to zero).
//! Pairs past a multiple of 16 are left to the caller (the vector micro-kernel).
//!
//! Linux hands out the tile state only on request (`arch_prctl(ARCH_REQ_XCOMP_PERM)`, once per
//! process): [`available`] asks, and says no where the CPU, the kernel or a VM refuses.

/// Rows of the tile an AMX call computes (and columns: one B panel).
pub const ROWS: usize = 32;
/// Pairs of k per tile step (16 pairs: 64 bytes of an A row, 16 rows of a B tile).
pub const STEP: usize = 16;

/// Whether the CPU says it has AMX-TILE and AMX-BF16 (CPUID.(7, 0):EDX bits 24 and 22),
/// whether or not this process may use them.
pub fn in_cpuid() -> bool {
    // Leaf 7 exists on every x86-64 CPU with AVX2 or AVX-512; on an older one it reads as the
    // highest basic leaf, whose EDX has no meaning here but is harmless.
    let leaf = std::arch::x86_64::__cpuid_count(7, 0);
    leaf.edx & (1 << 22) != 0 && leaf.edx & (1 << 24) != 0
}

/// Whether the CPU has AMX-TILE and AMX-BF16 and the kernel lets this process use them.
pub fn available() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| {
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        {
            if !in_cpuid() {
                return false;
            }
            const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
            const XFEATURE_XTILEDATA: libc::c_long = 18;
            // SAFETY: a request for a permission; it changes nothing else.
            unsafe {
                libc::syscall(
                    libc::SYS_arch_prctl,
                    ARCH_REQ_XCOMP_PERM,
                    XFEATURE_XTILEDATA,
                ) == 0
            }
        }
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
        false
    })
}

/// Palette 1, eight tiles of 16 rows × 64 bytes.
#[repr(C, align(64))]
struct Config([u8; 64]);

const CONFIG: Config = {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut t = 0;
    while t < 8 {
        c[16 + 2 * t] = 64; // bytes per row (little-endian u16)
        c[48 + t] = 16; // rows
        t += 1;
    }
    Config(c)
};

/// The tile configuration loaded on this thread for a run of [`tile`] calls, released when
/// dropped (so the thread's tile state is not kept, and saved at every switch, after the
/// products).
pub struct Tiles(());

impl Tiles {
    /// Loads the configuration.
    ///
    /// # Safety
    /// [`available`] returned true. The value must be dropped on the thread that made it, and
    /// no other tile configuration loaded on that thread while it lives.
    #[cfg(target_arch = "x86_64")]
    pub unsafe fn configure() -> Tiles {
        std::arch::asm!(
            "ldtilecfg [{cfg}]",
            cfg = in(reg) &CONFIG as *const Config,
            options(nostack, readonly),
        );
        Tiles(())
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: the configuration was loaded by `configure` on this thread.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            std::arch::asm!("tilerelease", options(nostack, nomem))
        };
    }
}

/// `C[32×32] (+)= A · B` over `steps · 16` pairs of k: C f32 with leading dimension `ldc`
/// (added to when `load`, else overwritten), A rows `lda` words apart, B one packed panel.
///
/// # Safety
/// The tiles configured on this thread (`_tiles`); `steps ≥ 1`; A's 32 rows and B's
/// `steps · 16` pairs readable; C's 32 rows of 32 values readable and writable.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn tile(
    _tiles: &Tiles,
    steps: usize,
    a: *const u32,
    lda: usize,
    b: *const u32,
    c: *mut f32,
    ldc: usize,
    load: bool,
) {
    debug_assert!(steps >= 1);
    let ldc4 = ldc * 4;
    let lda4 = lda * 4;
    std::arch::asm!(
        "test {load}, {load}",
        "jz 2f",
        "tileloadd tmm0, [{c0} + {ldc4}*1]",
        "tileloadd tmm1, [{c0} + {ldc4}*1 + 64]",
        "tileloadd tmm2, [{c1} + {ldc4}*1]",
        "tileloadd tmm3, [{c1} + {ldc4}*1 + 64]",
        "jmp 3f",
        "2:",
        "tilezero tmm0",
        "tilezero tmm1",
        "tilezero tmm2",
        "tilezero tmm3",
        "3:",
        "tileloadd tmm4, [{a0} + {lda4}*1]",
        "tileloadd tmm5, [{a1} + {lda4}*1]",
        "tileloadd tmm6, [{b} + {s128}*1]",
        "tileloadd tmm7, [{b} + {s128}*1 + 64]",
        "tdpbf16ps tmm0, tmm4, tmm6",
        "tdpbf16ps tmm1, tmm4, tmm7",
        "tdpbf16ps tmm2, tmm5, tmm6",
        "tdpbf16ps tmm3, tmm5, tmm7",
        "add {a0}, 64",
        "add {a1}, 64",
        "add {b}, 2048",
        "dec {n}",
        "jnz 3b",
        "tilestored [{c0} + {ldc4}*1], tmm0",
        "tilestored [{c0} + {ldc4}*1 + 64], tmm1",
        "tilestored [{c1} + {ldc4}*1], tmm2",
        "tilestored [{c1} + {ldc4}*1 + 64], tmm3",
        load = in(reg) load as usize,
        c0 = in(reg) c,
        c1 = in(reg) c.add(16 * ldc),
        ldc4 = in(reg) ldc4,
        a0 = inout(reg) a => _,
        a1 = inout(reg) a.add(16 * lda) => _,
        lda4 = in(reg) lda4,
        b = inout(reg) b => _,
        s128 = in(reg) 128usize,
        n = inout(reg) steps => _,
        options(nostack),
    );
}
