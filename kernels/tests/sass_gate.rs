//! The SASS gate: the machine code every CUDA kernel becomes, read with `nvdisasm`, for each
//! real architecture the probe runs on (sm_80, sm_89, sm_90, and sm_100 and sm_120 where the
//! NVRTC loaded knows them). A kernel that exists to measure an instruction must hold that
//! instruction — DFMA, FFMA, HFMA2, HMMA, IMMA, QMMA, the 16-byte loads and stores — the right
//! number of times in its loop, no conversion or call that would mean the instruction is
//! emulated, and no kernel may touch local memory. PTX cannot show this: ptxas decides what
//! an `mma.sync` becomes (on sm_90 an fp8 one becomes conversions and f16 HMMAs).
//!
//! Needs NVRTC (as `nvrtc_gate.rs`) and `nvdisasm` (the pip wheel `nvidia-cuda-nvdisasm`, found
//! through `ROOFLINE_NVDISASM`, beside the NVRTC loaded, `CUDA_HOME` or `/usr/local/cuda`).
//! Under `CI=true` a missing one fails the gate; elsewhere the gate skips.

use rayon::prelude::*;
use roofline_kernels::cuda::nvrtc::{self, Target, SOURCES};
use roofline_kernels::probe::gpu::{mma_support, wgmma_support};
use std::collections::BTreeMap;
use std::path::PathBuf;

mod common;

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// nvdisasm: `ROOFLINE_NVDISASM`, beside the NVRTC loaded (a CUDA 13 wheel's `cu13/bin`, a
/// toolkit's `bin`), `CUDA_HOME/bin`, `/usr/local/cuda/bin`.
fn nvdisasm() -> Option<PathBuf> {
    common::tool_beside_nvrtc("nvdisasm", Some("ROOFLINE_NVDISASM"), &["cu13/bin"])
}

/// One SASS instruction: its opcode (predicate dropped) and the label it branches to, if any.
#[derive(Debug)]
struct Instr {
    opcode: String,
    target: Option<String>,
}

/// One function of a disassembly: its instructions, and the instruction index each label
/// stands before.
#[derive(Debug, Default)]
struct Function {
    instrs: Vec<Instr>,
    labels: BTreeMap<String, usize>,
}

impl Function {
    /// The loops: `[start, end)` ranges closed by a branch back to a label before it.
    fn loops(&self) -> Vec<(usize, usize)> {
        self.instrs
            .iter()
            .enumerate()
            .filter_map(|(i, ins)| {
                let start = *self.labels.get(ins.target.as_ref()?)?;
                (start <= i).then_some((start, i + 1))
            })
            .collect()
    }

    fn count(&self, range: (usize, usize), want: &dyn Fn(&str) -> bool) -> usize {
        self.instrs[range.0..range.1]
            .iter()
            .filter(|i| want(&i.opcode))
            .count()
    }
}

/// `nvdisasm -c` output, split by function (`.text.<name>` sections).
fn parse_sass(text: &str) -> BTreeMap<String, Function> {
    let mut out: BTreeMap<String, Function> = BTreeMap::new();
    let mut cur: Option<String> = None;
    for line in text.lines() {
        let t = line.trim();
        // `.section .text.<name>,...` (not `.sectioninfo`, which follows it on sm_80/sm_89).
        if let Some(rest) = t
            .strip_prefix(".section")
            .filter(|r| r.starts_with(char::is_whitespace))
        {
            cur = rest
                .trim()
                .strip_prefix(".text.")
                .map(|n| n.split(',').next().unwrap_or(n).trim().to_string());
            if let Some(c) = &cur {
                out.entry(c.clone()).or_default();
            }
            continue;
        }
        let Some(f) = cur.as_ref().and_then(|c| out.get_mut(c)) else {
            continue;
        };
        if let Some(label) = t.strip_suffix(':').filter(|l| l.starts_with(".L_")) {
            f.labels.insert(label.to_string(), f.instrs.len());
            continue;
        }
        // `/*0370*/   @!P0 HFMA2.MMA.BF16_V2 R0, R0, R6, R7 ;`
        let Some(body) = t
            .strip_prefix("/*")
            .and_then(|r| r.split_once("*/"))
            .map(|x| x.1)
        else {
            continue;
        };
        let mut words = body.split_whitespace().skip_while(|w| w.starts_with('@'));
        let Some(opcode) = words.next() else { continue };
        let opcode = opcode.trim_end_matches(';').to_string();
        let target = body
            .split_once("`(")
            .and_then(|(_, r)| r.split_once(')'))
            .map(|(l, _)| l.to_string());
        f.instrs.push(Instr { opcode, target });
    }
    out
}

/// What a kernel exists to measure: an instruction, the number of times one iteration of its
/// source loop issues it (the loop in SASS holds a positive multiple of that), and a name.
struct Expect {
    name: String,
    is: Box<dyn Fn(&str) -> bool>,
    per_iteration: usize,
}

fn exact(names: &'static [&'static str]) -> Box<dyn Fn(&str) -> bool> {
    Box::new(move |op| names.contains(&op))
}

fn wide_load(op: &str) -> bool {
    op.starts_with("LDG.E") && op.split('.').any(|p| p == "128")
}

fn wide_store(op: &str) -> bool {
    op.starts_with("STG.E") && op.split('.').any(|p| p == "128")
}

/// The instructions kernel `k` must hold on `arch`; empty for the kernels that measure no
/// instruction of their own (the trainer's layers, `stream_init`, `stream_check`).
fn expected(k: &str) -> Vec<Expect> {
    let one = |name: &str, is: Box<dyn Fn(&str) -> bool>, n: usize| Expect {
        name: name.into(),
        is,
        per_iteration: n,
    };
    // fma.cu: 8 chains × 16 unrolled steps; mma.cu, mma_fp8.cu: 4 chains.
    match k {
        "fma_f64" => vec![one("DFMA", exact(&["DFMA"]), 128)],
        "fma_f32" => vec![one("FFMA", exact(&["FFMA"]), 128)],
        "fma_f16x2" => vec![one("HFMA2 (f16)", exact(&["HFMA2", "HFMA2.MMA"]), 128)],
        "fma_bf16x2" => vec![one(
            "HFMA2.BF16_V2",
            exact(&["HFMA2.BF16_V2", "HFMA2.MMA.BF16_V2"]),
            128,
        )],
        "mma_f16" => vec![one("HMMA.16816.F32", exact(&["HMMA.16816.F32"]), 4)],
        "mma_bf16" => vec![one(
            "HMMA.16816.F32.BF16",
            exact(&["HMMA.16816.F32.BF16"]),
            4,
        )],
        "mma_tf32" => vec![one("HMMA.1688.F32.TF32", exact(&["HMMA.1688.F32.TF32"]), 4)],
        "mma_int8" => vec![one("IMMA.16832.S8.S8", exact(&["IMMA.16832.S8.S8"]), 4)],
        "mma_fp8" => vec![one(
            "QMMA.16832.F32.E4M3.E4M3",
            exact(&["QMMA.16832.F32.E4M3.E4M3"]),
            4,
        )],
        // wgmma.cu (sm_90a): UNROLL (4) warpgroup MMAs an iteration, m64n256.
        "wgmma_f16" => vec![one(
            "HGMMA.64x256x16.F32",
            exact(&["HGMMA.64x256x16.F32"]),
            4,
        )],
        "wgmma_bf16" => vec![one(
            "HGMMA.64x256x16.F32.BF16",
            exact(&["HGMMA.64x256x16.F32.BF16"]),
            4,
        )],
        "wgmma_tf32" => vec![one(
            "HGMMA.64x256x8.F32.TF32",
            exact(&["HGMMA.64x256x8.F32.TF32"]),
            4,
        )],
        "wgmma_e4m3" => vec![one(
            "QGMMA.64x256x32.F32.E4M3.E4M3",
            exact(&["QGMMA.64x256x32.F32.E4M3.E4M3"]),
            4,
        )],
        "wgmma_e5m2" => vec![one(
            "QGMMA.64x256x32.F32.E5M2.E5M2",
            exact(&["QGMMA.64x256x32.F32.E5M2.E5M2"]),
            4,
        )],
        "wgmma_int8" => vec![one(
            "IGMMA.64x256x32.S8.S8",
            exact(&["IGMMA.64x256x32.S8.S8"]),
            4,
        )],
        "stream_read" => vec![one("LDG.E.128", Box::new(wide_load), 1)],
        "stream_write" => vec![one("STG.E.128", Box::new(wide_store), 1)],
        "stream_copy" => vec![
            one("LDG.E.128", Box::new(wide_load), 1),
            one("STG.E.128", Box::new(wide_store), 1),
        ],
        "stream_triad" => vec![
            one("LDG.E.128", Box::new(wide_load), 2),
            one("STG.E.128", Box::new(wide_store), 1),
            one("FFMA", exact(&["FFMA"]), 4),
        ],
        _ => match k
            .strip_prefix("ert_f32_")
            .and_then(|n| n.parse::<usize>().ok())
        {
            // ert.cu: N FMAs on each of the 4 floats of one 16-byte load.
            Some(n) => vec![
                one("FFMA", exact(&["FFMA"]), 4 * n),
                one("LDG.E.128", Box::new(wide_load), 1),
                one("STG.E.128", Box::new(wide_store), 1),
            ],
            None => Vec::new(),
        },
    }
}

/// Instructions that in a measuring loop mean the measured one is emulated or diluted:
/// conversions (fp8 → f16 unpacking) and calls to the compiler's routines (`$__internal_…`
/// slow paths). A `CALL.REL.NOINC` to a label of the same function is ptxas's structured
/// control flow on sm_80/sm_89 (the loop's exit), not a call.
fn emulation(i: &Instr) -> bool {
    let conversion = ["F2FP", "F2F", "I2F", "F2I"]
        .iter()
        .any(|p| i.opcode == *p || i.opcode.starts_with(&format!("{p}.")));
    let call = (i.opcode == "CALL" || i.opcode.starts_with("CALL."))
        && !i.target.as_deref().is_some_and(|t| t.starts_with(".L_"));
    conversion || call
}

fn local_memory(op: &str) -> bool {
    ["LDL", "STL"]
        .iter()
        .any(|p| op == *p || op.starts_with(&format!("{p}.")))
}

/// Whether the probe runs kernel `k` on `arch` (the mma kernels only where the precision has
/// its own tensor-core instruction; everything else on every architecture from sm_80).
fn runs_on(k: &str, arch: u32) -> bool {
    if k.starts_with("mma_") {
        mma_support(k, arch).is_ok()
    } else if k.starts_with("wgmma_") {
        wgmma_support(arch).is_ok()
    } else {
        true
    }
}

/// Checks one kernel's SASS; the failures, one line each.
fn check_kernel(k: &str, arch: u32, f: &Function) -> (Vec<String>, String) {
    let mut failures = Vec::new();
    let all = (0, f.instrs.len());
    let local = f.count(all, &local_memory);
    if local > 0 {
        failures.push(format!(
            "{k} sm_{arch}: {local} local-memory instructions (LDL/STL)"
        ));
    }
    let mut summary = Vec::new();
    let want = expected(k);
    if want.is_empty() || !runs_on(k, arch) {
        return (
            failures,
            if want.is_empty() {
                "-".into()
            } else {
                "not run here".into()
            },
        );
    }
    let loops = f.loops();
    for e in &want {
        // The loop that does the work: the one with most of the instruction.
        let best = loops
            .iter()
            .map(|l| (f.count(*l, &*e.is), *l))
            .max_by_key(|(n, _)| *n);
        let Some((n, range)) = best.filter(|(n, _)| *n > 0) else {
            failures.push(format!(
                "{k} sm_{arch}: no {} in any loop ({} in the whole kernel; opcodes: {})",
                e.name,
                f.count(all, &*e.is),
                opcodes(f)
            ));
            continue;
        };
        if n % e.per_iteration != 0 {
            failures.push(format!(
                "{k} sm_{arch}: {n} × {} in its loop, not a multiple of the {} one source iteration issues",
                e.name, e.per_iteration
            ));
        }
        let emulated: Vec<&str> = f.instrs[range.0..range.1]
            .iter()
            .filter(|i| emulation(i))
            .map(|i| i.opcode.as_str())
            .collect();
        if !emulated.is_empty() {
            failures.push(format!(
                "{k} sm_{arch}: its loop holds {} (an emulation sequence, not the {} it measures)",
                emulated.join(", "),
                e.name
            ));
        }
        summary.push(format!("{n} × {} per loop", e.name));
    }
    (failures, summary.join(", "))
}

/// The distinct opcodes of a function, for a failure's message.
fn opcodes(f: &Function) -> String {
    let mut v: Vec<&str> = f.instrs.iter().map(|i| i.opcode.as_str()).collect();
    v.sort();
    v.dedup();
    v.join(" ")
}

/// Compiles `source` for `target`, disassembles it with `nvdisasm` and checks each of its
/// kernels for `arch`: the report's lines and the failures.
fn disassemble_and_check(
    source: &nvrtc::Source,
    arch: u32,
    target: Target,
    nvdisasm: &std::path::Path,
    dir: &std::path::Path,
) -> (Vec<String>, Vec<String>) {
    let c = nvrtc::compile(source, target).unwrap_or_else(|e| panic!("{e}"));
    let cubin = dir.join(format!("{}.{}.cubin", source.file, target.name()));
    std::fs::write(&cubin, &c.image).unwrap();
    let out = std::process::Command::new(nvdisasm)
        .arg("-c")
        .arg(&cubin)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "nvdisasm {}: {}",
        cubin.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let sass = parse_sass(&String::from_utf8_lossy(&out.stdout));
    let (mut lines, mut failures) = (Vec::new(), Vec::new());
    for k in source.kernels {
        let Some(f) = sass.get(*k) else {
            failures.push(format!("{k} sm_{arch}: not in the disassembly"));
            continue;
        };
        let (mut fail, summary) = check_kernel(k, arch, f);
        lines.push(format!("{:<24} sm_{arch:<4} {summary}", k));
        failures.append(&mut fail);
    }
    (lines, failures)
}

#[test]
fn every_kernel_is_the_instruction_it_measures() {
    if let Err(e) = nvrtc::ensure_nvrtc() {
        assert!(!in_ci(), "CI=true and NVRTC is missing: {e}");
        roofline_model::skipped::skipped("the SASS gate", &e.to_string());
        return;
    }
    let Some(nvdisasm) = nvdisasm() else {
        assert!(
            !in_ci(),
            "CI=true and nvdisasm is missing (pip wheel nvidia-cuda-nvdisasm; set ROOFLINE_NVDISASM)"
        );
        roofline_model::skipped::skipped("the SASS gate", "no nvdisasm (ROOFLINE_NVDISASM)");
        return;
    };
    let supported = nvrtc::supported_archs().expect("nvrtcGetSupportedArchs");
    let archs: Vec<u32> = [80, 89, 90, 100, 120]
        .into_iter()
        .filter(|a| supported.contains(a))
        .collect();
    let (major, minor) = nvrtc::version().expect("nvrtcVersion");
    println!(
        "NVRTC {major}.{minor}, {}; SASS for sm_{}",
        nvdisasm.display(),
        archs
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(", sm_")
    );
    let dir = std::env::temp_dir().join(format!("roofline-sass-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // One job per source and architecture; arch-specific code (sm_90a) is built for its own
    // architecture only.
    let jobs: Vec<_> = SOURCES
        .iter()
        .flat_map(|source| archs.iter().map(move |&arch| (source, arch)))
        .filter_map(|(source, arch)| match source.arch_specific {
            Some(a) if a == arch => Some((source, arch, Target::SassA(a))),
            Some(_) => None,
            None => Some((source, arch, Target::Sass(arch))),
        })
        .collect();
    // NVRTC and nvdisasm take one core each: the jobs run on rayon's pool, a thread per core
    // (NVRTC's calls are thread-safe on separate programs), and are reported in their order.
    let done: Vec<(Vec<String>, Vec<String>)> = jobs
        .par_iter()
        .map(|&(source, arch, target)| disassemble_and_check(source, arch, target, &nvdisasm, &dir))
        .collect();
    let mut failures = Vec::new();
    for (lines, mut fail) in done {
        for l in lines {
            println!("{l}");
        }
        failures.append(&mut fail);
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "SASS gate:\n{}", failures.join("\n"));
}

/// The parser and the checks on a fixed disassembly: sm_90's fp8 mma as ptxas 13.0 writes it
/// (conversions and f16 HMMAs) fails; sm_89's (QMMA) passes.
#[test]
fn an_emulated_fp8_mma_fails_and_a_native_one_passes() {
    let head = "\t.section\t.text.mma_fp8,\"ax\",@progbits\n\t.sectioninfo\t@\"SHI_REGISTERS=20\"\nmma_fp8:\n\
        /*0000*/ LDC R1, c[0x0][0x28] ;\n.L_x_1:\n";
    let tail = "        /*0f00*/ @P0 BRA `(.L_x_1) ;\n        /*0f10*/ EXIT ;\n";
    let emulated = format!(
        "{head}{}{}{tail}",
        "        /*0100*/ F2FP.F16.E4M3.UNPACK_B R4, R2 ;\n".repeat(4),
        "        /*0200*/ HMMA.16816.F32 R8, R4, R6, R8 ;\n".repeat(4)
    );
    let f = parse_sass(&emulated);
    let (fail, _) = check_kernel("mma_fp8", 89, &f["mma_fp8"]);
    assert!(
        fail.iter().any(|l| l.contains("no QMMA")),
        "an emulated fp8 mma passed: {fail:?}"
    );
    let native = format!(
        "{head}{}{tail}",
        "        /*0100*/ QMMA.16832.F32.E4M3.E4M3 R8, R4, R6, R8 ;\n".repeat(16)
    );
    let f = parse_sass(&native);
    let (fail, summary) = check_kernel("mma_fp8", 89, &f["mma_fp8"]);
    assert!(fail.is_empty(), "{fail:?}");
    assert_eq!(summary, "16 × QMMA.16832.F32.E4M3.E4M3 per loop");
    // A call to the compiler's routines in the loop fails; ptxas's CALL.REL.NOINC to a label
    // of the kernel (structured control flow on sm_80) does not.
    let with_call = |target: &str| {
        format!(
            "{head}{}        /*0200*/ @P0 CALL.REL.NOINC `({target}) ;\n{tail}",
            "        /*0100*/ FFMA R4, R4, R5, R6 ;\n".repeat(128)
        )
        .replace("mma_fp8", "fma_f32")
    };
    let f = parse_sass(&with_call("$__internal_0_$__cuda_sm20_div_rn_f64_full"));
    let (fail, _) = check_kernel("fma_f32", 80, &f["fma_f32"]);
    assert!(fail.iter().any(|l| l.contains("emulation")), "{fail:?}");
    let f = parse_sass(&with_call(".L_x_19"));
    let (fail, _) = check_kernel("fma_f32", 80, &f["fma_f32"]);
    assert!(fail.is_empty(), "{fail:?}");
    // A spill in any kernel fails.
    let spilled = format!("{head}        /*0100*/ STL [R1], R2 ;\n{tail}");
    let f = parse_sass(&spilled.replace("mma_fp8", "relu"));
    let (fail, _) = check_kernel("relu", 90, &f["relu"]);
    assert!(fail.iter().any(|l| l.contains("local-memory")), "{fail:?}");
}
