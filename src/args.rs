//! What every verb checks of its arguments: value parsers, and that an output can be written
//! before minutes of work.

use std::path::Path;
use std::time::Duration;

/// Fails early (before minutes of probing) when `path` cannot be written; `flag` is the
/// option that named it (the one to change).
pub fn check_writable(path: &Path, flag: &str) -> Result<(), anyhow::Error> {
    roofline_model::write::check_writable(path).map_err(|e| unwritable(path, flag, e))
}

/// Why `path` (named by `flag`) cannot be written, as the command line says it: the file
/// system's refusal with the option to change, or what is wrong with the target.
pub fn unwritable(path: &Path, flag: &str, e: roofline_model::ModelError) -> anyhow::Error {
    match e {
        roofline_model::ModelError::Write { source, .. } => {
            anyhow::Error::new(source).context(format!(
                "cannot write {} (choose another path with {flag})",
                path.display()
            ))
        }
        e => e.into(),
    }
}

/// `256M`, `4G`, `1024`: bytes (binary multiples).
pub fn parse_bytes(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (num, mult) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1usize << 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 1 << 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let v: usize = num
        .parse()
        .map_err(|_| format!("`{s}`: expected bytes such as 1048576, 256M or 4G"))?;
    let bytes = v
        .checked_mul(mult)
        .ok_or_else(|| format!("`{s}` is too large"))?;
    if !(8..=(2usize << 30) - 1).contains(&bytes) && bytes != 2 << 30 {
        return Err(format!("`{s}`: give 8 bytes to 2G (MPI counts are 32-bit)"));
    }
    Ok(bytes)
}

/// A duration: seconds, or a number with s, m or h (90, 90s, 3m, 1.5h).
/// A comma-separated list of numbers given to `what` (none given: empty).
pub fn numbers(s: &Option<String>, what: &str) -> Result<Vec<usize>, crate::exit::Failure> {
    let Some(s) = s else { return Ok(Vec::new()) };
    s.split(',')
        .map(|x| x.trim().parse::<usize>())
        .collect::<Result<_, _>>()
        .map_err(|_| {
            crate::exit::Failure::Input(anyhow::anyhow!(
                "{what} {s}: expected numbers separated by commas"
            ))
        })
}

pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (num, unit) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (&t[..i], c),
        _ => (t, 's'),
    };
    let k = match unit {
        's' => 1.0,
        'm' => 60.0,
        'h' => 3600.0,
        _ => {
            return Err(format!(
                "`{s}`: expected seconds or a number with s, m or h (90s, 3m, 1h)"
            ))
        }
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("`{s}`: expected seconds or a number with s, m or h (90s, 3m, 1h)"))?;
    if !(v > 0.0 && v * k <= 30.0 * 86_400.0) {
        return Err(format!("`{s}`: give more than 0 and at most 30 days"));
    }
    Ok(Duration::from_secs_f64(v * k))
}

pub fn parse_seconds(s: &str) -> Result<Duration, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}`: expected seconds, e.g. 60"))?;
    if !(v > 0.0 && v <= 86_400.0) {
        return Err(format!("`{s}`: give 0 < seconds ≤ 86400"));
    }
    Ok(Duration::from_secs_f64(v))
}

/// A number in [0, 1) (label smoothing: 1 would leave no signal in the labels).
pub fn fraction_below_one(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number"))?;
    if (0.0..1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!(
            "{v} is out of range: give a fraction from 0 up to below 1"
        ))
    }
}

/// A number above 0 (a learning rate).
pub fn positive_number(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number"))?;
    if v > 0.0 && v.is_finite() {
        Ok(v)
    } else {
        Err(format!("{v} is out of range: give a number above 0"))
    }
}

/// The command line parsed. A mistake is answered in one line on stderr with exit 2 (what
/// clap found, its tip, and the verb's `--help`); help and the version are printed, and a
/// failure to print them (a full disk) is an error too, as for every other output.
pub fn parse<C: clap::Parser>() -> Result<C, std::process::ExitCode> {
    use clap::error::ErrorKind;
    use std::process::ExitCode;
    let parsed = negatives(C::command())
        .try_get_matches()
        .and_then(|m| C::from_arg_matches(&m));
    parsed.map_err(|e| match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => match e.print() {
            Ok(()) => ExitCode::SUCCESS,
            Err(io) if io.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
            Err(io) => {
                eprintln!("roofline: error: cannot write to standard output: {io}");
                ExitCode::from(2)
            }
        },
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            ExitCode::from(2)
        }
        _ => {
            // The verb whose help to read: the first argument, where it is one.
            let verb = std::env::args()
                .nth(1)
                .filter(|a| C::command().get_subcommands().any(|c| c.get_name() == a))
                .map_or("roofline".to_string(), |v| format!("roofline {v}"));
            eprintln!(
                "roofline: error: {}",
                one_line(&e.render().to_string(), &verb)
            );
            ExitCode::from(2)
        }
    })
}

/// Every option's value may be a negative number (`--lr -0.1`, `--batch -1`), so that the
/// option's own check refuses it by its range rather than clap taking it for a flag.
fn negatives(cmd: clap::Command) -> clap::Command {
    cmd.mut_args(|a| {
        if a.get_action().takes_values() && !a.is_positional() {
            a.allow_negative_numbers(true)
        } else {
            a
        }
    })
    .mut_subcommands(negatives)
}

/// clap's error text (`error: …`, a tip, the usage, a pointer to help) as one line that
/// points at `verb`'s help.
fn one_line(text: &str, verb: &str) -> String {
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines.next().unwrap_or("bad arguments");
    let mut out = first.strip_prefix("error: ").unwrap_or(first).to_string();
    // "the following required arguments were not provided:" and the list under it.
    let mut lines = lines.peekable();
    if out.ends_with(':') {
        let mut listed = Vec::new();
        while let Some(l) = lines.next_if(|l| !l.starts_with("Usage:") && !l.starts_with("tip:")) {
            listed.push(l);
        }
        out = format!("{} {}", out, listed.join(", "));
    }
    if let Some(tip) = lines.find_map(|l| l.strip_prefix("tip: ")) {
        out.push_str(&format!(" ({tip})"));
    }
    out.push_str(&format!("; see `{verb} --help`"));
    out
}

#[cfg(test)]
mod parse_tests {
    #[test]
    fn clap_errors_become_one_line_naming_the_verbs_help() {
        let text = "error: unexpected argument '-0' found\n\n  tip: to pass '-0' as a value, use '-- -0'\n\nUsage: roofline train [OPTIONS]\n\nFor more information, try '--help'.\n";
        assert_eq!(
            super::one_line(text, "roofline train"),
            "unexpected argument '-0' found (to pass '-0' as a value, use '-- -0'); see `roofline train --help`"
        );
        let text = "error: invalid value 'x' for '--batch <BATCH>': invalid digit found in string\n\nFor more information, try '--help'.\n";
        assert_eq!(
            super::one_line(text, "roofline"),
            "invalid value 'x' for '--batch <BATCH>': invalid digit found in string; see `roofline --help`"
        );
        let text = "error: the following required arguments were not provided:\n  --baseline <FILE>\n\nUsage: roofline gate --baseline <FILE> --current <FILE>...\n\nFor more information, try '--help'.\n";
        assert_eq!(
            super::one_line(text, "roofline gate"),
            "the following required arguments were not provided: --baseline <FILE>; see `roofline gate --help`"
        );
    }
}
