//! The distributed probe under `mpirun` (build with `--features mpi`; needs Open MPI's
//! `mpirun`): two and four ranks, two pretend nodes on one host (so the inter-node paths run),
//! TCP only (a real network stack), and a rank that stops answering.
#![cfg(feature = "mpi")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// The tests of this file run at once, except one that measures the fleet: it compares the
/// nodes' speed and takes the machine alone (the others hold it shared).
static MACHINE: std::sync::RwLock<()> = std::sync::RwLock::new(());

fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    MACHINE.read().unwrap_or_else(|e| e.into_inner())
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("roofline-mpi-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `mpirun -np <n> [mpi args] roofline <args>`.
fn mpirun(n: usize, mpi_args: &[&str], args: &[&str], out: Option<&Path>) -> Output {
    let mut c = Command::new("mpirun");
    c.args([
        "--allow-run-as-root",
        "--oversubscribe",
        "-np",
        &n.to_string(),
    ]);
    c.args(mpi_args);
    c.arg(env!("CARGO_BIN_EXE_roofline"));
    c.args(args);
    if let Some(p) = out {
        c.arg("-o").arg(p);
    }
    c.output().expect("mpirun runs (Open MPI's openmpi-bin)")
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

const COLLECTIVES: [&str; 5] = [
    "allreduce",
    "allgather",
    "reducescatter",
    "broadcast",
    "alltoall",
];

#[test]
fn two_ranks_write_every_intra_node_ceiling_with_its_size_curve() {
    let _shared = shared();
    let dir = tmpdir("np2");
    let out = dir.join("m.json");
    let o = mpirun(
        2,
        &[],
        &["probe", "--only", "comm", "--quick", "--max-size", "4M"],
        Some(&out),
    );
    assert!(o.status.success(), "{}", text(&o));
    let m = roofline_model::Machine::read(&out).unwrap();
    let cluster = m.provenance.cluster.as_ref().expect("cluster info");
    assert_eq!((cluster.ranks, cluster.nodes), (2, 1));
    for c in COLLECTIVES {
        for scope in ["intra", "world"] {
            let id = format!("net/{c}/{scope}");
            let ceiling = m.ceiling(&id).unwrap_or_else(|| panic!("{id} missing"));
            assert!(ceiling.value > 0.0 && ceiling.unit == "B/s");
            let curve = m.curves.iter().find(|k| k.id == id).unwrap();
            // 8 B (or the smallest size that gives each rank an element) to 4 MiB.
            assert!(
                curve.points.len() >= 15,
                "{id}: {} points",
                curve.points.len()
            );
            assert_eq!(curve.points.last().unwrap().x, (4 << 20) as f64);
            assert!(m.curves.iter().any(|k| k.id == format!("{id}/algbw")));
        }
    }
    for id in [
        "net/p2p/intra/latency",
        "net/p2p/intra/bw",
        "net/p2p/intra/bw_bidir",
    ] {
        assert!(m.ceiling(id).is_some(), "{id} missing");
    }
    assert!(m.ceiling("net/p2p/intra/latency").unwrap().unit == "s");
    // NCCL ran up to where a GPU is needed, and said why it stopped.
    if roofline_kernels::cuda::device::init().is_err() {
        assert!(
            m.provenance
                .notes
                .iter()
                .any(|n| n.starts_with("no NCCL measured")),
            "{:?}",
            m.provenance.notes
        );
    }
    // Only the root wrote, and the table was printed once.
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).matches("wrote ").count(),
        1
    );
}

#[test]
fn two_pretend_nodes_give_inter_node_ceilings_aggregates_and_the_distributed_plot() {
    let _shared = shared();
    let dir = tmpdir("fake");
    let out = dir.join("m.json");
    let o = mpirun(
        4,
        &["-x", "ROOFLINE_FAKE_NODES=2"],
        &["probe", "--only", "fma,comm", "--quick", "--max-size", "1M"],
        Some(&out),
    );
    assert!(o.status.success(), "{}", text(&o));
    let m = roofline_model::Machine::read(&out).unwrap();
    let cluster = m.provenance.cluster.as_ref().unwrap();
    assert_eq!(
        (cluster.ranks, cluster.nodes, cluster.fake_nodes),
        (4, 2, true)
    );
    assert_eq!(cluster.ranks_per_node, [2, 2]);
    for c in COLLECTIVES {
        for scope in ["intra", "inter", "world"] {
            assert!(
                m.ceiling(&format!("net/{c}/{scope}")).is_some(),
                "net/{c}/{scope}"
            );
        }
    }
    assert!(m.ceiling("net/p2p/inter/bw").is_some());
    // Every node probed itself; the aggregate is the sum of the nodes' values.
    assert_eq!(m.nodes.len(), 2);
    let agg = m.ceiling("agg/cpu/fma/f32/all").unwrap();
    let sum: f64 = m
        .nodes
        .iter()
        .map(|n| {
            n.ceilings
                .iter()
                .find(|c| c.id == "cpu/fma/f32/all")
                .unwrap()
                .value
        })
        .sum();
    assert!((agg.value - sum).abs() <= 1e-9 * sum);
    let svg = dir.join("dist.svg");
    let p = Command::new(env!("CARGO_BIN_EXE_roofline"))
        .args(["plot", "--model", "dist-coi"])
        .arg(&out)
        .arg("-o")
        .arg(&svg)
        .output()
        .unwrap();
    assert!(p.status.success(), "{}", text(&p));
    let s = std::fs::read_to_string(&svg).unwrap();
    for roof in [
        "net/allreduce/inter",
        "net/allreduce/intra",
        "agg/cpu/fma/f32/all",
        "COI",
    ] {
        assert!(s.contains(roof), "{roof} not drawn");
    }
    let clash = roofline_plots::labels::collisions(&s);
    assert!(clash.is_empty(), "dist-coi: overlapping labels {clash:?}");
    let p = Command::new(env!("CARGO_BIN_EXE_roofline"))
        .args(["plot", "--model", "node-coi"])
        .arg(&out)
        .arg("-o")
        .arg(dir.join("node.svg"))
        .output()
        .unwrap();
    assert!(p.status.success(), "{}", text(&p));
    let s = std::fs::read_to_string(dir.join("node.svg")).unwrap();
    let clash = roofline_plots::labels::collisions(&s);
    assert!(clash.is_empty(), "node-coi: overlapping labels {clash:?}");
}

#[test]
fn tcp_only_measures_a_network_path() {
    let _shared = shared();
    let dir = tmpdir("tcp");
    let out = dir.join("m.json");
    let o = mpirun(
        2,
        &["--mca", "pml", "ob1", "--mca", "btl", "self,tcp"],
        &["probe", "--only", "comm", "--quick", "--max-size", "1M"],
        Some(&out),
    );
    assert!(o.status.success(), "{}", text(&o));
    let m = roofline_model::Machine::read(&out).unwrap();
    assert!(
        m.ceiling("net/allreduce/intra").is_some() && m.ceiling("net/p2p/intra/latency").is_some()
    );
}

#[test]
fn a_rank_that_stops_answering_ends_the_run_with_its_name_and_nothing_written() {
    let _shared = shared();
    let dir = tmpdir("stall");
    let out = dir.join("m.json");
    let start = Instant::now();
    let o = mpirun(
        2,
        &["-x", "ROOFLINE_TEST_STALL_RANK=1"],
        &["probe", "--only", "comm", "--quick", "--comm-timeout", "2"],
        Some(&out),
    );
    assert!(!o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("rank 1 did not reach allreduce"),
        "{}",
        text(&o)
    );
    assert!(!out.exists(), "a file was written");
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "took {:?}",
        start.elapsed()
    );
}

#[test]
fn two_rank_training_equals_single_process_training_after_three_steps() {
    let _shared = shared();
    let args = [
        "train",
        "--width",
        "0.125",
        "--depth",
        "1,1,0,0",
        "--resolution",
        "32",
        "--classes",
        "4",
        "--batch",
        "8",
        "--steps",
        "3",
        "--train-images",
        "64",
        "--json",
    ];
    let single = Command::new(env!("CARGO_BIN_EXE_roofline"))
        .args(args)
        .output()
        .unwrap();
    assert!(single.status.success(), "{}", text(&single));
    let two = mpirun(2, &[], &args, None);
    assert!(two.status.success(), "{}", text(&two));
    // Only rank 0 reports.
    let s: serde_json::Value = serde_json::from_slice(&single.stdout).unwrap();
    let t: serde_json::Value =
        serde_json::from_slice(&two.stdout).expect("one JSON document from rank 0");
    assert_eq!(
        (s["ranks"].as_u64(), t["ranks"].as_u64()),
        (Some(1), Some(2))
    );
    for k in ["final_loss", "param_norm"] {
        let (a, b) = (s[k].as_f64().unwrap(), t[k].as_f64().unwrap());
        assert!(
            (a - b).abs() <= 1e-5 * a.abs(),
            "{k}: single {a}, two ranks {b}"
        );
    }
    assert!(t["comm_bytes_per_step"].as_f64().unwrap() > 0.0);
    assert_eq!(t["overlap"], true);
    // Small buckets, not overlapped: the same sums, so the same bits.
    let with = |extra: &[&str]| {
        let all: Vec<&str> = args.iter().chain(extra).copied().collect();
        let o = mpirun(2, &[], &all, None);
        assert!(o.status.success(), "{}", text(&o));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    let serial = with(&["--no-overlap", "--bucket-elements", "5000"]);
    assert_eq!(serial["param_norm"], t["param_norm"]);
    assert_eq!(serial["overlap"], false);
    // Gradients compressed to f16 on the wire (over MPI_Sendrecv rings): half their bytes,
    // and the training moves as before up to their rounding.
    let parameters = t["parameters"].as_f64().unwrap();
    for wire in ["fp16", "bf16"] {
        let c = with(&["--grad-compression", wire, "--bucket-elements", "5000"]);
        assert_eq!(c["grad_compression"], wire);
        let saved =
            t["comm_bytes_per_step"].as_f64().unwrap() - c["comm_bytes_per_step"].as_f64().unwrap();
        assert_eq!(saved, 2.0 * parameters, "{wire}: bytes saved");
        let (a, b) = (
            s["param_norm"].as_f64().unwrap(),
            c["param_norm"].as_f64().unwrap(),
        );
        assert!(
            (a - b).abs() <= 1e-3 * a && a != b,
            "{wire}: parameter norm {b} against {a}"
        );
    }
}

/// `place --workload resnet50` under two ranks: the point has a COI from the gradient bytes and
/// is held against the intra-node allreduce roof, and only rank 0 writes.
#[test]
fn two_rank_placement_has_a_coi_and_the_allreduce_roof() {
    let _shared = shared();
    let dir = tmpdir("place");
    let m = dir.join("m.json");
    let o = mpirun(
        2,
        &[],
        &[
            "probe",
            "--only",
            "comm,gemm,mem",
            "--quick",
            "--max-size",
            "4M",
        ],
        Some(&m),
    );
    assert!(o.status.success(), "{}", text(&o));
    let out = dir.join("p.json");
    let mut args = vec![
        "place",
        "--workload",
        "resnet50",
        "--width",
        "0.125",
        "--depth",
        "1,1,0,0",
        "--resolution",
        "32",
        "--classes",
        "4",
        "--batch",
        "8",
        "--steps",
        "2",
        "--warm",
        "1",
        "--grad-compression",
        "fp16",
        "--machine",
    ];
    let ms = m.to_str().unwrap().to_string();
    args.push(&ms);
    let o = mpirun(2, &[], &args, Some(&out));
    assert!(o.status.success(), "{}", text(&o));
    let p: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(p["workload"]["ranks"], 2);
    let coi = &p["point"]["coi"];
    let bytes = coi["intra_node_bytes"].as_f64().unwrap();
    let flops = p["point"]["flops_per_step"].as_f64().unwrap();
    assert!(bytes > 0.0);
    assert!((coi["intra_node"].as_f64().unwrap() - flops / bytes).abs() < 1e-9 * flops / bytes);
    let roofs = p["point"]["bound"]["roofs"].as_array().unwrap();
    assert!(
        roofs.iter().any(|r| r["ceiling"] == "net/allreduce/intra"),
        "{roofs:?}"
    );
    // The EWA detector placed the same way: its COI from its gradient bytes (every parameter
    // in f32, and the batch-norm statistics), beside resnet50's.
    let out = dir.join("e.json");
    let tmp = format!("TMPDIR={}", dir.display());
    let o = mpirun(
        2,
        &["-x", &tmp],
        &[
            "place",
            "--workload",
            "ewa",
            "--width",
            "0.125",
            "--depth",
            "1,1,1,1",
            "--resolution",
            "64x96",
            "--batch",
            "2",
            "--steps",
            "2",
            "--warm",
            "1",
            "--threads",
            "1",
            "--machine",
            &ms,
        ],
        Some(&out),
    );
    assert!(o.status.success(), "{}", text(&o));
    let e: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(e["workload"]["ranks"], 2);
    let params = e["workload"]["parameters"].as_f64().unwrap();
    let coi = &e["point"]["coi"];
    let bytes = coi["intra_node_bytes"].as_f64().unwrap();
    assert!(
        bytes > 4.0 * params && bytes < 4.2 * params,
        "{bytes} bytes for {params} parameters"
    );
    let flops = e["point"]["flops_per_step"].as_f64().unwrap();
    assert!((coi["intra_node"].as_f64().unwrap() - flops / bytes).abs() < 1e-9 * flops / bytes);
    // `sweep --ranks 1,2`: each point a placement under the launcher, strong scaling over ranks.
    let sw = dir.join("sweep.json");
    let o = Command::new(env!("CARGO_BIN_EXE_roofline"))
        .args([
            "sweep",
            "--ranks",
            "1,2",
            "--mpirun",
            "mpirun --allow-run-as-root --oversubscribe",
            "--images",
            "32",
            "--resolution",
            "32",
            "--width",
            "0.125",
            "--depth",
            "1,1,0,0",
            "--batch",
            "8",
            "--steps",
            "2",
            "--machine",
            &ms,
            "-o",
        ])
        .arg(&sw)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&sw).unwrap()).unwrap();
    assert_eq!(s["processes"], "ranks");
    let pts = s["points"].as_array().unwrap();
    assert_eq!(pts.len(), 2);
    assert_eq!(pts[1]["problem"]["processes"], 2);
    assert_eq!(s["scaling"][0]["points"].as_array().unwrap().len(), 2);
}

/// `mpirun -np 4 score --bagging 2`: two teams of two ranks, each training its own model on its
/// own bootstrap sample (data parallel inside the team), the ensemble scored on rank 0; with 3
/// ranks the split is refused, naming the numbers.
#[test]
fn four_ranks_bag_two_models_of_two_ranks() {
    let _shared = shared();
    let dir = tmpdir("bagging");
    let out = dir.join("bag.json");
    let args = [
        "score",
        "--bagging",
        "2",
        "--runs",
        "1",
        "--width",
        "0.125",
        "--depth",
        "1,1,0,0",
        "--resolution",
        "32",
        "--classes",
        "4",
        "--batch",
        "16",
        "--steps",
        "14",
        "--train-images",
        "128",
        "--eval-images",
        "64",
        "--threads",
        "1",
    ];
    let o = mpirun(4, &[], &args, Some(&out));
    assert!(o.status.success(), "{}", text(&o));
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(s["system"]["ranks"], 4);
    let b = &s["runs"][0]["bagging"];
    assert_eq!(b["models"], 2);
    assert_eq!(b["ranks_per_model"], 2);
    assert_eq!(b["sys_scale"], 4);
    let members = b["members"].as_array().unwrap();
    assert_eq!(members.len(), 2);
    for m in members {
        let q = m["quality"].as_f64().unwrap();
        assert!(q > 0.0 && q <= 1.0, "each team reported its model: {m}");
        assert!(m["step_seconds"].as_f64().unwrap() > 0.0);
    }
    assert_ne!(members[0]["seed"], members[1]["seed"]);
    let e = b["ensemble_quality"].as_f64().unwrap();
    assert!(e > 0.0 && e <= 1.0);
    assert!(s["configuration"]["bagging (HPC AI500 V3.0)"]
        .as_str()
        .unwrap()
        .contains("data parallel over its team"));
    // The teams train the same models as one process does side by side: the same seeds and
    // samples (data parallel over two ranks computes what one process computes).
    let one = dir.join("one.json");
    let o = Command::new(env!("CARGO_BIN_EXE_roofline"))
        .args(args)
        .arg("-o")
        .arg(&one)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let s1: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&one).unwrap()).unwrap();
    let m1 = s1["runs"][0]["bagging"]["members"].as_array().unwrap();
    for (a, b) in members.iter().zip(m1) {
        assert_eq!(a["sample_seed"], b["sample_seed"]);
        assert_eq!(a["distinct_images"], b["distinct_images"]);
    }
    let o = mpirun(3, &[], &args, Some(&dir.join("no.json")));
    assert!(!o.status.success());
    let t = text(&o);
    assert!(t.contains("3 is not a multiple of 2"), "{t}");
}

/// AutoML under mpirun: rank 0 the master, the other ranks teams of `--team` (here 1 + one
/// team of two ranks training data parallel, and 1 + two single-rank teams): candidates are
/// trained by every team, written by the master alone; a wrong rank count is one line.
#[test]
fn automl_master_and_teams_of_ranks() {
    let _shared = shared();
    for (n, team, workers) in [(3, 1, 2), (3, 2, 1)] {
        let dir = tmpdir(&format!("automl-{n}-{team}"));
        let out = dir.join("run.json");
        let team_arg = team.to_string();
        let o = mpirun(
            n,
            &[],
            &[
                "automl",
                "--budget",
                "15s",
                "--rounds",
                "1,2",
                "--classes",
                "4",
                "--train-images",
                "64",
                "--eval-images",
                "32",
                "--batch",
                "16",
                "--threads",
                "1",
                "--team",
                &team_arg,
            ],
            Some(&out),
        );
        assert!(o.status.success(), "{}", text(&o));
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert_eq!(
            stdout.matches("AIPerf AutoML:").count(),
            1,
            "one report: {}",
            text(&o)
        );
        let doc = roofline_model::automl::Automl::read(&out).unwrap();
        assert_eq!(doc.workers.len(), workers);
        let trained: Vec<_> = doc
            .candidates
            .iter()
            .filter(|c| !c.epochs.is_empty())
            .collect();
        assert!(trained.len() >= 2, "{}", text(&o));
        for w in 0..workers {
            assert!(
                trained.iter().any(|c| c.worker == w),
                "worker {w} trained nothing: {}",
                text(&o)
            );
        }
        assert!(doc.configuration["workers"]
            .as_str()
            .unwrap()
            .contains(&format!("teams of {team}")));
    }
    let dir = tmpdir("automl-bad");
    let o = mpirun(
        4,
        &[],
        &["automl", "--team", "2", "--budget", "5s"],
        Some(&dir.join("x.json")),
    );
    assert!(!o.status.success());
    assert!(text(&o).contains("1 + a multiple of 2"), "{}", text(&o));
    assert!(!dir.join("x.json").exists());
}

/// The fleet of `m`, which a probe over several nodes must have.
fn fleet(m: &roofline_model::Machine) -> &roofline_model::fleet::Fleet {
    m.fleet
        .as_ref()
        .expect("a probe over several nodes screens its fleet")
}

/// Three pretend nodes, node 1 alone on its core (nodes 0 and 2 share the other, and take
/// turns): with nothing else running nobody is named; with a busy process pinned on node 1's
/// core, node 1 is named on its ceilings with its lower clock as the cause, the table says so,
/// and `gate` holds it to the quiet run node by node. (With two nodes the fleet's median is
/// their mean: a node at 63% of the other is only 23% short of it, within the margin plus the
/// noise of its time-sliced samples.)
#[test]
fn a_busy_core_names_its_pretend_node_and_a_quiet_fleet_names_nobody() {
    let _alone = MACHINE.write().unwrap_or_else(|e| e.into_inner());
    if std::thread::available_parallelism().map_or(0, |n| n.get()) < 2 {
        eprintln!("skipped: needs two CPUs");
        return;
    }
    let dir = tmpdir("fleet");
    let run = |name: &str| {
        let out = dir.join(name);
        let o = mpirun(
            3,
            &[
                "--bind-to",
                "core:overload-allowed",
                "--map-by",
                "core",
                "-x",
                "ROOFLINE_FAKE_NODES=3",
            ],
            &[
                "probe",
                "--only",
                "fma,comm",
                "--quick",
                "--max-size",
                "256K",
            ],
            Some(&out),
        );
        assert!(o.status.success(), "{}", text(&o));
        (roofline_model::Machine::read(&out).unwrap(), o, out)
    };
    // Quiet: nobody named (a second try where the VM's two vCPUs were placed on one host
    // core for a moment).
    let (mut quiet, mut o, mut quiet_path) = run("quiet.json");
    if !fleet(&quiet).outliers.is_empty() {
        eprintln!("first quiet run named {:?}; again", fleet(&quiet).outliers);
        (quiet, o, quiet_path) = run("quiet.json");
    }
    let f = fleet(&quiet);
    assert_eq!(f.nodes, 3);
    assert!(f.outliers.is_empty(), "{:?}\n{}", f.outliers, text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("outliers: none"));
    let links = f.links.as_ref().expect("the link matrix");
    assert_eq!((links.links.len(), links.rounds), (3, 3));
    // (Nodes 0 and 2 share a core: their round trip is slower, which may name that one link's
    // latency, never a node.)
    assert!(links.suspects.is_empty(), "{:?}", links.suspects);
    // A busy process on node 1's core.
    let mut busy = Command::new("taskset")
        .args(["-c", "1", "sh", "-c", "while :; do :; done"])
        .spawn()
        .expect("taskset (util-linux) runs");
    let (loaded, o, loaded_path) = run("loaded.json");
    let _ = busy.kill();
    let _ = busy.wait();
    let f = fleet(&loaded);
    assert_eq!(f.named_nodes(), vec![1], "{:?}\n{}", f.outliers, text(&o));
    // Its links too: both slow against the link between the other two, named by their hosts,
    // and node 1 the suspect.
    let links = f.links.as_ref().expect("the link matrix");
    let mut slow: Vec<(usize, usize)> = links
        .slow
        .iter()
        .filter(|s| s.metric == roofline_model::links::LinkMetric::Bandwidth)
        .map(|s| (s.a, s.b))
        .collect();
    slow.sort_unstable();
    assert_eq!(slow, [(0, 1), (1, 2)], "{:?}", links.links);
    assert_eq!(
        links.suspects.iter().map(|s| s.node).collect::<Vec<_>>(),
        [1],
        "{:?}",
        links.links
    );
    // Which FMA ceilings fall past the margin varies with how the host shares the core; at
    // least one does, and each named one with the clock as its cause.
    let fma: Vec<_> = f
        .outliers
        .iter()
        .filter(|x| x.id.to_string().starts_with("cpu/fma/"))
        .collect();
    assert!(!fma.is_empty(), "{:?}", f.outliers);
    for x in fma {
        assert!(x.short_by > 0.15, "{x:?}");
        assert!(
            x.causes
                .iter()
                .any(|c| matches!(c, roofline_model::fleet::Cause::LowerClock { .. })),
            "{x:?}"
        );
    }
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(
        table.contains("outliers (") && table.contains("lower measured clock"),
        "{table}"
    );
    // Gate: the loaded fleet against the quiet one fails on node 1.
    let g = Command::new(env!("CARGO_BIN_EXE_roofline"))
        .args(["gate", "--baseline"])
        .arg(&quiet_path)
        .arg("--current")
        .arg(&loaded_path)
        .output()
        .unwrap();
    assert_eq!(g.status.code(), Some(1), "{}", text(&g));
    assert!(
        String::from_utf8_lossy(&g.stdout).contains("node1/cpu/fma"),
        "{}",
        text(&g)
    );
    // The heat map of the links.
    let svg = dir.join("links.svg");
    let p = Command::new(env!("CARGO_BIN_EXE_roofline"))
        .args(["plot", "--model", "links"])
        .arg(&loaded_path)
        .arg("-o")
        .arg(&svg)
        .output()
        .unwrap();
    assert!(p.status.success(), "{}", text(&p));
    assert_eq!(
        std::fs::read_to_string(&svg)
            .unwrap()
            .matches("data-link=")
            .count(),
        6,
        "each of the three links, both ways"
    );
}

/// Four pretend nodes: six links in three rounds, each pair once. A node that stops answering
/// in the second round is named with its host and its partner, what was measured before is in
/// the file (marked incomplete), and the run ends non-zero.
#[test]
fn the_link_rounds_cover_every_pair_and_a_hung_node_is_named() {
    let _shared = shared();
    let dir = tmpdir("links");
    let out = dir.join("m.json");
    let args = ["probe", "--only", "comm", "--quick", "--max-size", "64K"];
    let o = mpirun(4, &["-x", "ROOFLINE_FAKE_NODES=4"], &args, Some(&out));
    assert!(o.status.success(), "{}", text(&o));
    let m = roofline_model::Machine::read(&out).unwrap();
    let l = fleet(&m).links.as_ref().unwrap();
    assert_eq!((l.links.len(), l.rounds), (6, 3));
    let mut pairs: Vec<(usize, usize)> = l.links.iter().map(|k| (k.a, k.b)).collect();
    pairs.sort_unstable();
    assert_eq!(pairs, [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]);
    assert!(l.incomplete.is_none());
    std::fs::remove_file(&out).unwrap();

    let start = Instant::now();
    let mut stall_args = args.to_vec();
    stall_args.extend(["--comm-timeout", "3"]);
    let o = mpirun(
        4,
        &[
            "-x",
            "ROOFLINE_FAKE_NODES=4",
            "-x",
            "ROOFLINE_TEST_STALL_RANK=2@link round 2",
        ],
        &stall_args,
        Some(&out),
    );
    assert!(!o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("rank 2 (node 2, ") && err.contains("#2, to be paired with node"),
        "{}",
        text(&o)
    );
    let m = roofline_model::Machine::read(&out).expect("what was measured before is kept");
    let l = fleet(&m).links.as_ref().unwrap();
    assert_eq!(l.links.len(), 2, "round 1's two links");
    assert!(l
        .incomplete
        .as_ref()
        .unwrap()
        .contains("before round 2 of 3"));
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "took {:?}",
        start.elapsed()
    );
}
