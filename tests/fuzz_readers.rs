//! The readers trust no file: thousands of mutations of real machine, placement, score and
//! sweep files (truncated, bytes flipped, numbers made huge, tiny, negative, zero or not
//! numbers, fields dropped, fields added) go through the model's readers and what consumes them
//! (the gate, the plots, the report) without a panic; a sample of them through the binary
//! (`plot`, `gate`), which must end in exit 0 or 2, never a crash.

use std::path::{Path, PathBuf};
use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_roofline"))
}

fn run_ok(c: &mut Command) {
    let o = c.output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// Real documents of every kind, written by the binary.
fn documents(dir: &Path) -> Vec<(&'static str, PathBuf)> {
    // The score and the AutoML search need no machine file: they run while the probe does.
    let s = dir.join("score.json");
    let mut score = bin();
    score
        .args([
            "score",
            "--runs",
            "1",
            "--bagging",
            "2",
            "--width",
            "0.125",
            "--depth",
            "1,0,0,0",
            "--resolution",
            "32",
            "--classes",
            "3",
            "--batch",
            "8",
            "--steps",
            "2",
            "--train-images",
            "16",
            "--eval-images",
            "8",
            "-o",
        ])
        .arg(&s);
    let a = dir.join("automl.json");
    let mut automl = bin();
    automl
        .args([
            "automl",
            "--budget",
            "4s",
            "--rounds",
            "1",
            "--classes",
            "3",
            "--train-images",
            "16",
            "--eval-images",
            "8",
            "--batch",
            "8",
            "-o",
        ])
        .arg(&a);
    let spawn = |c: &mut Command, name: &str| {
        let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
        c.stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap()
    };
    let (score, automl) = (spawn(&mut score, "score"), spawn(&mut automl, "automl"));
    let m = dir.join("machine.json");
    run_ok(
        bin()
            .args(["probe", "--quick", "--only", "fma,gemm", "-o"])
            .arg(&m),
    );
    let p = dir.join("placement.json");
    run_ok(
        bin()
            .args(["place", "--workload", "gemm:256x256x256", "--machine"])
            .arg(&m)
            .arg("-o")
            .arg(&p),
    );
    let w = dir.join("sweep.json");
    run_ok(
        bin()
            .args(["sweep", "--machine"])
            .arg(&m)
            .args([
                "--images",
                "16",
                "--resolution",
                "32",
                "--width",
                "0.125",
                "--depth",
                "1,0,0,0",
                "--threads",
                "1",
                "--batch",
                "8",
                "--steps",
                "1",
                "-o",
            ])
            .arg(&w),
    );
    for (name, mut child) in [("score", score), ("automl", automl)] {
        let status = child.wait().unwrap();
        let log = std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
        assert!(status.success(), "{name}: {log}");
    }
    vec![
        ("machine", m),
        ("placement", p),
        ("score", s),
        ("sweep", w),
        ("automl", a),
    ]
}

/// xorshift64*: deterministic mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const NUMBERS: [&str; 10] = [
    "1e308",
    "1e-320",
    "-5",
    "0",
    "-0.0",
    "1e400",
    "\"NaN\"",
    "null",
    "18446744073709551616",
    "3",
];

/// One mutation of `text`.
fn mutate(text: &str, r: &mut Rng) -> String {
    let b = text.as_bytes();
    match r.below(6) {
        // Truncated.
        0 => String::from_utf8_lossy(&b[..r.below(b.len())]).into_owned(),
        // A byte flipped.
        1 => {
            let mut v = b.to_vec();
            let i = r.below(v.len());
            v[i] ^= 1 << r.below(8);
            String::from_utf8_lossy(&v).into_owned()
        }
        // A number replaced.
        2 | 3 => {
            let starts: Vec<usize> = (1..b.len())
                .filter(|&i| {
                    (b[i].is_ascii_digit() || b[i] == b'-')
                        && matches!(b[i - 1], b':' | b' ' | b'[' | b',')
                })
                .collect();
            if starts.is_empty() {
                return text.to_string();
            }
            let s = starts[r.below(starts.len())];
            let e = s + b[s..]
                .iter()
                .take_while(|c| c.is_ascii_digit() || matches!(c, b'-' | b'+' | b'.' | b'e' | b'E'))
                .count();
            format!(
                "{}{}{}",
                &text[..s],
                NUMBERS[r.below(NUMBERS.len())],
                &text[e..]
            )
        }
        // A field dropped: a `"key": value` pair of an object removed.
        4 => {
            let mut v: serde_json::Value = match serde_json::from_str(text) {
                Ok(v) => v,
                Err(_) => return text.to_string(),
            };
            // A path down to some object, then one of its keys removed.
            let mut path = String::new();
            let mut node = &v;
            for _ in 0..r.below(6) {
                match node {
                    serde_json::Value::Object(o) if !o.is_empty() => {
                        let k = o.keys().nth(r.below(o.len())).cloned().unwrap_or_default();
                        path.push('/');
                        path.push_str(&k.replace('~', "~0").replace('/', "~1"));
                        node = &o[&k];
                    }
                    serde_json::Value::Array(a) if !a.is_empty() => {
                        let i = r.below(a.len());
                        path.push_str(&format!("/{i}"));
                        node = &a[i];
                    }
                    _ => break,
                }
            }
            let pick = r.next() as usize;
            if let Some(serde_json::Value::Object(o)) = v.pointer_mut(&path) {
                if let Some(k) = o.keys().nth(pick % o.len().max(1)).cloned() {
                    o.remove(&k);
                }
            }
            v.to_string()
        }
        // A field added.
        _ => text.replacen('{', "{\"unexpected\": [1, {\"x\": null}],", 1 + r.below(3)),
    }
}

/// Reads `text` as a document of `kind` and hands what parses to its consumers; a panic
/// anywhere fails the test.
fn consume(kind: &str, text: &str) -> bool {
    use roofline_model::{placement::Placement, score::Score, sweep::Sweep, Machine};
    let ok = match kind {
        "machine" => match Machine::from_json(text) {
            Ok(m) => {
                let _ = roofline_plots::classic_svg(&m, &Default::default());
                true
            }
            Err(_) => false,
        },
        "placement" => Placement::from_json(text).is_ok(),
        "score" => match Score::from_json(text) {
            Ok(s) => {
                let _ = roofline_plots::report::html(&s, None);
                true
            }
            Err(_) => false,
        },
        "automl" => match roofline_model::automl::Automl::from_json(text) {
            Ok(a) => {
                let _ = roofline_plots::automl::html(&a);
                true
            }
            Err(_) => false,
        },
        _ => match Sweep::from_json(text) {
            Ok(s) => {
                let _ = roofline_plots::sweep::trend_svg(&s.points, "t", &s.processes);
                let _ = roofline_plots::sweep::scaling_svg(&s.scaling, "s", &s.processes);
                true
            }
            Err(_) => false,
        },
    };
    if let Ok(g) = roofline_model::gate::read_input(text) {
        let _ = roofline_model::gate::gate(&g, &g, &Default::default());
    }
    ok
}

/// 1,500 mutations of the `kind` document at `path` through its readers, every 30th through
/// the binary too: (accepted, refused, runs of the binary).
fn fuzz_kind(kind: &str, path: &Path, dir: &Path, k: u64) -> (usize, usize, usize) {
    let mut r = Rng(0x9E37_79B9_7F4A_7C15 ^ (k.wrapping_mul(0x1000_0001) + 1));
    let (mut accepted, mut refused, mut through_binary) = (0, 0, 0);
    let text = std::fs::read_to_string(path).unwrap();
    assert!(consume(kind, &text), "the unmutated {kind} file reads");
    for i in 0..1500 {
        let t = mutate(&text, &mut r);
        match std::panic::catch_unwind(|| consume(kind, &t)) {
            Ok(true) => accepted += 1,
            Ok(false) => refused += 1,
            Err(_) => {
                let f = dir.join(format!("panic-{kind}-{i}.json"));
                std::fs::write(&f, &t).unwrap();
                panic!("a {kind} reader panicked on {}", f.display());
            }
        }
        // Every 30th through the binary: exit 0 or 2, never a crash (101) or a signal.
        if i % 30 == 0 {
            let f = dir.join(format!("m-{kind}.json"));
            std::fs::write(&f, &t).unwrap();
            let mut cmds = vec![{
                let mut c = bin();
                c.arg("gate")
                    .arg("--baseline")
                    .arg(&f)
                    .arg("--current")
                    .arg(&f);
                c
            }];
            if kind == "machine" {
                let mut c = bin();
                c.arg("plot").arg(&f).arg("-o").arg(dir.join("x.svg"));
                cmds.push(c);
            }
            for mut c in cmds {
                let o = c.output().unwrap();
                let code = o.status.code();
                assert!(
                    matches!(code, Some(0) | Some(2)),
                    "{kind} mutation {i}: exit {code:?}: {}",
                    String::from_utf8_lossy(&o.stderr)
                );
                through_binary += 1;
            }
        }
    }
    (accepted, refused, through_binary)
}

#[test]
fn thousands_of_mutated_files_never_panic_a_reader() {
    let dir = std::env::temp_dir().join(format!("roofline-fuzz-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let docs = documents(&dir);
    // One thread a kind (each its own mutations, from a seed of its own): the kinds share
    // nothing but the binary.
    let counts: Vec<(usize, usize, usize)> = std::thread::scope(|scope| {
        let workers: Vec<_> = docs
            .iter()
            .enumerate()
            .map(|(k, (kind, path))| {
                let dir = &dir;
                scope.spawn(move || fuzz_kind(kind, path, dir, k as u64))
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let (accepted, refused, through_binary) = counts
        .iter()
        .fold((0, 0, 0), |t, c| (t.0 + c.0, t.1 + c.1, t.2 + c.2));
    eprintln!(
        "{accepted} mutations accepted, {refused} refused, {through_binary} runs of the binary"
    );
    assert!(
        refused > 1000 && accepted > 100,
        "{accepted} accepted, {refused} refused"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The values the issue names, each refused with exit 2 naming the file, the id and the field.
#[test]
fn impossible_values_are_refused_by_name() {
    let dir = std::env::temp_dir().join(format!("roofline-invalid-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let m = dir.join("m.json");
    run_ok(
        bin()
            .args(["probe", "--quick", "--only", "fma", "-o"])
            .arg(&m),
    );
    let base: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&m).unwrap()).unwrap();
    let id = base["ceilings"][0]["id"].as_str().unwrap().to_string();
    let max = base["ceilings"][0]["stats"]["max"].as_f64().unwrap();
    for (field, value, needle) in [
        ("value", serde_json::json!(-5.0), "value is -5"),
        ("value", serde_json::json!(0.0), "value is 0"),
        (
            "value",
            serde_json::json!(max * 10.0),
            "outside its samples' range",
        ),
        ("unit", serde_json::json!("B/s"), "unit is \"B/s\""),
    ] {
        let mut v = base.clone();
        v["ceilings"][0][field] = value;
        let f = dir.join(format!("bad-{field}.json"));
        std::fs::write(&f, v.to_string()).unwrap();
        for args in [vec!["plot"], vec!["gate", "--baseline"]] {
            let mut c = bin();
            c.args(&args).arg(&f);
            if args[0] == "gate" {
                c.arg("--current").arg(&f);
            } else {
                c.arg("-o").arg(dir.join("x.svg"));
            }
            let o = c.output().unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(2), "{args:?} {field}: {err}");
            assert!(
                err.contains(f.to_str().unwrap()) && err.contains(&id) && err.contains(needle),
                "{args:?} {field}: {err}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
