//! Comparing runs: hotpath against native, native against the expected files, with diffs.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use crate::catalog::{Expected, Linkage, Sample};
use crate::paths;
use crate::runner::{Outcome, Termination};

/// Lines of diff shown per stream before the rest is cut.
const MAX_DIFF_LINES: usize = 80;
/// Above this many lines per side the diff falls back to "first difference" (the LCS table
/// is lines x lines).
const MAX_LCS_LINES: usize = 4000;

/// `Ok` when `translated` did exactly what `native` did: same stdout and stderr bytes and the
/// same exit status or fatal signal.
///
/// # Errors
///
/// A readable report of every difference, with a line diff of each differing stream
/// (`-` native, `+` hotpath).
pub fn compare_outcomes(native: &Outcome, translated: &Outcome) -> Result<(), String> {
    let mut report = String::new();
    if native.termination != translated.termination {
        let _ = writeln!(
            report,
            "  status: native {}, hotpath {}",
            native.termination, translated.termination
        );
    }
    for (stream, a, b) in [
        ("stdout", &native.stdout, &translated.stdout),
        ("stderr", &native.stderr, &translated.stderr),
    ] {
        if a != b {
            let _ = writeln!(report, "  {stream} differs (- native, + hotpath):");
            report.push_str(&diff(a, b));
        }
    }
    if report.is_empty() {
        Ok(())
    } else {
        if translated.stdout.is_empty() && translated.stderr.is_empty() && !native.stdout.is_empty()
        {
            let _ = writeln!(report, "  (hotpath produced no output at all)");
        }
        Err(report)
    }
}

/// `Ok` when `translated` is hotpath refusing the guest: exit status 1, nothing on stdout, and
/// exactly one line on stderr, starting with `hotpath: ` and containing `message`.
///
/// # Errors
///
/// A report of what hotpath did instead.
pub fn check_refusal(translated: &Outcome, message: &str) -> Result<(), String> {
    let mut report = String::new();
    if translated.termination != Termination::Exited(1) {
        let _ = writeln!(
            report,
            "  status: expected exit status 1 (refused: {message}), hotpath {}",
            translated.termination
        );
    }
    if !translated.stdout.is_empty() {
        let _ = writeln!(report, "  stdout should be empty, hotpath wrote:");
        report.push_str(&diff(b"", &translated.stdout));
    }
    let stderr = String::from_utf8_lossy(&translated.stderr);
    let one_line = stderr.ends_with('\n') && stderr.matches('\n').count() == 1;
    if !(one_line && stderr.starts_with("hotpath: ") && stderr.contains(message)) {
        let _ = writeln!(
            report,
            "  stderr should be one line `hotpath: ...{message}...`, hotpath wrote:\n{}",
            diff(b"", &translated.stderr)
        );
    }
    if report.is_empty() {
        Ok(())
    } else {
        Err(report)
    }
}

/// Replaces the built executable's path, then its file name, with `{exe}` and `{exe_name}`,
/// so one expected file serves both linkages and any target dir.
fn normalise(bytes: &[u8], exe: &Path) -> Vec<u8> {
    let text = String::from_utf8_lossy(bytes);
    let path = exe.display().to_string();
    let name = exe
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut text = text.replace(&path, "{exe}");
    if !name.is_empty() {
        text = text.replace(&name, "{exe_name}");
    }
    text.into_bytes()
}

fn expected_file(sample: &Sample, stream: &str) -> PathBuf {
    paths::expected_dir().join(format!("{}.{stream}", sample.name))
}

fn bless_requested() -> bool {
    std::env::var_os("HOTPATH_BLESS").is_some_and(|v| v != "0")
}

/// Checks a native run against the catalog's expected status and (for golden samples) the
/// expected stdout and stderr files. With `HOTPATH_BLESS=1` the static run (re)writes the
/// files first.
///
/// # Errors
///
/// A report of the differences (missing expected files count as a difference).
pub fn check_expected(
    sample: &Sample,
    linkage: Linkage,
    exe: &Path,
    native: &Outcome,
) -> Result<(), String> {
    let mut report = String::new();
    let want = match sample.expect {
        Expected::Exit(code) => Termination::Exited(code),
        Expected::Signal(sig) => Termination::Signaled(sig),
    };
    if native.termination != want {
        let _ = writeln!(
            report,
            "  status: expected {want}, native run {}",
            native.termination
        );
    }
    let streams: &[(&str, &Vec<u8>)] = if sample.golden {
        &[("stdout", &native.stdout), ("stderr", &native.stderr)]
    } else {
        &[]
    };
    for &(stream, actual) in streams {
        let actual = normalise(actual, exe);
        let file = expected_file(sample, stream);
        if bless_requested() && linkage == Linkage::Static {
            if let Err(e) =
                fs::create_dir_all(paths::expected_dir()).and_then(|_| fs::write(&file, &actual))
            {
                let _ = writeln!(report, "  cannot write {}: {e}", file.display());
            }
            continue;
        }
        match fs::read(&file) {
            Ok(expected) if expected == actual => {}
            Ok(expected) => {
                let _ = writeln!(
                    report,
                    "  {stream} differs from {} (- expected, + native):",
                    file.display()
                );
                report.push_str(&diff(&expected, &actual));
            }
            Err(e) => {
                let _ = writeln!(report, "  cannot read {}: {e}", file.display());
            }
        }
    }
    if report.is_empty() {
        Ok(())
    } else {
        Err(report)
    }
}

/// A line diff of `a` against `b`: `-` lines only in `a`, `+` lines only in `b`, two lines
/// of context, at most `MAX_DIFF_LINES` (80) lines. Bytes that are not UTF-8 are shown lossily.
pub fn diff(a: &[u8], b: &[u8]) -> String {
    let a_text = String::from_utf8_lossy(a);
    let b_text = String::from_utf8_lossy(b);
    let a_lines: Vec<&str> = a_text.split_inclusive('\n').collect();
    let b_lines: Vec<&str> = b_text.split_inclusive('\n').collect();
    let mut out = String::new();

    let ops = if a_lines.len() <= MAX_LCS_LINES && b_lines.len() <= MAX_LCS_LINES {
        lcs_ops(&a_lines, &b_lines)
    } else {
        prefix_suffix_ops(&a_lines, &b_lines)
    };

    // Keep two lines of context around every change.
    let changed: Vec<bool> = ops.iter().map(|op| !matches!(op, Op::Same(_))).collect();
    let near_change = |i: usize| {
        let lo = i.saturating_sub(2);
        let hi = (i + 3).min(changed.len());
        changed[lo..hi].iter().any(|&c| c)
    };
    let mut shown = 0;
    let mut skipped = false;
    for (i, op) in ops.iter().enumerate() {
        if !near_change(i) {
            skipped = true;
            continue;
        }
        if skipped {
            out.push_str("    ...\n");
            skipped = false;
        }
        if shown == MAX_DIFF_LINES {
            out.push_str("    ... (diff cut)\n");
            return out;
        }
        let (mark, line) = match op {
            Op::Same(l) => (' ', *l),
            Op::Del(l) => ('-', *l),
            Op::Add(l) => ('+', *l),
        };
        let _ = write!(out, "   {mark}{}", show_line(line));
        shown += 1;
    }
    if skipped {
        out.push_str("    ...\n");
    }
    out
}

/// A line for display: without its newline, with a marker when it had none.
fn show_line(line: &str) -> String {
    match line.strip_suffix('\n') {
        Some(l) => format!("{l}\n"),
        None => format!("{line}⏎(no newline at end)\n"),
    }
}

enum Op<'a> {
    Same(&'a str),
    Del(&'a str),
    Add(&'a str),
}

/// Longest-common-subsequence diff: O(len(a) * len(b)) time and memory.
fn lcs_ops<'a>(a: &[&'a str], b: &[&'a str]) -> Vec<Op<'a>> {
    let (n, m) = (a.len(), b.len());
    // lcs[i][j] = length of the LCS of a[i..] and b[j..]
    let mut lcs = vec![0u32; (n + 1) * (m + 1)];
    let at = |i: usize, j: usize| i * (m + 1) + j;
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[at(i, j)] = if a[i] == b[j] {
                lcs[at(i + 1, j + 1)] + 1
            } else {
                lcs[at(i + 1, j)].max(lcs[at(i, j + 1)])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    let mut ops = Vec::with_capacity(n + m);
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            ops.push(Op::Same(a[i]));
            i += 1;
            j += 1;
        } else if j < m && (i == n || lcs[at(i, j + 1)] >= lcs[at(i + 1, j)]) {
            ops.push(Op::Add(b[j]));
            j += 1;
        } else {
            ops.push(Op::Del(a[i]));
            i += 1;
        }
    }
    ops
}

/// For big outputs: common prefix and suffix, everything between shown as replaced.
fn prefix_suffix_ops<'a>(a: &[&'a str], b: &[&'a str]) -> Vec<Op<'a>> {
    let prefix = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let suffix = a[prefix..]
        .iter()
        .rev()
        .zip(b[prefix..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let mut ops: Vec<Op<'a>> = a[..prefix].iter().map(|l| Op::Same(l)).collect();
    ops.extend(a[prefix..a.len() - suffix].iter().map(|l| Op::Del(l)));
    ops.extend(b[prefix..b.len() - suffix].iter().map(|l| Op::Add(l)));
    ops.extend(a[a.len() - suffix..].iter().map(|l| Op::Same(l)));
    ops
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diff_marks_changed_lines_with_context() {
        let d = diff(b"a\nb\nc\nd\ne\nf\ng\n", b"a\nb\nc\nX\ne\nf\ng\n");
        assert!(d.contains("   -d\n"), "{d}");
        assert!(d.contains("   +X\n"), "{d}");
        assert!(d.contains("    b\n"), "{d}");
        assert!(!d.contains("    g\n") || d.contains("    f\n"), "{d}");
    }

    #[test]
    fn diff_of_missing_output_lists_every_native_line() {
        let d = diff(b"one\ntwo\n", b"");
        assert_eq!(d, "   -one\n   -two\n");
    }

    #[test]
    fn diff_shows_a_missing_final_newline() {
        let d = diff(b"x\n", b"x");
        assert!(d.contains("no newline at end"), "{d}");
    }
}
