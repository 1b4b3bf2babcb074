//! Is the AutoML master a bottleneck at 64 and 512 workers? The workers search: before each
//! proposal a worker reads the new lines of the master's history log (a candidate's state
//! each, about two per candidate recorded since its last proposal) and runs the GP and the
//! annealing on the history. The master checks a proposal against every network taken, logs
//! a line, answers; logs a line when a candidate ends; reads each epoch's event; and rewrites
//! `automl.json` at most every 20 × its writing time (at least a second). This times each on
//! synthetic histories of ResNet-50 children (64 to 4096 candidates of 15 epochs each, at
//! 224²) and prints the master's share of a run whose workers finish an epoch every `EPOCH_S`
//! seconds and a candidate every `EPOCHS` epochs.
//!
//! `cargo bench -p roofline-benches --bench automl_scale` (best of 5 each, this machine).

use roofline_automl::buffer::Ack;
use roofline_automl::propose::{propose, History};
use roofline_automl::scale::{history, master_share, plan, taken, MasterCosts};
use roofline_automl::worker::Event;
use roofline_workloads::data::Rng;
use roofline_workloads::graph::Description;
use roofline_workloads::resnet::Config;
use std::io::Write;
use std::time::Instant;

/// ResNet-50 on ImageNet on one 8-GPU node: an epoch a minute (1.28 M images at ~21 k/s).
const EPOCH_S: f64 = 60.0;
/// AIPerf's rounds: 15, 30, 45, then 60 epochs; early stopping ends many sooner.
const EPOCHS: f64 = 30.0;

fn best_of<T>(n: usize, mut f: impl FnMut() -> T) -> f64 {
    (0..n)
        .map(|_| {
            let t0 = Instant::now();
            std::hint::black_box(f());
            t0.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` runs this too: keep that quick.
    let quick = !std::env::args().any(|a| a == "--bench");
    let sizes: &[usize] = if quick { &[8] } else { &[64, 512, 2048, 4096] };
    let side = 224;
    let start = Description::resnet(&Config::resnet50(1000), 3);
    let dir = std::env::temp_dir().join(format!("roofline-automl-scale-{}", std::process::id()));
    let weights = dir.join("weights");
    let (out, log, ack) = (
        dir.join("automl.json"),
        dir.join("history.jsonl"),
        dir.join("ack.json"),
    );
    println!("history | automl.json | worker: search | worker: a log line | master: an epoch | master: a proposal | master: automl.json | master's share, 64 workers | 512 workers");
    println!("---|---|---|---|---|---|---|---|---");
    for &n in sizes {
        let doc = history(&start, side, n, 15, &weights, 7).expect("a history");
        let h = History::of(&doc).expect("a history");
        let p = plan(&start, side, &weights);
        let mut rng = Rng::new(3);
        let search = best_of(5, || propose(&h, &p, &mut rng));
        let last = doc.candidates.last().expect("one at least").clone();
        let line = serde_json::to_vec(&last).expect("json");
        let parse = best_of(5, || {
            serde_json::from_slice::<roofline_model::automl::Candidate>(&line).expect("parsed")
        });
        let child = propose(&h, &p, &mut Rng::new(4))
            .expect("a proposal")
            .description;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("the log");
        let mut append = || {
            let mut l = serde_json::to_vec(&last).expect("json");
            l.push(b'\n');
            file.write_all(&l).expect("appended")
        };
        let end = best_of(5, &mut append);
        let proposal = best_of(5, || {
            let t = taken(&h, &child);
            append();
            let a = serde_json::to_vec(&Ack::Trial(n)).expect("json");
            roofline_model::write::write_atomic(&ack, &a).expect("written");
            t
        });
        let event = serde_json::to_vec(&Event::Beat {
            worker: 1,
            trial: n,
        })
        .expect("json");
        let epoch = best_of(5, || {
            serde_json::from_slice::<Event>(&event).expect("parsed")
        });
        let write = best_of(3, || {
            let text = doc.to_json().expect("json");
            roofline_model::write::write_atomic(&out, text.as_bytes()).expect("written");
            text.len()
        });
        let costs = MasterCosts {
            epoch_s: epoch,
            proposal_s: proposal,
            end_s: end,
            write_s: write,
        };
        let size = std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
        println!(
            "{n} | {:.1} MB | {:.0} ms | {:.2} ms | {:.1} µs | {:.2} ms | {:.0} ms | {:.3} % | {:.2} %",
            size as f64 / 1e6,
            search * 1e3,
            parse * 1e3,
            epoch * 1e6,
            proposal * 1e3,
            write * 1e3,
            100.0 * master_share(64, EPOCH_S, EPOCHS, costs),
            100.0 * master_share(512, EPOCH_S, EPOCHS, costs)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
