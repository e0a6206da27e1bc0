//! hotpath's profile report as typed data, and every rendering of it.
//!
//! ```text
//! monitor tables + path recorder ──▶ Report (schema.rs) ──write──▶ FILE.json (hotpath-report/2)
//!                                        ▲  │
//!                 FILE.json ──read (strict)─┘  ├──▶ text summary (text.rs)
//!                 FILE.json ... ──merge.rs──▶  ├──▶ DOT per hot function, flame graph (graph.rs)
//!                                              ├──▶ drcov coverage for Lighthouse / bncov (drcov.rs)
//!                                              ├──▶ callgrind profile for KCachegrind (callgrind.rs)
//!                                              └──▶ pprof profile.proto for go tool pprof (pprof.rs)
//! ```
//!
//! Source lines (lines.rs) come from each module's DWARF, read with addr2line, for the text
//! report's hot lines, callgrind and pprof.
//!
//! Every renderer reads the same typed [`Report`]; none looks at JSON. A report file is read
//! only if its `schema` is exactly [`SCHEMA`], and a field missing or of the wrong type is an
//! error, never a zero. The field-by-field description is docs/report-schema.md.

pub mod callgrind;
pub mod drcov;
pub mod graph;
mod json;
pub mod lines;
pub mod merge;
pub mod pprof;
#[cfg(test)]
mod sample;
mod schema;
pub mod text;

pub use schema::*;

use std::path::PathBuf;

/// What can go wrong reading, merging or writing reports. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The file cannot be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file is not JSON at all.
    #[error("{}: not a hotpath report (not JSON: {source})", path.display())]
    NotJson {
        path: PathBuf,
        source: serde_json::Error,
    },
    /// JSON without a `hotpath-report/…` schema.
    #[error("{}: not a hotpath report (no \"schema\": \"{SCHEMA}\")", path.display())]
    NotAReport { path: PathBuf },
    /// A report of another schema version.
    #[error("{}: schema {found}, but this hotpath reads {SCHEMA}: run the program again to make a new report", path.display())]
    Schema { path: PathBuf, found: String },
    /// A field missing or of the wrong type.
    #[error("{}: malformed {SCHEMA} report: {source}", path.display())]
    Malformed {
        path: PathBuf,
        source: serde_json::Error,
    },
    /// Reports that cannot be merged (different programs).
    #[error("cannot merge {} with {}: {reason}", first.display(), other.display())]
    Mismatch {
        first: PathBuf,
        other: PathBuf,
        reason: String,
    },
    /// A renderer's own failure (the flame graph library's).
    #[error("{}: {message}", path.display())]
    Render { path: PathBuf, message: String },
}
