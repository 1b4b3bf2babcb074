//! The distributed probe under `mpirun` (build with `--features mpi`; needs Open MPI's
//! `mpirun`): two and four ranks, two pretend nodes on one host (so the inter-node paths run),
//! TCP only (a real network stack), and a rank that stops answering.
#![cfg(feature = "mpi")]

mod common;
mod mpi_support;

use mpi_support::{mpirun, shared, text, tmpdir};
use std::process::Command;
use std::time::{Duration, Instant};

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

/// `probe --only comm,fma --quick` under `n` ranks, collectives up to `max_size`, into
/// `dir`/m.json: the allreduce roofs the placement tests hold a step against, and an FMA roof to
/// place it under (the GEMM and memory sweeps took 20 of the 23 s under two ranks, and no
/// placement test reads them).
fn probe_comm(n: usize, dir: &std::path::Path, max_size: &str) -> std::path::PathBuf {
    let m = dir.join("m.json");
    let args = [
        "probe",
        "--only",
        "comm,fma",
        "--quick",
        "--max-size",
        max_size,
    ];
    let o = mpirun(n, &[], &args, Some(&m));
    assert!(o.status.success(), "{}", text(&o));
    m
}

/// `place --workload resnet50` of a small ResNet (width 0.125, depth 1,1,0,0, 32², 4 classes,
/// batch 8, 1 warm-up and 2 measured steps) under `n` ranks on machine `m`, with `extra`
/// options, written to `out`: the placement.
fn place_small_resnet(
    n: usize,
    m: &std::path::Path,
    extra: &[&str],
    out: &std::path::Path,
) -> serde_json::Value {
    let ms = m.to_str().unwrap();
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
        "--machine",
        ms,
    ];
    args.extend_from_slice(extra);
    let o = mpirun(n, &[], &args, Some(out));
    assert!(o.status.success(), "{}", text(&o));
    serde_json::from_str(&std::fs::read_to_string(out).unwrap()).unwrap()
}

/// `place --workload resnet50` under two ranks: the point has a COI from the gradient bytes and
/// is held against the intra-node allreduce roof, and only rank 0 writes.
#[test]
fn two_rank_placement_has_a_coi_and_the_allreduce_roof() {
    let _shared = shared();
    let dir = tmpdir("place");
    let m = probe_comm(2, &dir, "4M");
    let ms = m.to_str().unwrap().to_string();
    let p = place_small_resnet(2, &m, &["--grad-compression", "fp16"], &dir.join("p.json"));
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

/// `place --workload resnet50` under four ranks: the COI counts bus bytes, as the allreduce
/// roofs count busbw. By hand: each rank's payload (every gradient in f32 and the batch-norm
/// sums) crosses its link 2·(4−1)/4 = 1.5 times in a ring allreduce, so the intensity is the
/// step's FLOPs over 1.5 × the payload, and the roof it allows is busbw × that.
#[test]
fn four_rank_placement_counts_bus_bytes_against_busbw() {
    let _shared = shared();
    let dir = tmpdir("place4");
    let m = probe_comm(4, &dir, "1M");
    let p = place_small_resnet(4, &m, &["--threads", "1"], &dir.join("p.json"));
    assert_eq!(p["workload"]["ranks"], 4);
    let params = p["workload"]["parameters"].as_f64().unwrap();
    let coi = &p["point"]["coi"];
    let payload = coi["payload_bytes"].as_f64().unwrap();
    // Every gradient in f32, and four f64 sums (Σx, Σx² forward; Σdy, Σdy·x backward) for each
    // batch-norm channel: the stem's 8, layer1.0's 8 + 8 + 32 and its shortcut's 32, layer2.0's
    // 16 + 16 + 64 and its shortcut's 64 (width 0.125 of 64, 256, 128, 512): 248 channels.
    assert_eq!(payload, 4.0 * params + 32.0 * 248.0, "{params} parameters");
    assert_eq!(coi["bus_factor"].as_f64(), Some(1.5));
    let bus = coi["intra_node_bytes"].as_f64().unwrap();
    assert!(
        (bus - 1.5 * payload).abs() < 1e-9 * bus,
        "{bus} vs 1.5 × {payload}"
    );
    let flops = p["point"]["flops_per_step"].as_f64().unwrap();
    let coi_v = coi["intra_node"].as_f64().unwrap();
    assert!((coi_v - flops / bus).abs() < 1e-9 * coi_v);
    // The allreduce roof at the point: busbw × the COI (not × FLOPs over the payload).
    let busbw = serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(&m).unwrap())
        .unwrap()["ceilings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "net/allreduce/intra")
        .and_then(|c| c["value"].as_f64())
        .expect("net/allreduce/intra in the probe");
    let roofs = p["point"]["bound"]["roofs"].as_array().unwrap();
    let roof = roofs
        .iter()
        .find(|r| r["ceiling"] == "net/allreduce/intra")
        .unwrap_or_else(|| panic!("no allreduce roof: {roofs:?}"));
    let allows = roof["allows"].as_f64().unwrap();
    assert!(
        (allows - busbw * coi_v).abs() < 1e-6 * allows,
        "the roof allows {allows}, busbw {busbw} × COI {coi_v}"
    );
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

/// AutoML under `n` ranks in teams of `team`: rank 0 the master, the others `workers` teams;
/// candidates are trained by every team and written by the master alone.
fn automl_in_teams(n: usize, team: usize, workers: usize) {
    let _shared = shared();
    let dir = tmpdir(&format!("automl-{n}-{team}"));
    let out = dir.join("run.json");
    let team_arg = team.to_string();
    let mut args = vec!["automl", "--budget", "15s"];
    args.extend(common::SMALL_AUTOML);
    args.extend(["--threads", "1", "--team", &team_arg]);
    let o = mpirun(n, &[], &args, Some(&out));
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

/// AutoML under mpirun, 1 + one team of two ranks training data parallel (each AutoML test runs
/// its 15 s budget beside the other tests).
#[test]
fn automl_master_and_a_team_of_two_ranks() {
    automl_in_teams(3, 2, 1);
}

/// AutoML under mpirun, 1 + two single-rank teams.
#[test]
fn automl_master_and_two_teams_of_one_rank() {
    automl_in_teams(3, 1, 2);
}

/// AutoML under mpirun with a rank count its teams do not divide: one line, nothing written.
#[test]
fn automl_ranks_that_teams_do_not_divide_are_one_line() {
    let _shared = shared();
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
