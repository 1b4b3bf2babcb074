//! The probe's progress on stderr: a bar on a terminal, plain lines on a log.

use crate::output;
use roofline_kernels::probe::Progress;
use std::io::IsTerminal;
use std::sync::atomic::Ordering;

/// A probe's progress: a bar on a terminal; on a log, a line per section and at least every
/// ten seconds (`log`); nothing on the ranks that do not report.
pub(crate) struct Bar {
    bar: Option<indicatif::ProgressBar>,
    log: Option<Log>,
}

/// The probe's count for a log's lines.
pub(crate) struct Log {
    ticker: output::Ticker,
    total: std::sync::atomic::AtomicU64,
    done: std::sync::atomic::AtomicU64,
}

impl Progress for Bar {
    fn note(&self, line: &str) {
        match &self.bar {
            Some(b) => b.suspend(|| eprintln!("roofline: {line}")),
            None => eprintln!("roofline: {line}"),
        }
    }
    fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
    fn begin(&self, total: u64) {
        // The CPU probe and then the GPU probe each announce their own steps.
        if let Some(b) = &self.bar {
            b.inc_length(total);
        }
        if let Some(l) = &self.log {
            l.total.fetch_add(total, Ordering::SeqCst);
        }
    }
    fn advance(&self, label: &str) {
        if let Some(b) = &self.bar {
            if b.position() > 0 || !b.message().is_empty() {
                b.inc(1);
            }
            b.set_message(label.to_string());
        }
        if let Some(l) = &self.log {
            let n = l.done.fetch_add(1, Ordering::SeqCst) + 1;
            // A section is the label's first word (fma, gemm, mem …); the clock readings
            // between the measurements belong to the section around them.
            let section = label.split_whitespace().next().unwrap_or("");
            if section != "clock" {
                l.ticker.tick(section, false, || {
                    format!("{n}/{} {label}", l.total.load(Ordering::SeqCst))
                });
            }
        }
    }
}

pub(crate) fn progress_bar(show: bool) -> Bar {
    let terminal = std::io::stderr().is_terminal();
    let bar = (show && terminal).then(|| {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{elapsed_precise} [{bar:30}] {pos}/{len} {msg}",
            )
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    let log = (show && !terminal).then(|| Log {
        ticker: output::Ticker::new(),
        total: Default::default(),
        done: Default::default(),
    });
    Bar { bar, log }
}
