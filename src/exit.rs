//! How a command ends: its failure and exit code, Ctrl-C. Shared by every verb (the verbs
//! themselves never import one another).

use anyhow::anyhow;
use std::sync::atomic::AtomicBool;

/// Set by Ctrl-C; the probe stops at the next sample and nothing is written.
pub(crate) static CANCEL: AtomicBool = AtomicBool::new(false);

/// How the command ended.
pub(crate) enum Failure {
    /// Bad input: exit 2.
    Input(anyhow::Error),
    /// Interrupted: exit 130, nothing written.
    Interrupted,
    /// Interrupted after writing part of the result: exit 130, saying what was kept.
    InterruptedKept(String),
    /// A probe failed (e.g. a result check): exit 1.
    Run(anyhow::Error),
    /// Under mpirun: another rank failed and said why; exit with this code, silently.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    Quiet(u8),
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Self {
        Failure::Run(e)
    }
}

/// A run's error as the command line's: its message alone (it already says what its cause
/// said; the cause chain is for callers of the library).
impl From<roofline_workloads::run::RunError> for Failure {
    fn from(e: roofline_workloads::run::RunError) -> Failure {
        use roofline_workloads::run::RunError;
        if let RunError::InterruptedKept(kept) = e {
            Failure::InterruptedKept(kept)
        } else if matches!(e, RunError::Interrupted) {
            Failure::Interrupted
        } else if e.is_input() {
            Failure::Input(anyhow!("{e}"))
        } else {
            Failure::Run(anyhow!("{e}"))
        }
    }
}

/// A node probe's failure as the command line's.
impl From<roofline_kernels::probe::node::NodeError> for Failure {
    fn from(e: roofline_kernels::probe::node::NodeError) -> Failure {
        use roofline_kernels::probe::node::NodeError;
        match e {
            NodeError::Interrupted => Failure::Interrupted,
            e if e.is_input() => Failure::Input(anyhow!("{e}")),
            e => Failure::Run(anyhow!("{e}")),
        }
    }
}

/// For verbs that stop where they are told: Ctrl-C sets `CANCEL`, which their work polls.
pub(crate) fn install_ctrlc() -> Result<(), Failure> {
    ctrlc::set_handler(|| CANCEL.store(true, std::sync::atomic::Ordering::SeqCst))
        .map_err(|e| Failure::Run(anyhow::anyhow!("cannot install the Ctrl-C handler: {e}")))
}

/// For verbs whose work cannot stop half-way (training runs): Ctrl-C says what it leaves
/// (`kept`: what is on disk, or nothing) and exits 130 at once.
pub(crate) fn exit_on_ctrlc(kept: String) -> Result<(), Failure> {
    exit_on_ctrlc_with(move || kept.clone())
}

/// As [`exit_on_ctrlc`], what is kept said as it stands when Ctrl-C comes (a score's runs so
/// far).
pub(crate) fn exit_on_ctrlc_with(
    kept: impl Fn() -> String + Send + 'static,
) -> Result<(), Failure> {
    ctrlc::set_handler(move || {
        eprintln!("\nroofline: interrupted; {}", kept());
        std::process::exit(130);
    })
    .map_err(|e| Failure::Run(anyhow::anyhow!("cannot install the Ctrl-C handler: {e}")))
}

/// An error and its causes on one line, each cause said once: a cause whose text the line
/// already holds (an error that prints its source, and chains it too) is left out.
pub(crate) fn causes(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for c in e.chain() {
        let s = c.to_string();
        if out.contains(&s) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&s);
    }
    out
}

/// Writes to standard output, checked: every line of every verb goes through here
/// ([`out!`](crate::out) and [`outln!`](crate::outln)). A reader that went away (a closed pipe:
/// `roofline peaks | head -1`) ends the command quietly, as other tools do; any other failure (a
/// full disk, a closed descriptor) ends it with exit 2 and one line saying so. The result
/// files are written before their tables are printed, so they are kept either way.
pub(crate) fn write_stdout(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let result = out.write_fmt(args).and_then(|()| out.flush());
    if let Err(e) = result {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("roofline: error: cannot write to standard output: {e}");
        std::process::exit(2);
    }
}
