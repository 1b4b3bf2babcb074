//! `roofline probe --runs N`: N probes of this machine merged into one calibrated baseline for
//! `gate` (`roofline_model::calibration`), the file rewritten after every run.

use super::{failed_checks, failure, progress_bar, ProbeArgs};
use crate::exit::{Failure, CANCEL};
use crate::output;
use anyhow::anyhow;
use roofline_kernels::probe::run::{self, Request, RunError};
use roofline_kernels::probe::Progress;
use roofline_model::{write::write_atomic, Machine};

/// `--runs N`: N probes merged into one calibrated baseline (`roofline_model::calibration`),
/// written after every run so that an interruption keeps the runs finished.
pub fn calibrate(a: &ProbeArgs, req: &Request) -> Result<(), Failure> {
    let mut runs: Vec<Machine> = Vec::new();
    let mut merged = None;
    for i in 1..=a.runs {
        // A bar per run: each run's probe finishes its own.
        let progress = &progress_bar(true);
        progress.note(&format!("run {i} of {}", a.runs));
        match run::probe(req, &CANCEL, progress) {
            Ok(Some(m)) => runs.push(m),
            Ok(None) => return Ok(()),
            Err(RunError::Interrupted) if !runs.is_empty() => {
                progress.finish();
                eprintln!(
                    "roofline: interrupted in run {i} of {}: {} holds the {} run(s) finished",
                    a.runs,
                    a.output.display(),
                    runs.len()
                );
                return Err(Failure::Interrupted);
            }
            Err(e) => {
                progress.finish();
                return Err(failure(e));
            }
        }
        let m = roofline_model::calibration::merge(runs.clone())
            .map_err(|e| Failure::Run(anyhow!("cannot merge the runs: {e}")))?;
        let text = m.to_json().map_err(|e| Failure::Run(e.into()))?;
        write_atomic(&a.output, text.as_bytes()).map_err(|e| Failure::Input(e.into()))?;
        merged = Some(m);
    }
    let Some(m) = merged else { return Ok(()) };
    if a.json {
        let text = m.to_json().map_err(|e| Failure::Run(e.into()))?;
        outln!("{text}");
        return failed_checks(&m);
    }
    output::machine_table(&m);
    if let Some(c) = &m.calibration {
        for l in &c.left_out {
            outln!("left out: {l}");
        }
        outln!(
            "\nrun-to-run spread of the ceilings ((max − min) / median of the {} runs kept): {}",
            c.runs.len(),
            output::calibration_spread(&m)
        );
    }
    outln!(
        "wrote {}: {} runs merged into one calibrated baseline ({:.0} s); gate a later run against it with: roofline gate --baseline {} --current NEW.json",
        a.output.display(),
        m.calibration.as_ref().map_or(1, |c| c.runs.len()),
        m.provenance.duration_s,
        a.output.display()
    );
    failed_checks(&m)
}
