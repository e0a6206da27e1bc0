//! Pictures of a report: one Graphviz file per hot function's observed CFG, and a flame graph
//! of the shadow call stacks (both need a report made with `--paths`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::{Addr, Report, ReportError};

/// Writes one Graphviz file per function among the `top` hottest (`DIR/<n>-<name>.dot`): the
/// function's observed CFG, blocks labelled `symbol+offset` and count, edges labelled and
/// weighted (pen width) by count, back edges dashed. Returns the files written.
///
/// # Errors
/// [`ReportError::Render`] when the report has no path profile, [`ReportError::Io`] creating
/// `dir` or a file.
pub fn write_dot(r: &Report, dir: &Path, top: usize) -> Result<Vec<PathBuf>, ReportError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ReportError::Io { path, source }
    };
    let Some(pp) = &r.path_profile else {
        return Err(ReportError::Render {
            path: dir.to_path_buf(),
            message: "the report has no function CFGs (run with --paths)".into(),
        });
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let names: HashMap<Addr, &str> = r
        .blocks
        .iter()
        .filter_map(|b| Some((b.addr, b.symbol.as_deref()?)))
        .collect();
    let mut written = Vec::new();
    for (i, f) in pp.functions.iter().take(top).enumerate() {
        let safe: String = f
            .name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let path = dir.join(format!("{i:02}-{safe}.dot"));
        let max = f.edges.iter().map(|e| e.count).max().unwrap_or(1).max(1) as f64;
        let mut s = format!(
            "digraph \"{}\" {{\n  node [shape=box, fontname=monospace];\n",
            f.name.replace('"', "'")
        );
        for b in &f.blocks {
            let label = names
                .get(&b.addr)
                .map_or_else(|| b.addr.to_string(), |s| s.to_string())
                .replace('"', "'");
            s.push_str(&format!(
                "  \"{}\" [label=\"{}\\n{}\"];\n",
                b.addr, label, b.count
            ));
        }
        for e in &f.edges {
            s.push_str(&format!(
                "  \"{}\" -> \"{}\" [label=\"{}\", weight={}, penwidth={:.2}{}];\n",
                e.from,
                e.to,
                e.count,
                e.count.max(1),
                1.0 + 4.0 * e.count as f64 / max,
                if e.back { ", style=dashed" } else { "" }
            ));
        }
        s.push_str("}\n");
        std::fs::write(&path, s).map_err(io(&path))?;
        written.push(path);
    }
    Ok(written)
}

/// Writes a flame graph SVG of the report's folded call stacks (blocks executed per shadow
/// call stack) with inferno.
///
/// # Errors
/// [`ReportError::Render`] when the report has no call stacks or inferno fails,
/// [`ReportError::Io`] when the file cannot be written (as [`crate::write_atomically`]).
pub fn write_flamegraph(r: &Report, path: &Path) -> Result<(), ReportError> {
    let lines: Vec<String> = r
        .path_profile
        .iter()
        .flat_map(|p| &p.stacks)
        .map(|s| format!("{} {}", s.stack, s.blocks))
        .collect();
    let render = |message: String| ReportError::Render {
        path: path.to_path_buf(),
        message,
    };
    if lines.is_empty() {
        return Err(render(
            "the report has no call stacks (run with --paths)".into(),
        ));
    }
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = "hotpath: guest blocks executed by call stack".into();
    opts.count_name = "blocks".into();
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), &mut svg)
        .map_err(|e| render(e.to_string()))?;
    crate::write_atomically(path, |w| std::io::Write::write_all(w, &svg))
}
