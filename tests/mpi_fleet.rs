//! The fleet screening under `mpirun` (build with `--features mpi`): three pretend nodes, one
//! of them slowed for real by a busy process on its core, and the link rounds on four, one of
//! which stops answering.
#![cfg(feature = "mpi")]

mod common;
mod mpi_support;

use mpi_support::{mpirun, shared, text, tmpdir, MACHINE};
use std::process::Command;
use std::time::{Duration, Instant};

/// The fleet of `m`, which a probe over several nodes must have.
fn fleet(m: &roofline_model::Machine) -> &roofline_model::fleet::Fleet {
    m.fleet
        .as_ref()
        .expect("a probe over several nodes screens its fleet")
}

/// How many runs a screening test makes before it holds one: each retry is a run the host's
/// scheduling spoiled, never a code path.
const TRIES: usize = 3;

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
    // Quiet: nobody named, neither a node nor a node's links.
    let named = |m: &roofline_model::Machine| {
        let f = fleet(m);
        !f.outliers.is_empty() || f.links.as_ref().is_some_and(|l| !l.suspects.is_empty())
    };
    // Up to `TRIES` runs: on a 2-vCPU VM the host places both vCPUs on one core for a while,
    // once for two runs in a row (node 0's FMA roofs 19–25% short, twice, in one CI run).
    let (mut quiet, mut o, mut quiet_path) = run("quiet.json");
    for attempt in 2..=TRIES {
        if !named(&quiet) {
            break;
        }
        eprintln!(
            "quiet run {} named {:?}; again",
            attempt - 1,
            fleet(&quiet).outliers
        );
        (quiet, o, quiet_path) = run("quiet.json");
    }
    let f = fleet(&quiet);
    assert_eq!(f.nodes, 3);
    assert!(f.outliers.is_empty(), "{:?}\n{}", f.outliers, text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("outliers: none"));
    let links = f.links.as_ref().expect("the link matrix");
    let again = links.links.iter().filter(|k| k.again.is_some()).count();
    assert_eq!((links.links.len(), links.rounds), (3, 3 + again));
    // (Nodes 0 and 2 share a core: their round trip is slower, which may name that one link's
    // latency, never a node.)
    assert!(links.suspects.is_empty(), "{:?}", links.suspects);
    // A busy process on node 1's core.
    let loaded_run = || {
        let mut busy = Command::new("taskset")
            .args(["-c", "1", "sh", "-c", "while :; do :; done"])
            .spawn()
            .expect("taskset (util-linux) runs");
        let r = run("loaded.json");
        let _ = busy.kill();
        let _ = busy.wait();
        r
    };
    // Node 1's bandwidth links, slow against the link between the other two.
    let slow_links = |m: &roofline_model::Machine| {
        let links = fleet(m).links.as_ref().expect("the link matrix");
        let mut slow: Vec<(usize, usize)> = links
            .slow
            .iter()
            .filter(|s| s.metric == roofline_model::links::LinkMetric::Bandwidth)
            .map(|s| (s.a, s.b))
            .collect();
        slow.sort_unstable();
        slow
    };
    // More tries, as the quiet run's, where the host's scheduling hid the load from one of
    // the node's links for the run (its samples time-sliced with the busy process's: one run
    // named (0, 1) and not (1, 2)).
    let (mut loaded, mut o, mut loaded_path) = loaded_run();
    for attempt in 2..=TRIES {
        if fleet(&loaded).named_nodes() == [1] && slow_links(&loaded) == [(0, 1), (1, 2)] {
            break;
        }
        eprintln!(
            "loaded run {} named {:?}, slow links {:?}; again",
            attempt - 1,
            fleet(&loaded).named_nodes(),
            slow_links(&loaded)
        );
        (loaded, o, loaded_path) = loaded_run();
    }
    let f = fleet(&loaded);
    assert_eq!(f.named_nodes(), vec![1], "{:?}\n{}", f.outliers, text(&o));
    // Its links too: both slow against the link between the other two, named by their hosts,
    // and node 1 the suspect.
    let links = f.links.as_ref().expect("the link matrix");
    assert_eq!(slow_links(&loaded), [(0, 1), (1, 2)], "{:?}", links.links);
    // Each measured again, alone, after the schedule's three rounds (and still slow).
    for (a, b) in slow_links(&loaded) {
        let again = links.link(a, b).and_then(|l| l.again);
        assert!(again.is_some_and(|r| r >= 3), "{:?}", links.links);
    }
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
        table.contains("of them a slow link measured again, alone")
            && table.contains("; slow again when measured alone"),
        "{table}"
    );
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
    common::assert_figures_fit(&[&svg]);
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
    // Three rounds, and one more for each link that read slow (measured again, alone).
    let again = l.links.iter().filter(|k| k.again.is_some()).count();
    assert_eq!((l.links.len(), l.rounds), (6, 3 + again), "{:?}", l.links);
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
