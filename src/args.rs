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
