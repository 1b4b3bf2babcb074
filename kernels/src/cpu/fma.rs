//! Peak arithmetic: chains of fused multiply-adds (and bf16 / int8 dot products) on independent
//! vector accumulators, written in inline assembly so that the compiler can neither fold nor drop
//! them: each loop iteration executes exactly [`INSTR_PER_ITER`] arithmetic instructions, plus
//! one `dec`/`jnz` pair. AVX-512 uses 24 accumulators (zmm0–11, zmm16–27), one instruction each per
//! iteration: 12 cover an FMA's 4-cycle latency on two pipes, but `vdpbf16ps` needs more (12
//! chains reached 92% of the FMA rate on Zen 5, 24 chains 100%). AVX2 has 16 registers: 12
//! accumulators, two instructions each per iteration.
//!
//! Checks: a short run of the very same kernel is compared bit for bit with a scalar reference
//! (an FMA is one correctly rounded operation, so vector and scalar agree exactly), and the state
//! after the timed runs is compared with the recurrence's closed form.

use crate::driver::{CheckError, Kernel};
use crate::ProbeError;

/// Accumulator slots (64 bytes each) in a kernel's state: the most any ISA uses.
pub const ACCUMULATORS: usize = 24;
/// Arithmetic instructions per loop iteration, on every vector ISA.
pub const INSTR_PER_ITER: usize = 24;

/// Independent accumulators (vector registers) of a kernel.
pub fn accumulators(isa: Isa) -> usize {
    match isa {
        Isa::Avx512 | Isa::Neon => 24,
        Isa::Avx2 => 12,
        Isa::Scalar => 8,
    }
}

/// Arithmetic instructions per loop iteration: [`INSTR_PER_ITER`] on x86; 48 on NEON (each of
/// the 24 accumulators gets `fmla` by +b, then by −b: `fmla` only adds to its accumulator, so
/// the pair keeps every value exact and bounded).
pub fn instr_per_iter(isa: Isa) -> usize {
    match isa {
        Isa::Neon => 2 * INSTR_PER_ITER,
        _ => INSTR_PER_ITER,
    }
}

/// The NEON operands: a · b = 2^-10, added (and, in a timed run, taken away again) per step.
const NEON_A: f64 = 1.0 / 32.0;
const NEON_B: f64 = 1.0 / 32.0;

/// The instruction set a kernel runs on.
pub use super::isa::Isa;

/// What the peak kernel computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    F64,
    F32,
    /// `vdpbf16ps`: f32 += bf16 × bf16 + bf16 × bf16 per lane.
    Bf16,
    /// `vpdpbusd`: i32 += four u8 × i8 products per lane.
    Int8,
}

impl From<Precision> for roofline_model::Precision {
    fn from(p: Precision) -> roofline_model::Precision {
        match p {
            Precision::F64 => roofline_model::Precision::F64,
            Precision::F32 => roofline_model::Precision::F32,
            Precision::Bf16 => roofline_model::Precision::Bf16,
            Precision::Int8 => roofline_model::Precision::Int8,
        }
    }
}

impl Precision {
    pub const ALL: [Precision; 4] = [
        Precision::F64,
        Precision::F32,
        Precision::Bf16,
        Precision::Int8,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Precision::F64 => "f64",
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
            Precision::Int8 => "int8",
        }
    }
    pub fn unit(self) -> &'static str {
        match self {
            Precision::Int8 => "OP/s",
            _ => "FLOP/s",
        }
    }
}

/// The best instruction set this CPU offers for `p`, or `None` when it has no instruction for it.
pub fn best_isa(p: Precision) -> Option<Isa> {
    let cap = Isa::current();
    detected_isa(p).map(|i| i.min(cap)).filter(|i| match p {
        // bf16 and int8 have only their AVX-512 kernel.
        Precision::Bf16 | Precision::Int8 => *i == Isa::Avx512,
        Precision::F64 | Precision::F32 => true,
    })
}

/// The widest instruction set this CPU runs the kernel of precision `p` with (no cap).
fn detected_isa(p: Precision) -> Option<Isa> {
    #[cfg(target_arch = "x86_64")]
    {
        let avx512 = std::arch::is_x86_feature_detected!("avx512f");
        match p {
            Precision::F64 | Precision::F32 => {
                if avx512 {
                    Some(Isa::Avx512)
                } else if std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                {
                    Some(Isa::Avx2)
                } else {
                    Some(Isa::Scalar)
                }
            }
            Precision::Bf16 => {
                (avx512 && std::arch::is_x86_feature_detected!("avx512bf16")).then_some(Isa::Avx512)
            }
            Precision::Int8 => {
                (avx512 && std::arch::is_x86_feature_detected!("avx512vnni")).then_some(Isa::Avx512)
            }
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        let neon = std::arch::is_aarch64_feature_detected!("neon");
        matches!(p, Precision::F64 | Precision::F32).then_some(if neon {
            Isa::Neon
        } else {
            Isa::Scalar
        })
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        matches!(p, Precision::F64 | Precision::F32).then_some(Isa::Scalar)
    }
}

/// The recurrence x ← a·x + b: contracting towards b / (1 − a) = 1.
const A: f64 = 1.0 - 1.0 / 1024.0;
const B: f64 = 1.0 / 1024.0;

/// Operations one loop iteration performs.
pub fn ops_per_iter(p: Precision, isa: Isa) -> f64 {
    let lanes = |elem_bits: u32| (isa.bits() / elem_bits) as f64;
    let per_instr = match p {
        Precision::F64 => lanes(64) * 2.0,
        Precision::F32 => lanes(32) * 2.0,
        Precision::Bf16 => lanes(32) * 2.0 * 2.0,
        Precision::Int8 => lanes(32) * 4.0 * 2.0,
    };
    match isa {
        // The scalar fallback keeps 8 chains of one multiply and one add.
        Isa::Scalar => 8.0 * 2.0,
        _ => instr_per_iter(isa) as f64 * per_instr,
    }
}

/// Accumulator state: 12 vectors of 64 bytes (the AVX2 and scalar paths use a prefix).
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct State([u8; 64 * ACCUMULATORS]);

/// A peak-arithmetic kernel.
pub struct FmaKernel {
    p: Precision,
    isa: Isa,
    state: State,
    initial: State,
    /// Operand vectors (64 bytes each), for bf16 and int8.
    ops: [State; 1],
    total_iters: u64,
}

impl FmaKernel {
    pub fn new(p: Precision, isa: Isa) -> Result<FmaKernel, ProbeError> {
        // What this CPU runs (the cap does not matter here: a capped run asks for less).
        let runs = Isa::of_this_arch().contains(&isa)
            && match (p, detected_isa(p)) {
                (Precision::Bf16 | Precision::Int8, Some(d)) => {
                    isa == Isa::Avx512 && d == Isa::Avx512
                }
                (_, Some(d)) => isa <= d,
                (_, None) => false,
            };
        if !runs {
            return Err(ProbeError::Unsupported(format!(
                "{} on {} is not supported by this CPU",
                p.name(),
                isa.name()
            )));
        }
        Ok(FmaKernel::unchecked(p, isa))
    }

    /// A kernel for a precision and instruction set already known to run here.
    fn unchecked(p: Precision, isa: Isa) -> FmaKernel {
        let mut k = FmaKernel {
            p,
            isa,
            state: State([0; 64 * ACCUMULATORS]),
            initial: State([0; 64 * ACCUMULATORS]),
            ops: [State([0; 64 * ACCUMULATORS])],
            total_iters: 0,
        };
        k.reset(false);
        k
    }

    /// Initial accumulators and operands. `counting` selects operands whose effect grows with
    /// every instruction (for the exact short check); otherwise bf16 operands cancel exactly
    /// (so long runs stay exact and finite).
    fn reset(&mut self, counting: bool) {
        self.total_iters = 0;
        match self.p {
            Precision::F32 => {
                for (i, x) in as_f32_mut(&mut self.state).iter_mut().enumerate() {
                    *x = 0.5 + (i % 97) as f32 / 64.0;
                }
                // Operands a and b, broadcast by the kernel from bytes 0 and 64.
                let ops = &mut self.ops[0].0;
                ops[..4].copy_from_slice(&(A as f32).to_le_bytes());
                ops[64..68].copy_from_slice(&(B as f32).to_le_bytes());
            }
            Precision::F64 => {
                for (i, x) in as_f64_mut(&mut self.state).iter_mut().enumerate() {
                    *x = 0.5 + (i % 97) as f64 / 64.0;
                }
                let ops = &mut self.ops[0].0;
                ops[..8].copy_from_slice(&A.to_le_bytes());
                ops[64..72].copy_from_slice(&B.to_le_bytes());
            }
            Precision::Bf16 => {
                for (i, x) in as_f32_mut(&mut self.state).iter_mut().enumerate() {
                    *x = (i % 13) as f32;
                }
                // Operand 1: all ones; operand 2: pairs (2^-8, ±2^-8).
                let one = half::bf16::from_f32(1.0).to_bits();
                let pos = half::bf16::from_f32(1.0 / 256.0).to_bits();
                let second = if counting {
                    pos
                } else {
                    half::bf16::from_f32(-1.0 / 256.0).to_bits()
                };
                let ops = &mut self.ops[0].0;
                for j in 0..32 {
                    ops[2 * j..2 * j + 2].copy_from_slice(&one.to_le_bytes());
                    let v = if j % 2 == 0 { pos } else { second };
                    ops[64 + 2 * j..64 + 2 * j + 2].copy_from_slice(&v.to_le_bytes());
                }
            }
            Precision::Int8 => {
                for (i, x) in as_i32_mut(&mut self.state).iter_mut().enumerate() {
                    *x = i as i32 * 1000;
                }
                let ops = &mut self.ops[0].0;
                ops[..64].fill(1); // u8 operand
                ops[64..128].fill(if counting { 1 } else { 255 }); // i8 operand: 1 or −1
            }
        }
        if self.isa == Isa::Neon {
            // a, b and ±b (the pair's second operand), broadcast from bytes 0, 64 and 128.
            let second = if counting { NEON_B } else { -NEON_B };
            let ops = &mut self.ops[0].0;
            ops.fill(0);
            if self.p == Precision::F32 {
                ops[..4].copy_from_slice(&(NEON_A as f32).to_le_bytes());
                ops[64..68].copy_from_slice(&(NEON_B as f32).to_le_bytes());
                ops[128..132].copy_from_slice(&(second as f32).to_le_bytes());
            } else {
                ops[..8].copy_from_slice(&NEON_A.to_le_bytes());
                ops[64..72].copy_from_slice(&NEON_B.to_le_bytes());
                ops[128..136].copy_from_slice(&second.to_le_bytes());
            }
        }
        self.initial = self.state;
    }

    fn run_raw(&mut self, iters: u64) {
        if iters == 0 {
            return;
        }
        self.total_iters += iters;
        let s = self.state.0.as_mut_ptr();
        let o = self.ops[0].0.as_ptr();
        // SAFETY: `new` verified the CPU has the instructions of (p, isa); `s` points to 1536
        // bytes, 64-aligned; `o` to 1536 bytes of which 128 are read; iters ≥ 1.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            match (self.p, self.isa) {
                (Precision::F32, Isa::Avx512) => x86::f32_avx512(s, o, iters),
                (Precision::F64, Isa::Avx512) => x86::f64_avx512(s, o, iters),
                (Precision::F32, Isa::Avx2) => x86::f32_avx2(s, o, iters),
                (Precision::F64, Isa::Avx2) => x86::f64_avx2(s, o, iters),
                (Precision::Bf16, _) => x86::bf16_avx512(s, o, iters),
                (Precision::Int8, _) => x86::int8_avx512(s, o, iters),
                // `new` refuses NEON here.
                (p, Isa::Scalar | Isa::Neon) => scalar(&mut self.state, p, iters),
            }
        }
        // SAFETY: as above (NEON detected by `new`).
        #[cfg(target_arch = "aarch64")]
        unsafe {
            match (self.p, self.isa) {
                (Precision::F32, Isa::Neon) => neon::f32(s, o, iters),
                (Precision::F64, Isa::Neon) => neon::f64(s, o, iters),
                (p, _) => scalar(&mut self.state, p, iters),
            }
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            let _ = (s, o);
            scalar(&mut self.state, self.p, iters);
        }
    }

    /// Values the state must hold after `n` recurrence steps from the initial state, and the
    /// tolerance: exact (bit for bit) when `exact`, else the closed form within 1e-3.
    fn verify(&self, steps: u64, exact: bool, counting: bool) -> Result<f64, CheckError> {
        let lanes_used = |elem: usize| match self.isa {
            Isa::Avx512 => 64 / elem,
            Isa::Avx2 => 32 / elem,
            Isa::Neon => 16 / elem,
            Isa::Scalar => 1,
        };
        let used = |elem: usize, reg: usize, lane: usize| -> usize { reg * (64 / elem) + lane };
        let regs = accumulators(self.isa);
        let mut worst = 0.0f64;
        match self.p {
            Precision::F32 | Precision::F64 => {
                for r in 0..regs {
                    for l in 0..lanes_used(if self.p == Precision::F32 { 4 } else { 8 }) {
                        let (got, x0) = if self.p == Precision::F32 {
                            let i = used(4, r, l);
                            (
                                as_f32(&self.state)[i] as f64,
                                as_f32(&self.initial)[i] as f64,
                            )
                        } else {
                            let i = used(8, r, l);
                            (as_f64(&self.state)[i], as_f64(&self.initial)[i])
                        };
                        let want = if self.isa == Isa::Neon {
                            // +a·b per step when counting; +a·b then −a·b otherwise: exact.
                            if counting {
                                x0 + steps as f64 * NEON_A * NEON_B
                            } else {
                                x0
                            }
                        } else if exact {
                            reference_chain(self.p, self.isa, x0, steps)
                        } else {
                            1.0 + A.powf(steps as f64) * (x0 - 1.0)
                        };
                        let exact = exact || self.isa == Isa::Neon;
                        let rel = ((got - want) / want).abs();
                        let what = || {
                            format!(
                                "{} accumulator {r} lane {l} after {steps} steps",
                                self.p.name()
                            )
                        };
                        if exact && got != want {
                            return Err(CheckError::exact(what(), got, want));
                        }
                        if !got.is_finite() || rel > 1e-3 {
                            return Err(CheckError::Bound {
                                what: what(),
                                got,
                                want,
                                err: rel,
                                scale: "the value",
                                bound: 1e-3,
                            });
                        }
                        worst = worst.max(rel);
                    }
                }
            }
            Precision::Bf16 => {
                for (i, (&got, &x0)) in as_f32(&self.state)
                    .iter()
                    .zip(as_f32(&self.initial))
                    .enumerate()
                {
                    // Each instruction adds 2^-8 + 2^-8 (counting) or 2^-8 − 2^-8 (cancelling).
                    let want = if counting {
                        x0 + steps as f32 / 128.0
                    } else {
                        x0
                    };
                    if got != want {
                        return Err(CheckError::exact(
                            format!("bf16 lane {i} after {steps} dot products"),
                            got,
                            want,
                        ));
                    }
                }
            }
            Precision::Int8 => {
                for (i, (&got, &x0)) in as_i32(&self.state)
                    .iter()
                    .zip(as_i32(&self.initial))
                    .enumerate()
                {
                    let per = if counting { 4i64 } else { -4 };
                    let want = (x0 as i64).wrapping_add(per.wrapping_mul(steps as i64)) as i32;
                    if got != want {
                        return Err(CheckError::exact(
                            format!("int8 lane {i} after {steps} dot products"),
                            got,
                            want,
                        ));
                    }
                }
            }
        }
        Ok(worst)
    }

    /// Recurrence steps (updates of each accumulator) done so far.
    fn steps(&self) -> u64 {
        match self.isa {
            Isa::Avx2 | Isa::Neon => 2 * self.total_iters,
            _ => self.total_iters,
        }
    }

    /// Instructions one loop iteration retires, as the CPU's counter sees them: the difference
    /// of two runs of different lengths, so that call overhead cancels. `Ok(None)` when no
    /// counter is available; an error when the count is not the expected
    /// [`INSTR_PER_ITER`] + 2 (`dec`, `jnz`).
    pub fn confirm_instructions(p: Precision, isa: Isa) -> Result<Option<f64>, ProbeError> {
        if isa == Isa::Scalar {
            return Ok(None);
        }
        let mut k = FmaKernel::new(p, isa)?;
        let (short, long) = (100_000u64, 300_000u64);
        let (_, a) = crate::perf::count_instructions(|| k.run_raw(short));
        let (_, b) = crate::perf::count_instructions(|| k.run_raw(long));
        let (Some(a), Some(b)) = (a, b) else {
            return Ok(None);
        };
        let per_iter = (b as f64 - a as f64) / (long - short) as f64;
        // + the loop's two (dec/jnz; subs/b.ne).
        let want = (instr_per_iter(isa) + 2) as f64;
        if (per_iter - want).abs() > 0.25 {
            return Err(CheckError::exact(
                format!(
                    "{} {}: instructions the CPU retired per loop iteration",
                    p.name(),
                    isa.name()
                ),
                format!("{per_iter:.2}"),
                want,
            )
            .into());
        }
        Ok(Some(per_iter))
    }

    /// The exact short check: a fresh state, `iters` iterations, compared bit for bit.
    pub fn self_test(p: Precision, isa: Isa, iters: u64) -> Result<(), ProbeError> {
        Ok(FmaKernel::new(p, isa)?.exact_run(iters)?)
    }

    /// The exact short check on a fresh state, leaving this kernel's state as it was.
    fn exact_run(&self, iters: u64) -> Result<(), CheckError> {
        let mut k = FmaKernel::unchecked(self.p, self.isa);
        k.reset(true);
        k.run_raw(iters);
        k.verify(k.steps(), true, true).map(|_| ())
    }
}

impl Kernel for FmaKernel {
    fn ops_per_iter(&self) -> f64 {
        ops_per_iter(self.p, self.isa)
    }
    fn bytes_per_iter(&self) -> f64 {
        0.0
    }
    fn run(&mut self, iters: u64) {
        self.run_raw(iters)
    }
    fn check(&mut self) -> Result<f64, CheckError> {
        self.exact_run(1000)?;
        self.verify(self.steps(), false, false)
    }
}

/// The scalar reference of one f32/f64 accumulator: `steps` FMAs (or multiply-then-add on the
/// scalar path) from `x0`.
fn reference_chain(p: Precision, isa: Isa, x0: f64, steps: u64) -> f64 {
    let mut x = x0;
    let mut x32 = x0 as f32;
    for _ in 0..steps {
        match (p, isa) {
            (Precision::F32, Isa::Scalar) => x32 = std::hint::black_box(x32 * A as f32) + B as f32,
            (Precision::F32, _) => x32 = x32.mul_add(A as f32, B as f32),
            (_, Isa::Scalar) => x = std::hint::black_box(x * A) + B,
            _ => x = x.mul_add(A, B),
        }
    }
    if p == Precision::F32 {
        x32 as f64
    } else {
        x
    }
}

/// Eight scalar chains of multiply-then-add, for CPUs without vector FMA. Chain r lives in
/// lane 0 of "register" r (byte offset 64·r), where `verify` looks for it.
fn scalar(state: &mut State, p: Precision, iters: u64) {
    match p {
        Precision::F32 => {
            let s = as_f32_mut(state);
            let (a, b) = (
                std::hint::black_box(A as f32),
                std::hint::black_box(B as f32),
            );
            for _ in 0..iters {
                for r in 0..8 {
                    s[16 * r] = std::hint::black_box(s[16 * r] * a) + b;
                }
            }
        }
        _ => {
            let s = as_f64_mut(state);
            let (a, b) = (std::hint::black_box(A), std::hint::black_box(B));
            for _ in 0..iters {
                for r in 0..8 {
                    s[8 * r] = std::hint::black_box(s[8 * r] * a) + b;
                }
            }
        }
    }
}

fn as_f32(s: &State) -> &[f32] {
    // SAFETY: State is 64-aligned, 1536 bytes; every bit pattern is a valid f32.
    unsafe { std::slice::from_raw_parts(s.0.as_ptr() as *const f32, s.0.len() / 4) }
}
fn as_f32_mut(s: &mut State) -> &mut [f32] {
    // SAFETY: as above, exclusive borrow.
    unsafe { std::slice::from_raw_parts_mut(s.0.as_mut_ptr() as *mut f32, s.0.len() / 4) }
}
fn as_f64(s: &State) -> &[f64] {
    // SAFETY: as above.
    unsafe { std::slice::from_raw_parts(s.0.as_ptr() as *const f64, s.0.len() / 8) }
}
fn as_f64_mut(s: &mut State) -> &mut [f64] {
    // SAFETY: as above, exclusive borrow.
    unsafe { std::slice::from_raw_parts_mut(s.0.as_mut_ptr() as *mut f64, s.0.len() / 8) }
}
fn as_i32(s: &State) -> &[i32] {
    // SAFETY: as above.
    unsafe { std::slice::from_raw_parts(s.0.as_ptr() as *const i32, s.0.len() / 4) }
}
fn as_i32_mut(s: &mut State) -> &mut [i32] {
    // SAFETY: as above, exclusive borrow.
    unsafe { std::slice::from_raw_parts_mut(s.0.as_mut_ptr() as *mut i32, s.0.len() / 4) }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The kernels. Each loads its accumulators from `s` (64 bytes apart), broadcasts or loads its
    //! operands into two registers, runs `n` iterations of 24 instructions, and stores the
    //! accumulators back.
    use std::arch::asm;

    /// 24 AVX-512 accumulators zmm0–11 and zmm16–27 (state slots 0–23), operands zmm30, zmm31; `$setup` fills the operands.
    macro_rules! kernel512 {
        ($name:ident, $feat:literal, $setup:literal, $op:literal) => {
            #[target_feature(enable = $feat)]
            pub unsafe fn $name(s: *mut u8, o: *const u8, n: u64) {
                asm!(
                    ".irp r,0,1,2,3,4,5,6,7,8,9,10,11,16,17,18,19,20,21,22,23,24,25,26,27",
                    "vmovaps zmm\\r, [{s} + 64 * (\\r - 4 * (\\r / 16))]",
                    ".endr",
                    $setup,
                    "2:",
                    ".irp r,0,1,2,3,4,5,6,7,8,9,10,11,16,17,18,19,20,21,22,23,24,25,26,27",
                    concat!($op, " zmm\\r, zmm30, zmm31"),
                    ".endr",
                    "dec {n}",
                    "jnz 2b",
                    ".irp r,0,1,2,3,4,5,6,7,8,9,10,11,16,17,18,19,20,21,22,23,24,25,26,27",
                    "vmovaps [{s} + 64 * (\\r - 4 * (\\r / 16))], zmm\\r",
                    ".endr",
                    s = in(reg) s,
                    o = in(reg) o,
                    n = inout(reg) n => _,
                    out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm3") _,
                    out("xmm4") _, out("xmm5") _, out("xmm6") _, out("xmm7") _,
                    out("xmm8") _, out("xmm9") _, out("xmm10") _, out("xmm11") _,
                    out("xmm16") _, out("xmm17") _, out("xmm18") _, out("xmm19") _,
                    out("xmm20") _, out("xmm21") _, out("xmm22") _, out("xmm23") _,
                    out("xmm24") _, out("xmm25") _, out("xmm26") _, out("xmm27") _,
                    out("xmm30") _, out("xmm31") _,
                    options(nostack),
                );
            }
        };
    }

    // FMA kernels take their operands a, b as broadcast scalars at o[0..8] and o[64..72].
    kernel512!(
        f32_avx512,
        "avx512f",
        "vbroadcastss zmm30, dword ptr [{o}]\nvbroadcastss zmm31, dword ptr [{o} + 64]",
        "vfmadd213ps"
    );
    kernel512!(
        f64_avx512,
        "avx512f",
        "vbroadcastsd zmm30, qword ptr [{o}]\nvbroadcastsd zmm31, qword ptr [{o} + 64]",
        "vfmadd213pd"
    );
    // Dot products take full operand vectors: acc += dot(zmm30, zmm31).
    kernel512!(
        bf16_avx512,
        "avx512f,avx512bf16",
        "vmovaps zmm30, [{o}]\nvmovaps zmm31, [{o} + 64]",
        "vdpbf16ps"
    );
    kernel512!(
        int8_avx512,
        "avx512f,avx512vnni",
        "vmovaps zmm30, [{o}]\nvmovaps zmm31, [{o} + 64]",
        "vpdpbusd"
    );

    /// 12 AVX2 accumulators ymm0–11, operands ymm12, ymm13, two instructions each per iteration.
    macro_rules! kernel256 {
        ($name:ident, $setup:literal, $op:literal) => {
            #[target_feature(enable = "avx2,fma")]
            pub unsafe fn $name(s: *mut u8, o: *const u8, n: u64) {
                asm!(
                    ".irp r,0,1,2,3,4,5,6,7,8,9,10,11",
                    "vmovaps ymm\\r, [{s} + 64 * \\r]",
                    ".endr",
                    $setup,
                    "2:",
                    ".rept 2",
                    ".irp r,0,1,2,3,4,5,6,7,8,9,10,11",
                    concat!($op, " ymm\\r, ymm12, ymm13"),
                    ".endr",
                    ".endr",
                    "dec {n}",
                    "jnz 2b",
                    ".irp r,0,1,2,3,4,5,6,7,8,9,10,11",
                    "vmovaps [{s} + 64 * \\r], ymm\\r",
                    ".endr",
                    s = in(reg) s,
                    o = in(reg) o,
                    n = inout(reg) n => _,
                    out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm3") _,
                    out("xmm4") _, out("xmm5") _, out("xmm6") _, out("xmm7") _,
                    out("xmm8") _, out("xmm9") _, out("xmm10") _, out("xmm11") _,
                    out("xmm12") _, out("xmm13") _,
                    options(nostack),
                );
            }
        };
    }

    kernel256!(
        f32_avx2,
        "vbroadcastss ymm12, dword ptr [{o}]\nvbroadcastss ymm13, dword ptr [{o} + 64]",
        "vfmadd213ps"
    );
    kernel256!(
        f64_avx2,
        "vbroadcastsd ymm12, qword ptr [{o}]\nvbroadcastsd ymm13, qword ptr [{o} + 64]",
        "vfmadd213pd"
    );
}

#[cfg(target_arch = "aarch64")]
mod neon {
    //! The NEON kernels: 24 accumulators v0–v23 (state slots 0–23, 16 of their 64 bytes), the
    //! operands a, b, ±b in v24–v26; each iteration `fmla`s every accumulator by a·b, then by
    //! a·(±b): 48 instructions, two dependent per chain, 24 chains (enough for four pipes of
    //! four cycles' latency, Neoverse V2).
    use std::arch::asm;

    macro_rules! kernel {
        ($name:ident, $t:literal) => {
            pub unsafe fn $name(s: *mut u8, o: *const u8, n: u64) {
                asm!(
                    concat!("ld1r {{v24.", $t, "}}, [{o}]"),
                    "add {p}, {o}, #64",
                    concat!("ld1r {{v25.", $t, "}}, [{p}]"),
                    "add {p}, {o}, #128",
                    concat!("ld1r {{v26.", $t, "}}, [{p}]"),
                    ".irp r,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23",
                    "ldr q\\r, [{s}, #(64 * \\r)]",
                    ".endr",
                    "2:",
                    ".irp r,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23",
                    concat!("fmla v\\r\\().", $t, ", v24.", $t, ", v25.", $t),
                    ".endr",
                    ".irp r,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23",
                    concat!("fmla v\\r\\().", $t, ", v24.", $t, ", v26.", $t),
                    ".endr",
                    "subs {n}, {n}, #1",
                    "b.ne 2b",
                    ".irp r,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23",
                    "str q\\r, [{s}, #(64 * \\r)]",
                    ".endr",
                    s = in(reg) s,
                    o = in(reg) o,
                    p = out(reg) _,
                    n = inout(reg) n => _,
                    out("v0") _, out("v1") _, out("v2") _, out("v3") _,
                    out("v4") _, out("v5") _, out("v6") _, out("v7") _,
                    out("v8") _, out("v9") _, out("v10") _, out("v11") _,
                    out("v12") _, out("v13") _, out("v14") _, out("v15") _,
                    out("v16") _, out("v17") _, out("v18") _, out("v19") _,
                    out("v20") _, out("v21") _, out("v22") _, out("v23") _,
                    out("v24") _, out("v25") _, out("v26") _,
                    options(nostack),
                );
            }
        };
    }

    kernel!(f32, "4s");
    kernel!(f64, "2d");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_supported_kernel_is_exact_against_the_scalar_reference() {
        let mut tested = 0;
        for p in Precision::ALL {
            let Some(best) = best_isa(p) else { continue };
            for isa in Isa::available() {
                // bf16 and int8 have only their AVX-512 kernel; f32 and f64 every set.
                let allowed = isa <= best
                    && (matches!(p, Precision::F32 | Precision::F64) || isa == Isa::Avx512);
                if !allowed {
                    continue;
                }
                for iters in [1, 7, 1000] {
                    FmaKernel::self_test(p, isa, iters)
                        .unwrap_or_else(|e| panic!("{} {}: {e}", p.name(), isa.name()));
                }
                tested += 1;
            }
        }
        assert!(tested >= 2);
    }

    #[test]
    fn long_runs_match_the_closed_form_and_a_corrupted_state_is_caught() {
        let isa = best_isa(Precision::F32).unwrap();
        let mut k = FmaKernel::new(Precision::F32, isa).unwrap();
        k.run(100_000);
        assert!(k.check().is_ok());
        // Corrupt one accumulator: the check must fail.
        as_f32_mut(&mut k.state)[0] = 3.0;
        assert!(k.check().is_err());
    }

    #[test]
    fn the_cpu_retires_exactly_the_stated_instructions() {
        for p in Precision::ALL {
            let Some(isa) = best_isa(p) else { continue };
            match FmaKernel::confirm_instructions(p, isa) {
                Ok(Some(n)) => {
                    let want = (instr_per_iter(isa) + 2) as f64;
                    assert!((n - want).abs() <= 0.25, "{n}, expected {want}")
                }
                Ok(None) => eprintln!(
                    "no perf counters: instruction count of {} not confirmed",
                    p.name()
                ),
                Err(e) => panic!("{e}"),
            }
        }
    }

    #[test]
    fn counts_are_what_the_instructions_do() {
        assert_eq!(ops_per_iter(Precision::F32, Isa::Avx512), 24.0 * 16.0 * 2.0);
        assert_eq!(ops_per_iter(Precision::F64, Isa::Avx512), 24.0 * 8.0 * 2.0);
        assert_eq!(ops_per_iter(Precision::F32, Isa::Avx2), 24.0 * 8.0 * 2.0);
        // NEON: 48 fmla (24 accumulators, by +b then by −b) of 4 or 2 lanes.
        assert_eq!(ops_per_iter(Precision::F32, Isa::Neon), 48.0 * 4.0 * 2.0);
        assert_eq!(ops_per_iter(Precision::F64, Isa::Neon), 48.0 * 2.0 * 2.0);
        assert_eq!(
            ops_per_iter(Precision::Bf16, Isa::Avx512),
            24.0 * 16.0 * 4.0
        );
        assert_eq!(
            ops_per_iter(Precision::Int8, Isa::Avx512),
            24.0 * 16.0 * 8.0
        );
    }
}
