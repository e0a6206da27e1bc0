//! The profile in pprof's `profile.proto` (gzipped), which `go tool pprof` and the profile
//! stores (Pyroscope, Parca, Grafana) read.
//!
//! Two sample types, both exact counts rather than samples: `guest_instructions` (the
//! default) and `block_executions`. A sample is one run of a block's instructions that come
//! from one source line (one sample per block where a module has no line information), under:
//! - with a path profile (`--paths`, `--callgrind`): the calling context the shadow stack saw,
//!   for a function all of whose instructions ran in one context; a function that ran in
//!   several contexts is the root of its samples, with a `calling_contexts` label saying in
//!   how many (the shadow stack counts instructions per context, not per line per context, so
//!   its lines cannot be split between them exactly). One set of samples per thread that has
//!   its own path profile, labelled `thread`;
//! - otherwise, nothing above the function: the function and the source position (with its
//!   inlined frames) are the sample's whole stack.
//!
//! Locations carry the guest address and, where the module has DWARF, every inlined frame
//! ([`crate::lines`]); mappings carry each module's path, address range and build id, so pprof
//! can find the binary and disassemble. Every sample is labelled with the program's path and,
//! when the run itself writes the profile, the guest's `pid`.
//!
//! Format: github.com/google/pprof, `proto/profile.proto`; the messages below are that file's,
//! field for field, encoded with `prost`.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::Path;

use prost::Message;

use crate::callgrind::function_of_symbol;
use crate::lines::{Frame, SourceLines};
use crate::{Addr, PathProfile, Report, ReportError};

/// `profile.proto`'s messages (only the fields hotpath writes are used; the rest stay zero).
mod proto {
    /// The whole profile.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "3")]
        pub mapping: Vec<Mapping>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        #[prost(int64, tag = "12")]
        pub period: i64,
        #[prost(int64, repeated, tag = "13")]
        pub comment: Vec<i64>,
        #[prost(int64, tag = "14")]
        pub default_sample_type: i64,
    }

    /// A sample type or the period's: string-table indexes of its name and unit.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }

    /// One stack (leaf first) and its values, one per sample type.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
        #[prost(message, repeated, tag = "3")]
        pub label: Vec<Label>,
    }

    /// A sample's label: a string (`str`) or a number (`num`).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Label {
        #[prost(int64, tag = "1")]
        pub key: i64,
        #[prost(int64, tag = "2")]
        pub str: i64,
        #[prost(int64, tag = "3")]
        pub num: i64,
    }

    /// A mapped module.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Mapping {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub memory_start: u64,
        #[prost(uint64, tag = "3")]
        pub memory_limit: u64,
        #[prost(uint64, tag = "4")]
        pub file_offset: u64,
        #[prost(int64, tag = "5")]
        pub filename: i64,
        #[prost(int64, tag = "6")]
        pub build_id: i64,
        #[prost(bool, tag = "7")]
        pub has_functions: bool,
        #[prost(bool, tag = "8")]
        pub has_filenames: bool,
        #[prost(bool, tag = "9")]
        pub has_line_numbers: bool,
        #[prost(bool, tag = "10")]
        pub has_inline_frames: bool,
    }

    /// A code address and its source positions (innermost first; the last is the function
    /// the others were inlined into).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub mapping_id: u64,
        #[prost(uint64, tag = "3")]
        pub address: u64,
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
    }

    /// A function and line of a location.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Line {
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        #[prost(int64, tag = "2")]
        pub line: i64,
    }

    /// A function: string-table indexes of its name and source file.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Function {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "2")]
        pub name: i64,
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        #[prost(int64, tag = "4")]
        pub filename: i64,
    }
}

/// The profile being built: interned strings, functions and locations.
struct Builder {
    p: proto::Profile,
    strings: HashMap<String, i64>,
    functions: HashMap<(String, String), u64>,
    /// Locations by guest address (code) or by function name (a caller frame with no known
    /// call site).
    locations: HashMap<Addr, u64>,
    caller_locations: HashMap<String, u64>,
}

impl Builder {
    fn new() -> Builder {
        let mut b = Builder {
            p: proto::Profile::default(),
            strings: HashMap::new(),
            functions: HashMap::new(),
            locations: HashMap::new(),
            caller_locations: HashMap::new(),
        };
        b.string(""); // index 0 is the empty string, as the format requires
        b
    }

    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.p.string_table.len() as i64;
        self.p.string_table.push(s.to_string());
        self.strings.insert(s.to_string(), i);
        i
    }

    fn function(&mut self, name: &str, file: &str) -> u64 {
        if let Some(&id) = self.functions.get(&(name.to_string(), file.to_string())) {
            return id;
        }
        let id = self.p.function.len() as u64 + 1;
        let (n, f) = (self.string(name), self.string(file));
        self.p.function.push(proto::Function {
            id,
            name: n,
            system_name: n,
            filename: f,
        });
        self.functions
            .insert((name.to_string(), file.to_string()), id);
        id
    }

    /// The location of guest code at `addr` with source position `frames` (innermost first),
    /// or, without frames, named `fallback`.
    fn code_location(
        &mut self,
        addr: Addr,
        mapping: Option<usize>,
        frames: &[Frame],
        fallback: &str,
    ) -> u64 {
        if let Some(&id) = self.locations.get(&addr) {
            return id;
        }
        let mut line = Vec::new();
        for f in frames {
            let function = self.function(
                f.function.as_deref().unwrap_or(crate::callgrind::UNKNOWN),
                f.file.as_deref().unwrap_or(""),
            );
            line.push(proto::Line {
                function_id: function,
                line: f.line as i64,
            });
        }
        if line.is_empty() {
            let function = self.function(fallback, "");
            line.push(proto::Line {
                function_id: function,
                line: 0,
            });
        }
        let id = self.p.location.len() as u64 + 1;
        self.p.location.push(proto::Location {
            id,
            mapping_id: mapping.map_or(0, |m| m as u64 + 1),
            address: addr.0,
            line,
        });
        self.locations.insert(addr, id);
        id
    }

    /// A caller's frame where its call site is not known: its function alone.
    fn function_location(&mut self, name: &str) -> u64 {
        if let Some(&id) = self.caller_locations.get(name) {
            return id;
        }
        let function = self.function(name, "");
        let id = self.p.location.len() as u64 + 1;
        self.p.location.push(proto::Location {
            id,
            mapping_id: 0,
            address: 0,
            line: vec![proto::Line {
                function_id: function,
                line: 0,
            }],
        });
        self.caller_locations.insert(name.to_string(), id);
        id
    }

    fn label_str(&mut self, key: &str, value: &str) -> proto::Label {
        proto::Label {
            key: self.string(key),
            str: self.string(value),
            num: 0,
        }
    }

    fn label_num(&mut self, key: &str, value: i64) -> proto::Label {
        proto::Label {
            key: self.string(key),
            str: 0,
            num: value,
        }
    }
}

/// A block's runs and its module, computed once.
struct BlockLines<'a> {
    block: &'a crate::Block,
    runs: Vec<crate::lines::Run>,
    /// The name of its code where no frame names it (its symbol's function).
    fallback: String,
}

/// Builds `r`'s pprof profile (not yet encoded), every sample labelled with the program and,
/// when known, the guest's process id `pid`.
fn build(r: &Report, pid: Option<u32>) -> proto::Profile {
    let lines = SourceLines::load(r, true);
    let mut b = Builder::new();
    let instructions = b.string("guest_instructions");
    let blocks_executed = b.string("block_executions");
    let count = b.string("count");
    b.p.sample_type = vec![
        proto::ValueType {
            r#type: instructions,
            unit: count,
        },
        proto::ValueType {
            r#type: blocks_executed,
            unit: count,
        },
    ];
    b.p.period_type = Some(proto::ValueType {
        r#type: instructions,
        unit: count,
    });
    b.p.period = 1;
    b.p.default_sample_type = instructions;
    for c in [
        format!("hotpath: {}", r.argv.join(" ")),
        "exact counts of every executed guest block and instruction (not samples)".to_string(),
    ] {
        let i = b.string(&c);
        b.p.comment.push(i);
    }
    for (i, m) in r.modules.iter().enumerate() {
        let has_lines = lines.has_module(i);
        let (filename, build_id) = (
            b.string(&m.path),
            b.string(m.build_id.as_deref().unwrap_or("")),
        );
        b.p.mapping.push(proto::Mapping {
            id: i as u64 + 1,
            memory_start: m.base.0,
            memory_limit: m.base.0 + m.size,
            file_offset: 0,
            filename,
            build_id,
            has_functions: true,
            has_filenames: has_lines,
            has_line_numbers: has_lines,
            has_inline_frames: has_lines,
        });
    }
    let module_path = |m: Option<usize>| m.and_then(|m| r.modules.get(m)).map(|m| m.path.as_str());
    let by_addr: HashMap<Addr, BlockLines> = r
        .blocks
        .iter()
        .filter(|bl| bl.count > 0)
        .map(|bl| {
            let fallback = bl.symbol.as_deref().map_or_else(
                || crate::callgrind::UNKNOWN.to_string(),
                |s| function_of_symbol(s, module_path(bl.module)),
            );
            let runs = lines.runs(bl);
            (
                bl.addr,
                BlockLines {
                    block: bl,
                    runs,
                    fallback,
                },
            )
        })
        .collect();
    let mut common = vec![b.label_str("program", &r.program)];
    if let Some(pid) = pid {
        common.push(b.label_num("pid", pid as i64));
    }

    // Samples of block `a` executed `n` times, under `callers` (innermost first).
    let emit = |b: &mut Builder, a: Addr, n: u64, callers: &[u64], labels: &[proto::Label]| {
        let Some(bl) = by_addr.get(&a) else { return };
        for (i, run) in bl.runs.iter().enumerate() {
            let leaf = b.code_location(run.addr, bl.block.module, &run.frames, &bl.fallback);
            let mut location_id = vec![leaf];
            location_id.extend_from_slice(callers);
            b.p.sample.push(proto::Sample {
                location_id,
                value: vec![
                    (n * run.instructions as u64) as i64,
                    if i == 0 { n as i64 } else { 0 },
                ],
                label: labels.to_vec(),
            });
        }
    };

    let profiles: Vec<(Option<u32>, &PathProfile)> =
        if r.threads.iter().any(|t| t.path_profile.is_some()) {
            r.threads
                .iter()
                .filter_map(|t| t.path_profile.as_ref().map(|p| (Some(t.tid), p)))
                .collect()
        } else {
            r.path_profile.iter().map(|p| (None, p)).collect()
        };
    let mut covered: HashMap<Addr, u64> = HashMap::new();
    for (tid, pp) in profiles {
        let mut labels = common.clone();
        if let Some(tid) = tid {
            labels.push(b.label_num("thread", tid as i64));
        }
        let sites = call_sites(r, pp);
        let mut contexts: HashMap<&str, Vec<Vec<&str>>> = HashMap::new();
        for s in pp.stacks.iter().filter(|s| s.blocks > 0) {
            let frames: Vec<&str> = s.stack.split(';').collect();
            if let Some(&leaf) = frames.last() {
                contexts.entry(leaf).or_default().push(frames);
            }
        }
        for f in &pp.functions {
            let ctx = contexts.get(f.name.as_str()).map_or(&[][..], Vec::as_slice);
            let mut callers = Vec::new();
            let mut labels = labels.clone();
            if let [frames] = ctx {
                // Innermost caller first: each caller's call site into the frame below it.
                for w in frames.windows(2).rev() {
                    let (caller, callee) = (w[0], w[1]);
                    let site = sites.get(&(caller, callee)).and_then(|s| match s[..] {
                        [one] => by_addr.get(&one),
                        _ => None,
                    });
                    callers.push(
                        match site.and_then(|bl| bl.runs.last().map(|run| (bl, run))) {
                            Some((bl, run)) => b.code_location(
                                run.addr,
                                bl.block.module,
                                &run.frames,
                                &bl.fallback,
                            ),
                            None => b.function_location(caller),
                        },
                    );
                }
            } else {
                labels.push(b.label_num("calling_contexts", ctx.len() as i64));
            }
            for c in &f.blocks {
                *covered.entry(c.addr).or_insert(0) += c.count;
                emit(&mut b, c.addr, c.count, &callers, &labels);
            }
        }
    }
    // What no path profile covers (or everything, without one).
    for bl in r.blocks.iter().filter(|bl| bl.count > 0) {
        let rest = bl
            .count
            .saturating_sub(covered.get(&bl.addr).copied().unwrap_or(0));
        if rest > 0 {
            emit(&mut b, bl.addr, rest, &[], &common);
        }
    }
    b.p
}

/// `(caller, callee)` function names → the blocks whose call enters the callee from the
/// caller (from the edge table's direct and indirect calls).
fn call_sites<'a>(r: &Report, pp: &'a PathProfile) -> HashMap<(&'a str, &'a str), Vec<Addr>> {
    let mut owner: HashMap<Addr, (u64, &str)> = HashMap::new();
    let mut by_entry: HashMap<Addr, &str> = HashMap::new();
    for f in &pp.functions {
        by_entry.insert(f.entry, f.name.as_str());
        for c in &f.blocks {
            let o = owner.entry(c.addr).or_insert((0, f.name.as_str()));
            if c.count > o.0 {
                *o = (c.count, f.name.as_str());
            }
        }
    }
    let mut out: HashMap<(&str, &str), Vec<Addr>> = HashMap::new();
    for (from, to, _) in r.calls() {
        if let (Some(&(_, caller)), Some(&callee)) = (owner.get(&from), by_entry.get(&to)) {
            let v = out.entry((caller, callee)).or_default();
            if !v.contains(&from) {
                v.push(from);
            }
        }
    }
    out
}

/// Writes `r`'s gzipped pprof profile to `path` (atomically, as reports are); `pid` is the
/// guest's process id when the run is the one writing it (a saved report does not keep it).
///
/// # Errors
/// [`ReportError::Io`].
pub fn write(r: &Report, path: &Path, pid: Option<u32>) -> Result<(), ReportError> {
    let bytes = build(r, pid).encode_to_vec();
    crate::write_atomically(path, |w| {
        let mut gz = flate2::write::GzEncoder::new(w, flate2::Compression::fast());
        gz.write_all(&bytes)?;
        gz.finish().map(drop)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::pie_run;

    #[test]
    fn every_executed_instruction_is_in_one_sample() {
        let r = pie_run(0x1000);
        let p = build(&r, None);
        let total: i64 = p.sample.iter().map(|s| s.value[0]).sum();
        assert_eq!(total as u64, r.totals.guest_instructions);
        let blocks: i64 = p.sample.iter().map(|s| s.value[1]).sum();
        assert_eq!(blocks as u64, r.totals.blocks_executed);
        // The module's file does not exist here: no lines, one location per block, named by
        // its symbol's function.
        let name = |id: u64| {
            let f = &p.function[id as usize - 1];
            p.string_table[f.name as usize].clone()
        };
        let names: Vec<String> = p
            .location
            .iter()
            .map(|l| name(l.line[0].function_id))
            .collect();
        assert_eq!(names, ["main", "main", "main", "f"]);
        assert_eq!(p.mapping.len(), 1);
        assert_eq!(p.string_table[p.mapping[0].build_id as usize], "abcd");
    }

    #[test]
    fn the_profile_is_gzipped_protobuf_that_decodes_back() {
        let r = pie_run(0x1000);
        let path = std::env::temp_dir().join(format!("hotpath-pprof-{}.pb.gz", std::process::id()));
        write(&r, &path, Some(7)).unwrap();
        let mut raw = Vec::new();
        std::io::Read::read_to_end(
            &mut flate2::read::GzDecoder::new(std::fs::File::open(&path).unwrap()),
            &mut raw,
        )
        .unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(
            proto::Profile::decode(raw.as_slice()).unwrap(),
            build(&r, Some(7))
        );
    }
}
